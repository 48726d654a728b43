"""What the throughput gate says: its statuses, the metrics it gates, and the verdict of a metric and of a cell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_ddtree.measure.stats import fmt_pct as fmt_pct  # re-exported: the gate's messages format changes with it
from pytest_ddtree.metrics import ACCEPT_LENGTH, MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT, REQUEST_GOODPUT, TOKENS_PER_VERIFY
from pytest_ddtree.records.shapes import CellVerdictData, MetricVerdictData
from pytest_ddtree.records.words import MeasurementStatus, Status, Verdict


Direction = Literal["higher", "lower"]


#: Blessed sessions a baseline keeps (bless appends one and drops the oldest).
DEFAULT_SESSIONS_KEPT = 3


#: A metric baseline needs this many samples to be trusted (one session of 3 repeats).
MIN_BASELINE_SAMPLES = 3


class BaselineFormatError(ValueError):
    """A baseline file's ``metrics`` section does not have the expected shape."""


@dataclass(frozen=True)
class MetricSpec:
    """A gated metric: its key, which way is better, tolerance floor and assumed day shift."""

    key: str
    direction: Direction
    tolerance: float
    unit: str
    label: str
    day_shift: float = 0.02  # assumed day-to-day sigma when the baseline cannot show it


#: What the gate checks. Throughput is the headline; acceptance catches a drafter/verify
#: change even when the clock hides it; TTFT p50 catches prefill/scheduling regressions.
GATED_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(OUTPUT_THROUGHPUT, "higher", 0.05, "tok/s", "output tok/s"),
    MetricSpec(TOKENS_PER_VERIFY, "higher", 0.03, "tok/step", "tokens per verify step", day_shift=0.01),
    MetricSpec(MEDIAN_TTFT_MS, "lower", 0.25, "ms", "TTFT p50"),
    # only where an SLO is set (--ddtree-slo, a matrix or profile slo:): good requests per second
    MetricSpec(REQUEST_GOODPUT, "higher", 0.05, "req/s", "goodput"),
)


SPECS: dict[str, MetricSpec] = {s.key: s for s in GATED_METRICS}


#: Gate keys renamed since baselines were first written: old name -> current. A baseline file
#: with the old key is read as the current one (and rewritten with it at the next bless).
RENAMED_GATES = {ACCEPT_LENGTH: TOKENS_PER_VERIFY}


#: Statuses that fail a cell's test.
FAILING = (Status.REGRESSION, Status.INVALID, Status.METRIC_MISSING)


@dataclass(frozen=True)
class MetricBaseline:
    """One metric of one cell's baseline: samples grouped by blessed session, oldest first."""

    key: str
    direction: Direction
    tolerance: float
    unit: str
    sessions: tuple[tuple[str, tuple[float, ...]], ...]

    @property
    def samples(self) -> list[float]:
        return [v for _, values in self.sessions for v in values]

    @classmethod
    def from_entry(cls, key: str, entry: Mapping[str, Any]) -> MetricBaseline:
        spec = SPECS.get(key)
        sessions: list[tuple[str, tuple[float, ...]]] = []
        if isinstance(entry.get("sessions"), list):
            for i, s in enumerate(entry["sessions"]):
                sessions.append((str(s.get("session", i)), tuple(float(v) for v in s.get("samples") or [])))
        else:  # the single-session layout of schema 1
            values = entry.get("samples") or [entry["median"]]
            sessions.append(("legacy", tuple(float(v) for v in values)))
        return cls(key, entry["direction"], float(entry["tolerance"]),
                   str(entry.get("unit", spec.unit if spec else "")), tuple(sessions))


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    status: Verdict
    direction: Direction
    tolerance: float
    baseline_median: float | None
    current_median: float | None
    change: float | None  # signed relative change of the median, (now - base) / base
    ci_low: float | None = None  # labelled interval of the relative change
    ci_high: float | None = None
    unit: str = ""
    message: str = ""
    shift: float | None = None  # the config's common change removed before judging
    ci_label: str = ""
    first_change: float | None = None  # the first pass, when a confirmation decided
    baseline_samples: int = 0
    baseline_sessions: int = 0
    shift_se: float | None = None  # of the config's common change, log units (None: < 3 cells)
    blessed_shifts: tuple[tuple[str, float], ...] = ()  # the config's common change per blessed session (log)
    floor: float | None = None  # the baseline's tolerance floor for this metric
    confirm_change: float | None = None  # the confirmation's relative change, the config's common change removed

    def as_dict(self) -> MetricVerdictData:
        return {
            "metric": self.metric,
            "status": self.status,
            "direction": self.direction,
            "tolerance": self.tolerance,
            "baseline_median": self.baseline_median,
            "current_median": self.current_median,
            "change": self.change,
            "config_shift": self.shift,
            "tolerance_floor": self.floor,
            "config_shift_se": self.shift_se,
            "config_blessed_shifts": dict(self.blessed_shifts) if self.blessed_shifts else None,
            "first_pass_change": self.first_change,
            "change_ci": [self.ci_low, self.ci_high] if self.ci_low is not None else None,
            "change_ci_label": self.ci_label or None,
            "baseline_samples": self.baseline_samples,
            "baseline_sessions": self.baseline_sessions,
            "message": self.message,
        }


@dataclass(frozen=True)
class CellVerdict:
    cell: str
    status: Verdict
    metrics: tuple[MetricVerdict, ...] = ()
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> bool:
        """True when the cell must fail the gate (regression, invalid, a gated metric gone)."""
        return self.status in FAILING

    @property
    def flagged(self) -> bool:
        return any(m.status == Status.FLAGGED for m in self.metrics)

    def metric(self, key: str) -> MetricVerdict | None:
        return next((m for m in self.metrics if m.metric == key), None)

    def message(self, config: str = "") -> str:
        """One human-readable paragraph: what happened and what to do."""
        where = f"{config} {self.cell}".strip()
        if self.status == Status.INVALID:
            head = f"{where}: INVALID measurement (not a regression, not a pass):"
            shown = [f"  - {r if len(r) <= 200 else r[:197] + '...'}" for r in self.reasons[:5]]
            if len(self.reasons) > 5:
                shown.append(f"  - ... and {len(self.reasons) - 5} more (all in the results records)")
            return "\n".join([head, *shown])
        lines = [f"{where}: {self.status.upper()}"]
        lines.extend(f"  - {r}" for r in self.reasons)
        lines.extend(f"  - {m.message}" for m in self.metrics if m.message)
        return "\n".join(lines)

    def as_dict(self) -> CellVerdictData:
        return {
            "cell": self.cell,
            "status": self.status,
            "reasons": list(self.reasons),
            "metrics": {m.metric: m.as_dict() for m in self.metrics},
        }


@dataclass(frozen=True)
class CellInput:
    """What the gate needs of one measured cell."""

    baseline: Mapping[str, Any] | None  # the ``metrics.<cell>`` entry, None when missing
    current: Mapping[str, Sequence[float]]  # gated metric -> repeat samples
    status: MeasurementStatus = Status.VALID  # the measurement's own status (measurement_status)
    problems: Sequence[str] = ()
    workload: Mapping[str, Any] | None = None


def fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"
