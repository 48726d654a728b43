"""What the throughput gate says: its statuses, the metrics it gates, and the verdict of a metric and of a cell;
and whether a cell's measurement can be judged at all (the engine kept busy, the client's concurrency,
the repeats' agreement), and whether it may be blessed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_ddtree.measure.stats import fmt_pct as fmt_pct  # re-exported: the gate's messages format changes with it
from pytest_ddtree.metrics import ACCEPT_LENGTH, MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT, REQUEST_GOODPUT, TOKENS_PER_VERIFY
from pytest_ddtree.records.shapes import CellVerdictData, MetricVerdictData
from pytest_ddtree.records.words import MeasurementStatus, Status, Verdict
from pytest_ddtree.measure import stats
from pytest_ddtree.service.validated_profile import DEFAULT_BLESS_MAX_HALF_WIDTH


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


#: Below this median engine busy fraction (engines that report their simulated clock: the
#: reference engine) the host, not the config, set the pace: the cell is inconclusive.
MIN_ENGINE_BUSY_FRACTION = 0.85


#: Below this share of its simulated clock kept while it had work (engines that report the wall time
#: they had work: the reference engine), a repeat measured the host: a host that keeps up keeps
#: 99-100% in every cell, and a c32 cell whose passes ran late on a loaded 2-core box kept 70-90%
#: (5-25% fewer tok/s) with at most one overrun and an engine busy 86-90% of the measured time.
MIN_ENGINE_CLOCK_SHARE = 0.95


#: A client that kept fewer requests in flight than this share of the configured concurrency
#: measured a lighter load than the cell names (a starved or overloaded load generator): the
#: engine then looks busy and its own figures cannot tell; the cell is inconclusive.
MIN_CONCURRENCY_SHARE = 0.90


#: A bless asks more of a cell than a judged run: the 95% t-interval of its output tok/s within the
#: profile's ``bless_max_half_width`` (+-5% by default), after up to ``measurement.MAX_EXTRA_REPEATS``
#: extra repeats; a judged run tolerates the robust spread of ``max_repeat_spread`` (12%).
BLESS_MAX_HALF_WIDTH = DEFAULT_BLESS_MAX_HALF_WIDTH


def open_loop(metrics: Mapping[str, Any]) -> bool:
    """Whether a repeat was sent on an arrival schedule (bench_serving's finite ``request_rate``).

    Such a repeat's engine is idle between arrivals by design, and the requests in flight follow
    the rate, not a client count: the busy-fraction floor and the client-concurrency checks, made
    for a closed loop that keeps the engine fed, would call every light load a starved client.
    What still holds is the engine's clock while it had work (``ddtree_engine_clock_share``)."""
    rate = metrics.get("request_rate")
    return stats.is_number(rate) and math.isfinite(float(rate))


def concurrency_shortfall(repeats: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the client's load was lighter than the cell's concurrency, or None.

    The figure is the requests in flight while requests were still waiting to be sent
    (``ddtree_loaded_concurrency``), bench_serving's ``concurrency`` where a repeat has none:
    bench_serving's figure also counts the drain at the end of a finite closed loop, which a
    healthy engine shows too (16 requests at concurrency 8: 6.4-7.2)."""
    shares, shown = [], []
    for m in repeats:
        if open_loop(m):
            continue
        configured = m.get("max_concurrency")
        achieved = m.get("ddtree_loaded_concurrency")
        if not stats.is_number(achieved):
            achieved = m.get("concurrency")
        if stats.is_number(configured) and configured > 0 and stats.is_number(achieved):
            shares.append(float(achieved) / float(configured))
            shown.append(round(float(achieved), 1))
    if not shares or stats.median(shares) >= MIN_CONCURRENCY_SHARE:
        return None
    configured = next(m.get("max_concurrency") for m in repeats if stats.is_number(m.get("max_concurrency")))
    served = [round(float(c), 1) for m in repeats if stats.is_number(c := m.get("concurrency"))]
    return (f"the client kept only {shown} requests in flight per repeat of the configured {configured} "
            f"({1 - stats.median(shares):.0%} short, more than {1 - MIN_CONCURRENCY_SHARE:.0%}; bench_serving's "
            f"concurrency {served}): the engine saw a lighter load than the cell names (a starved or overloaded "
            "load generator), whatever it reports")


def repeat_load_problem(metrics: Mapping[str, Any], min_busy_fraction: float = MIN_ENGINE_BUSY_FRACTION) -> str | None:
    """Why one repeat measured the machine rather than the config, or None when it is clean.

    ``metrics`` is the repeat's ``CellResult.metrics()`` with ``clock_overruns`` (the service's
    counter differenced over the repeat) where the service reports one. Spoiled: the service fell
    behind its own clock more than once, or its engine was busy less than ``min_busy_fraction`` of
    the measured time or kept less than ``MIN_ENGINE_CLOCK_SHARE`` of its clock while it had work
    (``ddtree_engine_clock_share``: passes that each ran a little late add up to a slower repeat
    without a single overrun, and in a short repeat they hide under the busy-fraction floor, which
    must leave room for the gaps a single client leaves), or the client kept fewer than
    ``MIN_CONCURRENCY_SHARE`` of the configured requests in flight while requests were waiting to
    be sent. Such a repeat is retaken, not counted (``stats.run_interleaved``)."""
    overruns = metrics.get("clock_overruns")
    if stats.is_number(overruns) and overruns > 1:
        return f"the service fell behind its own clock {overruns:g} times"
    kept = metrics.get("ddtree_engine_clock_share")
    if stats.is_number(kept) and kept < MIN_ENGINE_CLOCK_SHARE:
        return (f"the engine kept only {kept:.0%} of its simulated clock while it had work (below "
                f"{MIN_ENGINE_CLOCK_SHARE:.0%}): its passes ran late on this host")
    if open_loop(metrics):
        return None
    busy = metrics.get("ddtree_engine_busy_fraction")
    if stats.is_number(busy) and busy < min_busy_fraction:
        return f"the engine was busy only {busy:.0%} of the measured time (below {min_busy_fraction:.0%})"
    configured, achieved = metrics.get("max_concurrency"), metrics.get("ddtree_loaded_concurrency")
    if not stats.is_number(achieved):
        achieved = metrics.get("concurrency")
    if stats.is_number(configured) and configured > 0 and stats.is_number(achieved) \
            and achieved / configured < MIN_CONCURRENCY_SHARE:
        return (f"the client kept only {achieved:.1f} of {configured} requests in flight "
                f"(below {MIN_CONCURRENCY_SHARE:.0%})")
    return None


#: What a reader does about a measurement that describes the machine.
WHAT_TO_DO = "rerun on a quieter machine (fewer -n workers, nothing else running) or raise --ddtree-repeats"


def measurement_status(
    policy: stats.RepeatPolicy,
    primary: Sequence[float],
    invalid: bool,
    repeats: Sequence[Mapping[str, Any]],
    problems: Sequence[str] = (),
    min_busy_fraction: float = MIN_ENGINE_BUSY_FRACTION,
    spoiled: Sequence[str] = (),
) -> tuple[MeasurementStatus, list[str]]:
    """The status of a measured cell and the reasons behind a non-valid one.

    ``primary`` and ``repeats`` are the repeats that count; ``spoiled`` describes each repeat that
    was retaken because it measured the machine (``repeat_load_problem``). invalid: errors or
    wrong token counts in any repeat; inconclusive: fewer clean repeats than the policy's minimum
    (too many were spoiled: the evidence is each spoiled repeat's reason), the repeats still
    disagree after the extra repeats (policy), or the counted repeats themselves show a loaded
    machine - any service that reports ``clock_overruns`` (more than one per repeat in most
    repeats) or an engine busy fraction (simulated busy time over our wall time) below
    ``min_busy_fraction``: the numbers would describe the machine, not the config.
    """
    if invalid:
        return Status.INVALID, list(problems)[:20] or ["measurement invalid"]
    if spoiled and len(primary) < policy.min_repeats:
        shown = "; ".join(spoiled[:8]) + (f"; ... and {len(spoiled) - 8} more" if len(spoiled) > 8 else "")
        return Status.INCONCLUSIVE, [
            f"only {len(primary)} clean repeat(s) of the {policy.min_repeats} needed: {len(spoiled)} repeat(s) measured "
            f"the machine, not the config, and were retaken as far as the extra repeats allow ({shown}); {WHAT_TO_DO}"]
    status = policy.status(primary, invalid=invalid)
    if status == Status.INVALID:
        return status, list(problems)[:20] or ["measurement invalid"]
    what_to_do = WHAT_TO_DO
    if status == Status.INCONCLUSIVE:
        spread = policy.spread(primary) if primary else math.inf
        return status, [f"repeats disagree after {len(primary)} repeats: output tok/s {[round(p, 1) for p in primary]} "
                        f"(robust spread {spread:.1%} > {policy.inconclusive_rel_ci:.0%}); {what_to_do}"]
    fractions = [float(f) for m in repeats if not open_loop(m) and stats.is_number(f := m.get("ddtree_engine_busy_fraction"))]
    if fractions and stats.median(fractions) < min_busy_fraction:
        return Status.INCONCLUSIVE, [
            f"the engine was busy only {stats.median(fractions):.0%} of the measured time (host overloaded or "
            f"client too slow): the numbers describe the machine, not the config; {what_to_do}"]
    overruns = [float(o) for m in repeats if stats.is_number(o := m.get("clock_overruns"))]
    if overruns and stats.median(overruns) > 1:
        return Status.INCONCLUSIVE, [
            f"the service fell behind its own clock in most repeats (clock_overruns per repeat {overruns}): "
            f"the numbers describe the machine, not the config; {what_to_do}"]
    short = concurrency_shortfall(repeats)
    if short is not None:
        return Status.INCONCLUSIVE, [f"{short}; {what_to_do}"]
    return status, []


def bless_refusal(status: MeasurementStatus, reasons: Sequence[str], primary: Sequence[float],
                  max_half_width: float = BLESS_MAX_HALF_WIDTH) -> str | None:
    """Why a measured cell must not become part of a baseline, or None when it may.

    A baseline is what every later run is judged against, so a bless asks more than a judged
    run: a valid measurement (not invalid, not inconclusive: repeats that agree, an engine that
    kept its clock, a client that kept the cell's concurrency) whose output tok/s interval is
    within ``max_half_width`` (the profile's ``bless_max_half_width``)."""
    if status != Status.VALID:
        return "; ".join(reasons) or f"the measurement is {status}"
    half = stats.log_mean_half_width(primary)
    if half > max_half_width:
        shown = "unbounded" if math.isinf(half) else f"+-{half:.1%}"
        return (f"output tok/s {[round(p, 1) for p in primary]}: 95% t-interval {shown}, wider than the "
                f"+-{max_half_width:.0%} a bless needs after {len(primary)} repeats (a loaded machine or a "
                "noisy service); rerun on a quieter machine or with more --ddtree-repeats")
    return None


@dataclass(frozen=True)
class BlessDecision:
    """Whether a bless proposes a measured cell for its baseline: ``refusal`` says why not (None:
    it does). Taken once per cell (``judge_bless``, by ``cells.judged_cell``); the cell's table
    status, its proposal (``cells.judge_cell``) and the control's record read it."""

    refusal: str | None = None

    @property
    def blessed(self) -> bool:
        return self.refusal is None


def judge_bless(status: MeasurementStatus, reasons: Sequence[str], primary: Sequence[float],
                max_half_width: float = BLESS_MAX_HALF_WIDTH) -> BlessDecision:
    """A bless trusts a cell only when its measurement does (``bless_refusal``)."""
    return BlessDecision(bless_refusal(status, reasons, primary, max_half_width))
