"""The shapes of a session's records, and their check where records come back from elsewhere.

Why: a record crosses modules and processes. The throughput suite, the control, the relaunch and
the adaptive sweep write records; the report, the session end, the control's and the session's
judgement, the HTML report and the repro kit read them. Each kind's shape is one TypedDict here
(``RecordKind`` names the kinds, ``SHAPES`` maps each kind to its shape), so writers build them and
readers take them, and mypy holds both to one definition.

A record that comes back from another process (an xdist worker's ``workeroutput``) or from a
file (a journal, ``results.json``) is data, not code: :func:`check_record` checks it against its
kind's shape, key by key, and says which key is wrong and how; :func:`screen` sets a malformed
record aside as a ``corrupt-record`` that keeps it (nothing measured is lost) and says why, so a
reader never meets a ``KeyError`` deep inside. The typed views (:func:`throughput_records` ...)
raise :class:`RecordError` on a malformed record of their kind.

On disk the records are unchanged: a TypedDict is a plain dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, TypedDict, Union, cast

from pytest_ddtree.records.launch_shapes import LaunchData
from pytest_ddtree.records.rate_shapes import SLOData, SustainableRateData
# the check's names are read from here too, where readers of records look for them
from pytest_ddtree.records.typecheck import RecordError as RecordError, checked as checked, describe as describe, problem_of
from pytest_ddtree.records.words import MeasurementStatus, RecordKind, Status, Verdict

class RecordStamp(TypedDict, total=False):
    """What ``SessionRecorder.record`` stamps on every record besides its kind and config (``host``
    only on a fleet or remote service; ``session`` when it is journaled)."""

    worker: str
    time: float
    host: str
    session: str


class RecordEnvelope(RecordStamp, total=False):
    """What ``SessionRecorder.record`` puts around every record's data."""

    kind: str
    config: str | None


class HealthData(TypedDict):
    """``RecordKind.HEALTH``: a config's short generation (suites/test_health.py)."""

    completion_tokens: int | None
    text: str
    status: Literal["ok", "failed"]
    passed: bool
    problems: list[str]


class _ProblemRequired(TypedDict):
    id: str
    verdict: str  # a ``sandbox.Verdict`` value
    message: str
    code: str
    answer: str
    request_s: float
    run_s: float
    completion_tokens: int | None
    finish_reason: str | None


class ProblemRecord(_ProblemRequired, total=False):
    """One problem's outcome in a ``CodingData`` (``coding.ProblemResult.to_record``); the sandbox's
    tier and uid once its code ran there (a failed request or an answer without code never ran)."""

    sandbox_tier: str
    sandbox_uid: int | None  # which unprivileged uid ran it (leftover checks key on it)


class CodingGateData(TypedDict):
    """The coding gate's decision inside a ``CodingData``."""

    passed: bool
    mode: str
    floor: int | None
    regressions: list[str]
    new_passes: list[str]


class CodingData(TypedDict):
    """``RecordKind.CODING``: a config's coding set (suites/test_coding.py)."""

    set: str
    limit: int | None
    max_tokens: int
    passed: int
    total: int
    gate: CodingGateData
    sandbox: str
    speed_factor: float
    problems: list[ProblemRecord]


class HostEnvData(TypedDict, total=False):
    """``RecordKind.HOST_ENV``: a remote host's environment (``snapshot``) and its systemd unit, or
    why it could not be taken (``error``)."""

    host: str
    systemd_unit: str | None
    snapshot: dict[str, object]
    error: str


class _CalibrationRequired(TypedDict):
    when: str
    command: str
    calibration_host: str
    started_at: float
    seconds: float
    figures: dict[str, float]
    instance: int


class CalibrationData(_CalibrationRequired, total=False):
    """``RecordKind.CALIBRATION``: one run of the calibration probe (``service.calibration.CalibrationRun``):
    when in the session, the command as run, where, its figures (none with an ``error``)."""

    error: str


class FloorData(TypedDict):
    """How far a non-speculative launch disagrees with itself (``lossless.Floor.to_json``)."""

    compared: int
    diverged: int
    earliest: int | None
    batch_sizes: list[int]


class DivergenceData(TypedDict):
    """Where one prompt's output first left the reference's (``lossless.Divergence``)."""

    prompt_id: str
    position: int
    unit: str
    reference: str
    got: str
    detail: str


class LosslessOutcomeData(TypedDict):
    """The lossless gate's verdict (``lossless.LosslessOutcome.to_record``)."""

    passed: bool
    compared: int
    diverged: list[DivergenceData]
    missing: list[str]


class LosslessData(LosslessOutcomeData):
    """``RecordKind.LOSSLESS``: a config against the non-speculative reference (suites/test_lossless.py)."""

    reference: str
    floor: FloorData
    exact: str | None  # why this service must be token-exact (lossless.exact_reason), or None
    max_new_tokens: int


class _LosslessReferenceRequired(TypedDict):
    command: str
    floor: FloorData


class LosslessReferenceData(_LosslessReferenceRequired, total=False):
    """``RecordKind.LOSSLESS_REFERENCE``: the reference launch's command and its own floor, and the
    seconds its prompts took to generate (the session's bill)."""

    measured_s: float


# --- The throughput gate's records ------------------------------------------------------------
#
# Optional keys are declared in a ``total=False`` subclass of the required ones (``typing.NotRequired``
# is Python 3.11, the package supports 3.10, and typing_extensions is not a dependency).


class _WorkloadRequired(TypedDict):
    concurrency: int
    context_tokens: int
    output_tokens: int
    requests: int
    prompts: str


class WorkloadData(_WorkloadRequired, total=False):
    """A cell's workload as measured (``load.workload_dict``); open-loop (bench_serving's keys) and sampled cells add theirs."""

    request_rate: float
    arrival: str
    burstiness: float
    max_concurrency: int | None
    sampling: dict[str, float]  # a sampled cell's temperature, top_p
    api: str  # "chat": a chat cell through /v1/chat/completions (absent: /generate)
    thinking: str | None  # a chat cell's enable_thinking: "on", "off", None (not sent: the template's default)
    prompts_digest: str  # PromptSet.digest of the measured prompts (absent: not known, e.g. a baseline older than it)


class SpreadData(TypedDict):
    """The repeats' output tok/s summarised (``stats.Summary.as_dict``)."""

    n: int
    median: float
    mad: float
    rel_spread: float
    ci_low: float
    ci_high: float
    ci_coverage: float
    rel_half_width: float


class MetricVerdictData(TypedDict):
    """The gate's verdict on one metric of a cell (``verdicts.MetricVerdict.as_dict``)."""

    metric: str
    status: Verdict
    direction: Literal["higher", "lower"]
    tolerance: float
    baseline_median: float | None
    current_median: float | None
    change: float | None
    config_shift: float | None
    tolerance_floor: float | None
    config_shift_se: float | None
    config_blessed_shifts: dict[str, float] | None
    first_pass_change: float | None
    change_ci: list[float | None] | None
    change_ci_label: str | None
    baseline_samples: int
    baseline_sessions: int
    message: str


class CellVerdictData(TypedDict):
    """The gate's verdict on a cell (``verdicts.CellVerdict.as_dict``)."""

    cell: str
    status: Verdict
    reasons: list[str]
    metrics: dict[str, MetricVerdictData]


class SpoiledRepeatData(TypedDict):
    """A repeat retaken because it measured the machine, not the config."""

    repeat: int
    reason: str


class _ThroughputRequired(TypedDict):
    config: str
    cell: str
    workload: WorkloadData
    status: Verdict
    measurement_status: MeasurementStatus
    repeats: int
    metrics: dict[str, float | None]  # each metric's median over the counted repeats
    samples: dict[str, list[float]]  # each gated metric's repeat samples
    output_throughput_spread: SpreadData | None
    change: dict[str, float]  # each judged metric's relative change against its baseline
    verdict: CellVerdictData
    problems: list[str]
    notes: list[str]
    hardware_profile: str | None
    baseline: dict[str, object]  # the cell's baseline gates (``baseline.baseline_cell_entry``'s)
    server_info: dict[str, object] | None


class BuildComparisonData(TypedDict):
    """The build a cell's baseline was blessed on against the build judged now
    (``service.build``: engine version, algorithm, drafter and its digest, patches, driver)."""

    blessed: dict[str, object]
    judged: dict[str, object]
    changed: list[str]  # each differing fact, "key 'was' when blessed, 'now' here"


class ThroughputData(_ThroughputRequired, total=False):
    """``RecordKind.THROUGHPUT``: one measured cell with its verdict (``gates.throughput.cells.throughput_record``,
    completed by ``gate.throughput.judged_cell``)."""

    build: BuildComparisonData  # where the caller knew the build judged now

    slo: SLOData  # where the session has an SLO: the goodput figures' targets
    acceptance_by_category: dict[str, float]  # tokens per verify step per prompt category (labelled datasets)

    spoiled_repeats: list[SpoiledRepeatData]
    accept_histogram: list[int]  # the valid repeats' acceptance histograms summed
    acceptance_by_depth: list[float]
    repeat_histograms: list[list[int] | None]
    not_judged: dict[str, str]  # gated metric -> why it is recorded, not judged (an open-loop cell at the SLO's edge)


class ControlCellData(ThroughputData, total=False):
    """``RecordKind.THROUGHPUT_CONTROL``: one cell of the session's control (``gate.control``)."""

    control_source: str
    control_launch: int  # its launch's number in its process
    control_at: str  # where in its process that launch was measured (``gate.control.START`` or ``END``)
    blessed_launches: dict[str, int]  # how many launches each blessed session of control.yaml averaged
    baseline_problem: str
    bless_refused: str  # why a bless did not propose the cell
    retry: str  # the command that retries a refused bless


class RelaunchCellData(ThroughputData):
    """``RecordKind.THROUGHPUT_RELAUNCH`` of a measured cell: its config's relaunch ``relaunch``."""

    relaunch: int


class RelaunchFailureData(TypedDict):
    """``RecordKind.THROUGHPUT_RELAUNCH`` of a relaunch that failed, with the reason."""

    error: str
    relaunch: int


class ControlUnavailableData(TypedDict):
    """``RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE``: why no control was measured."""

    reason: str


class _RepeatRequired(TypedDict):
    cell: str
    repeat: int
    workload: WorkloadData
    metrics: dict[str, float | None]
    problems: list[str]
    notes: list[str]
    spoiled: str | None  # why it was retaken, not counted (None: it counts)
    prompts: str
    accept_histogram: list[int] | None


class RepeatData(_RepeatRequired, total=False):
    """One measured repeat of a cell (``gate.throughput.sample_record``): the kinds
    ``THROUGHPUT_REPEAT``, ``THROUGHPUT_CONFIRM_REPEAT``, ``THROUGHPUT_CONTROL_REPEAT`` (with its
    ``control_launch``) and ``THROUGHPUT_RELAUNCH_REPEAT`` (with its ``relaunch``)."""

    control_launch: int
    control_at: str
    relaunch: int


# --- The adaptive sweep's outcome -------------------------------------------------------------


class _PredictedRequired(TypedDict):
    config: str
    cell: str
    status: Literal[Status.PREDICTED]
    predicted: bool
    output_throughput: float
    output_throughput_interval: list[float]  # its 95% interval: low, high


class PredictedRowData(_PredictedRequired, total=False):
    """A throughput cell the advisor predicted instead of measuring (never gated)."""

    workload: WorkloadData


class _AdaptivePickRequired(TypedDict):
    cell: str
    config: str
    output_throughput: float
    challenger: str | None
    challenger_high: float | None


class AdaptivePickData(_AdaptivePickRequired, total=False):
    """The advisor's pick for one cell (always a measured config) and its challenger, if any; where the
    fit broke a near tie, the config measured highest there and its figure."""

    measured_best: str
    measured_best_output_throughput: float
    challenger_output_throughput: float  # the challenger's predicted tok/s (it is chosen by it)


class _AdaptiveRequired(TypedDict):
    restarts: int
    full_sweep_restarts: int
    max_restarts: int
    measured: list[str]
    failed: list[str]
    not_measured: list[str]
    predicted: list[PredictedRowData]
    recommendations: list[AdaptivePickData]
    prior: str | None


class AdaptiveSweepData(_AdaptiveRequired, total=False):
    """``RecordKind.ADAPTIVE_SWEEP``: the outcome of the adaptive sweep (``adaptive.AdaptiveSweep.outcome``)."""

    error: str  # why the advisor stopped early or could not predict


class CorruptRecordData(TypedDict, total=False):
    """``RecordKind.CORRUPT_RECORD``: a torn journal line (its ``file`` and ``line``), or a record
    set aside by :func:`screen` (the ``problem``, and the ``record`` as it came)."""

    file: str
    line: int
    problem: str
    record: dict[str, object]


# --- Records as read back: the data beside the recorder's stamp -------------------------------


class ThroughputRecord(ThroughputData, RecordStamp, total=False):
    """A throughput cell's record as the session holds it."""

    kind: str
    relaunch: int  # a relaunched cell's (``RecordKind.THROUGHPUT_RELAUNCH``)


class ControlCellRecord(ControlCellData, RecordStamp, total=False):
    """A control cell's record as the session holds it."""

    kind: str


# --- What the session end's judgements read of a measured cell ---------------------------------
#
# The judgement of each config against its session (``session_check.config_moves``) and of the control
# (``gate.control.judge``) read a few keys of a cell's record; these are those keys. A full
# ``ThroughputRecord`` is one (a TypedDict with more keys is a subtype), and so is what the gate's
# benchmarks build for thousands of simulated sessions.


class _JudgedRequired(TypedDict):
    config: str
    cell: str
    verdict: CellVerdictData
    hardware_profile: str | None
    metrics: dict[str, float | None]


class JudgedCellData(_JudgedRequired, total=False):
    """A measured cell as the session end's judgements read it (a config's, a relaunched one's or
    the control's): its verdict, config, hardware and host, and its medians (the speedups)."""

    kind: str
    host: str
    relaunch: int


class ControlJudgedData(JudgedCellData, total=False):
    """A control cell as ``gate.control.judge`` reads it (the keys of ``ControlCellData`` it uses)."""

    worker: str
    control_source: str
    control_launch: int
    control_at: str
    blessed_launches: dict[str, int]
    bless_refused: str
    retry: str


class RelaunchFailureRecord(RelaunchFailureData, RecordEnvelope, total=False):
    """A failed relaunch's record as the session holds it."""


class HostEnvRecord(HostEnvData, RecordEnvelope, total=False):
    """A host's environment record as the session holds it."""


class LaunchRecord(LaunchData, RecordEnvelope, total=False):
    """A launch's record as the session holds it."""


class AdaptiveSweepRecord(AdaptiveSweepData, RecordEnvelope, total=False):
    """The adaptive sweep's record as the session holds it."""


#: A record as it comes, of any kind, not yet checked (JSON from a journal, a worker or a file).
RawRecord = Mapping[str, object]

#: The data a writer hands ``SessionRecorder.record``: one of the shapes.
RecordData = Union[ThroughputData, ControlCellData, RelaunchCellData, RelaunchFailureData, ControlUnavailableData,
                   RepeatData, AdaptiveSweepData, HealthData, CodingData, HostEnvData, LosslessData,
                   LosslessReferenceData, LaunchData, CorruptRecordData, SustainableRateData, CalibrationData]

#: Each kind's shape: what ``check_record`` holds a record of that kind to (beside the stamp).
SHAPES: dict[RecordKind, object] = {
    RecordKind.THROUGHPUT: ThroughputData,
    RecordKind.THROUGHPUT_REPEAT: RepeatData,
    RecordKind.THROUGHPUT_CONFIRM_REPEAT: RepeatData,
    RecordKind.THROUGHPUT_CONTROL: ControlCellData,
    RecordKind.THROUGHPUT_CONTROL_REPEAT: RepeatData,
    RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE: ControlUnavailableData,
    RecordKind.THROUGHPUT_RELAUNCH: Union[RelaunchCellData, RelaunchFailureData],
    RecordKind.THROUGHPUT_RELAUNCH_REPEAT: RepeatData,
    RecordKind.CODING: CodingData,
    RecordKind.LOSSLESS: LosslessData,
    RecordKind.LOSSLESS_REFERENCE: LosslessReferenceData,
    RecordKind.HEALTH: HealthData,
    RecordKind.LAUNCH: LaunchData,
    RecordKind.HOST_ENV: HostEnvData,
    RecordKind.CALIBRATION: CalibrationData,
    RecordKind.ADAPTIVE_SWEEP: AdaptiveSweepData,
    RecordKind.SUSTAINABLE_RATE: SustainableRateData,
    RecordKind.CORRUPT_RECORD: CorruptRecordData,
}


# --- The check ------------------------------------------------------------------------------


def check_record(record: RawRecord) -> str | None:
    """What is wrong with ``record`` as its kind's shape (and the recorder's stamp), or None; a kind
    this version does not know is not checked (a newer writer's)."""
    kind = record.get("kind")
    shape = SHAPES.get(cast(RecordKind, kind)) if isinstance(kind, str) else None
    problem = problem_of(record, RecordStamp, "")
    if problem is None and shape is not None:
        problem = problem_of(record, shape, "")
    return f"{describe(record)}: {problem}" if problem is not None else None


def screen(records: Iterable[RawRecord]) -> list[dict[str, object]]:
    """Records that came from another process or a file, each checked: a malformed one is set
    aside as a ``corrupt-record`` that keeps it whole and says what is wrong (its ``problem``),
    with its stamp, so it shows in the results and no reader meets it."""
    out: list[dict[str, object]] = []
    for record in records:
        problem = check_record(record)
        if problem is None:
            out.append(dict(record))
            continue
        stamp = {k: record[k] for k in ("worker", "time", "session", "host") if k in record}
        out.append({**stamp, "kind": RecordKind.CORRUPT_RECORD, "config": record.get("config"),
                    "problem": f"malformed record set aside: {problem}", "record": dict(record)})
    return out


def _flat(record: RawRecord) -> RawRecord:
    """A record as the session holds it; the older ``{"kind", "config", "data": {...}}`` wrapping
    is flattened (its data's keys beside the kind and config)."""
    data = record.get("data")
    if not isinstance(data, Mapping):
        return record
    return {"config": record.get("config"), **data, "kind": record.get("kind")}


def _of_kind(records: Iterable[RawRecord], kind: RecordKind) -> list[RawRecord]:
    return [r for r in map(_flat, records) if r.get("kind") == kind]


def throughput_records(records: Iterable[RawRecord], kind: RecordKind = RecordKind.THROUGHPUT) -> list[ThroughputRecord]:
    """The measured throughput cells among ``records`` (``kind``: ``THROUGHPUT``, or
    ``THROUGHPUT_RELAUNCH`` for the relaunched ones, whose failed relaunches are left out), checked."""
    return [checked(ThroughputRecord, dict(r)) for r in _of_kind(records, kind) if "cell" in r or kind == RecordKind.THROUGHPUT]


def relaunch_failures(records: Iterable[RawRecord]) -> list[RelaunchFailureRecord]:
    """The relaunches that failed, with the reason."""
    return [checked(RelaunchFailureRecord, r) for r in _of_kind(records, RecordKind.THROUGHPUT_RELAUNCH) if "cell" not in r]


def control_records(records: Iterable[RawRecord], cell: str | None = None) -> list[ControlCellRecord]:
    """The control's measured cells among ``records`` (``cell``: that cell's only), checked."""
    return [checked(ControlCellRecord, r) for r in _of_kind(records, RecordKind.THROUGHPUT_CONTROL)
            if cell is None or r.get("cell") == cell]


def control_judged(records: Iterable[RawRecord]) -> list[ControlJudgedData]:
    """The control's measured cells among ``records`` as its judgement reads them, checked."""
    return [checked(ControlJudgedData, dict(r)) for r in _of_kind(records, RecordKind.THROUGHPUT_CONTROL)]


def judged_relaunches(records: Iterable[RawRecord]) -> list[JudgedCellData]:
    """The relaunched configs' measured cells among ``records`` as the judgements read them, checked."""
    return [checked(JudgedCellData, dict(r)) for r in _of_kind(records, RecordKind.THROUGHPUT_RELAUNCH) if "cell" in r]


def control_unavailable(records: Iterable[RawRecord]) -> list[ControlUnavailableData]:
    """Why no control was measured, as recorded."""
    return [checked(ControlUnavailableData, r) for r in _of_kind(records, RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE)]


def host_envs(records: Iterable[RawRecord]) -> list[HostEnvRecord]:
    """The hosts' environment records among ``records``, checked."""
    return [checked(HostEnvRecord, r) for r in _of_kind(records, RecordKind.HOST_ENV)]


def calibration_runs(records: Iterable[RawRecord]) -> list[CalibrationData]:
    """The calibration probe's runs among ``records``, checked, oldest first."""
    keys = CalibrationData.__annotations__  # the required ones too (inherited)
    runs = [checked(CalibrationData, {k: v for k, v in r.items() if k in keys}) for r in _of_kind(records, RecordKind.CALIBRATION)]
    return sorted(runs, key=lambda run: run["started_at"])


def launch_records(records: Iterable[RawRecord]) -> list[LaunchRecord]:
    """The launch records among ``records``, checked."""
    return [checked(LaunchRecord, r) for r in _of_kind(records, RecordKind.LAUNCH)]


def adaptive_outcome(records: Iterable[RawRecord]) -> AdaptiveSweepRecord | None:
    """The session's adaptive-sweep outcome, if it ran one (the last record wins), checked."""
    found = _of_kind(records, RecordKind.ADAPTIVE_SWEEP)
    return checked(AdaptiveSweepRecord, found[-1]) if found else None
