"""Baseline comparison: regression needs tolerance AND statistics; invalid is never a verdict."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.gates.throughput import baseline as baseline_mod, rule, verdicts as verdicts_mod
from pytest_ddtree.baselines import BaselineError, BaselineStore
from pytest_ddtree.records.recorder import BaselineUpdate
from pytest_ddtree.records.words import Status

WORKLOAD = {"concurrency": 8, "context_tokens": 128, "output_tokens": 64, "requests": 16}
BASE = {"output_throughput": [1000.0, 1004.0, 996.0], "ddtree_tokens_per_verify": [4.0, 4.0, 4.0],
        "median_ttft_ms": [20.0, 21.0, 19.5]}


def _entry(base: dict[str, list[float]] | None = None) -> dict[str, Any]:
    return baseline_mod.baseline_cell_entry(WORKLOAD, base or BASE)


def _three_sessions(values: dict[str, list[float]]) -> dict[str, Any]:
    """An entry blessed in three sessions through the bless flow's own function."""
    entry = None
    for i in range(3):
        entry = baseline_mod.baseline_cell_entry(WORKLOAD, values, entry, session=f"s{i}")
    assert entry is not None
    return entry


def test_entry_shape_is_reviewable_and_keeps_the_last_three_sessions() -> None:
    e = _entry()
    assert e["workload"] == WORKLOAD
    g = e["gates"]["output_throughput"]
    assert g == {"direction": "higher", "median": 1000.0, "tolerance": 0.05, "unit": "tok/s",
                 "sessions": [{"session": "session", "samples": [1000.0, 1004.0, 996.0]}]}
    assert e["gates"]["median_ttft_ms"]["direction"] == "lower" and "min_change" not in e["gates"]["median_ttft_ms"]
    # a hand-edited tolerance survives an update; bless appends a session and drops the oldest
    e["gates"]["output_throughput"]["tolerance"] = 0.2
    for i in range(4):
        e = baseline_mod.baseline_cell_entry(WORKLOAD, {"output_throughput": [float(i)] * 3}, existing=e, session=f"s{i}")
    g = e["gates"]["output_throughput"]
    assert g["tolerance"] == 0.2 and [s["session"] for s in g["sessions"]] == ["s1", "s2", "s3"]
    # the same session blessed twice replaces itself; a changed workload starts over
    again = baseline_mod.baseline_cell_entry(WORKLOAD, {"output_throughput": [9.0] * 3}, existing=e, session="s3")
    assert [s["session"] for s in again["gates"]["output_throughput"]["sessions"]] == ["s1", "s2", "s3"]
    moved = baseline_mod.baseline_cell_entry(dict(WORKLOAD, requests=32), {"output_throughput": [9.0] * 3}, existing=e, session="s4")
    assert [s["session"] for s in moved["gates"]["output_throughput"]["sessions"]] == ["s4"]
    assert moved["gates"]["output_throughput"]["tolerance"] == 0.2
    assert "ddtree_tokens_per_verify" not in baseline_mod.baseline_cell_entry(WORKLOAD, {"output_throughput": [1.0]})["gates"]


def test_old_single_session_entries_are_read_and_migrated_by_bless() -> None:
    old = {"workload": WORKLOAD, "gates": {"output_throughput": {
        "direction": "higher", "median": 1000.0, "samples": [1000.0, 1004.0, 996.0], "tolerance": 0.05,
        "unit": "tok/s"}, "median_ttft_ms": {"direction": "lower", "median": 20.0, "min_change": 10.0,
                                               "samples": [20.0, 21.0, 19.5], "tolerance": 0.25, "unit": "ms"}}}
    baseline_mod.validate_section({"c8_short": old}, "x")
    assert rule.judge_cell_alone("c8_short", old, {"output_throughput": [1001.0] * 3,
                                               "median_ttft_ms": [20.0] * 3}).status == Status.PASS
    migrated = baseline_mod.baseline_cell_entry(WORKLOAD, BASE, existing=old, session="new")
    assert [s["session"] for s in migrated["gates"]["output_throughput"]["sessions"]] == ["legacy", "new"]
    assert "samples" not in migrated["gates"]["output_throughput"]


def test_unchanged_engine_passes() -> None:
    now = {"output_throughput": [1002.0, 998.0, 1001.0], "ddtree_tokens_per_verify": [4.0, 4.0, 4.0],
           "median_ttft_ms": [20.5, 19.8, 20.1]}
    v = rule.judge_cell_alone("c8_short", _three_sessions(BASE), now, workload=WORKLOAD)
    assert v.status == Status.PASS and not v.failed


def test_prompts_other_than_the_blessed_ones_are_not_compared_and_a_baseline_without_a_digest_still_is() -> None:
    now = {"output_throughput": [1000.0] * 3, "ddtree_tokens_per_verify": [3.8] * 3, "median_ttft_ms": [20.0] * 3}
    blessed = {**WORKLOAD, "prompts_digest": "aaaaaaaaaaaa"}
    entry = None
    for i in range(3):
        entry = baseline_mod.baseline_cell_entry(blessed, BASE, entry, session=f"s{i}")
    other = rule.judge_cell_alone("c8_4k", entry, now, workload={**WORKLOAD, "prompts_digest": "bbbbbbbbbbbb"})
    assert other.status == Status.MISSING
    assert ("prompts_digest aaaaaaaaaaaa -> bbbbbbbbbbbb) (the prompts sent differ from the blessed ones: the prompt text "
            "or the service's tokenizer changed" in other.message())
    assert rule.judge_cell_alone("c8_4k", entry, now, workload={**WORKLOAD, "prompts_digest": "aaaaaaaaaaaa"}).status != Status.MISSING
    # blessed before digests were recorded: judged on its numbers (a 5% acceptance drop is a flag)
    older = rule.judge_cell_alone("c8_4k", _three_sessions(BASE), now, workload={**WORKLOAD, "prompts_digest": "bbbbbbbbbbbb"})
    assert older.status == Status.FLAGGED


def test_ten_percent_slowdown_is_flagged_then_fails_only_when_the_confirmation_agrees() -> None:
    base = _three_sessions(BASE)
    now = {"output_throughput": [905.0, 910.0, 900.0], "ddtree_tokens_per_verify": [4.0, 4.0, 4.0],
           "median_ttft_ms": [20.0, 20.0, 20.0]}
    first = rule.judge_cell_alone("c8_short", base, now, workload=WORKLOAD)
    assert first.status == Status.FLAGGED and first.flagged and not first.failed
    confirmed = rule.judge_cell_alone("c8_short", base, now, confirmation={"output_throughput": [903.0, 907.0, 901.0] * 2})
    assert confirmed.status == Status.REGRESSION and confirmed.failed
    msg = confirmed.message("bs8_b8_k4")
    assert "bs8_b8_k4 c8_short: REGRESSION" in msg
    assert "output_throughput: 1000 -> 905 tok/s, -9.5% (95% t-interval on log values" in msg
    assert "reproduced by the confirmation (6 fresh repeats)" in msg and "tolerance 6.2% = max(floor 6.2%" in msg
    m = confirmed.metric("output_throughput")
    assert m is not None and m.change == pytest.approx(-0.095, abs=1e-3) and m.first_change is not None
    passed = rule.judge_cell_alone("c8_short", base, now, confirmation={"output_throughput": [1001.0, 999.0, 1000.0]})
    assert passed.status == Status.PASS
    assert "not reproduced by the confirmation" in passed.metrics[0].message or any(
        "not reproduced" in x.message for x in passed.metrics)
    # a flag that could not be confirmed (the service died) is not a pass
    lost = rule.judge_cell_alone("c8_short", base, now, confirmation={})
    assert lost.status == Status.REGRESSION and "no confirmation run was possible" in lost.message()


def test_a_day_shift_common_to_the_config_is_not_a_regression_but_one_cell_beyond_it_is() -> None:
    cells = {f"c{i}": (100.0 + 50 * i) for i in range(6)}
    baseline = {c: _three_sessions({"output_throughput": [v * f for f in (0.99, 1.0, 1.01)]}) for c, v in cells.items()}
    slower_day = {c: verdicts_mod.CellInput(baseline[c], {"output_throughput": [v * 0.95 * f for f in (0.99, 1.0, 1.01)]})
                  for c, v in cells.items()}
    assert {v.status for v in rule.judge_config(slower_day).values()} == {Status.PASS}
    one_cell = dict(slower_day, c3=verdicts_mod.CellInput(baseline["c3"], {"output_throughput": [cells["c3"] * 0.85] * 3}))
    verdicts = rule.judge_config(one_cell)
    assert verdicts["c3"].status == Status.FLAGGED and "relative to the config's common change -5.0%" in verdicts["c3"].message()
    assert {verdicts[c].status for c in cells if c != "c3"} == {Status.PASS}
    # the whole config 20% slower is a config-wide move, beyond the day-to-day allowance
    whole = {c: verdicts_mod.CellInput(baseline[c], {"output_throughput": [v * 0.8] * 3}) for c, v in cells.items()}
    verdicts = rule.judge_config(whole)
    assert {v.status for v in verdicts.values()} == {Status.FLAGGED}
    assert "the whole config moved -20.0%" in verdicts["c0"].message()
    confirmed = rule.judge_config(whole, {c: {"output_throughput": [v * 0.8] * 6} for c, v in cells.items()})
    assert {v.status for v in confirmed.values()} == {Status.REGRESSION}


def test_ttft_has_no_absolute_floor_a_3x_slowdown_of_4_ms_fails() -> None:
    base = _three_sessions({"median_ttft_ms": [4.0, 4.1, 3.9]})
    now = {"median_ttft_ms": [12.0, 12.2, 11.9]}
    assert rule.judge_cell_alone("c", base, now).status == Status.FLAGGED
    assert rule.judge_cell_alone("c", base, now, confirmation={"median_ttft_ms": [12.0] * 6}).status == Status.REGRESSION
    # +15% of a noisy TTFT may be screened, but stays inside its 25% floor
    small = {"median_ttft_ms": [4.6, 4.5, 4.7]}
    assert rule.judge_cell_alone("c", base, small, confirmation=small).status == Status.PASS


def test_improvement_is_reported() -> None:
    now = {"output_throughput": [1200.0, 1210.0, 1190.0]}
    v = rule.judge_cell_alone("c8_short", _three_sessions({"output_throughput": BASE["output_throughput"]}), now)
    assert v.status == Status.IMPROVED and "--ddtree-update-baselines" in v.message()


def test_invalid_measurement_is_never_compared() -> None:
    v = rule.judge_cell_alone("c8_short", _entry(), {"output_throughput": [1.0, 1.0, 1.0]},
                              status=Status.INVALID, problems=["request 3 failed: HTTP 500: injected"])
    assert v.status == Status.INVALID and v.failed and not v.metrics
    assert "INVALID measurement (not a regression, not a pass)" in v.message("cfg")
    assert "HTTP 500" in v.message()


def test_unstable_cell_never_passes() -> None:
    now = {"output_throughput": [1002.0, 998.0, 1001.0]}
    only = _entry({"output_throughput": BASE["output_throughput"]})
    assert rule.judge_cell_alone("c", only, now, status=Status.INCONCLUSIVE).status == Status.INCONCLUSIVE
    # far better, but untrusted: reported as inconclusive, and nothing tells the reader to bless it
    better = rule.judge_cell_alone("c", _three_sessions({"output_throughput": BASE["output_throughput"]}),
                                   {"output_throughput": [1500.0, 1400.0, 1600.0]}, status=Status.INCONCLUSIVE,
                                   problems=["repeats disagree"])
    assert better.status == Status.INCONCLUSIVE and {m.status for m in better.metrics} == {Status.INCONCLUSIVE}
    assert "bless it" not in better.message() and "not to be blessed: the measurement is inconclusive" in better.message()


def test_missing_and_changed_workload() -> None:
    assert rule.judge_cell_alone("c", None, {"output_throughput": [1.0]}).status == Status.MISSING
    changed = dict(WORKLOAD, requests=32)
    v = rule.judge_cell_alone("c", _entry(), {"output_throughput": [1000.0] * 3}, workload=changed)
    assert v.status == Status.MISSING and "requests 16 -> 32" in v.reasons[0]


def test_a_gated_metric_missing_from_the_run_fails_naming_it() -> None:
    now = {"output_throughput": [1001.0] * 3, "median_ttft_ms": [20.0] * 3}  # speculation silently stopped
    v = rule.judge_cell_alone("c8_short", _three_sessions(BASE), now)
    assert v.status == Status.METRIC_MISSING and v.failed
    assert "ddtree_tokens_per_verify: gated in the baseline but not produced by this run" in v.message()


def test_a_metric_the_baseline_lacks_is_reported_as_new() -> None:
    base = _three_sessions({"output_throughput": BASE["output_throughput"]})
    v = rule.judge_cell_alone("c8_short", base, {"output_throughput": [1001.0] * 3, "ddtree_tokens_per_verify": [4.0] * 3})
    assert v.status == Status.PASS
    new = v.metric("ddtree_tokens_per_verify")
    assert new is not None and new.status == Status.NEW and "new (measured 4 tok/step, not in the baseline)" in new.message


def test_a_one_sample_baseline_is_too_thin_to_trust() -> None:
    thin = _entry({"output_throughput": [1000.0]})
    v = rule.judge_cell_alone("c", thin, {"output_throughput": [500.0] * 3})  # even a halving
    assert v.status == Status.THIN and not v.failed
    assert "holds 1 sample(s), the gate needs at least 3" in v.message()


@pytest.mark.parametrize("bad, fragment", [
    ([1, 2], "'metrics' must be a mapping"),
    ({"c1": {"gates": {"output_throughput": {"direction": "up", "median": 1, "tolerance": 0.1}}}}, "direction"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": "x", "tolerance": 0.1}}}}, "median must be a number"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": 1, "tolerance": -1}}}}, "tolerance must be >= 0"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": 1, "tolerance": 0.1, "samples": "1"}}}}, "samples"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": 1, "tolerance": 0.1,
                                             "sessions": [{"samples": [0]}]}}}}, "sessions must be a list"),
    ({"c1": 3}, "metrics.c1 must be a mapping"),
])
def test_malformed_section_errors_clearly(bad: Any, fragment: str) -> None:
    with pytest.raises(verdicts_mod.BaselineFormatError, match=fragment):
        baseline_mod.validate_section(bad, "baselines/x/bs8_b8_k4.yaml")


def test_corrupt_yaml_file_errors_with_the_fix(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "refserver")
    store.path_for("bs8_b8_k4").parent.mkdir(parents=True)
    store.path_for("bs8_b8_k4").write_text("metrics: {c1: [unclosed\n")
    with pytest.raises(BaselineError, match=r"corrupt baseline .*bs8_b8_k4.yaml.*--ddtree-update-baselines"):
        store.load("bs8_b8_k4")


def _writer(root: str, index: int, rounds: int) -> None:
    store = BaselineStore(Path(root), "refserver", update_mode=True)
    for r in range(rounds):
        entry = baseline_mod.baseline_cell_entry(WORKLOAD, {"output_throughput": [float(index * 100 + r + 1)] * 3})
        store.apply_updates([BaselineUpdate("bs8_b8_k4", "metrics", {f"cell{index}": entry}, "refserver")])


def test_concurrent_writers_never_corrupt_a_baseline(tmp_path: Path) -> None:
    """Several processes merging cells into one file: every read parses, no cell is lost."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), i, 15)) for i in range(4)]
    for p in procs:
        p.start()
    store = BaselineStore(tmp_path, "refserver")
    reads = 0
    while any(p.is_alive() for p in procs):
        if store.path_for("bs8_b8_k4").exists():
            data = store.load("bs8_b8_k4")  # never a half-written file
            assert data is not None and isinstance(data.get("metrics"), dict)
            baseline_mod.validate_section(data["metrics"], "x")
            reads += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    final = yaml.safe_load(store.path_for("bs8_b8_k4").read_text())
    assert sorted(final["metrics"]) == ["cell0", "cell1", "cell2", "cell3"]
    assert final["metrics"]["cell3"]["gates"]["output_throughput"]["median"] == 315.0
    assert not list(store.directory.glob(".*.tmp"))


def test_one_repeat_that_measured_the_machine_is_named_with_its_reason() -> None:
    clean = {"clock_overruns": 0, "ddtree_engine_busy_fraction": 0.97, "max_concurrency": 8,
             "ddtree_loaded_concurrency": 7.9, "concurrency": 7.1}
    assert verdicts_mod.repeat_load_problem(clean) is None
    assert verdicts_mod.repeat_load_problem({**clean, "clock_overruns": 1}) is None  # one late pass is not a stall
    assert "fell behind its own clock 6 times" in (verdicts_mod.repeat_load_problem({**clean, "clock_overruns": 6}) or "")
    assert "busy only 62%" in (verdicts_mod.repeat_load_problem({**clean, "ddtree_engine_busy_fraction": 0.62}) or "")
    # passes that ran a little late, no overrun, busy above its floor: the clock share says it
    late = {**clean, "clock_overruns": 1, "ddtree_engine_busy_fraction": 0.86, "ddtree_engine_clock_share": 0.87}
    assert "kept only 87% of its simulated clock while it had work" in (verdicts_mod.repeat_load_problem(late) or "")
    assert verdicts_mod.repeat_load_problem({**clean, "ddtree_engine_clock_share": 0.996}) is None
    assert "only 6.0 of 8 requests in flight" in (verdicts_mod.repeat_load_problem({**clean, "ddtree_loaded_concurrency": 6.0}) or "")
    # a service that reports none of it (an external SGLang): bench_serving's concurrency alone
    assert verdicts_mod.repeat_load_problem({"max_concurrency": 8, "concurrency": 7.5}) is None
    assert verdicts_mod.repeat_load_problem({"max_concurrency": 8, "concurrency": 5.0}) is not None
    assert verdicts_mod.repeat_load_problem({}) is None


def test_measurement_status_flags_an_overloaded_host() -> None:
    from pytest_ddtree.measure import stats

    policy = stats.RepeatPolicy()
    ok = [{"ddtree_engine_busy_fraction": 0.97}] * 3
    assert verdicts_mod.measurement_status(policy, [100.0, 100.5, 99.9], False, ok) == (Status.VALID, [])
    status, why = verdicts_mod.measurement_status(policy, [100.0, 100.5, 99.9], False, [{"ddtree_engine_busy_fraction": 0.6}] * 3)
    assert status == Status.INCONCLUSIVE and "busy only 60%" in why[0]
    assert verdicts_mod.measurement_status(policy, [100.0], True, ok, ["boom"]) == (Status.INVALID, ["boom"])
    status, why = verdicts_mod.measurement_status(policy, [100.0, 160.0, 60.0], False, ok)
    assert status == Status.INCONCLUSIVE and "repeats disagree" in why[0] and "rerun on a quieter machine" in why[0]
    # any service that reports clock overruns, not only the reference engine
    status, why = verdicts_mod.measurement_status(policy, [100.0, 100.5, 99.9], False, [{"clock_overruns": 7}] * 3)
    assert status == Status.INCONCLUSIVE and "fell behind its own clock" in why[0]
    assert verdicts_mod.measurement_status(policy, [100.0, 100.5, 99.9], False, [{"clock_overruns": 0}] * 3)[0] == Status.VALID
    # one wild repeat of three does not make a cell inconclusive (robust spread)
    assert verdicts_mod.measurement_status(policy, [100.0, 100.5, 80.0], False, ok)[0] == Status.VALID
    # too few clean repeats (the others were spoiled and retaken): inconclusive, with each one's evidence
    spoiled = ["repeat 1, output tok/s 61.0: the service fell behind its own clock 6 times",
               "repeat 2, output tok/s 58.0: the engine was busy only 62% of the measured time (below 85%)"]
    status, why = verdicts_mod.measurement_status(policy, [100.0, 100.5], False, ok[:2], spoiled=spoiled)
    assert status == Status.INCONCLUSIVE and "only 2 clean repeat(s) of the 3 needed" in why[0]
    assert spoiled[0] in why[0] and spoiled[1] in why[0] and "rerun on a quieter machine" in why[0]
    assert verdicts_mod.measurement_status(policy, [100.0, 100.5, 99.9], False, ok, spoiled=spoiled) == (Status.VALID, [])
    # an overloaded measurement is never a regression, even when it is far off
    v = rule.judge_cell_alone("c", _entry({"output_throughput": [1000.0] * 3}), {"output_throughput": [500.0] * 3},
                              status=Status.INCONCLUSIVE, problems=why)
    assert v.status == Status.INCONCLUSIVE and not v.failed


def test_a_baseline_written_before_the_rename_is_read_under_the_current_key() -> None:
    """Baselines blessed when the gated acceptance was called ``accept_length`` stay readable: the
    gate reads that entry as ``ddtree_tokens_per_verify`` (the same number), and a file with both
    names is an error saying which to delete."""
    entry = _three_sessions(BASE)
    old = {"c8_short": {**entry, "gates": {("accept_length" if k == "ddtree_tokens_per_verify" else k): v
                                           for k, v in entry["gates"].items()}}}
    section = baseline_mod.validate_section(old, "bs8_b8_k4.yaml")
    assert set(section["c8_short"]["gates"]) == {"output_throughput", "ddtree_tokens_per_verify", "median_ttft_ms"}
    assert rule.judge_cell_alone("c8_short", section["c8_short"], BASE).status == Status.PASS
    both = {"c8_short": {**entry, "gates": {**entry["gates"], "accept_length": entry["gates"]["ddtree_tokens_per_verify"]}}}
    with pytest.raises(verdicts_mod.BaselineFormatError, match="has both 'accept_length' .* delete the 'accept_length' entry"):
        baseline_mod.validate_section(both, "bs8_b8_k4.yaml")


def test_a_confirmation_that_clears_its_cell_early_stops_and_one_that_does_not_takes_all_its_repeats() -> None:
    """measurement.confirm_in_stages: a cell flagged by an unlucky first pass whose first stage sits at
    its baseline stops after CONFIRM_FIRST_STAGE repeats and passes; a cell really 15% slower takes
    all CONFIRM_REPEATS and is a regression; the recorded repeat numbers run on across the stages."""
    from pytest_ddtree.gates.throughput import measurement

    cells = {f"c{i}": 100.0 + 50 * i for i in range(6)}
    baseline = {c: _three_sessions({"output_throughput": [v * f for f in (0.99, 1.0, 1.01)]}) for c, v in cells.items()}
    first = {c: verdicts_mod.CellInput(baseline[c], {"output_throughput": [v * f for f in (0.99, 1.0, 1.01)]}) for c, v in cells.items()}
    first["c1"] = verdicts_mod.CellInput(baseline["c1"], {"output_throughput": [cells["c1"] * 0.85] * 3})  # unlucky: flagged
    first["c3"] = verdicts_mod.CellInput(baseline["c3"], {"output_throughput": [cells["c3"] * 0.85] * 3})  # really slower
    flagged = [name for name, v in rule.judge_config(first).items() if v.flagged]
    assert flagged == ["c1", "c3"]
    truth = {"c1": 1.0, "c3": 0.85}
    recorded: list[tuple[str, int]] = []

    def measure(name: str, r: int) -> float:
        return cells[name] * truth[name] * (0.99, 1.0, 1.01)[len([1 for n, _ in recorded if n == name]) % 3]

    def judge(runs: Any) -> dict[str, verdicts_mod.CellVerdict]:
        return rule.judge_config(first, {n: {"output_throughput": list(run.primary)} for n, run in runs.items()})

    runs, verdicts = measurement.confirm_in_stages(flagged, measure, lambda v: v, judge,
                                                  lambda name, r, v: recorded.append((name, r)))
    assert len(runs["c1"].primary) == measurement.CONFIRM_FIRST_STAGE < len(runs["c3"].primary) == measurement.CONFIRM_REPEATS
    assert verdicts["c1"].status == Status.PASS and verdicts["c3"].status == Status.REGRESSION
    assert [r for n, r in recorded if n == "c3"] == list(range(measurement.CONFIRM_REPEATS))
    assert measurement.cleared_early(verdicts["c1"]) and not measurement.cleared_early(verdicts["c3"])


RATE_WORKLOAD = {**WORKLOAD, "request_rate": 12.5, "arrival": "constant", "max_concurrency": None}
SLO_RECORD = {"label": "p90 tpot<=6ms", "goodput_slos_ms": {"tpot": 6.0}, "percentile": 90.0}


def test_a_blessed_rate_is_written_beside_the_metrics_and_a_file_without_it_loads_unchanged(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "refserver", update_mode=True)
    store.apply_updates([BaselineUpdate("bs8_b8_k4", "metrics", {"c1": _entry()}, "refserver")])
    old = store.load("bs8_b8_k4")
    assert old is not None and baseline_mod.validate_rate_section(old.get(baseline_mod.RATE_SECTION), "x") == {}  # written before it
    cell = baseline_mod.baseline_cell_entry(RATE_WORKLOAD, {"request_goodput": [11.9, 12.1, 12.0]},
                                    specs=[verdicts_mod.SPECS["request_goodput"]])
    rate = baseline_mod.rate_entry(12.5, SLO_RECORD, cell)
    store.apply_updates([BaselineUpdate("bs8_b8_k4", baseline_mod.RATE_SECTION, {"r8": rate}, "refserver")])
    data = store.load("bs8_b8_k4")
    assert data is not None and data["metrics"] == old["metrics"]  # the rate joins the file, the cells stay
    (entry,) = baseline_mod.validate_rate_section(data[baseline_mod.RATE_SECTION], "x").values()
    assert entry["rate"] == 12.5 and entry["slo"] == SLO_RECORD
    assert entry["cell"]["gates"]["request_goodput"]["median"] == 12.0 and list(entry["cell"]["gates"]) == ["request_goodput"]


@pytest.mark.parametrize("bad, fragment", [
    ([1], "'sustainable_rate' must be a mapping"),
    ({"r8": {"rate": 0, "slo": SLO_RECORD, "cell": {}}}, r"sustainable_rate.r8.rate must be a positive number"),
    ({"r8": {"rate": 2, "slo": {"label": "x"}, "cell": {}}}, r"sustainable_rate.r8.slo must be a mapping"),
    ({"r8": {"rate": 2, "slo": SLO_RECORD}}, r"sustainable_rate.r8.cell must be a mapping"),
    ({"r8": {"rate": 2, "slo": SLO_RECORD, "cell": {"gates": {"request_goodput": {"direction": "up"}}}}}, "direction"),
])
def test_a_malformed_blessed_rate_errors_clearly(bad: Any, fragment: str) -> None:
    with pytest.raises(verdicts_mod.BaselineFormatError, match=fragment):
        baseline_mod.validate_rate_section(bad, "baselines/x/bs8_b8_k4.yaml")


def test_a_blessed_rate_is_judged_only_under_its_own_slo() -> None:
    from pytest_ddtree.gates.throughput.rate_gate import same_slo
    from pytest_ddtree.measure.slo import parse_slo

    assert same_slo(SLO_RECORD, parse_slo("tpot_ms=6,percentile=90"))
    assert not same_slo(SLO_RECORD, parse_slo("tpot_ms=6"))  # p99
    assert not same_slo(SLO_RECORD, parse_slo("tpot_ms=6,ttft_ms=500,percentile=90"))
    assert not same_slo({"label": "?"}, parse_slo("tpot_ms=6,percentile=90"))


def test_baselines_are_written_byte_for_byte_as_the_pure_python_emitter_writes_them() -> None:
    """The bless writes with libyaml's emitter where PyYAML has it: a committed baseline re-blessed
    unchanged must keep its bytes, whichever emitter the machine has (a review diff of re-wrapped
    lines would hide the real change)."""
    from pytest_ddtree.baselines import dump_yaml

    class PurePython(yaml.SafeDumper):
        pass

    PurePython.add_multi_representer(Status, lambda dumper, word: dumper.represent_str(str(word)))
    files = sorted(Path(__file__).resolve().parent.parent.joinpath("baselines").rglob("*.yaml"))
    assert len(files) >= 10
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data["status_word"] = Status.PASS  # a vocabulary word reaches the dumper as the plain string
        expected = yaml.dump(data, Dumper=PurePython, sort_keys=True, default_flow_style=False, allow_unicode=True, width=100)
        assert dump_yaml(data) == expected, path
