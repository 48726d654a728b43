"""gate.check.judge_cell, the throughput gate's one entry point for a cell: each decision it makes.

The cells here are built by hand (no engine): the suites' own runs (tests/test_throughput_suite.py)
take the same path with real measurements.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.baselines import BaselineStore
from pytest_ddtree.gates.throughput.cells import JudgedCell
from pytest_ddtree.gates.throughput.cells import judge_cell
from pytest_ddtree.options import Settings
from pytest_ddtree.records.shapes import ThroughputData
from pytest_ddtree.records.recorder import SessionRecorder
from pytest_ddtree.service.manager import RunningService
from pytest_ddtree.records.words import GateDecision, MeasurementStatus, Status, Verdict


def _cell(verdict: Verdict, *, status: MeasurementStatus = Status.VALID, metrics: tuple[verdicts.MetricVerdict, ...] = (),
          problem: str | None = None) -> JudgedCell:
    record = cast(ThroughputData, {"measurement_status": status, "samples": {}, "repeats": 3})
    return JudgedCell(verdict=verdicts.CellVerdict("c8", verdict, metrics, ("why",)), record=record, durations=[],
                      primary=[100.0, 101.0, 99.0], baseline_cell=None, baseline_problem=problem)


def _check(cell: JudgedCell, tmp_path: Path, require: bool = False) -> Any:
    settings = cast(Settings, SimpleNamespace(require_baselines=require, session_stamp="s1"))
    return judge_cell(cell, "bs8_b8_k4", "c8", baselines=BaselineStore(tmp_path, "refserver"),
                      recorder=cast(SessionRecorder, None), service=cast(RunningService, None), settings=settings)


@pytest.mark.parametrize(("verdict", "status", "require", "decision", "words"), [
    (Status.PASS, Status.VALID, False, Status.PASS, ""),
    (Status.REGRESSION, Status.VALID, False, Status.FAIL, "REGRESSION"),
    (Status.INVALID, Status.INVALID, False, Status.FAIL, "INVALID measurement"),
    (Status.MISSING, Status.VALID, False, Status.WARN, ""),
    (Status.MISSING, Status.VALID, True, Status.FAIL, "--ddtree-require-baselines"),
    (Status.INCONCLUSIVE, Status.INCONCLUSIVE, False, Status.SKIP, "INCONCLUSIVE"),
    (Status.INCONCLUSIVE, Status.INCONCLUSIVE, True, Status.FAIL, "a CI run must not pass a cell it could not judge"),
])
def test_each_verdict_becomes_one_decision_with_its_message(tmp_path: Path, verdict: Verdict, status: MeasurementStatus, require: bool,
                                                            decision: GateDecision, words: str) -> None:
    outcome = _check(_cell(verdict, status=status), tmp_path, require)
    assert outcome.decision is decision and words in outcome.message, outcome


def test_a_missing_baseline_warns_with_the_command_that_creates_it(tmp_path: Path) -> None:
    outcome = _check(_cell(Status.MISSING), tmp_path)
    assert [w.kind for w in outcome.warnings] == ["missing-baseline"]
    assert "create it with: pytest suites --ddtree-update-baselines" in outcome.warnings[0].message


def test_a_baseline_file_that_cannot_be_read_fails_before_anything_else(tmp_path: Path) -> None:
    outcome = _check(_cell(Status.PASS, problem="baselines/refserver/bs8_b8_k4.yaml: not YAML"), tmp_path)
    assert outcome.decision is Status.FAIL and outcome.message == "bs8_b8_k4 c8: baselines/refserver/bs8_b8_k4.yaml: not YAML"


def _validate_section_callers(root: Path) -> set[tuple[str, str]]:
    """(module file, enclosing function) of every use of ``validate_section`` under ``root``: a call, or
    the function handed on to be called (``blessed_judging`` gives it to the pass over every file)."""
    import ast

    found: set[tuple[str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Attribute) and node.attr == "validate_section") \
                        or (isinstance(node, ast.Name) and node.id == "validate_section"):
                    found.add((path.name, func.name))
    return found


def test_a_cell_path_validates_its_baseline_in_one_place(repo_root: Path) -> None:
    """#35: the suite, the relaunch and the control read a cell's baseline through
    ``cells.read_baseline`` alone (a real session counts the calls: tests/test_throughput_suite.py);
    the only other reader is the pass over every config's file for the noise priors (``blessed_judging``
    hands it the validator), and the rate section's check of its own cell entry."""
    callers = _validate_section_callers(repo_root / "pytest_ddtree") | _validate_section_callers(repo_root / "suites")
    assert callers == {("cells.py", "read_baseline"), ("measurement.py", "blessed_judging"),
                       ("baseline.py", "validate_rate_section")}, callers


def test_a_bless_records_and_a_failure_compares_the_setup_the_session_filed_its_baselines_by(tmp_path: Path) -> None:
    """A fleet host's fingerprint is taken there (its GPUs by nvidia-smi over ssh), not by this
    machine's NVML: the store carries it, so a bless records that host's setup and a judged cell
    compares its baseline's setup with it (no service is asked here: ``service`` is None)."""
    import dataclasses

    from pytest_ddtree.gates.throughput.verdicts import BlessDecision
    from pytest_ddtree.service.fingerprint import fingerprint

    class Inventory:
        gpus = [SimpleNamespace(name="NVIDIA H200")] * 8
        driver_version, cuda_driver_version = "575.51", "12.9"

    host = fingerprint({"version": "0.5.23", "model_path": "/models/k26"}, None, Inventory())
    store = BaselineStore(tmp_path, host.name, update_mode=True, fingerprint=host)
    proposed: list[tuple[str, str, Any]] = []
    recorder = cast(SessionRecorder, SimpleNamespace(propose_baseline=lambda *a: proposed.append(a)))
    settings = cast(Settings, SimpleNamespace(require_baselines=False, session_stamp="s1"))
    blessed = dataclasses.replace(_cell(Status.PASS), bless=BlessDecision(),
                                  record=cast(ThroughputData, {"measurement_status": Status.VALID, "repeats": 3,
                                                               "samples": {"output_throughput": [100.0, 101.0, 99.0]},
                                                               "workload": {"concurrency": 8, "context_tokens": 128}}))
    outcome = judge_cell(blessed, "bs8_b8_k4", "c8", baselines=store, recorder=recorder,
                         service=cast(RunningService, None), settings=settings)
    assert outcome.decision is Status.PASS
    assert ("bs8_b8_k4", "fingerprint", host.as_dict()) in proposed and host.details["gpu"] == "8xH200"
    # judged against a file blessed on H100s under a shared name: the failure says so, from the store's setup
    failed = dataclasses.replace(_cell(Status.REGRESSION), blessed_setup={**host.details, "gpu": "8xH100"})
    outcome = judge_cell(failed, "bs8_b8_k4", "c8", baselines=dataclasses.replace(store, update_mode=False),
                         recorder=recorder, service=cast(RunningService, None), settings=settings)
    assert outcome.decision is Status.FAIL
    assert "was blessed on another setup than this service's: gpu '8xH100' when blessed, '8xH200' here" in outcome.message
