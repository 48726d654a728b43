"""The throughput gate's one entry point for a measured cell: pass, fail, skip or warn, with why.

Like pytest-regressions' ``perform_regression_check``, a suite's test measures and hands the
result here (:func:`check_cell`); what the gate decides for the cell is decided here and
nowhere else: a baseline file it cannot read, an invalid measurement, a bless it refuses or
proposes, a missing or thin baseline, a metric the baseline lacks, a regression, an
inconclusive cell, and what ``--ddtree-require-baselines`` (CI) changes. Whether a bless can
trust the cell is its ``BlessDecision``, taken once as it is evaluated (``cells.evaluate_cell``,
by ``measurement.decide_bless``); here it becomes the proposal or the refusal. The suite only turns
the outcome into pytest's fail, skip or warnings (this module does not import pytest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pytest_ddtree.service.fingerprint import local_fingerprint, setup_differences
from pytest_ddtree.gates.throughput.baseline_format import baseline_cell_entry
from pytest_ddtree.gates.throughput.measurement import BlessDecision
from pytest_ddtree.records.words import GateDecision
from pytest_ddtree.records.words import Status

if TYPE_CHECKING:
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.gates.throughput.cells import CellEvaluation
    from pytest_ddtree.hookspec import ProjectHooks
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.fingerprint import HardwareProfile
    from pytest_ddtree.service.manager import RunningService


@dataclass(frozen=True)
class GateWarning:
    """Something to say while the cell is not failed: no (trusted) baseline yet, or a new metric."""

    kind: Literal["missing-baseline", "new-metric"]
    message: str


@dataclass(frozen=True)
class CellOutcome:
    """The gate's decision for one cell, its message, and the warnings to show with it."""

    decision: GateDecision
    message: str = ""
    warnings: tuple[GateWarning, ...] = ()


def check_cell(cell: CellEvaluation, config: str, workload: str, *, baselines: BaselineStore, recorder: SessionRecorder,
               service: RunningService, settings: Settings, hooks: ProjectHooks | None = None) -> CellOutcome:
    """Decide one measured cell (``cells.evaluate_cell``'s evaluation, already recorded), and tell
    the project's ``pytest_ddtree_verdict`` hooks through ``hooks`` (the session's relay).

    Under ``--ddtree-update-baselines`` a trustworthy cell is proposed as this session's part
    of its baseline (with the hardware fingerprint); the main process writes it at session end.
    """
    outcome = _decide(cell, config, workload, baselines, recorder, service, settings)
    if hooks is not None:  # a warning's message is its notes' (no baseline yet, a new metric)
        message = outcome.message or "\n".join(note.message for note in outcome.warnings)
        hooks.verdict(config, workload, {"decision": outcome.decision, "message": message, **cell.verdict.as_dict()})
    return outcome


def _decide(cell: CellEvaluation, config: str, workload: str, baselines: BaselineStore, recorder: SessionRecorder,
            service: RunningService, settings: Settings) -> CellOutcome:
    if cell.baseline_problem is not None:
        return CellOutcome(Status.FAIL, f"{config} {workload}: {cell.baseline_problem}")
    verdict = cell.verdict
    if cell.status == Status.INVALID:
        return CellOutcome(Status.FAIL, verdict.message(config))
    if cell.bless is not None:
        return _bless(cell, cell.bless, config, workload, baselines, recorder, service, settings)
    require = settings.require_baselines
    notes: list[GateWarning] = []
    if verdict.status in (Status.MISSING, Status.THIN):
        reasons = "; ".join([*verdict.reasons, *(m.message for m in verdict.metrics if m.status == Status.THIN)])
        msg = (f"{config} {workload}: {reasons} in {baselines.path_for(config)}; "
               f"create it with: {baselines.create_command(config)}")
        if require:
            return CellOutcome(Status.FAIL, msg + " (--ddtree-require-baselines)")
        # A warning, not a skip: the measurement is real and must reach --benchmark-json
        # (pytest-benchmark drops skipped tests); CI makes it a failure with --ddtree-require-baselines.
        notes.append(GateWarning("missing-baseline", msg))
    new = [m.message for m in verdict.metrics if m.status == Status.NEW]
    if new:
        notes.append(GateWarning("new-metric", f"{config} {workload}: " + "; ".join(new)))
    build = f"\n  - build: {cell.build_sentence}" if cell.build_sentence else ""
    changed = bool(cell.record.get("build", {}).get("changed"))
    if verdict.failed:
        return CellOutcome(Status.FAIL, verdict.message(config) + _setup_note(cell, baselines, config, service) + build,
                           tuple(notes))
    if verdict.status == Status.INCONCLUSIVE:
        if require:
            return CellOutcome(Status.FAIL, verdict.message(config) + build + "\n  (inconclusive fails under --ddtree-require-baselines: "
                               "a CI run must not pass a cell it could not judge)", tuple(notes))
        # one line (pytest's short summary shows a skip's reason on one): "cell: INCONCLUSIVE: why; why"
        head, *why = verdict.message(config).split("\n  - ")
        why += [f"build: {cell.build_sentence}"] if changed else []
        return CellOutcome(Status.SKIP, head + (": " + "; ".join(w.replace("\n", " ") for w in why) if why else ""), tuple(notes))
    # a passing cell says its build only where it is not the blessed one: what changed and still passed
    return CellOutcome(Status.WARN if notes else Status.PASS, f"{config} {workload}: {cell.build_sentence}" if changed else "",
                       tuple(notes))


def _setup_note(cell: CellEvaluation, baselines: BaselineStore, config: str, service: RunningService) -> str:
    """Where the baseline was blessed on another setup than this service's, the failure says how
    (``fingerprint.setup_differences``): that, not the config, may be what moved."""
    if not cell.blessed_setup:  # a file with no recorded setup has nothing to compare
        return ""
    differences = setup_differences(cell.blessed_setup, _setup(baselines, service).details)
    if not differences:
        return ""
    return (f"\n  - {baselines.path_for(config)} was blessed on another setup than this service's: {'; '.join(differences)}"
            f"; to gate this setup, bless it ({baselines.create_command(config)}) or give its profile a hardware_profile "
            "of its own")


def _setup(baselines: BaselineStore, service: RunningService) -> HardwareProfile:
    """The setup this service is: the fingerprint the session filed its baselines by (a fleet host's
    GPUs are that host's), else this machine's view of it."""
    return baselines.fingerprint or local_fingerprint(service.profile, service.server_info)


def _bless(cell: CellEvaluation, decision: BlessDecision, config: str, workload: str, baselines: BaselineStore,
           recorder: SessionRecorder, service: RunningService, settings: Settings) -> CellOutcome:
    """Propose the cell for its baseline, or refuse a measurement that cannot be trusted."""
    refusal = decision.refusal
    if refusal is not None:
        retry = f"{baselines.create_command(config)} --ddtree-cell={workload}"
        return CellOutcome(Status.FAIL, f"{config} {workload}: not blessed, the measurement cannot be trusted: {refusal}\n"
                                          f"  retry this cell with: {retry}")
    fingerprint = _setup(baselines, service)
    entry = baseline_cell_entry(cell.record["workload"], cell.samples, existing=cell.baseline_cell, session=settings.session_stamp,
                                slo_share=cell.slo_latency_share)
    recorder.propose_baseline(config, "metrics", {workload: entry})
    recorder.propose_baseline(config, "fingerprint", {**fingerprint.as_dict(), "build": dict(cell.build or fingerprint.build)})
    return CellOutcome(Status.PASS, f"{config} {workload}: proposed for the baseline")
