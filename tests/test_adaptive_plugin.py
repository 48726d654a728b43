"""The adaptive sweep in the plugin (--ddtree-max-restarts, --ddtree-prior).

Every bad use is refused before any service starts, with exit 4 and a message saying what to do:
the sweep is serial (it needs each config's results before it picks the next), so ``-n`` is
refused; the restart limit must be a positive count; a prior folder must exist and hold results.
Then a real session on the reference engine: restarts as the service manager counted them,
predicted rows apart from the measured ones, and none of them blessed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.gates.throughput.cells import throughput_record
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.measure.load import workload_dict
from pytest_ddtree.records.words import RecordKind, Status
from tests.suite_helpers import MATRIX, REFERENCE_PROFILE, reference_profile, run_suite
from tests.adaptive_helpers import check_sweep, sweep_matrix

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    pass\n")
    return pytester.runpytest_subprocess(
        f"--ddtree-matrix={MATRIX}", f"--ddtree-service={REFERENCE_PROFILE}",
        f"--ddtree-results={pytester.path / 'results'}", "--ddtree-config=all", "-p", "no:cacheprovider", *args,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ddtree-max-restarts", "3", "-n", "2"], "*--ddtree-max-restarts runs serially*Run without -n*"),
        (["--ddtree-max-restarts", "0"], "*--ddtree-max-restarts must be at least 1*got 0*"),
        (["--ddtree-max-restarts", "3", "--ddtree-prior", "no/such/dir"], "*--ddtree-prior: no such results folder*no/such/dir*"),
        (["--ddtree-prior", "."], "*--ddtree-prior only informs the adaptive sweep: add --ddtree-max-restarts N*"),
        (["--ddtree-max-restarts", "3", "--ddtree-prior", "."], "*--ddtree-prior *: no results.json in it*"),
    ],
    ids=["xdist", "zero", "missing-prior", "prior-without-limit", "prior-without-results"],
)
def test_bad_adaptive_use_is_a_usage_error_before_anything_starts(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = _run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines([message])
    assert not (pytester.path / "results" / "records-main.jsonl").exists()


def test_without_numpy_and_scipy_the_error_names_the_extra(pytester: pytest.Pytester) -> None:
    # The conftest loads before the plugin's configure hook: importing scipy then fails as if
    # the optional extra were not installed.
    pytester.makeconftest("import sys\nsys.modules['scipy'] = None\n")
    result = _run(pytester, "--ddtree-max-restarts", "3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "the adaptive sweep needs numpy and scipy: pip install 'pytest-ddtree[advisor]'" in result.stderr.str()


def test_a_prior_folder_may_be_a_results_root_of_session_folders(tmp_path: Path) -> None:
    from pytest_ddtree.adaptive.sweep import PriorError, check_prior_dirs

    (tmp_path / "20260101T000000Z-abc").mkdir()
    with pytest.raises(PriorError, match="no results.json"):
        check_prior_dirs([tmp_path])
    (tmp_path / "20260101T000000Z-abc" / "results.json").write_text("{}")
    check_prior_dirs([tmp_path])


@pytest.mark.slow  # over 20 s on a 2-core box
def test_six_restarts_of_eighteen_on_the_reference_engine(pytester: pytest.Pytester) -> None:
    """--ddtree-config=all --ddtree-max-restarts 6 with the bless flow on: six launches counted by
    the service manager and printed, the other twelve configs deselected (said so) and predicted,
    and never blessed. Two short cells keep it cheap; the quality figures over the whole matrix
    against a full sweep of the same engine are benchmarks/bench_advisor.py --end-to-end."""
    shipped = {w["name"]: w for w in yaml.safe_load(MATRIX.read_text())["cells"]}
    cells = [shipped["c1_short"], shipped["c8_short"]]
    matrix = sweep_matrix(pytester.path, cells)
    results, baselines = pytester.path / "results", pytester.path / "baselines"
    # no control: it is not what the sweep plans, and measuring it at both ends of the session was a
    # third of this test's time (test_control.py has its own)
    profile = reference_profile(pytester.path, control="none")
    result = run_suite(pytester, profile, f"--ddtree-matrix={matrix}", "--ddtree-max-restarts", "6",
                       "--ddtree-update-baselines", suite="test_throughput.py", config="all", timeout=400)
    text = result.stdout.str()
    failed = re.findall(r"^FAILED \S+\[(\w+)-(\w+)\]", text, flags=re.M)
    # the bless flow refuses a cell it cannot trust (a loaded box); nothing else may fail
    assert result.ret == 0 or failed or "not blessed:" in text, text[-3000:]
    assert all(f"{config} {cell}: not blessed, the measurement cannot be trusted" in text for cell, config in failed), text[-3000:]
    payload = check_sweep(result, results, limit=6, cells=len(cells))
    assert payload["adaptive_sweep"]["restarts"] == 6  # two cells, 18 configs: not decided before the limit
    measured = set(payload["adaptive_sweep"]["measured"])
    blessed = {p.stem for p in (baselines / "refserver").glob("*.yaml")}
    assert "control" not in blessed
    assert blessed and blessed <= measured, (blessed, measured)
    # the main process's [ddtree] lines reach pytest's terminal (stdout) where it has one, else stderr
    said = result.stdout.str() + result.stderr.str()
    assert "adaptive sweep: 24 tests deselected, their configs not measured" in said, said[-3000:]


def test_prior_sessions_of_the_same_hardware_shape_the_fit_and_others_are_ignored_with_a_warning(tmp_path: Path) -> None:
    """--ddtree-prior: an earlier session's measured cells on this hardware profile become the
    planner's prior; cells measured on another profile are left out, and the session says so."""
    from pytest_ddtree.adaptive.sweep import AdaptiveSweep

    matrix = load_matrix(MATRIX)
    configs = list(matrix.configs)
    cells = [w for w in matrix.cells if w.name in ("c1_short", "c8_short")]

    def row(config: str, cell: Any, tok_s: float, profile: str) -> dict[str, Any]:
        return {"kind": "throughput", "config": config, "cell": cell.name, "measurement_status": "valid",
                "hardware_profile": profile, "output_throughput": tok_s, "accept_length": 4.0,
                "workload": {"concurrency": cell.concurrency, "context_tokens": cell.context_tokens,
                             "output_tokens": cell.output_tokens}}

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    rows = [row(c.name, w, 900.0 + 10 * (c.budget or 0) * w.concurrency, "refserver") for c in configs[:6] for w in cells]
    rows += [row(configs[0].name, w, 50.0, "h100-other") for w in cells]
    (earlier / "results.json").write_text(json.dumps({"throughput": rows}))
    lines: list[str] = []
    sweep = AdaptiveSweep(configs, cells, 4, default=matrix.default.name, priors=[earlier], progress=lines.append)
    first = sweep.next_config()
    assert first is not None
    # this session's own records, as the throughput suite writes them
    verdict = verdicts.CellVerdict("c", Status.MISSING).as_dict()
    measured = [{"kind": RecordKind.THROUGHPUT, **throughput_record(
        config=first, cell=w.name, workload=workload_dict(w), repeats=[{"output_throughput": 1000.0, "accept_length": 4.0}],
        samples={"output_throughput": [1000.0]}, measurement_status=Status.VALID, verdict=verdict,
        hardware_profile="refserver")} for w in cells]
    assert sweep.record_config(first, measured, "refserver") == len(cells)
    assert sweep.planner.prior is not None and sweep.planner.prior.n_obs == 12
    assert any("ignored 2 prior cells measured on hardware profile h100-other" in line for line in lines), lines
    assert sweep.prior_note and "12 cells of 6 configs" in sweep.prior_note


def test_a_nan_from_an_earlier_results_file_stays_out_of_the_fit() -> None:
    """results.json written by another process may hold NaN (json reads it back as a float): the
    prior's rows go through stats.is_number, so no NaN reaches the planner's fit."""
    from pytest_ddtree.adaptive.sweep import _measurements

    workload = {"concurrency": 8, "context_tokens": 512, "output_tokens": 128}
    rows = json.loads(json.dumps([
        {"config": "bs8_b8_k4", "cell": "c8", "workload": workload, "output_throughput": float("nan"), "accept_length": 4.0},
        {"config": "bs8_b16_k4", "cell": "c8", "workload": workload, "output_throughput": 900.0, "accept_length": float("nan")},
        {"config": "bs8_b32_k4", "cell": "c8", "workload": workload, "output_throughput": float("inf"), "accept_length": 4.0},
    ]))
    _configs, _cells, measured = _measurements(rows)
    assert [(m.config, m.tok_s, m.accept_length) for m in measured] == [("bs8_b16_k4", 900.0, None)]
