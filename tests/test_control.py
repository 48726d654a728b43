"""The session's control (pytest_ddtree/control.py) and the gate's trust checks, through the gate's
own functions: baselines blessed by ``baseline.baseline_cell_entry``, verdicts by ``rule.judge_config``,
the session-end judgement by ``control.judge`` over records shaped as the suite records them."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.gates.throughput import baseline, rule, session_check, verdicts as verdicts_mod
from pytest_ddtree.measure import load, stats
from pytest_ddtree.gates.throughput import baseline, control, launches as launches_mod
from pytest_ddtree.records.shapes import ControlJudgedData
from pytest_ddtree.service.manager import REFERENCE_LABEL
from pytest_ddtree.records.words import Status
from tests.suite_helpers import reference_profile

CELLS = ("c1", "c2", "c3", "c4")
WORKLOAD = {"concurrency": 8, "context_tokens": 128, "output_tokens": 64, "requests": 16}


def _samples(rng: random.Random, value: float, factor: float, n: int = 3) -> dict[str, list[float]]:
    return {"output_throughput": [value * factor * math.exp(rng.gauss(0, 0.01)) for _ in range(n)],
            "median_ttft_ms": [20.0 / factor * math.exp(rng.gauss(0, 0.02)) for _ in range(n)]}


def _launch(rng: random.Random, name: str, value: float, entries: dict[str, Any], factor: float,
            kind: str = "throughput", launch: int = 1) -> list[ControlJudgedData]:
    """One launch judged against its blessed entries: the records the suite writes."""
    inputs = {cell: verdicts_mod.CellInput(entries[cell], _samples(rng, value * (1 + i / 10), factor), workload=WORKLOAD)
              for i, cell in enumerate(CELLS)}
    verdicts = rule.judge_config(inputs, {c: inp.current for c, inp in inputs.items()})
    return [{"kind": kind, "config": name, "cell": cell, "hardware_profile": "hw", "host": "node1",
             "metrics": {"output_throughput": stats.median(list(inputs[cell].current["output_throughput"]))},
             "verdict": v.as_dict(), "control_source": "non-speculative launch", "control_launch": launch}
            for cell, v in verdicts.items()]


def _session(control_factor: float, config_factor: float, seed: int = 1, control_blessed: str = "s",
             control_at_end: float | None = None) -> control.ControlJudgement:
    """Three blessed sessions of a control (100 tok/s) and two configs (300, 400 tok/s), then a
    session where the control runs ``control_factor`` and every config ``config_factor`` as fast
    (and the control once more at the session's end at ``control_at_end``)."""
    rng = random.Random(seed)
    values = {baseline.CONTROL: 100.0, "bs8_b4_k4": 300.0, "bs8_b8_k4": 400.0}
    entries: dict[str, dict[str, Any]] = {name: {} for name in values}
    for s in range(3):
        day = math.exp(rng.gauss(0, 0.01))
        for name, value in values.items():
            for i, cell in enumerate(CELLS):
                entries[name][cell] = baseline.baseline_cell_entry(
                    WORKLOAD, _samples(rng, value * (1 + i / 10), day), entries[name].get(cell),
                    session=f"{control_blessed if name == baseline.CONTROL else 's'}{s}")
    records = _launch(rng, baseline.CONTROL, 100.0, entries[baseline.CONTROL], control_factor, control.CONTROL_RECORD)
    if control_at_end is not None:
        records += _launch(rng, baseline.CONTROL, 100.0, entries[baseline.CONTROL], control_at_end,
                           control.CONTROL_RECORD, launch=2)
    configs = [r for name in ("bs8_b4_k4", "bs8_b8_k4") for r in _launch(rng, name, values[name], entries[name],
                                                                        config_factor)]
    return control.judge(records + configs, configs)


def test_every_config_slower_while_the_control_holds_fails_as_only_speculative_configs_moved() -> None:
    judged = _session(1.0, 0.92)
    (group,) = judged.groups
    assert group.failed and group.kind == control.KIND_SPECULATIVE
    assert group.control_status == "held" and abs(group.control_change or 0) < 0.03
    assert group.uniform_shift is not None and -0.11 < group.uniform_shift < -0.05
    low, high = group.uniform_interval or (0, 0)
    assert low < group.uniform_shift < high < 0
    text = judged.text()
    assert "REGRESSION: every speculative config is" in text and "only speculative configs moved" in text
    # each config's speedup over the control, per cell and for all its cells
    for name in ("bs8_b4_k4", "bs8_b8_k4"):
        assert -0.11 < group.configs[name]["speedup_change"] < -0.05
        assert set(group.configs[name]["cells"]) == set(CELLS)
    assert 2.5 < group.configs["bs8_b4_k4"]["cells"]["c1"]["speedup"] < 3.5
    assert judged.as_dict()["groups"][0]["kind"] == control.KIND_SPECULATIVE


def test_a_whole_machine_slower_moves_the_control_not_the_speedups() -> None:
    judged = _session(0.85, 0.85)
    (group,) = judged.groups
    assert group.kind == control.KIND_CONTROL and group.control_status in ("moved", "failed")
    assert group.uniform_shift is not None and abs(group.uniform_shift) < 0.03
    assert "control moved" in judged.text()


def test_an_unchanged_session_says_nothing_moved_and_passes() -> None:
    judged = _session(1.0, 1.0)
    (group,) = judged.groups
    assert not judged.failed and group.kind == control.KIND_NONE
    assert "uniform shift of the 2 speculative configs" in judged.text()
    assert "their median speedup change over the control" in judged.text()


def test_without_a_control_the_summary_says_the_per_config_rule_applies() -> None:
    judged = control.judge([{"kind": control.CONTROL_UNAVAILABLE, "reason": "profile x cannot launch it"}], [])
    assert not judged.available and not judged.failed
    assert "no control in this session: profile x cannot launch it" in judged.text()
    assert "per-config rule" in judged.text()


def test_a_missing_control_baseline_fails_only_under_require_baselines() -> None:
    rec: ControlJudgedData = {"kind": control.CONTROL_RECORD, "config": baseline.CONTROL, "cell": "c1", "hardware_profile": "hw",
                              "metrics": {}, "verdict": verdicts_mod.CellVerdict("c1", Status.MISSING, (), ("no baseline for this cell",)).as_dict()}
    assert not control.judge([rec], []).failed
    judged = control.judge([rec], [], require_baselines=True)
    assert judged.failed and "c1: MISSING" in judged.text()


def test_a_client_that_kept_too_few_requests_in_flight_is_inconclusive() -> None:
    policy = stats.RepeatPolicy()
    short = [{"max_concurrency": 32, "concurrency": 20.0, "ddtree_loaded_concurrency": 24.0}] * 3
    status, why = verdicts_mod.measurement_status(policy, [870.0, 880.0, 875.0], False, short)
    assert status == Status.INCONCLUSIVE and "25% short" in why[0] and "of the configured 32" in why[0]
    # the drain at the end of a finite closed loop does not count: the loaded figure decides
    drained = [{"max_concurrency": 8, "concurrency": 6.4, "ddtree_loaded_concurrency": 7.9}] * 3
    assert verdicts_mod.measurement_status(policy, [870.0, 880.0, 875.0], False, drained)[0] == Status.VALID


def test_loaded_concurrency_counts_requests_in_flight_until_the_last_one_is_sent() -> None:
    def req(start: float, end: float) -> load.RequestResult:
        return load.RequestResult(index=0, expected_prompt_tokens=8, expected_output_tokens=8, start=start, end=end)

    # two clients that keep a request in flight each, then a drain
    full = [req(0, 1), req(0, 1), req(1, 2), req(1, 2), req(2, 3), req(2, 4)]
    assert abs((load.loaded_concurrency(full) or 0) - 2.0) < 1e-9
    # a starved client: the second request of each pair starts late
    starved = [req(0, 1), req(0.5, 1), req(1, 2), req(1.5, 2), req(2, 3)]
    assert (load.loaded_concurrency(starved) or 0) < 1.6
    assert load.loaded_concurrency([req(0, 1)]) is None
    # with the cell's concurrency: the ramp (requests in flight climbing while they are sent) is left
    # out, and a single wave (no more requests than clients) has no loaded window at all
    ramp = [req(0.0, 1), req(0.1, 1), req(0.2, 1), req(0.3, 1)]
    assert (load.loaded_concurrency(ramp) or 0) < 3 and load.loaded_concurrency(ramp, 4) is None
    waves = [req(0.0, 1), req(0.1, 1), req(0.2, 1), req(1, 2), req(1, 2), req(1, 2), req(2, 3)]
    assert abs((load.loaded_concurrency(waves, 3) or 0) - 3.0) < 1e-9
    assert (load.loaded_concurrency(waves) or 0) < 3


def test_served_concurrency_is_what_the_service_held_of_the_clients_count() -> None:
    def req(start: float, end: float, served: float | None) -> load.RequestResult:
        return load.RequestResult(index=0, expected_prompt_tokens=8, expected_output_tokens=8, start=start, end=end,
                                  server_e2e_s=served)

    # a client that keeps two requests in flight; the service held each for all but its network time
    healthy = [req(0, 1, 0.98), req(0, 1, 0.98), req(1, 2, 0.98), req(1, 2, 0.98), req(2, 3, 0.98)]
    loaded = load.loaded_concurrency(healthy)
    assert loaded is not None and abs((load.served_concurrency(healthy, loaded) or 0) - 0.98 * loaded) < 1e-9
    # a starved client: same count on its side, but each request reached the service late and was read late
    starved = [req(0, 1, 0.7), req(0, 1, 0.7), req(1, 2, 0.7), req(1, 2, 0.7), req(2, 3, 0.7)]
    assert abs((load.served_concurrency(starved, loaded) or 0) - 0.7 * loaded) < 1e-9
    # a service that does not report e2e_latency on every response: no figure
    assert load.served_concurrency([*healthy[:4], req(2, 3, None)], loaded) is None
    assert load.served_concurrency(healthy, None) is None
    # recorded, not judged: the per-request cost of sending a long prompt lowers it as much (c8 with
    # 4k-token prompts: 0.87-0.93 of 8 at the same tok/s) as a starved client does
    assert verdicts_mod.repeat_load_problem({"max_concurrency": 8, "ddtree_loaded_concurrency": 7.9,
                                     "ddtree_served_concurrency": 7.0}) is None


def test_a_bless_refuses_two_slow_repeats_of_three_that_the_robust_spread_misses() -> None:
    primary = [1330.0, 870.0, 870.0]
    assert stats.RepeatPolicy().status(primary) == Status.VALID  # the judged run's rule lets it through
    refusal = verdicts_mod.bless_refusal(Status.VALID, [], primary)
    assert refusal is not None and "wider than the +-5% a bless needs" in refusal
    assert verdicts_mod.bless_refusal(Status.VALID, [], [1000.0, 1010.0, 995.0]) is None
    assert verdicts_mod.bless_refusal(Status.INCONCLUSIVE, ["engine busy 70%"], [1000.0] * 3) == "engine busy 70%"
    # a bless asks the repeat policy for the tighter interval: more repeats until then
    assert not stats.RepeatPolicy(target_rel_ci=0.12, target_half_width=0.05).is_tight(primary)


def test_launch_spread_pools_the_configs_blessed_sessions() -> None:
    rng = random.Random(3)
    sections = []
    for _ in range(12):
        section: dict[str, Any] = {}
        for s in range(3):
            launch = math.exp(rng.gauss(0, 0.03))
            for i, cell in enumerate(CELLS):
                section[cell] = baseline.baseline_cell_entry(WORKLOAD, _samples(rng, 100 * (i + 1), launch),
                                                         section.get(cell), session=f"s{s}")
        sections.append(section)
    spread = baseline.launch_spread(sections)["output_throughput"]
    assert 0.015 < spread < 0.05, spread
    assert baseline.launch_spread(sections[:2]) == {}  # too few configs to pool


def test_a_control_blessed_apart_from_the_configs_states_the_shift_but_does_not_judge_it() -> None:
    judged = _session(1.0, 0.90, control_blessed="other")
    (group,) = judged.groups
    assert not judged.failed and group.uniform_shift is not None and group.uniform_shift < -0.05
    assert "share no blessed session" in judged.text()


def test_the_control_at_the_start_and_the_end_of_a_drifting_session_is_judged_on_their_mean() -> None:
    # the machine drifted 6% over the session: the control's first launch saw it 3% faster, its last
    # 3% slower, the configs (in between) as they were
    judged = _session(1.03, 1.0, control_at_end=0.97)
    (group,) = judged.groups
    assert not judged.failed and group.kind == control.KIND_NONE
    assert group.control_change is not None and abs(group.control_change) < 0.015
    assert group.uniform_shift is not None and abs(group.uniform_shift) < 0.015
    assert "2 launches on 4 cells" in judged.text() and "over 2 launches this session" in judged.text()
    # the first launch alone would have read the configs 3% slower than the control
    alone = _session(1.03, 1.0)
    assert alone.groups[0].uniform_parts["over_control"] < -0.02


def test_the_day_spread_counts_the_blessed_days_once_not_once_per_config() -> None:
    rng = random.Random(4)
    days = [math.exp(rng.gauss(0, 0.05)) for _ in range(3)]
    sections: list[dict[str, Any]] = [{} for _ in range(12)]
    for s, day in enumerate(days):
        for section in sections:
            launch = math.exp(rng.gauss(0, 0.005))
            for i, cell in enumerate(CELLS):
                section[cell] = baseline.baseline_cell_entry(WORKLOAD, _samples(rng, 100 * (i + 1), day * launch),
                                                         section.get(cell), session=f"s{s}")
    # twelve configs, one launch-to-launch spread of ~0.5%, three blessed days 5% apart (sd)
    spread = baseline.launch_spread(sections)["output_throughput"]
    blessed = baseline.blessed_config_shifts(sections)["output_throughput"]
    assert spread >= max(0.02, baseline.day_spread(blessed) or 0.0)
    moves = [session_check.ConfigMove(str(i), "output_throughput", "higher", 0.05, 0.0, 0.0, b) for i, b in enumerate(blessed)]
    assert session_check.launch_wobble(moves) < 0.012


def test_a_cell_noisy_in_every_config_gets_its_own_noise_from_all_of_them() -> None:
    rng = random.Random(5)
    sections: list[dict[str, Any]] = [{} for _ in range(6)]
    for s in range(3):
        for section in sections:
            for i, cell in enumerate(CELLS):
                noise = 0.05 if cell == "c4" else 0.01
                values = {"output_throughput": [100.0 * math.exp(rng.gauss(0, noise)) for _ in range(3)]}
                section[cell] = baseline.baseline_cell_entry(WORKLOAD, values, section.get(cell), session=f"s{s}")
    pooled = baseline.cell_noise(sections)["output_throughput"]
    assert 0.03 < pooled["c4"] < 0.08 and 0.005 < pooled["c1"] < 0.016
    assert baseline.cell_noise(sections[:2]) == {}  # a cell blessed in fewer than 3 configs: its own estimate stands


def _launches_session(launches: int, blessed_launches: int, seed: int = 5) -> control.ControlJudgement:
    """Two configs and a control blessed over three sessions of ``blessed_launches`` control launches
    each (pooled, as the bless flow pools them), then a session measuring the control ``launches``
    times (half at its start, half at its end, as ``launches.measure_launches`` places them)."""
    rng = random.Random(seed)
    values = {baseline.CONTROL: 100.0, "bs8_b4_k4": 300.0, "bs8_b8_k4": 400.0}
    entries: dict[str, dict[str, Any]] = {name: {} for name in values}
    for s in range(3):
        for name, value in values.items():
            count = blessed_launches if name == baseline.CONTROL else 1
            for i, cell in enumerate(CELLS):
                pooled: dict[str, list[float]] = {}
                for _ in range(count):
                    for key, got in _samples(rng, value * (1 + i / 10), 1.0).items():
                        pooled.setdefault(key, []).extend(got)
                entries[name][cell] = baseline.baseline_cell_entry(
                    WORKLOAD, pooled, entries[name].get(cell), session=f"s{s}",
                    launches=count if name == baseline.CONTROL else None)
    blessed = launches_mod.blessed_launches(entries[baseline.CONTROL])
    records: list[ControlJudgedData] = []
    for n in range(1, launches + 1):
        at = control.START if n <= launches_mod.launches_at(launches, control.START) else control.END
        for rec in _launch(rng, baseline.CONTROL, 100.0, entries[baseline.CONTROL], 1.0, control.CONTROL_RECORD, n):
            records.append({**rec, "control_at": at, "blessed_launches": blessed})
    configs = [r for name in ("bs8_b4_k4", "bs8_b8_k4") for r in _launch(rng, name, values[name], entries[name], 1.0)]
    return control.judge(records + configs, configs)


def test_every_launch_of_the_control_counts_in_the_uniform_shift_today_and_in_its_baseline() -> None:
    # 8 launches today (4 at the start, 4 at the end) and 8 in each blessed session: 1/8 of one
    # launch's own shift today, 1/24 in the baseline (three sessions of 8), against 1/2 + 1/3 with
    # one launch at each end and one launch blessed a session (a baseline blessed before the count)
    (many,) = _launches_session(8, 8).groups
    (few,) = _launches_session(2, 1).groups
    assert many.uniform_parts["control_launches"] == 8 and few.uniform_parts["control_launches"] == 2
    assert math.isclose(many.uniform_parts["control_launch_share"], (1 / 4 + 1 / 4) / 4 + 3 * (1 / 8) / 9)
    assert math.isclose(few.uniform_parts["control_launch_share"], (1 + 1) / 4 + 3 / 9)
    width = {name: g.uniform_interval[1] - g.uniform_interval[0] for name, g in (("many", many), ("few", few))
             if g.uniform_interval is not None}
    assert width["many"] < 0.8 * width["few"], width
    assert "8 launches on 4 cells" in "\n".join(many.lines)


def test_a_bless_keeps_each_sessions_launch_count_and_a_bad_count_is_refused() -> None:
    rng = random.Random(2)
    entry = baseline.baseline_cell_entry(WORKLOAD, _samples(rng, 100.0, 1.0, n=12), session="s0", launches=4)
    entry = baseline.baseline_cell_entry(WORKLOAD, _samples(rng, 100.0, 1.0), entry, session="s1")  # no count
    sessions = entry["gates"]["output_throughput"]["sessions"]
    assert [s.get("launches") for s in sessions] == [4, None]
    assert launches_mod.blessed_launches({"c1": entry}) == {"s0": 4}
    baseline.validate_section({"c1": entry}, "control.yaml")
    sessions[0]["launches"] = 0
    with pytest.raises(verdicts_mod.BaselineFormatError, match=r"sessions\[0\]\.launches must be a whole number >= 1"):
        baseline.validate_section({"c1": entry}, "control.yaml")


@pytest.mark.slow
def test_a_profile_asking_for_three_control_launches_measures_and_blesses_them_all(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    """Through the plugin in one process: ``bless_control_launches: 3`` and one config measure the control
    twice at the process's start (the third would be at its end, after three configs or more), each
    a fresh launch of the reference, and the bless writes both launches' samples with their count."""
    matrix = pytester.path / "configs.yaml"
    matrix.write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4]\ncell_defaults: {output_tokens: 16}\ncells:\n"
                      "  - {name: c1_tiny, concurrency: 1, context_tokens: 32, requests: 2, warmup_requests: 1}\n")
    profile = reference_profile(pytester.path, clock_scale=5, control_launches=3, bless_control_launches=3)
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}",
        f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'my-baselines'}",
        "--ddtree-config=bs8_b8_k4", "--ddtree-update-baselines", "-p", "no:cacheprovider", timeout=180)
    assert "2 launches on 1 cell " in result.stdout.str()  # the config's own bless is not the point here
    # a bless into --ddtree-baselines DIR says to review DIR (relative to where it ran), not baselines/
    assert "review with: git diff -- my-baselines/" in result.stdout.str(), result.stdout.str()[-3000:]
    records = [json.loads(line) for path in (pytester.path / "results").glob("records-*.jsonl")
               for line in path.read_text().splitlines()]
    measured = [r for r in records if r.get("kind") == control.CONTROL_RECORD]
    assert sorted((r["control_launch"], r["control_at"]) for r in measured) == [(1, "start"), (2, "start")]
    launches = [r for r in records if r.get("kind") == "launch" and r.get("config") == REFERENCE_LABEL]
    assert len(launches) == 2  # a fresh launch each time, not the running one measured twice
    blessed = yaml.safe_load((pytester.path / "my-baselines" / "refserver" / "control.yaml").read_text())
    (session,) = blessed["metrics"]["c1_tiny"]["gates"]["output_throughput"]["sessions"]
    assert session["launches"] == 2 and len(session["samples"]) >= 6
    assert blessed["fingerprint"]["details"]["clock_scale"] == 5  # the setup it was blessed on, as a config's file


def test_a_session_interrupted_before_the_control_finished_says_so() -> None:
    judged = control.judge([], [], interrupted=True)
    assert "interrupted before the control's measurement finished" in judged.text()
    assert "no control was measured (no throughput cell ran)" in control.judge([], []).text()


@pytest.mark.slow
def test_ctrl_c_while_the_control_is_measured_says_the_session_was_interrupted_there(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    """SIGINT (Ctrl-C) once the control's first repeat is recorded: the session ends INTERRUPTED and its
    control paragraph says the control's measurement was interrupted, not 'no control was measured'."""
    import os
    import signal
    import subprocess
    import sys

    from tests.polling import wait_until
    from tests.suite_helpers import default_sigint

    matrix = pytester.path / "configs.yaml"
    matrix.write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4]\ncell_defaults: {output_tokens: 32}\ncells:\n"
                      "  - {name: c1_tiny, concurrency: 1, context_tokens: 32, requests: 4, warmup_requests: 1}\n")
    profile = reference_profile(pytester.path, clock_scale=1)  # a real-time clock: the control's repeats take seconds
    results = pytester.path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={profile}",
         f"--ddtree-matrix={matrix}", f"--ddtree-results={results}", f"--ddtree-baselines={pytester.path / 'baselines'}",
         "--ddtree-config=bs8_b8_k4", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def control_repeats() -> list[dict[str, Any]]:
        lines = [line for path in results.glob("records-*.jsonl") for line in path.read_text().splitlines()]
        return [r for line in lines if line.endswith("}") and (r := json.loads(line)).get("kind") == control.CONTROL_REPEAT]

    try:
        wait_until(lambda: control_repeats() or proc.poll() is not None, 120, "the control's first repeat")
        assert proc.poll() is None, "the session ended before the control was measured"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert not any(r.get("kind") == control.CONTROL_RECORD for path in results.glob("records-*.jsonl")
                   for line in path.read_text().splitlines() if line.endswith("}") for r in [json.loads(line)])
    assert "INTERRUPTED" in out and "interrupted before the control's measurement finished" in out, out[-3000:]
    assert "no control was measured" not in out, out[-3000:]
