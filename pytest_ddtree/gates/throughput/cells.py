"""One config's cells, from its baseline to its records: the throughput gate's one cell orchestration.

Why one: the suite's cell tests, the relaunch of a flagged config and the session's control each do
the same steps for a set of cells on one running service; written once (``run_cells``), the baseline
file is read and validated once per cell and a bless is decided in one place:

1. read the baseline once (``read_baseline``: the file loaded and its ``metrics`` section validated;
   a problem is kept, and the cells fail on it after they are recorded);
2. measure every cell with interleaved repeats and confirm the flagged ones while the service is up
   (``measurement.measure_config``; under a bless nothing is judged);
3. judge each cell against that baseline (``judged_cell``), which takes the cell's one bless
   decision (``verdicts.judge_bless``; ``judge_cell`` turns it into a proposal or a refusal);
4. record each cell (``throughput_record``, then ``on_cell``; the suite's cell tests record their own as they run).

``plan_for`` builds the plan from a ``CellSetup`` (the profile, the options it reads, the SLO),
so a script (the gate's benchmark) drives the same path the suite does; ``run_config`` is the whole path for a config's cells on a running service. The pytest
items are walked for cells once per caller (``collected_cells``).

Each measured cell's outcome is judged here and nowhere else (``judge_cell``, like pytest-regressions'
``perform_regression_check``): a baseline file it cannot read, an invalid measurement, a bless it
refuses or proposes, a missing or thin baseline, a metric the baseline lacks, a regression, an
inconclusive cell, and what ``--ddtree-require-baselines`` (CI) changes. The suite only turns the
outcome into pytest's fail, skip or warnings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pytest_ddtree.baselines import BaselineError
from pytest_ddtree.gates.throughput.baseline import session_share, validate_section, baseline_cell_entry
from pytest_ddtree.gates.throughput import rule, verdicts
from pytest_ddtree.gates.throughput.verdicts import BLESS_MAX_HALF_WIDTH, BlessDecision, judge_bless
from pytest_ddtree.gates.throughput.measurement import (Campaign, Driving, Judging, Recording, cell_histogram,
                                                        cell_input, edge_exemption, gate_samples, measure_config,
                                                        measured_workload, repeat_metrics, spoiled_evidence)
from pytest_ddtree.configs import config_or_none
from pytest_ddtree.measure import load, stats
from pytest_ddtree.gates.measure_only import NOT_JUDGED
from pytest_ddtree.metrics import OUTPUT_THROUGHPUT
from pytest_ddtree.records.shapes import CellVerdictData, ThroughputData, WorkloadData
from pytest_ddtree.records.words import MeasurementStatus, Status, GateDecision
from pytest_ddtree.service import proof
from pytest_ddtree.service.build import blessed_build, build_changes, build_sentence, build_under_test
from pytest_ddtree.service.plain import is_plain
from pytest_ddtree.service.fingerprint import local_fingerprint, setup_differences

if TYPE_CHECKING:
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.hookspec import ProjectHooks
    from pytest_ddtree.measure.slo import SLO
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import RunningService
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.service.fingerprint import HardwareProfile


@dataclass(frozen=True)
class CellBaseline:
    """A config's baseline as its cells are judged and blessed: read and validated once.

    ``section`` is the file's validated ``metrics`` section (``{}`` when there is no file, or it
    could not be read); ``problem`` says why it could not, and each cell fails on it after its
    measurement is recorded."""

    config: str
    path: Path
    hardware_profile: str
    section: Mapping[str, Any]
    problem: str | None = None
    #: The setup the file was blessed on (its ``fingerprint.details``; ``{}`` when it has none).
    blessed_setup: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Why its numbers cannot be compared with this service's at all (then ``section`` is empty).
    incomparable: str | None = None
    #: The build it was blessed on (``service.build.blessed_build``) and the build judged now
    #: (``service.build.build_under_test``; ``{}``: not known to the caller).
    blessed_build: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    build: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Where the file was read from the older layout's folder, the note that says so.
    note: str | None = None

    def cell(self, name: str) -> Any:
        """The cell's entry as blessed (a bless merges into it), or None."""
        return self.section.get(name)


def judged_build(store: BaselineStore, service: Any) -> dict[str, Any]:
    """The build ``service`` (a ``RunningService``) is, with the driver the session found."""
    return build_under_test(service.server_info, service.profile, store.fingerprint.build if store.fingerprint else None)


def read_baseline(store: BaselineStore, config: str, build: Mapping[str, Any] | None = None) -> CellBaseline:
    """``config``'s baseline file of ``store``, loaded and validated (the one ``validate_section``
    of a cell path); ``build``: the build judged now (``service.build.build_under_test``), which
    each cell's verdict compares with the one the file was blessed on."""
    path = store.read_path(config)
    try:
        data = store.load(config)
        section = validate_section((data or {}).get("metrics"), str(path))
    except (BaselineError, verdicts.BaselineFormatError) as exc:
        return CellBaseline(config, path, store.hardware_profile, {}, str(exc), build=dict(build or {}))
    recorded = (data or {}).get("fingerprint")
    details = recorded.get("details") if isinstance(recorded, Mapping) else None
    blessed = details if isinstance(details, Mapping) else {}
    other_clock = clock_difference(blessed, store.fingerprint.details if store.fingerprint is not None else {})
    return CellBaseline(config, path, store.hardware_profile, {} if other_clock else section, blessed_setup=blessed,
                        incomparable=other_clock, blessed_build=blessed_build(recorded) if data else {},
                        build=dict(build or {}), note=store.legacy_note(config))


def clock_difference(blessed: Mapping[str, Any], here: Mapping[str, Any]) -> str | None:
    """Why a baseline of the reference engine does not apply to this one: it was blessed at another
    clock scale, so every time and tok/s in it is of another simulated accelerator (None: same clock,
    or one side does not say). A hand-started engine runs at scale 1 unless told; the shipped profile's
    is 10; compared anyway, every cell 'regressed' by 90%."""
    was, now = blessed.get("clock_scale"), here.get("clock_scale")
    if not (stats.is_number(was) and stats.is_number(now)) or float(was) == float(now):
        return None
    return (f"the baseline was blessed on the reference engine at clock scale {float(was):g}, and this engine runs at "
            f"{float(now):g}: its times and tok/s are another clock's, so none is compared; start the engine with "
            f"--clock-scale {float(was):g} (as suites/services/reference.yaml does), or bless this clock")


@dataclass(frozen=True)
class JudgedCell:
    """One measured cell judged against its baseline: its record (``ThroughputData``: what
    results.json and the sweep table are made of, and what the measurement's status, samples and
    repeats are read from) and what ``judge_cell`` judges its outcome on beside it."""

    verdict: verdicts.CellVerdict
    record: ThroughputData
    durations: list[float]
    primary: list[float]
    baseline_cell: Any
    baseline_problem: str | None
    status_reasons: list[str] = dataclasses.field(default_factory=list)  # why not valid (inconclusive, invalid)
    #: Under a bless, whether the cell is proposed for its baseline (``verdicts.judge_bless``); None otherwise.
    bless: BlessDecision | None = None
    #: An open-loop cell's worst ``SLO_LATENCY_SHARE`` over its counted repeats (what a bless keeps: ``slo_edge.py``).
    slo_latency_share: float | None = None
    #: The setup its baseline was blessed on (``CellBaseline.blessed_setup``).
    blessed_setup: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: The build judged now (``CellBaseline.build``), and what the verdict says of it against the
    #: build its baseline was blessed on (``service.build.build_sentence``; empty: none recorded).
    build: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    build_sentence: str = ""

    @property
    def status(self) -> MeasurementStatus:
        return self.record["measurement_status"]

    @property
    def samples(self) -> dict[str, list[float]]:
        """Each gated metric's counted repeat samples (what a bless proposes)."""
        return self.record["samples"]

    @property
    def repeats(self) -> int:
        return self.record["repeats"]


def judged_cell(config: str, workload: load.CellLike, campaign: Campaign, baseline: CellBaseline,
                bless: bool = False, measure_only: bool = False) -> JudgedCell:
    """Status of the measurement, verdict against ``baseline``, the result record, and under a bless
    (``bless``) the cell's bless decision (a cell it proposes shows ``updated`` in the table); under
    ``--ddtree-measure-only`` every cell that is not broken is ``measured`` (gates/measure_only.py)."""
    run = campaign.runs[workload.name]
    valid = [s for s in run.counted if s.valid]
    repeats = [repeat_metrics(s) for s in valid]
    problems = [p for s in run.samples for p in s.problems()]
    notes = sorted({n for s in run.samples for n in s.notes})
    spoiled = spoiled_evidence(run)
    if spoiled:
        notes.append(f"{len(spoiled)} repeat(s) retaken, not counted (they measured the machine): " + "; ".join(spoiled))
    samples = gate_samples(repeats, campaign.gated)  # recorded and blessed (an open-loop cell's tok/s too) ...
    cell_base = baseline.cell(workload.name)  # as blessed (a bless merges into it) ...
    facts = cell_input(campaign, workload, cell_base)  # ... and as this session judges it (the gate's own input)
    status, why, judged = facts.status, list(facts.problems), facts.baseline
    workload_info = measured_workload(run, workload)  # the record's (facts.workload is the same, untyped)
    verdict = campaign.verdicts.get(workload.name) or rule.judge_cell_alone(
        workload.name, judged, facts.current, status=status, problems=why, workload=workload_info)
    if measure_only and verdict.status != Status.INVALID:  # numbers, no verdict (an inconclusive one says why)
        verdict = dataclasses.replace(verdict, status=Status.MEASURED, metrics=(),
                                      reasons=(NOT_JUDGED, *why) if status == Status.INCONCLUSIVE else (NOT_JUDGED,))
    if baseline.incomparable and verdict.status == Status.MISSING:  # why there is nothing to compare with
        verdict = dataclasses.replace(verdict, reasons=(baseline.incomparable,))
    edge = edge_exemption(cell_base, campaign.slo, workload) if campaign.slo_edge and not bless else None
    if edge is not None:  # said in the verdict (the test's message, the report) and the record
        verdict = dataclasses.replace(verdict, reasons=(*verdict.reasons, edge.reason))
    half_width = campaign.policy.target_half_width or BLESS_MAX_HALF_WIDTH  # the profile's bless_max_half_width
    decision = judge_bless(status, why, run.primary, half_width) if bless else None
    if decision is not None and decision.blessed:
        verdict = dataclasses.replace(verdict, status=Status.UPDATED)  # the table shows what was blessed
    confirmation = campaign.confirmations.get(workload.name)
    if confirmation is not None:
        notes.append(f"confirmation run: {len(confirmation.primary)} fresh clean repeats, output tok/s "
                     f"{[round(p, 1) for p in confirmation.primary]}")
        retaken = spoiled_evidence(confirmation)
        if retaken:
            notes.append(f"confirmation run: {len(retaken)} repeat(s) retaken, not counted: " + "; ".join(retaken))
    record = throughput_record(
        config=config, cell=workload.name, workload=workload_info, repeats=repeats, samples=samples,
        measurement_status=status, verdict=verdict.as_dict(), problems=problems[:20], notes=notes,
        hardware_profile=baseline.hardware_profile, baseline=(judged or {}).get("gates"),
        server_info=next((s.server_info for s in reversed(valid) if s.server_info), None),
    )
    _complete_record(record, run, campaign.slo)
    sentence = build_sentence(baseline.blessed_build, baseline.build) if baseline.build else ""
    if baseline.build:
        record["build"] = {"blessed": dict(baseline.blessed_build), "judged": dict(baseline.build),
                           "changed": build_changes(baseline.blessed_build, baseline.build)}
        if record["build"]["changed"]:
            record["notes"].append(f"build: {sentence}")
    if baseline.note is not None:
        record["notes"].append(baseline.note)
    if edge is not None:
        record["not_judged"] = {m: edge.reason for m in edge.metrics}
    share = session_share(repeats) if workload.open_loop is not None and campaign.slo is not None else None
    return JudgedCell(verdict=verdict, record=record, durations=[s.duration_s for s in valid], primary=list(run.primary),
                      baseline_cell=cell_base, baseline_problem=baseline.problem, status_reasons=list(why),
                      bless=decision, slo_latency_share=share, blessed_setup=baseline.blessed_setup,
                      build=baseline.build, build_sentence=sentence)


def throughput_record(
    *,
    config: str,
    cell: str,
    workload: WorkloadData,
    repeats: Sequence[Mapping[str, object]],
    samples: Mapping[str, Sequence[float]],
    measurement_status: MeasurementStatus,
    verdict: CellVerdictData,
    problems: Sequence[str] = (),
    notes: Sequence[str] = (),
    hardware_profile: str | None = None,
    baseline: Mapping[str, object] | None = None,
    server_info: Mapping[str, object] | None = None,
) -> ThroughputData:
    """The record of one cell: medians over repeats, samples, spread, verdict.

    ``repeats`` are the per-repeat bench_serving metric dicts (``CellResult.metrics()``);
    ``verdict`` is ``verdicts.CellVerdict.as_dict()``; ``baseline`` the cell's baseline gates
    (samples, median, tolerance per metric), so the report can draw repeats against them.
    """
    primary = [float(v) for v in samples.get(OUTPUT_THROUGHPUT) or []]
    spread = stats.summarize(primary).as_dict() if primary else None
    change = {k: change for k, m in verdict["metrics"].items() if (change := m.get("change")) is not None}
    return {
        "config": config,
        "cell": cell,
        "workload": workload,
        "status": verdict["status"],
        "measurement_status": measurement_status,
        "repeats": len(repeats),
        "metrics": stats.aggregate_repeats(repeats),
        "samples": {k: list(v) for k, v in samples.items()},
        "output_throughput_spread": spread,
        "change": change,
        "verdict": verdict,
        "problems": list(problems),
        "notes": list(notes),
        "hardware_profile": hardware_profile,
        "baseline": dict(baseline or {}),
        "server_info": dict(server_info) if server_info else None,
    }


def _complete_record(record: ThroughputData, run: stats.CellRun[load.CellResult], slo: SLO | None) -> None:
    """The record's retaken repeats, its SLO (where the session has one), its acceptance per prompt
    category (a labelled dataset's) and its acceptance histograms."""
    record["spoiled_repeats"] = [{"repeat": i, "reason": r} for i, r in sorted(run.spoiled.items())]
    if slo is not None:
        record["slo"] = slo.record()
    pooled: dict[str, list[int]] = {}
    for sample in (s for s in run.samples if s.valid):
        for category, (tokens, steps) in sample.category_counts().items():
            pooled.setdefault(category, [0, 0])[0] += tokens
            pooled[category][1] += steps
    if pooled:  # a labelled dataset's acceptance per category, over every valid repeat
        record["acceptance_by_category"] = {c: tokens / steps for c, (tokens, steps) in sorted(pooled.items()) if steps}
    # acceptance from every valid repeat, retaken ones too: greedy acceptance ignores the host's speed
    hist = cell_histogram(run.samples)
    if hist is not None:  # acceptance by depth: share of verifies that accepted at least d drafts
        record["accept_histogram"] = hist
        record["acceptance_by_depth"] = proof.acceptance_by_depth(hist)
        # each repeat's own: configs compared on the same prompts compare these, whatever their repeat counts
        record["repeat_histograms"] = [s.accept_histogram() for s in run.samples if s.valid]


@dataclass(frozen=True)
class CellPlan:
    """What one run of a config's cells measures and how: the name its cells are judged and recorded
    under (a config's, or the control's), the cells, the least repeats of each, how each repeat drives
    the service, what the cells are judged with, and whether this is a bless."""

    config: str
    cells: tuple[load.CellLike, ...]
    repeats: int
    driving: Driving
    judging: Judging = Judging()
    bless: bool = False
    #: --ddtree-measure-only: nothing is judged, every cell is ``measured``.
    measure_only: bool = False


@dataclass(frozen=True)
class MeasuredCells:
    """A run of a config's cells: the baseline read for it, the campaign, each cell judged."""

    baseline: CellBaseline
    campaign: Campaign
    cells: dict[str, JudgedCell]


@dataclass(frozen=True)
class CellSetup:
    """What a run of a config's cells follows beside its baseline: the service profile (prompts, the
    cell deadline, the repeats' noise bounds, the control's and the relaunch's keys), the options of
    the session it reads and the session's SLO. The plugin's fixtures make it from the session
    (``of``), a script (the gate's benchmark) the same way."""

    profile: ServiceProfile
    repeats: int
    #: --ddtree-update-baselines: the cells are measured for a bless and nothing is judged.
    bless: bool = False
    #: --ddtree-measure-only: nothing is judged, every cell is ``measured``.
    measure_only: bool = False
    #: --ddtree-dataset: a ShareGPT file whose text becomes the prompts.
    dataset: str | None = None
    slo: SLO | None = None
    #: The session's stamp, which a bless files its samples under.
    session_stamp: str = ""

    @classmethod
    def of(cls, profile: ServiceProfile, settings: Settings, slo: SLO | None) -> CellSetup:
        return cls(profile, settings.repeats, bool(settings.update_baselines), settings.measure_only,
                   str(settings.dataset) if settings.dataset else None, slo, settings.session_stamp)


def driving_for(setup: CellSetup, *, accept_bound: int | None = None, speculative: bool = True,
                slo: SLO | None = None, label: str = "") -> Driving:
    """How the repeats drive the service: the profile's prompts and cell deadline, ``--ddtree-dataset``,
    and what the caller says of the launch."""
    profile = setup.profile
    return Driving(tokenizer_path=profile.tokenizer_path(), vocab_size=profile.vocab_size,
                   dataset=setup.dataset, accept_bound=accept_bound,
                   speculative=speculative, slo=slo, cell_timeout_s=profile.cell_timeout_s, label=label,
                   max_repeat_spread=profile.max_repeat_spread, bless_max_half_width=profile.bless_max_half_width)


def plan_for(setup: CellSetup, service: RunningService, config: str, cells: Sequence[load.CellLike],
             judging: Judging = Judging(), label: str | None = None) -> CellPlan:
    """The plan of a config's cells on its running ``service`` as the suite measures them: the
    session's repeats, its SLO, the config's accept bound, and a bless under
    ``--ddtree-update-baselines`` (which judges nothing: ``judging`` is then left out)."""
    driving = driving_for(setup, accept_bound=service.accept_bound(), slo=setup.slo,
                          label=config if label is None else label, speculative=not is_plain(config_or_none(config)))
    return CellPlan(config, tuple(cells), setup.repeats, driving,
                    Judging() if setup.bless or setup.measure_only else judging, setup.bless, setup.measure_only)


def run_cells(client: Any, plan: CellPlan, baseline: CellBaseline, recording: Recording = Recording(),
              on_cell: Callable[[JudgedCell], None] | None = None) -> MeasuredCells:
    """Measure, confirm and judge ``plan``'s cells against ``baseline`` (read once, by the caller
    with ``read_baseline``) on the service of ``client`` (its client, or a URL); ``recording`` gets
    each repeat as it exists, ``on_cell`` each judged cell in order. A bless, or a baseline that
    could not be read, judges nothing while measuring (the cells then fail on the problem)."""
    judged = None if plan.bless or plan.measure_only or baseline.problem is not None else baseline.section
    campaign = measure_config(client, plan.cells, plan.repeats, plan.driving, baseline=judged,
                              judging=plan.judging, recording=recording, bless=plan.bless)
    by_cell: dict[str, JudgedCell] = {}
    for workload in plan.cells:
        by_cell[workload.name] = cell = judged_cell(plan.config, workload, campaign, baseline, plan.bless, plan.measure_only)
        if on_cell is not None:
            on_cell(cell)
    return MeasuredCells(baseline, campaign, by_cell)


def run_config(setup: CellSetup, store: BaselineStore, service: RunningService, config: str,
               cells: Sequence[load.CellLike], recording: Recording = Recording(), judging: Judging = Judging(),
               hooks: ProjectHooks | None = None) -> MeasuredCells:
    """A config's cells on its running ``service`` as the suite measures them, from its baseline
    (in ``store``, read once) to each judged cell: ``plan_for``, ``read_baseline``, ``run_cells``.
    ``hooks`` (the session's relay) tells the project's ``pytest_ddtree_cell_measured`` of each cell."""
    baseline = (CellBaseline(config, store.path_for(config), store.hardware_profile, {}) if setup.measure_only
                else read_baseline(store, config, judged_build(store, service)))  # a measure-only run reads none

    def measured(cell: JudgedCell) -> None:
        if hooks is not None:
            hooks.cell_measured(config, cell.record["cell"], cell.record["metrics"], cell.samples)

    return run_cells(service.client, plan_for(setup, service, config, cells, judging), baseline, recording, measured)


@dataclass(frozen=True)
class CollectedCells:
    """The throughput cells of a session's collected tests, walked once: each config's cells in
    order (each once), and the configs themselves."""

    configs: dict[str, Any]
    by_config: dict[str, list[load.CellLike]]

    def of(self, config: str) -> list[load.CellLike]:
        return list(self.by_config.get(config, []))

    def all(self) -> list[load.CellLike]:
        """Every cell once (by name), in the order first collected."""
        seen: dict[str, load.CellLike] = {}
        for cells in self.by_config.values():
            for w in cells:
                seen.setdefault(w.name, w)
        return list(seen.values())


def collected_cells(items: Sequence[Any], test: str | None = None) -> CollectedCells:
    """The cells (``workload`` parameters) of the collected items (of the test named ``test``: the
    suite's own; None: any test with one), by their ``ddtree_config`` parameter (cells of an item
    without one come under ``""``); cells skipped for the profile (``max_context``) are left out:
    they are not measured."""
    configs: dict[str, Any] = {}
    by_config: dict[str, list[load.CellLike]] = {}
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is None or (test is not None and getattr(item, "originalname", None) != test):
            continue
        config, workload = spec.params.get("ddtree_config"), spec.params.get("cell", spec.params.get("workload"))  # "workload": a suite written before
        if workload is None or not isinstance(getattr(workload, "name", None), str) or item.get_closest_marker("skip"):
            continue
        name = getattr(config, "name", None)
        if isinstance(name, str):
            configs.setdefault(name, config)
        cells = by_config.setdefault(name if isinstance(name, str) else "", [])
        if workload not in cells:
            cells.append(workload)
    return CollectedCells(configs, by_config)


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


def judge_cell(cell: JudgedCell, config: str, workload: str, *, baselines: BaselineStore, recorder: SessionRecorder,
               service: RunningService, settings: Settings, hooks: ProjectHooks | None = None) -> CellOutcome:
    """Judge the outcome of one measured cell (``judged_cell``'s, already recorded), and tell
    the project's ``pytest_ddtree_verdict`` hooks through ``hooks`` (the session's relay).

    Under ``--ddtree-update-baselines`` a trustworthy cell is proposed as this session's part
    of its baseline (with the hardware fingerprint); the main process writes it at session end.
    """
    outcome = _outcome(cell, config, workload, baselines, recorder, service, settings)
    if hooks is not None:  # a warning's message is its notes' (no baseline yet, a new metric)
        message = outcome.message or "\n".join(note.message for note in outcome.warnings)
        hooks.verdict(config, workload, {"decision": outcome.decision, "message": message, **cell.verdict.as_dict()})
    return outcome


def _outcome(cell: JudgedCell, config: str, workload: str, baselines: BaselineStore, recorder: SessionRecorder,
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


def _setup_note(cell: JudgedCell, baselines: BaselineStore, config: str, service: RunningService) -> str:
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


def _bless(cell: JudgedCell, decision: BlessDecision, config: str, workload: str, baselines: BaselineStore,
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
