"""Baseline comparison: regression needs tolerance AND statistics; invalid is never a verdict."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree import gate
from pytest_ddtree.baselines import BaselineError, BaselineStore
from pytest_ddtree.results import BaselineUpdate

WORKLOAD = {"concurrency": 8, "context_tokens": 128, "output_tokens": 64, "requests": 16}
BASE = {"output_throughput": [1000.0, 1004.0, 996.0], "accept_length": [4.0, 4.0, 4.0],
        "median_ttft_ms": [20.0, 21.0, 19.5]}


def _entry() -> dict[str, Any]:
    return gate.baseline_cell_entry(WORKLOAD, BASE)


def test_entry_shape_is_reviewable() -> None:
    e = _entry()
    assert e["workload"] == WORKLOAD
    g = e["gates"]["output_throughput"]
    assert g == {"direction": "higher", "median": 1000.0, "samples": [1000.0, 1004.0, 996.0],
                 "tolerance": 0.05, "unit": "tok/s"}
    assert e["gates"]["median_ttft_ms"]["direction"] == "lower"
    # a hand-edited tolerance survives an update
    e["gates"]["output_throughput"]["tolerance"] = 0.2
    again = gate.baseline_cell_entry(WORKLOAD, BASE, existing=e)
    assert again["gates"]["output_throughput"]["tolerance"] == 0.2
    assert "accept_length" not in gate.baseline_cell_entry(WORKLOAD, {"output_throughput": [1.0]})["gates"]


def test_unchanged_engine_passes() -> None:
    now = {"output_throughput": [1002.0, 998.0, 1001.0], "accept_length": [4.0, 4.0, 4.0],
           "median_ttft_ms": [20.5, 19.8, 20.1]}
    v = gate.compare_cell("c8_short", _entry(), now, workload=WORKLOAD)
    assert v.status == gate.PASS and not v.failed


def test_ten_percent_slowdown_fails_with_how_much_and_how_sure() -> None:
    now = {"output_throughput": [905.0, 910.0, 900.0], "accept_length": [4.0, 4.0, 4.0],
           "median_ttft_ms": [20.0, 20.0, 20.0]}
    v = gate.compare_cell("c8_short", _entry(), now, workload=WORKLOAD)
    assert v.status == gate.REGRESSION and v.failed
    msg = v.message("bs8_b8_k4")
    assert "bs8_b8_k4 c8_short: REGRESSION" in msg
    assert "output_throughput: 1000 -> 905 tok/s, -9.5%" in msg
    assert "95% CI" in msg and "Mann-Whitney p=0.05" in msg and "5% tolerance" in msg
    m = v.metric("output_throughput")
    assert m is not None and m.change == pytest.approx(-0.095)


def test_beyond_tolerance_without_support_is_inconclusive_not_pass() -> None:
    now = {"output_throughput": [1010.0, 900.0, 905.0]}
    v = gate.compare_cell("c8_short", _entry(), now)
    assert v.status == gate.INCONCLUSIVE and not v.failed
    assert "not statistically supported" in v.message()


def test_significant_but_within_tolerance_passes() -> None:
    now = {"output_throughput": [980.0, 981.0, 979.0]}  # -2%: real, but inside 5%
    assert gate.compare_cell("c8_short", _entry(), now).status == gate.PASS


def test_absolute_floor_keeps_ms_noise_out() -> None:
    now = {"median_ttft_ms": [28.0, 29.0, 28.5]}  # +40%, but 8.5 ms < the 10 ms floor
    assert gate.compare_cell("c8_short", _entry(), now).status == gate.PASS
    assert _entry()["gates"]["median_ttft_ms"]["min_change"] == 10.0


def test_lower_is_better_metric_regresses_upwards() -> None:
    now = {"median_ttft_ms": [40.0, 41.0, 39.0]}
    v = gate.compare_cell("c8_short", _entry(), now)
    assert v.status == gate.REGRESSION
    assert "median_ttft_ms" in v.message()


def test_improvement_is_reported() -> None:
    now = {"output_throughput": [1200.0, 1210.0, 1190.0]}
    v = gate.compare_cell("c8_short", _entry(), now)
    assert v.status == gate.IMPROVED and "--ddtree-update-baselines" in v.message()


def test_invalid_measurement_is_never_compared() -> None:
    v = gate.compare_cell("c8_short", _entry(), {"output_throughput": [1.0, 1.0, 1.0]},
                          status="invalid", problems=["request 3 failed: HTTP 500: injected"])
    assert v.status == gate.INVALID and v.failed and not v.metrics
    assert "INVALID measurement (not a regression, not a pass)" in v.message("cfg")
    assert "HTTP 500" in v.message()


def test_unstable_cell_never_passes() -> None:
    now = {"output_throughput": [1002.0, 998.0, 1001.0]}
    assert gate.compare_cell("c", _entry(), now, status="inconclusive").status == gate.INCONCLUSIVE


def test_missing_and_changed_workload() -> None:
    assert gate.compare_cell("c", None, {"output_throughput": [1.0]}).status == gate.MISSING
    changed = dict(WORKLOAD, requests=32)
    v = gate.compare_cell("c", _entry(), {"output_throughput": [1000.0] * 3}, workload=changed)
    assert v.status == gate.MISSING and "requests 16 -> 32" in v.reasons[0]


@pytest.mark.parametrize("bad, fragment", [
    ([1, 2], "'metrics' must be a mapping"),
    ({"c1": {"gates": {"output_throughput": {"direction": "up", "median": 1, "tolerance": 0.1}}}}, "direction"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": "x", "tolerance": 0.1}}}}, "median must be a number"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": 1, "tolerance": -1}}}}, "tolerance must be >= 0"),
    ({"c1": {"gates": {"output_throughput": {"direction": "higher", "median": 1, "tolerance": 0.1, "samples": "1"}}}}, "samples"),
    ({"c1": 3}, "metrics.c1 must be a mapping"),
])
def test_malformed_section_errors_clearly(bad: Any, fragment: str) -> None:
    with pytest.raises(gate.BaselineFormatError, match=fragment):
        gate.validate_section(bad, "baselines/x/bs8_b8_k4.yaml")


def test_corrupt_yaml_file_errors_with_the_fix(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path, "refserver")
    store.path_for("bs8_b8_k4").parent.mkdir(parents=True)
    store.path_for("bs8_b8_k4").write_text("metrics: {c1: [unclosed\n")
    with pytest.raises(BaselineError, match=r"corrupt baseline .*bs8_b8_k4.yaml.*--ddtree-update-baselines"):
        store.load("bs8_b8_k4")


def _writer(root: str, index: int, rounds: int) -> None:
    store = BaselineStore(Path(root), "refserver", update_mode=True)
    for r in range(rounds):
        entry = gate.baseline_cell_entry(WORKLOAD, {"output_throughput": [float(index * 100 + r)] * 3})
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
            gate.validate_section(data["metrics"], "x")
            reads += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    final = yaml.safe_load(store.path_for("bs8_b8_k4").read_text())
    assert sorted(final["metrics"]) == ["cell0", "cell1", "cell2", "cell3"]
    assert final["metrics"]["cell3"]["gates"]["output_throughput"]["median"] == 314.0
    assert not list(store.directory.glob(".*.tmp"))


def test_measurement_status_flags_an_overloaded_host() -> None:
    from pytest_ddtree import stats

    policy = stats.RepeatPolicy()
    ok = [{"engine_busy_fraction": 0.97}] * 3
    assert gate.measurement_status(policy, [100.0, 100.5, 99.9], False, ok) == ("valid", [])
    status, why = gate.measurement_status(policy, [100.0, 100.5, 99.9], False, [{"engine_busy_fraction": 0.6}] * 3)
    assert status == "inconclusive" and "busy only 60%" in why[0]
    assert gate.measurement_status(policy, [100.0], True, ok, ["boom"]) == ("invalid", ["boom"])
    status, why = gate.measurement_status(policy, [100.0, 160.0, 60.0], False, ok)
    assert status == "inconclusive" and "repeats disagree" in why[0]
    # an overloaded measurement is never a regression, even when it is far off
    v = gate.compare_cell("c", _entry(), {"output_throughput": [500.0] * 3}, status="inconclusive", problems=why)
    assert v.status == gate.INCONCLUSIVE and not v.failed
