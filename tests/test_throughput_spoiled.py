"""Repeats that measured the machine, not the config, are recorded and retaken (real reference engines).

The engine's ``stall`` fault takes its core away for half a second during chosen measured phases (the
K-th /flush_cache is the K-th repeat's): the engine falls behind its clock there exactly as on a
loaded host, and says so through /server_info.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates.throughput import baseline as baseline_mod, verdicts
from pytest_ddtree.measure import load, stats
from pytest_ddtree.gates.throughput import baseline as baseline_mod, cells, measurement
from pytest_ddtree.records.shapes import RepeatData
from pytest_ddtree.records.words import Status
from tests.refserver_helpers import RefServer, config_args

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py

CELL = load.Cell(name="c4_tiny", concurrency=4, context_tokens=48, output_tokens=32, requests=8, warmup_requests=4)
ENGINE = ["--clock-scale", "5", *config_args("bs8_b8_k4")]
#: No baseline file: the cells are measured and evaluated, never judged.
NO_BASELINE = cells.CellBaseline("bs8_b8_k4", Path("none.yaml"), "refserver", {})


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    # repeats 1 and 2 (the 2nd and 3rd flushes) stall: two of the first three, a majority
    server = RefServer([*ENGINE, "--fault", "stall=2:0.5,stall=3:0.5"], tmp_path_factory.mktemp("spoiled"), "stalled")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def test_a_repeat_during_which_the_engine_stalled_is_recorded_and_retaken_not_counted(stalled: RefServer) -> None:
    recorded: list[RepeatData] = []
    campaign = measurement.measure_config(
        stalled.url, [CELL], 3,
        recording=measurement.Recording(lambda name, r, result: recorded.append(measurement.sample_record(name, r, result))))
    run = campaign.runs[CELL.name]
    # every repeat recorded as it happened, the stalled ones marked with the service's own words
    assert [r["repeat"] for r in recorded] == list(range(len(run.samples)))
    # (a loaded test machine may spoil more repeats than the two stalled ones: they are retaken too)
    assert {1, 2} <= set(run.spoiled), [r["spoiled"] for r in recorded]
    assert [r["repeat"] for r in recorded if r["spoiled"]] == sorted(run.spoiled)
    for i in (1, 2):
        assert any(words in run.spoiled[i] for words in ("busy only", "fell behind its own clock", "simulated clock"))
    # they would have decided the cell: far slower than every clean repeat
    stalled_tok_s = [run.samples[i].metrics()["output_throughput"] for i in (1, 2)]
    assert all(isinstance(v, float) and v < 0.8 * min(run.primary) for v in stalled_tok_s), (stalled_tok_s, run.primary)
    # more repeats took their place: three clean ones count, within the extra-repeat budget
    assert len(run.primary) == 3 and len(run.samples) == 3 + len(run.spoiled) and not run.short_of_clean

    ev = cells.judged_cell("bs8_b8_k4", CELL, campaign, NO_BASELINE, bless=True)
    assert ev.status == Status.VALID and ev.status_reasons == []
    # the gated samples and a bless's baseline hold the clean repeats only; the record shows the retaken ones
    assert ev.samples["output_throughput"] == run.primary and ev.repeats == 3
    entry = baseline_mod.baseline_cell_entry(ev.record["workload"], ev.samples)
    assert entry["gates"]["output_throughput"]["sessions"][0]["samples"] == [baseline_mod._round(v) for v in run.primary]
    assert [s["repeat"] for s in ev.record["spoiled_repeats"]] == sorted(run.spoiled)
    assert any(f"{len(run.spoiled)} repeat(s) retaken, not counted" in n for n in ev.record["notes"])


def test_a_cell_that_cannot_get_its_clean_repeats_is_inconclusive_with_each_repeats_evidence(
        tmp_path: Path) -> None:
    # every measured phase stalls: no clean repeat within the budget
    stalls = ",".join(f"stall={k}:0.5" for k in range(1, 2 + measurement.MAX_EXTRA_REPEATS + 1))
    server = RefServer([*ENGINE, "--fault", stalls], tmp_path, "always-stalled").wait_ready()
    try:
        campaign = measurement.measure_config(server.url, [CELL], 1)
    finally:
        server.stop()
    run = campaign.runs[CELL.name]
    assert len(run.samples) == 1 + measurement.MAX_EXTRA_REPEATS and run.primary == [] and run.short_of_clean
    ev = cells.judged_cell("bs8_b8_k4", CELL, campaign, NO_BASELINE, bless=False)
    assert ev.status == Status.INCONCLUSIVE and ev.samples == {}
    (why,) = ev.status_reasons
    assert "only 0 clean repeat(s) of the 1 needed" in why and "rerun on a quieter machine" in why
    for i in range(len(run.samples)):
        assert f"repeat {i}, output tok/s" in why


C1 = load.Cell(name="c1_tiny", concurrency=1, context_tokens=48, output_tokens=32, requests=2, warmup_requests=1)


def _baseline_ttft_a_third_of(measured: dict[str, list[float]]) -> dict[str, Any]:
    """A baseline of three sessions as the bless flow writes it, from this engine's own figures,
    except a TTFT three times as fast as the engine's: a latency regression to catch."""
    entry = None
    for session in ("s1", "s2", "s3"):
        entry = baseline_mod.baseline_cell_entry(
            {"concurrency": 1, "context_tokens": 48, "output_tokens": 32, "requests": 2, "prompts": "documents via /tokenize"},
            {**measured, "median_ttft_ms": [v / 3 for v in measured["median_ttft_ms"]]}, entry, session=session)
    assert entry is not None
    return entry


def test_a_latency_regression_beside_retaken_repeats_is_inconclusive_and_without_them_it_fails(tmp_path: Path) -> None:
    clean = RefServer(ENGINE, tmp_path, "clean").wait_ready()
    try:
        measured = measurement.measure_config(clean.url, [C1], 3)
        ev = cells.judged_cell("bs8_b8_k4", C1, measured, NO_BASELINE, bless=False)
        baseline = {C1.name: _baseline_ttft_a_third_of(ev.samples)}
        # the engine kept its clock in every repeat: the latency regression is the config's, and fails
        judged = measurement.measure_config(clean.url, [C1], 3, baseline=baseline)
    finally:
        clean.stop()
    verdict = judged.verdicts[C1.name]
    runs = [judged.runs[C1.name], *judged.confirmations.values()]
    pressure = measurement.host_cpu_pressure(*runs)
    if any(run.spoiled for run in runs) or (pressure or 0.0) > measurement.MAX_HOST_CPU_PRESSURE:
        # a loaded test machine: then the rules below apply, rightly
        assert verdict.status == Status.INCONCLUSIVE, verdict.message()
        return
    ttft = verdict.metric("median_ttft_ms")
    assert verdict.status == Status.REGRESSION and ttft is not None and ttft.status == Status.REGRESSION, verdict.message()
    # the same engine stalled during one repeat of the first pass: the same regression is the machine's
    stalls = RefServer([*ENGINE, "--fault", "stall=2:0.5"], tmp_path, "stalled-once").wait_ready()
    try:
        judged = measurement.measure_config(stalls.url, [C1], 3, baseline=baseline)
    finally:
        stalls.stop()
    verdict = judged.verdicts[C1.name]
    assert judged.runs[C1.name].spoiled, "the stall did not spoil its repeat"
    assert verdict.status == Status.INCONCLUSIVE and not verdict.failed, verdict.message()
    assert "median_ttft_ms" in verdict.reasons[0] and "not a verdict on the config" in verdict.reasons[0]


def _repeats(pressure: float | None) -> stats.CellRun[load.CellResult]:
    """Three clean repeats of one second during which tasks waited for a CPU ``pressure`` of the time."""
    sample = load.CellResult(cell=C1.name, workload=load.workload_dict(C1, "coding"), requests=[], duration_s=1.0,
                             host_cpu_stall_s=pressure)
    return stats.CellRun(samples=[sample] * 3, primary=[1000.0] * 3, min_clean=3)


def _regressed(metric: str, unit: str) -> verdicts.CellVerdict:
    m = verdicts.MetricVerdict(metric, Status.REGRESSION, "lower" if unit == "ms" else "higher", 0.25, 4.0, 6.0, 0.5, unit=unit)
    return verdicts.CellVerdict(C1.name, Status.REGRESSION, (m,))


@pytest.mark.parametrize(("pressure", "machine"), [(0.30, True), (0.05, False), (None, False)])
def test_a_latency_regression_on_a_host_whose_cpus_were_contended_is_the_machines(pressure: float | None, machine: bool) -> None:
    """Every repeat clean, the engine on its clock, yet tasks waited for a CPU 30% of the time:
    the TTFT regression is not a verdict on the config, and the reason gives the figure. At 5%,
    or where the kernel reports no CPU pressure, the regression stands."""
    first, confirmation = _repeats(pressure), _repeats(pressure)
    reason = measurement.latency_beside_a_loaded_machine(_regressed("median_ttft_ms", "ms"), first, confirmation)
    if machine:
        assert reason is not None and "waited for a CPU 30% of the time" in reason and "median_ttft_ms +50.0%" in reason
        assert "not a verdict on the config" in reason
    else:
        assert reason is None
    # a throughput regression is the config's whatever the host's load: the engine's clock judges that
    assert measurement.latency_beside_a_loaded_machine(_regressed("output_throughput", "tok/s"), first, confirmation) is None
