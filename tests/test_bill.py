"""The session's GPU bill (records/bill.py): printed, in results.json, on report.html, handed to the
``pytest_ddtree_session_bill`` hook, and predicted in the header, checked against what a real session
on the embedded engine recorded (its launches and their seconds to ready, its repeats and their
measured loops)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.records import bill
from pytest_ddtree.records.words import RecordKind
from pytest_ddtree.service.manager import REFERENCE_LABEL
from tests.suite_helpers import reference_profile

HOOK_PLUGIN = '''
import json, pathlib

def pytest_ddtree_session_bill(config, bill):
    pathlib.Path("hooked-bill.json").write_text(json.dumps(bill))
'''

#: The repeat kinds and the purpose each pays for, as the test counts them (independently of the module's table).
REPEATS = {RecordKind.THROUGHPUT_REPEAT: "configs", RecordKind.THROUGHPUT_CONFIRM_REPEAT: "confirmations",
           RecordKind.THROUGHPUT_CONTROL_REPEAT: "control", RecordKind.THROUGHPUT_RELAUNCH_REPEAT: "relaunches"}


@pytest.mark.slow
def test_a_sessions_bill_is_what_it_launched_and_measured(pytester: pytest.Pytester, repo_root: Path) -> None:
    """One config and the control at two start launches (``control_launches: 3``): the lossless reference's
    launch serves the control's first, the control's second is a fresh launch; the bill's every figure is
    the recorded launches' and repeats', and the header said beforehand how many launches it would take."""
    matrix = pytester.path / "configs.yaml"
    matrix.write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4]\ncell_defaults: {output_tokens: 16}\ncells:\n"
                      "  - {name: c1_tiny, concurrency: 1, context_tokens: 32, requests: 2, warmup_requests: 1}\n"
                      "  - {name: c2_tiny, concurrency: 2, context_tokens: 32, requests: 4, warmup_requests: 1}\n")
    profile = reference_profile(pytester.path, clock_scale=5, control_launches=3)
    (pytester.path / "bill_hook.py").write_text(HOOK_PLUGIN)
    results = pytester.path / "results"
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), str(repo_root / "suites" / "test_lossless.py"),
        f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}", f"--ddtree-results={results}",
        f"--ddtree-baselines={pytester.path / 'baselines'}", "--ddtree-config=bs8_b8_k4", "-p", "bill_hook",
        "-p", "no:cacheprovider", timeout=240)
    out = result.stdout.str()
    records = [json.loads(line) for path in results.glob("records-*.jsonl") for line in path.read_text().splitlines()]

    launches = [r["launch"] for r in records if r["kind"] == RecordKind.LAUNCH]
    # the plain launches first (the control's two, each fresh; the lossless gate measured on the one it found
    # running, or launched the first itself), then the config's
    first, second, config = launches
    assert (first["config"], second["config"], config["config"]) == (REFERENCE_LABEL, REFERENCE_LABEL, "bs8_b8_k4")
    plain = [[e["purpose"], *e.get("also_for", [])] for e in (first, second)]
    assert sorted(p for uses in plain for p in uses) == ["control", "control", "lossless reference"], plain
    assert config["purpose"] == "configs"
    expected: dict[str, dict[str, Any]] = {p: {"launches": 0, "restart_s": 0.0, "repeats": 0, "measured_s": 0.0,
                                                "shared_launches": 0} for p in bill.PURPOSES}
    for entry in launches:
        expected[entry["purpose"]]["launches"] += 1
        expected[entry["purpose"]]["restart_s"] += entry["ready_s"]
        for other in entry.get("also_for", []):
            expected[other]["shared_launches"] += 1
    for r in records:
        if r["kind"] in REPEATS:
            expected[REPEATS[r["kind"]]]["repeats"] += 1
            expected[REPEATS[r["kind"]]]["measured_s"] += r["metrics"]["duration"]
        elif r["kind"] == RecordKind.LOSSLESS_REFERENCE:
            expected["lossless reference"]["measured_s"] += r["measured_s"]
    assert expected["control"]["repeats"] >= 2 * 2 * 3 and expected["configs"]["repeats"] >= 2 * 3
    assert expected["lossless reference"]["measured_s"] > 0

    recorded = json.loads((results / "results.json").read_text())["bill"]
    for purpose, want in expected.items():
        got = recorded["by_purpose"][purpose]
        assert {k: got[k] for k in ("launches", "repeats", "shared_launches")} == \
               {k: want[k] for k in ("launches", "repeats", "shared_launches")}, purpose
        assert got["restart_s"] == pytest.approx(want["restart_s"], abs=1e-3) and \
               got["measured_s"] == pytest.approx(want["measured_s"], abs=1e-3), purpose
    restart = sum(e["ready_s"] for e in launches)
    measured = sum(w["measured_s"] for w in expected.values())
    assert recorded["launches"] == 3 and recorded["restart_s"] == pytest.approx(restart, abs=1e-3)
    assert recorded["gpu_s"] == pytest.approx(restart + measured, abs=2e-3)
    assert json.loads((pytester.path / "hooked-bill.json").read_text()) == recorded  # the hook got the same bill

    # the terminal summary and the page say the same figures
    assert re.search(rf"3 launches \({restart:.1f} s from start to ready\) and {measured:.1f} s measured", out), out[-3000:]
    ctl = expected["control"]
    assert f"  control: {ctl['launches']} launch{'' if ctl['launches'] == 1 else 'es'} ({ctl['restart_s']:.1f} s), " in out
    assert f"{ctl['repeats']} repeats ({ctl['measured_s']:.1f} s)" in out
    page = (results / "report.html").read_text()
    assert 'id="bill-table"' in page
    assert f'<tr data-purpose="control"><td>control</td><td class="num">{ctl["launches"]}</td>' in page

    # predicted before the run: the same three launches
    assert re.search(r"ddtree: this session will launch 3 times: 1 config, 1 control \(up to \d+ while the uniform shift "
                     r"is inconclusive\), 1 lossless reference", out), out[:3000]


def test_the_prediction_counts_each_process_its_control_and_the_shared_launch() -> None:
    """18 configs over 3 processes: each process measures 6 (>= 3: its end launch too), its control's start
    launches less the one it shares with its lossless reference; the policy's cap per process."""
    plan = bill.predict(configs=18, processes=3, control_launches=3, control_max_launches=11, control=True,
                        lossless_reference=True, shared=True, cells=6, repeats=3, end_launch_min_configs=3)
    assert (plan.configs, plan.control, plan.control_most, plan.lossless_reference, plan.launches) == (18, 6, 30, 3, 27)
    one = bill.predict(configs=1, processes=4, control_launches=3, control_max_launches=11, control=True,
                       lossless_reference=False, shared=True, cells=6, repeats=3, end_launch_min_configs=3)
    assert (one.processes, one.control, one.launches) == (1, 2, 3)  # two start launches; no end launch for one config
    # the defaults: one start launch on three cells, none in a process of fewer than three configs
    sweep = bill.predict(configs=4, processes=2, control_launches=1, control_max_launches=1, control=True,
                         lossless_reference=False, shared=True, cells=6, repeats=3, end_launch_min_configs=3,
                         control_min_configs=3, control_cells=3)
    assert (sweep.control, sweep.launches) == (0, 4)  # two configs a process
    sweep = bill.predict(configs=18, processes=1, control_launches=1, control_max_launches=1, control=True,
                         lossless_reference=False, shared=True, cells=6, repeats=3, end_launch_min_configs=3,
                         control_min_configs=3, control_cells=3)
    assert (sweep.control, sweep.launches, sweep.control_cells) == (1, 19, 3)
    measured = bill.predict(configs=18, processes=3, control_launches=3, control_max_launches=11, control=True,
                            lossless_reference=True, shared=True, cells=6, repeats=3, end_launch_min_configs=3, judged=False)
    assert (measured.control, measured.lossless_reference, measured.launches) == (0, 0, 18)  # --ddtree-measure-only
    assert "flagged" not in measured.text() and "no control, no lossless reference, no confirmation" in measured.text()


def _session(pytester: pytest.Pytester, repo_root: Path, name: str, **profile: Any) -> tuple[pytest.RunResult, list[dict[str, Any]]]:
    matrix = pytester.path / "configs.yaml"
    matrix.write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4]\ncell_defaults: {output_tokens: 16}\ncells:\n" + "".join(
        f"  - {{name: c{c}_tiny, concurrency: {c}, context_tokens: 32, requests: {2 * c}, warmup_requests: 1}}\n"
        for c in (1, 2, 3, 4)))
    results = pytester.path / name
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={reference_profile(pytester.path, clock_scale=5, filename=f'{name}.yaml', **profile)}",
        f"--ddtree-matrix={matrix}", f"--ddtree-results={results}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        "--ddtree-config=bs8_b8_k4", "-p", "no:cacheprovider", timeout=240)
    return result, [json.loads(line) for path in results.glob("records-*.jsonl") for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_the_shipped_defaults_measure_no_control_for_one_config_and_three_cells_for_several(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    """``control_min_configs: 3`` (the default): a one-config session launches no control, says why, and its
    header predicted it; ``control_cells: 3``: where the control is measured, it is on the matrix's first three cells."""
    result, records = _session(pytester, repo_root, "alone", control_min_configs=3, control_cells=3)
    out = result.stdout.str()
    assert [r["launch"]["purpose"] for r in records if r["kind"] == RecordKind.LAUNCH] == ["configs"]
    (why,) = [r["reason"] for r in records if r["kind"] == RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE]
    assert "fewer than the profile's control_min_configs (3)" in why and "control_min_configs: 1" in why
    assert "ddtree: this session will launch 1 time: 1 config; measuring 4 throughput cells x 3 repeats" in out, out[:2500]
    assert json.loads((pytester.path / "alone" / "results.json").read_text())["bill"]["by_purpose"]["control"]["launches"] == 0

    result, records = _session(pytester, repo_root, "three-cells", control_min_configs=1, control_cells=3)
    measured = {r["cell"] for r in records if r["kind"] == RecordKind.THROUGHPUT_CONTROL}
    assert measured == {"c1_tiny", "c2_tiny", "c3_tiny"}, measured
    assert "(3 on each of the control's)" in result.stdout.str()
