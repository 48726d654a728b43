"""Throughput/acceptance gate: the rule, its tolerances and the baseline entry format (no pytest).

The design target (docs/benchmarks.md, "Error budget"): an unchanged service passes a whole
sweep of the campaign matrix (18 configs x 6 cells x 3 gated metrics) at least 98% of the time
under 3% repeat noise plus a 2% day-to-day shift, while a 10% drop of one cell's output tok/s
is caught at least 95% of the time, with 3 repeats a cell in the first pass.
``benchmarks/bench_gate.py`` measures both through the functions below.

The rule, per gated metric of a cell (all arithmetic on log values: the noise is multiplicative):

1. **Change.** median(now) against the median of the baseline's samples, which hold the last
   K blessed sessions (K = 3 by default), so one odd blessing day does not become the truth.
2. **Day shift removed.** A machine that is 2% slower today is slower in every cell. The
   config's common change (with >= 3 cells: the mean of its cells' changes without the one in
   five farthest from their median; the median of 3-4) is that shift; each cell is judged on
   its change *relative to it*. The shift itself is judged once per config (step 5), so a
   uniform regression of the whole config is not hidden by it.
3. **Tolerance from measured noise.** sigma = the cell's own within-session standard deviation of
   the log samples (baseline sessions and today's repeats, robust; between half and three times the
   config's median: high concurrency is noisier than a single request); the spread between the baseline's
   sessions beyond what that noise explains is added (the cell's own day-to-day wobble). The
   tolerance is ``max(floor, Z_CELL * standard error of the change)``; the floor is the
   ``tolerance`` in the YAML (5% output tok/s, 3% accept length, 25% TTFT p50, no absolute ms
   floor) and reviewers may edit it.
4. **Flag, then confirm.** The first pass only *flags* a cell, at a lenient screen
   (``Z_FLAG`` standard errors, at least half the floor: a flag costs only confirmation
   repeats); the suite measures flagged cells again (``CONFIRM_REPEATS`` fresh repeats, same
   service lifetime) and the cell fails only when the confirmation alone is beyond the
   confirmation's tolerance too (vLLM's nightly gate: two consecutive violations):
   ``max(CONFIRM_FLOOR_SHARE x floor, Z_CONFIRM x its standard error)``, the noise in that
   standard error being the confirmation's own spread. Not reproduced = pass, with both
   numbers in the record.
5. **Config-wide moves.** The config's shift is judged against ``max(floor, Z_CONFIG * the
   day-to-day spread)``: how much a config's common change moves between blessed sessions
   (``launch_spread``: its launch-to-launch part from each config against the others of its blessed
   session, pooled over every config of the hardware profile; its day part from the blessed days,
   at least the metric's assumed day shift, 2%). Beyond it every cell of the config is flagged
   (and confirmed).
6. **A config against its session** (``judge_session``, at session end): the config's common
   change against the median of the other configs' in the same session, which share that
   day's machine; a config slower as a whole fails here even when each of its cells passed.
   A launch moves a config as a whole about as much as a day, so where the profile can relaunch
   (``relaunch_flagged``) a config beyond a lenient screen (``relaunch_candidates``) is launched
   once more and judged on both launches.
7. **The session's control** (``pytest_ddtree/control.py``, at session end): a non-speculative
   launch judged against its own baseline, each config's speedup over it, and the session's
   uniform shift; every config slower against a control that held fails there.

Noise differs by cell (concurrency 32 is noisier than one request): each cell's noise is pooled
over every config blessed on the hardware profile (``cell_noise``), not guessed from its own three
sessions.

A cell is *inconclusive* also when the client kept too few requests in flight
(``concurrency_shortfall``); a bless refuses what it cannot trust (``bless_refusal``).

Each message gives the change, a labelled 95% t-interval of the ratio (log values) and the
tolerance with what it was made of. Statuses besides pass/regression: *improved*
(beyond tolerance the good way; bless it), *inconclusive* (repeats disagree even after more
repeats: reported, fails under --ddtree-require-baselines), *invalid* (errors: never a
verdict), *missing* (no baseline), *thin* (the baseline has fewer samples than the gate needs:
not trusted), *new* (a metric the baseline lacks: reported) and *metric-missing* (a gated
metric the run did not produce: fails).

Baseline section layout (``baselines/<hardware-profile>/<config>.yaml``, ``metrics``)::

    metrics:
      c8_short:
        workload: {concurrency: 8, context_tokens: 128, output_tokens: 64, requests: 16}
        gates:
          output_throughput:
            direction: higher
            median: 512.3              # of all samples (for the reader)
            tolerance: 0.05            # the floor of the tolerance (editable)
            unit: tok/s
            sessions:                  # the last K blessed sessions, oldest first
            - {session: 20261130T064000Z, samples: [511.0, 512.3, 514.2]}

The old single-session layout (``samples: [...]`` beside ``median``) is still read, as one
session; the next bless rewrites it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pytest_ddtree import stats
from pytest_ddtree.report import TOKENS_PER_VERIFY
from pytest_ddtree.vocabulary import Status, Verdict

Direction = Literal["higher", "lower"]

#: Verdict vocabulary (cell and metric level): vocabulary.Status's words, under the gate's names.
PASS: Final = Status.PASS
IMPROVED: Final = Status.IMPROVED
FLAGGED: Final = Status.FLAGGED  # beyond tolerance in the first pass; waits for its confirmation run
REGRESSION: Final = Status.REGRESSION
INCONCLUSIVE: Final = Status.INCONCLUSIVE
INVALID: Final = Status.INVALID
MISSING: Final = Status.MISSING
THIN: Final = Status.THIN  # baseline with fewer samples than the gate needs: reported, not trusted
NEW: Final = Status.NEW  # metric measured now, absent from the baseline: reported
METRIC_MISSING: Final = Status.METRIC_MISSING  # gated in the baseline, not produced by the run: fails

#: Blessed sessions a baseline keeps (bless appends one and drops the oldest).
DEFAULT_SESSIONS_KEPT = 3
#: A metric baseline needs this many samples to be trusted (one session of 3 repeats).
MIN_BASELINE_SAMPLES = 3
#: Cells a config needs before its common shift is estimated and removed.
MIN_CELLS_FOR_SHIFT = 3
#: z (standard errors) of the first pass's flag, of the confirmation's verdict, and of the
#: config-wide tolerance. The flag is a screen (cheap: only flagged cells are measured again);
#: the confirmation decides, and carries the sweep-level false-alarm budget.
Z_FLAG = 1.0
#: The flag's floor is this share of the metric's tolerance floor.
FLAG_FLOOR_SHARE = 0.5
#: z of a verdict without a confirmation run (improved; a flagged cell that could not be confirmed).
Z_CELL = 3.0
#: The confirmation's verdict: z over its standard error, whose noise is the confirmation's own
#: (its 12 fresh repeats, scaled MAD, between 1x and 3x the config's typical noise), and its floor,
#: a share of the metric's tolerance floor. Chosen with ``benchmarks/bench_gate.py``: the
#: estimated standard error of a single cell is itself noisy, and at 3% repeat noise the floor
#: decides most confirmations, so the floor sits where an unchanged cell's confirmation rarely
#: reaches (about 3 of its real standard errors) and a 10% drop's almost always does. In a noisier
#: cell (concurrency 32 at 5%) the z decides, and the confirmation shares the baseline's error with
#: the first pass that flagged it: at 2.7, 36 such cells of a sweep failed 3.5% of unchanged sweeps;
#: at 3.2 a 3% cell whose confirmation spread wide let 10% drops through.
Z_CONFIRM = 3.0
CONFIRM_FLOOR_SHARE = 1.25
#: Step 5 (a config's common change against the day-to-day spread): a flag there is confirmed by the
#: same launch, so it reproduces a launch's or a drift's shift; a config or a build that moved as a
#: whole is judged by the session check (relaunched) and the control, so this is a backstop.
Z_CONFIG = 5.0
#: Variance factor of a median against a mean under normal noise (pi / 2).
_MEDIAN_VARIANCE = math.pi / 2.0


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
    MetricSpec("output_throughput", "higher", 0.05, "tok/s", "output tok/s"),
    MetricSpec(TOKENS_PER_VERIFY, "higher", 0.03, "tok/step", "tokens per verify step", day_shift=0.01),
    MetricSpec("median_ttft_ms", "lower", 0.25, "ms", "TTFT p50"),
)
SPECS: dict[str, MetricSpec] = {s.key: s for s in GATED_METRICS}
#: Gate keys renamed since baselines were first written: old name -> current. A baseline file
#: with the old key is read as the current one (and rewritten with it at the next bless).
RENAMED_GATES = {"accept_length": TOKENS_PER_VERIFY}

#: Statuses that fail a cell's test.
FAILING = (REGRESSION, INVALID, METRIC_MISSING)


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
    p_value: float | None = None  # kept for readers of old records; the rule is a z-rule
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

    def as_dict(self) -> dict[str, Any]:
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
        return any(m.status == FLAGGED for m in self.metrics)

    def metric(self, key: str) -> MetricVerdict | None:
        return next((m for m in self.metrics if m.metric == key), None)

    def message(self, config: str = "") -> str:
        """One human-readable paragraph: what happened and what to do."""
        where = f"{config} {self.cell}".strip()
        if self.status == INVALID:
            head = f"{where}: INVALID measurement (not a regression, not a pass):"
            shown = [f"  - {r if len(r) <= 200 else r[:197] + '...'}" for r in self.reasons[:5]]
            if len(self.reasons) > 5:
                shown.append(f"  - ... and {len(self.reasons) - 5} more (all in the results records)")
            return "\n".join([head, *shown])
        lines = [f"{where}: {self.status.upper()}"]
        lines.extend(f"  - {r}" for r in self.reasons)
        lines.extend(f"  - {m.message}" for m in self.metrics if m.message)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
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
    status: str = stats.VALID  # the measurement's own status (measurement_status)
    problems: Sequence[str] = ()
    workload: Mapping[str, Any] | None = None


def _fmt_pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"


def _log_median(values: Sequence[float]) -> float | None:
    m = stats.median(values)
    return math.log(m) if m > 0 else None


def _log_centre(values: Sequence[float]) -> float | None:
    """The centre the rule uses, of log values (None when a value is not positive)."""
    if not values or min(values) <= 0:
        return None
    return _centre_of_logs([math.log(v) for v in values])


def _centre_of_logs(logs: Sequence[float]) -> float:
    """Median of up to 4 values, else the mean without the extremes (one each end, two from 10).

    Trimming keeps a wild repeat out, and on more samples a trimmed mean is ~30% less noisy
    than the median. Two from 10: a confirmation's 12 repeats hold two slow outliers (2% of
    repeats 15% slow) 2% of the time, and one left in moved its centre 1.5% towards a false alarm.
    """
    ordered = sorted(logs)
    if len(ordered) <= 4:
        return stats.median(ordered)
    cut = 1 if len(ordered) < 10 else 2
    kept = ordered[cut:-cut]
    return sum(kept) / len(kept)


def _centre_variance(n: int) -> float:
    """Variance of ``_log_centre`` over n samples, in units of sigma^2 (normal noise)."""
    if n <= 1:
        return 1.0
    if n <= 4:
        return {2: 0.5, 3: 0.449, 4: 0.298}[n]
    return 1.1 / n


def _robust_log_sd(groups: Sequence[Sequence[float]]) -> float:
    """Repeat noise (sigma of log values) from groups of repeats, robust to one wild repeat.

    Each group's variance is an Exp(1)-scaled draw of sigma^2 for three repeats (chi^2 with
    2 degrees of freedom / 2), whose median is ln 2: so sigma = sqrt(median variance / ln 2).
    A pooled standard deviation would let one 15% outlier double the tolerance for K sessions.
    """
    variances = []
    for g in groups:
        logs = [math.log(v) for v in g if v > 0]
        if len(logs) < 2:
            continue
        m = sum(logs) / len(logs)
        variances.append(sum((v - m) ** 2 for v in logs) / (len(logs) - 1))
    return math.sqrt(stats.median(variances) / math.log(2.0)) if variances else 0.0


@dataclass
class _Metric:
    """Working state of one metric of one cell while the config is judged."""

    base: MetricBaseline
    current: list[float]
    base_log: float
    cur_log: float
    sigma: float = 0.0
    between: float = 0.0
    shift_variance: float = 0.0  # of the config's common change that is subtracted
    shift_se: float | None = None  # standard error of that common change (log), with >= 3 cells
    blessed_shifts: tuple[tuple[str, float], ...] = ()  # each blessed session's common change (log)
    typical_sigma: float = 0.0  # the config's median noise of this metric (with >= 3 cells)

    @property
    def change_log(self) -> float:
        return self.cur_log - self.base_log

    def std_error(self, n_current: int, sigma: float | None = None) -> float:
        noise = self.sigma if sigma is None else sigma
        within = noise**2 * (_centre_variance(len(self.base.samples)) + _centre_variance(n_current))
        k = max(1, len(self.base.sessions))
        return math.sqrt(within + self.between**2 * (1.0 + 1.0 / k) + self.shift_variance)


def _worse(direction: Direction, log_change: float) -> float:
    """> 0 when the change is in the bad direction."""
    return -log_change if direction == "higher" else log_change


def _common_shift(values: Sequence[float]) -> float:
    """The change all cells share: with 5+ cells the mean without the one farthest from the
    median (one in five), with 3-4 cells the median, so one regressed cell cannot drag it; 0
    with fewer cells.

    Why not the mean without the lowest and highest: when one cell really regressed, that
    drops it *and* the luckiest unchanged cell, so the shift comes out too low by a quarter of
    a cell's noise and hides that much of the regression; dropping only the outlying cell
    keeps the estimate unbiased and uses one cell more.
    """
    if len(values) < MIN_CELLS_FOR_SHIFT:
        return 0.0
    if len(values) < 5:
        return stats.median(values)
    centre = stats.median(values)
    kept = sorted(values, key=lambda v: abs(v - centre))[:len(values) - len(values) // 5]
    return sum(kept) / len(kept)


def _session_shifts(metrics: Mapping[str, _Metric]) -> dict[str, float]:
    """Each blessed session's common shift over the config's cells (log), by session id."""
    per_session: dict[str, list[float]] = {}
    for m in metrics.values():
        for sid, values in m.base.sessions:
            lm = _log_centre(values) if values else None
            if lm is not None:
                per_session.setdefault(sid, []).append(lm - m.base_log)
    return {sid: _common_shift(v) for sid, v in per_session.items()}


def _confirmation_sigma(m: _Metric, confirmation: Sequence[float]) -> float:
    """The cell's repeat noise now: the confirmation's own spread (scaled MAD of its logs: one
    wild repeat does not move it), at least the cell's own noise from its blessed sessions and
    the config's typical noise, at most 2x the latter (the scaled MAD of 12 repeats is itself ~25%
    off: at 3x, a confirmation that happened to spread wide waved a 10% drop through)."""
    own = stats.scaled_mad([math.log(v) for v in confirmation if v > 0]) if len(confirmation) >= 3 else 0.0
    typical = m.typical_sigma or m.sigma
    return min(max(typical, m.sigma, own), 2.0 * typical) if typical > 0 else own


def judge_config(
    cells: Mapping[str, CellInput],
    confirmations: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    launch_spread: Mapping[str, float] | None = None,
    cell_noise: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, CellVerdict]:
    """Verdicts for every measured cell of one config (see the module docstring for the rule).

    Without ``confirmations`` this is the first pass: cells beyond tolerance come back
    ``flagged``. With them (cell -> metric -> fresh repeat samples) flagged metrics are
    decided: regression when the confirmation alone is beyond the tolerance too, pass when
    not; a flagged cell without confirmation samples stays a regression, saying so.
    ``launch_spread`` (metric -> log spread, ``launch_spread``): how much a config's common change
    moves between launches, pooled over every config blessed on this hardware; step 5 judges the
    config's common change against it instead of this config's own three sessions. ``cell_noise``
    (metric -> cell -> log sigma, ``cell_noise``): each cell's repeat noise pooled over every config
    blessed on this hardware, which replaces the config's own thin estimate of it.
    """
    verdicts: dict[str, CellVerdict] = {}
    judged: dict[str, CellInput] = {}
    for name, cell in cells.items():
        early = _early_verdict(name, cell)
        if early is not None:
            verdicts[name] = early
        else:
            judged[name] = cell
    by_metric: dict[str, dict[str, _Metric]] = {}
    for name, cell in judged.items():
        gates = (cell.baseline or {}).get("gates") or {}
        for key, entry in gates.items():
            base = MetricBaseline.from_entry(key, entry)
            current = [float(v) for v in cell.current.get(key) or [] if v is not None]
            if not current or len(base.samples) < MIN_BASELINE_SAMPLES:
                continue
            b, c = _log_centre(base.samples), _log_centre(current)
            if b is None or c is None:
                continue
            by_metric.setdefault(key, {})[name] = _Metric(base, current, b, c)
    shifts: dict[str, float] = {}
    config_flags: dict[str, tuple[float, float]] = {}
    for key, metrics in by_metric.items():
        session_shift = _session_shifts(metrics)
        for m in metrics.values():
            # Pool the blessed sessions after taking out each one's config-wide shift (that
            # day's machine): otherwise trimming would weigh the sessions differently per cell.
            own = [session_shift.get(sid, 0.0) for sid, _ in m.base.sessions]
            aligned = [math.log(v) - shift for (_, values), shift in zip(m.base.sessions, own) for v in values]
            m.base_log = _centre_of_logs(aligned) + sum(own) / len(own)
            groups = [list(v) for _, v in m.base.sessions] + [m.current]
            m.sigma = _robust_log_sd(groups)
            residuals = []
            for sid, values in m.base.sessions:
                lm = _log_centre(values) if values else None
                if lm is not None:
                    residuals.append((lm - m.base_log - session_shift.get(sid, 0.0), len(values)))
            if len(residuals) >= 2:
                raw = sum(r * r for r, _ in residuals) / (len(residuals) - 1)
                expected = stats.mean([m.sigma**2 * _centre_variance(n) for _, n in residuals])
                m.between = math.sqrt(max(0.0, raw - expected))
        if len(metrics) >= MIN_CELLS_FOR_SHIFT:
            # One wild repeat inflates a cell's standard deviation, and three sessions say
            # little about one cell's wobble: a cell's noise counts between 1x and 2x the
            # config's median, its between-session spread is the config's median.
            typical_sigma = stats.median([m.sigma for m in metrics.values()])
            typical_between = stats.median([m.between for m in metrics.values()])
            for m in metrics.values():
                m.typical_sigma = typical_sigma
                # each cell's own noise (high concurrency is noisier than a single request), within
                # half and three times the config's median: four groups of repeats estimate it roughly
                m.sigma = min(max(m.sigma, 0.5 * typical_sigma), 3.0 * typical_sigma)
                m.between = typical_between
        pooled_noise = (cell_noise or {}).get(key) or {}
        for name, m in metrics.items():
            pooled = pooled_noise.get(name)
            if pooled is not None and pooled > 0:
                # the same cell in every config blessed on this hardware: dozens of groups of repeats
                m.sigma = m.typical_sigma = pooled
        # Each cell's change for the shift uses the plain mean of today's logs (less noisy than
        # a median of three; a cell with a wild repeat is trimmed away as a whole).
        shift = _common_shift([sum(math.log(v) for v in m.current) / len(m.current) - m.base_log
                               for m in metrics.values()])
        shifts[key] = shift
        if len(metrics) >= MIN_CELLS_FOR_SHIFT:
            # a mean of n cells' changes without the outlying ones: ~1.2 / n of one change's variance
            typical = stats.median([m.sigma**2 * (_centre_variance(len(m.base.samples)) + 1.0 / len(m.current))
                                    + m.between**2 for m in metrics.values()])
            for m in metrics.values():
                m.shift_variance = typical * 1.2 / len(metrics)
                m.shift_se = math.sqrt(m.shift_variance)
                m.blessed_shifts = tuple(sorted(session_shift.items()))
        if len(metrics) >= MIN_CELLS_FOR_SHIFT:
            tolerance = _config_tolerance(key, metrics, session_shift, (launch_spread or {}).get(key))
            direction = next(iter(metrics.values())).base.direction
            if _worse(direction, shift) > tolerance:
                config_flags[key] = (shift, tolerance)
    for name, cell in judged.items():
        verdicts[name] = _judge_cell(name, cell, by_metric, shifts, config_flags, confirmations)
    return {name: verdicts[name] for name in cells}


def _config_tolerance(key: str, metrics: Mapping[str, _Metric], session_shift: Mapping[str, float],
                      pooled: float | None = None) -> float:
    spec = SPECS.get(key)
    floor = min(m.base.tolerance for m in metrics.values())
    values = list(session_shift.values())
    measured = stats.stdev(values) * math.sqrt(len(values) / (len(values) - 1)) if len(values) >= 2 else 0.0
    # three blessed sessions say little about one config's launch-to-launch spread (2 degrees of
    # freedom): the spread pooled over every config blessed on this hardware says it, where known
    day = max(spec.day_shift if spec else 0.02, pooled if pooled is not None else measured)
    k = max(1, len(values))
    ses = [m.std_error(len(m.current)) for m in metrics.values()]
    shift_se = stats.median(ses) * math.sqrt(_MEDIAN_VARIANCE / len(ses))
    return max(floor, Z_CONFIG * math.sqrt(day**2 * (1.0 + 1.0 / k) + shift_se**2))


def median_chi2_share(dof: int) -> float:
    """Median of chi^2(dof) / dof (Wilson-Hilferty): a sample variance's median share of the true one."""
    return (1.0 - 2.0 / (9.0 * dof)) ** 3 if dof > 0 else 1.0


def blessed_config_shifts(sections: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per metric, each config's common change per blessed session (log; session id -> value)."""
    found: dict[str, list[dict[str, float]]] = {}
    for section in sections:
        by_metric: dict[str, dict[str, _Metric]] = {}
        for name, entry in (section or {}).items():
            if not isinstance(entry, Mapping):
                continue
            for key, gate_entry in (entry.get("gates") or {}).items():
                try:
                    base = MetricBaseline.from_entry(key, gate_entry)
                except (KeyError, TypeError, ValueError):
                    continue
                centre = _log_centre(base.samples)
                if centre is None or len(base.sessions) < 2:
                    continue
                by_metric.setdefault(key, {})[name] = _Metric(base, [], centre, centre)
        for key, metrics in by_metric.items():
            if len(metrics) >= MIN_CELLS_FOR_SHIFT:
                found.setdefault(key, []).append(_session_shifts(metrics))
    return found


def _unbiased_spread(values: Sequence[float]) -> float | None:
    """Sample standard deviation over the median share of chi^2 (few values: mostly below the truth)."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    variance = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance / median_chi2_share(len(values) - 1))


def day_spread(blessed: Sequence[Mapping[str, float]]) -> float | None:
    """How much the blessed sessions' day moved (log): the spread of each blessed session's median
    common change over the configs (``blessed``: each config's session id -> common change), median-
    unbiased; None with fewer than two sessions blessed in 3 or more configs. As many values as
    blessed sessions (three), however many configs: callers count at least the assumed day shift."""
    sessions = sorted({sid for shifts in blessed for sid in shifts})
    medians = [stats.median(v) for sid in sessions if len(v := [b[sid] for b in blessed if sid in b]) >= 3]
    return _unbiased_spread(medians) if len(medians) >= 2 else None


def launch_spread(sections: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """How much a config's common change moves between blessed sessions (launches), per metric (log).

    Each blessed session of a config was one launch of it on one day, so the config's common change
    moves between sessions by a launch-to-launch part (its own) and a day part (shared by every
    config blessed that day). The two are estimated apart, because they are known to very different
    precision: the launch part from each config against the other configs of the same blessed session
    (``config_wobble``: two degrees of freedom per config, pooled over every config of the hardware
    profile), the day part from how the sessions' median common change moved - only as many values as
    blessed sessions, however many configs there are, so it counts at least the metric's assumed day
    shift (``MetricSpec.day_shift``). Pooling the configs' own spreads instead, as if independent,
    counts the three days 18 times and states a day spread that is half the truth a quarter of the time.
    ``sections``: every config's ``metrics`` section; the result is sqrt(launch^2 + day^2). Configs
    blessed in different sessions (no shared session ids) fall back to the median of their own spreads.
    """
    out: dict[str, float] = {}
    for key, configs in blessed_config_shifts(sections).items():
        if len(configs) < 3:
            continue
        spec = SPECS.get(key)
        prior = spec.day_shift if spec else 0.02
        moves = [ConfigMove(str(i), key, "higher", 0.0, 0.0, 0.0, shifts) for i, shifts in enumerate(configs)]
        day = day_spread(configs)
        if day is not None:
            out[key] = math.sqrt(launch_wobble(moves) ** 2 + max(prior, day) ** 2)
            continue
        spreads = [s for shifts in configs if (s := _unbiased_spread(list(shifts.values()))) is not None]
        if len(spreads) >= 3:
            out[key] = max(prior, stats.median(spreads))
    return out


def cell_noise(sections: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each cell's repeat noise (log sigma) per metric, from the blessed repeats of every config.

    Three repeats a session and three sessions say little about one config's cell (four groups of
    three repeats, counting today's), but the same cell (its concurrency, its lengths) is about as
    noisy in every config: pooled over the configs of the hardware profile (``sections``: their
    ``metrics`` sections) the cell's noise is known from dozens of groups, robustly (the median of
    the groups' variances). Returns metric -> cell -> sigma; cells blessed in fewer than 3 configs
    are left out (the config's own estimate stands)."""
    groups: dict[tuple[str, str], list[list[float]]] = {}
    configs: dict[tuple[str, str], int] = {}
    for section in sections:
        for cell, entry in (section or {}).items():
            if not isinstance(entry, Mapping):
                continue
            for key, gate_entry in (entry.get("gates") or {}).items():
                try:
                    base = MetricBaseline.from_entry(key, gate_entry)
                except (KeyError, TypeError, ValueError):
                    continue
                found = [list(v) for _, v in base.sessions if len(v) >= 2]
                if found:
                    groups.setdefault((key, str(cell)), []).extend(found)
                    configs[(key, str(cell))] = configs.get((key, str(cell)), 0) + 1
    out: dict[str, dict[str, float]] = {}
    for (key, cell), found in groups.items():
        if configs[(key, cell)] >= 3:
            out.setdefault(key, {})[cell] = _robust_log_sd(found)
    return out


def _early_verdict(name: str, cell: CellInput) -> CellVerdict | None:
    """Invalid, missing and changed-workload cells are never compared."""
    if cell.status == stats.INVALID:
        return CellVerdict(name, INVALID, (), tuple(cell.problems) or ("measurement invalid",))
    if cell.baseline is None:
        return CellVerdict(name, MISSING, (), ("no baseline for this cell",))
    base_workload = cell.baseline.get("workload")
    if cell.workload is not None and isinstance(base_workload, Mapping):
        diff = {k: (base_workload.get(k), v) for k, v in cell.workload.items() if base_workload.get(k) != v}
        if diff:
            changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())
            return CellVerdict(name, MISSING, (), (
                f"the workload changed since the baseline ({changes}); the old numbers do not apply",))
    return None


def _judge_cell(
    name: str,
    cell: CellInput,
    by_metric: Mapping[str, Mapping[str, _Metric]],
    shifts: Mapping[str, float],
    config_flags: Mapping[str, tuple[float, float]],
    confirmations: Mapping[str, Mapping[str, Sequence[float]]] | None,
) -> CellVerdict:
    gates = (cell.baseline or {}).get("gates") or {}
    verdicts: list[MetricVerdict] = []
    # what to do with a better or a new number: bless it, unless the measurement is not trusted
    advice = ("; bless it with --ddtree-update-baselines" if cell.status != stats.INCONCLUSIVE
              else " (not to be blessed: the measurement is inconclusive)")
    for key, entry in sorted(gates.items()):
        base = MetricBaseline.from_entry(key, entry)
        current = [float(v) for v in cell.current.get(key) or [] if v is not None]
        m = by_metric.get(key, {}).get(name)
        if not current:
            verdicts.append(MetricVerdict(
                key, METRIC_MISSING, base.direction, base.tolerance, stats.median(base.samples), None, None,
                unit=base.unit, baseline_samples=len(base.samples), baseline_sessions=len(base.sessions),
                message=f"{key}: gated in the baseline but not produced by this run (did speculation stop? "
                        "a service that no longer reports it?); if that is intended, re-bless the config"))
            continue
        if m is None:
            verdicts.append(MetricVerdict(
                key, THIN, base.direction, base.tolerance, stats.median(base.samples) if base.samples else None,
                stats.median(current), None, unit=base.unit, baseline_samples=len(base.samples),
                baseline_sessions=len(base.sessions),
                message=f"{key}: the baseline holds {len(base.samples)} sample(s), the gate needs at least "
                        f"{MIN_BASELINE_SAMPLES}: not trusted; re-bless with --ddtree-update-baselines"))
            continue
        confirmation = None
        if confirmations is not None:
            confirmation = [float(v) for v in (confirmations.get(name) or {}).get(key) or [] if v is not None]
        verdicts.append(_judge_metric(key, m, shifts.get(key, 0.0), config_flags.get(key), confirmation, advice))
    for key in sorted(set(cell.current) - set(gates)):
        values = [float(v) for v in cell.current.get(key) or [] if v is not None]
        if values and key in SPECS:
            spec = SPECS[key]
            verdicts.append(MetricVerdict(
                key, NEW, spec.direction, spec.tolerance, None, stats.median(values), None, unit=spec.unit,
                message=f"{key}: new (measured {_fmt(stats.median(values))} {spec.unit}, not in the baseline)"
                        + advice))
    if cell.status == stats.INCONCLUSIVE:
        # Compared for the record, but a measurement that could not be trusted is neither a
        # regression nor a pass, and is not worth a confirmation run.
        verdicts = [dataclasses.replace(v, status=INCONCLUSIVE) if v.status in (FLAGGED, REGRESSION, IMPROVED) else v
                    for v in verdicts]
        return CellVerdict(name, INCONCLUSIVE, tuple(verdicts), tuple(cell.problems or ["repeats disagree"]))
    found = {v.status for v in verdicts}
    worst_first: tuple[Verdict, ...] = (REGRESSION, METRIC_MISSING, FLAGGED, THIN, IMPROVED)
    status: Verdict = next((s for s in worst_first if s in found), PASS)
    return CellVerdict(name, status, tuple(verdicts), ())


def _judge_metric(
    key: str,
    m: _Metric,
    shift: float,
    config_flag: tuple[float, float] | None,
    confirmation: list[float] | None,
    advice: str,
) -> MetricVerdict:
    base = m.base
    direction = base.direction
    flag_at = max(FLAG_FLOOR_SHARE * base.tolerance, Z_FLAG * m.std_error(len(m.current)))
    tolerance = max(base.tolerance, Z_CELL * m.std_error(len(m.current)))
    relative = m.change_log - shift
    worse = _worse(direction, relative)
    flagged_why = ""
    if worse > flag_at:
        flagged_why = (f"{_fmt_pct(math.expm1(relative))} relative to the config's common change "
                       f"{_fmt_pct(math.expm1(shift))}, beyond the first pass's {flag_at:.1%} screen")
    elif config_flag is not None:
        flagged_why = (f"the whole config moved {_fmt_pct(math.expm1(config_flag[0]))}, beyond the config-wide "
                       f"{config_flag[1]:.1%} tolerance (day-to-day spread)")
    base_median = stats.median(base.samples)
    cur_median = stats.median(m.current)
    interval = stats.log_ratio_interval(base.samples, m.current)
    ci = (f" ({interval.label} {_fmt_pct(interval.low - 1)} .. {_fmt_pct(interval.high - 1)})"
          if interval is not None else "")
    what = (f"{key}: {_fmt(base_median)} -> {_fmt(cur_median)} {base.unit}, "
            f"{_fmt_pct(math.expm1(m.change_log))}{ci}")

    def made_of(tol: float, n_now: int, floor: float = base.tolerance, z: float = Z_CELL,
                noise: float = m.sigma) -> str:
        return (f"tolerance {tol:.1%} = max(floor {floor:.1%}, {z} x standard error; "
                f"noise {noise:.1%}, between sessions {m.between:.1%}); {len(base.samples)} baseline samples "
                f"from {len(base.sessions)} session(s) vs {n_now} now")

    first_change: float | None = None
    status: Verdict
    if flagged_why and confirmation is None:
        status, msg = FLAGGED, f"{what}: flagged: {flagged_why}; a confirmation run decides"
    elif flagged_why and not confirmation:
        status = REGRESSION
        msg = (f"{what}: REGRESSION beyond the {tolerance:.1%} tolerance: {flagged_why}; no confirmation run was "
               f"possible ({made_of(tolerance, len(m.current))})")
    elif flagged_why and confirmation is not None:
        conf_log = _log_centre(confirmation)
        conf_sigma = _confirmation_sigma(m, confirmation)
        conf_floor = CONFIRM_FLOOR_SHARE * base.tolerance
        tolerance = max(conf_floor, Z_CONFIRM * m.std_error(len(confirmation), conf_sigma))
        conf_rel = (conf_log - m.base_log - shift) if conf_log is not None else 0.0
        reproduced = _worse(direction, conf_rel) > tolerance
        if config_flag is not None and conf_log is not None and not reproduced:
            reproduced = _worse(direction, conf_log - m.base_log) > config_flag[1]
        first_change = math.expm1(m.change_log)
        conf_txt = (f"confirmation ({len(confirmation)} fresh repeats): {_fmt(stats.median(confirmation))} "
                    f"{base.unit}, {_fmt_pct(math.expm1(conf_log - m.base_log)) if conf_log is not None else '?'}"
                    f" ({_fmt_pct(math.expm1(conf_rel))} relative)")
        if reproduced:
            status = REGRESSION
            msg = (f"{what}: REGRESSION beyond the {tolerance:.1%} tolerance: {flagged_why}; reproduced by the "
                   f"{conf_txt} ({made_of(tolerance, len(confirmation), conf_floor, Z_CONFIRM, conf_sigma)})")
        else:
            status = PASS
            msg = (f"{what}: flagged ({flagged_why}) but not reproduced by the {conf_txt}, "
                   f"within its {tolerance:.1%} tolerance: pass")
    elif -worse > tolerance:
        status = IMPROVED
        msg = f"{what}: improved beyond the {tolerance:.1%} tolerance{advice}"
    else:
        status, msg = PASS, ""
    return MetricVerdict(
        key, status, direction, tolerance, base_median, cur_median, math.expm1(m.change_log), None,
        (interval.low - 1) if interval else None, (interval.high - 1) if interval else None, base.unit, msg,
        shift=math.expm1(shift), ci_label=interval.label if interval else "", first_change=first_change,
        baseline_samples=len(base.samples), baseline_sessions=len(base.sessions), shift_se=m.shift_se,
        blessed_shifts=m.blessed_shifts, floor=base.tolerance)


def compare_metric(key: str, entry: Mapping[str, Any], current: Sequence[float]) -> MetricVerdict:
    """One metric of two finished sessions (reports): judged alone, today's samples standing as
    their own confirmation, since there is no service left to measure again."""
    verdict = compare_cell("cell", {"gates": {key: entry}}, {key: current}, confirmation={key: current})
    found = verdict.metric(key)
    assert found is not None
    return found


def compare_cell(
    cell: str,
    baseline: Mapping[str, Any] | None,
    current: Mapping[str, Sequence[float]],
    *,
    status: str = stats.VALID,
    problems: Sequence[str] = (),
    workload: Mapping[str, Any] | None = None,
    confirmation: Mapping[str, Sequence[float]] | None = None,
) -> CellVerdict:
    """One cell judged alone (no config shift to remove): the first pass, or with its confirmation."""
    cells = {cell: CellInput(baseline, current, status, problems, workload)}
    return judge_config(cells, None if confirmation is None else {cell: confirmation})[cell]


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
#: A bless asks more of a cell than a judged run: the 95% t-interval of its output tok/s (mean of
#: log values, not robust: two slow repeats of three widen it) within +-5%, after up to
#: ``throughput.MAX_EXTRA_REPEATS`` extra repeats; a judged run tolerates a robust spread of 12%.
BLESS_MAX_HALF_WIDTH = 0.05


def concurrency_shortfall(repeats: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the client's load was lighter than the cell's concurrency, or None.

    The figure is the requests in flight while requests were still waiting to be sent
    (``ddtree_loaded_concurrency``), bench_serving's ``concurrency`` where a repeat has none:
    bench_serving's figure also counts the drain at the end of a finite closed loop, which a
    healthy engine shows too (16 requests at concurrency 8: 6.4-7.2)."""
    shares, shown = [], []
    for m in repeats:
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
) -> tuple[str, list[str]]:
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
        return stats.INVALID, list(problems)[:20] or ["measurement invalid"]
    if spoiled and len(primary) < policy.min_repeats:
        shown = "; ".join(spoiled[:8]) + (f"; ... and {len(spoiled) - 8} more" if len(spoiled) > 8 else "")
        return stats.INCONCLUSIVE, [
            f"only {len(primary)} clean repeat(s) of the {policy.min_repeats} needed: {len(spoiled)} repeat(s) measured "
            f"the machine, not the config, and were retaken as far as the extra repeats allow ({shown}); {WHAT_TO_DO}"]
    status = policy.status(primary, invalid=invalid)
    if status == stats.INVALID:
        return status, list(problems)[:20] or ["measurement invalid"]
    what_to_do = WHAT_TO_DO
    if status == stats.INCONCLUSIVE:
        spread = policy.spread(primary) if primary else math.inf
        return status, [f"repeats disagree after {len(primary)} repeats: output tok/s {[round(p, 1) for p in primary]} "
                        f"(robust spread {spread:.1%} > {policy.inconclusive_rel_ci:.0%}); {what_to_do}"]
    fractions = [float(f) for m in repeats if stats.is_number(f := m.get("ddtree_engine_busy_fraction"))]
    if fractions and stats.median(fractions) < min_busy_fraction:
        return stats.INCONCLUSIVE, [
            f"the engine was busy only {stats.median(fractions):.0%} of the measured time (host overloaded or "
            f"client too slow): the numbers describe the machine, not the config; {what_to_do}"]
    overruns = [float(o) for m in repeats if stats.is_number(o := m.get("clock_overruns"))]
    if overruns and stats.median(overruns) > 1:
        return stats.INCONCLUSIVE, [
            f"the service fell behind its own clock in most repeats (clock_overruns per repeat {overruns}): "
            f"the numbers describe the machine, not the config; {what_to_do}"]
    short = concurrency_shortfall(repeats)
    if short is not None:
        return stats.INCONCLUSIVE, [f"{short}; {what_to_do}"]
    return status, []


def bless_refusal(status: str, reasons: Sequence[str], primary: Sequence[float]) -> str | None:
    """Why a measured cell must not become part of a baseline, or None when it may.

    A baseline is what every later run is judged against, so a bless asks more than a judged
    run: a valid measurement (not invalid, not inconclusive: repeats that agree, an engine that
    kept its clock, a client that kept the cell's concurrency) whose output tok/s interval is
    within ``BLESS_MAX_HALF_WIDTH``."""
    if status != stats.VALID:
        return "; ".join(reasons) or f"the measurement is {status}"
    half = stats.log_mean_half_width(primary)
    if half > BLESS_MAX_HALF_WIDTH:
        shown = "unbounded" if math.isinf(half) else f"+-{half:.1%}"
        return (f"output tok/s {[round(p, 1) for p in primary]}: 95% t-interval {shown}, wider than the "
                f"+-{BLESS_MAX_HALF_WIDTH:.0%} a bless needs after {len(primary)} repeats (a loaded machine or a "
                "noisy service); rerun on a quieter machine or with more --ddtree-repeats")
    return None


def _round(x: float) -> float:
    """6 significant digits: reviewable diffs, no float noise in the YAML."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


def baseline_cell_entry(
    workload: Mapping[str, Any],
    samples: Mapping[str, Sequence[float]],
    existing: Mapping[str, Any] | None = None,
    specs: Sequence[MetricSpec] = GATED_METRICS,
    session: str = "session",
    keep: int = DEFAULT_SESSIONS_KEPT,
) -> dict[str, Any]:
    """The ``metrics.<cell>`` entry after blessing this session's samples.

    The session is appended to the sessions already there (an old single-session entry
    counts as one) and only the last ``keep`` are kept; a workload change starts over, since
    the old numbers measured something else. A tolerance already in ``existing`` (edited by a
    reviewer) is kept; metrics without samples (e.g. acceptance of a non-speculative server)
    are left out.
    """
    old_gates = (existing or {}).get("gates") or {}
    if existing is not None and dict(existing.get("workload") or {}) != dict(workload):
        old_gates = {k: {"tolerance": v.get("tolerance")} for k, v in old_gates.items() if isinstance(v, Mapping)}
    gates: dict[str, Any] = {}
    for spec in specs:
        values = [float(v) for v in samples.get(spec.key) or [] if v is not None]
        if not values:
            continue
        old = old_gates.get(spec.key) or {}
        tolerance = old.get("tolerance")
        tolerance = spec.tolerance if not stats.is_number(tolerance) else float(tolerance)
        history: list[dict[str, Any]] = []
        if "direction" in old:
            history = [{"session": sid, "samples": list(v)}
                       for sid, v in MetricBaseline.from_entry(spec.key, old).sessions if v and sid != session]
        history.append({"session": session, "samples": [_round(v) for v in values]})
        history = history[-keep:]
        pooled = [v for h in history for v in h["samples"]]
        gates[spec.key] = {
            "direction": spec.direction,
            "median": _round(stats.median(pooled)),
            "sessions": history,
            "tolerance": tolerance,
            "unit": spec.unit,
        }
    return {"workload": dict(workload), "gates": gates}


def _renamed_gates(entry: Any, where: str) -> Any:
    """``entry`` with gate keys of RENAMED_GATES under their current names."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("gates"), Mapping):
        return entry
    gates = dict(entry["gates"])
    for old, new in RENAMED_GATES.items():
        if old in gates:
            if new in gates:
                raise BaselineFormatError(f"{where}.gates has both {old!r} (the old name) and {new!r}: "
                                          f"delete the {old!r} entry (it is the same metric)")
            gates[new] = gates.pop(old)
    return {**entry, "gates": gates}


def validate_section(section: Any, where: str) -> dict[str, Any]:
    """Check a loaded ``metrics`` section; raise BaselineFormatError saying what to fix."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise BaselineFormatError(f"{where}: 'metrics' must be a mapping of cell -> entry, got {type(section).__name__}")
    section = {cell: _renamed_gates(entry, f"{where}: metrics.{cell}") for cell, entry in section.items()}
    for cell, entry in section.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("gates", {}), Mapping):
            raise BaselineFormatError(f"{where}: metrics.{cell} must be a mapping with 'workload' and 'gates'")
        for key, gate in (entry.get("gates") or {}).items():
            w = f"{where}: metrics.{cell}.gates.{key}"
            if not isinstance(gate, Mapping):
                raise BaselineFormatError(f"{w} must be a mapping (direction, median, samples, tolerance)")
            if gate.get("direction") not in ("higher", "lower"):
                raise BaselineFormatError(f"{w}.direction must be 'higher' or 'lower', got {gate.get('direction')!r}")
            for num in ("median", "tolerance"):
                if not stats.is_number(gate.get(num)):
                    raise BaselineFormatError(f"{w}.{num} must be a number, got {gate.get(num)!r}")
            if float(gate["tolerance"]) < 0:
                raise BaselineFormatError(f"{w}.tolerance must be >= 0 (a fraction: 0.05 = 5%)")
            samples = gate.get("samples", [])
            if not isinstance(samples, list) or not all(stats.is_number(s) for s in samples):
                raise BaselineFormatError(f"{w}.samples must be a list of numbers")
            sessions = gate.get("sessions", [])
            if not isinstance(sessions, list) or not all(
                    isinstance(s, Mapping) and isinstance(s.get("samples"), list)
                    and all(stats.is_number(v) and v > 0 for v in s["samples"]) for s in sessions):
                raise BaselineFormatError(
                    f"{w}.sessions must be a list of {{session: ID, samples: [positive numbers]}} (oldest first)")
    return dict(section)


# --- A config against the rest of its session -------------------------------------------------
#
# A config that is uniformly slower moves its common change, which step 5 can only judge against
# the day-to-day spread (a 10% drop of one config competes with a 2% day shift). Every config of
# a session shares that day's machine, though: the other configs' common changes measure it.
# At session end each config's common change is compared with the median of the others' (same
# hardware profile and host), and judged against the noise of both plus the config-specific
# spread between the blessed sessions (each blessed session's change of this config against the
# others' in that session). There is no confirmation run (the service has moved on), so the
# rule is stricter than a cell's: Z_SESSION standard errors, at least the metric's floor, and the
# config's own change must be in the bad direction beyond half the floor, so with two configs an
# improvement of one is not read as a regression of the other.
#
# A config's launch moves its common change as a whole (KV-cache size, CUDA-graph capture, memory
# layout on a GPU server: about 2% (sd), as much as a day), and the others' median does not cancel
# it. With one launch, a tolerance that keeps 18 configs' false alarms under 1% sits near 8%, and a
# config 10% slower is caught about 3 times in 4. So a config beyond a lenient screen
# (Z_RELAUNCH_SCREEN standard errors: about 1 config in 15 of an unchanged sweep) is relaunched once
# where the profile can (``relaunch_flagged``) and judged on the mean of both launches (the launch
# part of the variance halves) at Z_RELAUNCHED; the relaunch alone must be beyond the screen too.
# bench_gate.py measures the cost: about one relaunch per unchanged sweep of 18 configs.

#: z of a config's common change against its session's other configs (one launch).
Z_SESSION = 3.5
#: The relaunch screen (``relaunch_candidates``) and the verdict on both launches' mean.
Z_RELAUNCH_SCREEN = 1.5
Z_RELAUNCHED = 3.6
#: A flagged config is relaunched at most this often (again while its launches' mean stays beyond the screen).
MAX_RELAUNCHES = 3


@dataclass(frozen=True)
class ConfigMove:
    """One config's common change of one metric this session (log units), from its verdicts."""

    config: str
    metric: str
    direction: Direction
    floor: float
    shift: float
    shift_se: float
    blessed: Mapping[str, float]  # blessed session id -> that session's common change
    group: str = ""  # hardware profile / host: configs are compared only within one group


@dataclass(frozen=True)
class SessionFinding:
    config: str
    metric: str
    status: Verdict  # REGRESSION or PASS
    shift: float  # the config's common change (relative, not log)
    others: float  # the median common change of the other configs
    relative: float
    tolerance: float
    compared_with: tuple[str, ...]
    message: str
    relaunched: bool = False  # judged on two launches (the relaunch screen flagged the first)

    @property
    def failed(self) -> bool:
        return self.status == REGRESSION

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_moves(records: Sequence[Mapping[str, Any]]) -> list[ConfigMove]:
    """Each config's common change per metric, from its throughput records (``verdict.metrics``).

    Only configs judged with a common change (>= 3 cells with baselines) take part. Records of
    several relaunches of a config (their ``relaunch`` index) give one move each, in that order."""
    found: dict[tuple[str, int, str], ConfigMove] = {}
    for rec in records:
        metrics = ((rec.get("verdict") or {}).get("metrics")) or {}
        config = str(rec.get("config") or "")
        group = f"{rec.get('hardware_profile') or ''}@{rec.get('host') or ''}"
        for key, m in metrics.items():
            if not isinstance(m, Mapping) or m.get("config_shift_se") is None or m.get("config_shift") is None:
                continue
            launch = int(rec.get("relaunch") or 0)
            if (config, launch, key) in found:
                continue
            found[(config, launch, key)] = ConfigMove(
                config, key, m.get("direction", "higher"), float(m.get("tolerance_floor") or 0.0),
                math.log1p(float(m["config_shift"])), float(m["config_shift_se"]),
                {str(k): float(v) for k, v in (m.get("config_blessed_shifts") or {}).items()}, group)
    return [found[k] for k in sorted(found, key=lambda k: k[1])]


def _median_se(ses: Sequence[float]) -> float:
    """Standard error of the median of values with these standard errors."""
    n = len(ses)
    if n <= 2:
        return math.sqrt(sum(s * s for s in ses)) / n
    return stats.median(ses) * math.sqrt(_MEDIAN_VARIANCE / n)


def _wobble(moves: Sequence[ConfigMove]) -> tuple[float, int]:
    """``config_wobble`` and its degrees of freedom."""
    variances = []
    dofs = []
    for c in moves:
        diffs = []
        for sid, value in c.blessed.items():
            others = [o.blessed[sid] for o in moves if o is not c and sid in o.blessed]
            if others:
                diffs.append(value - stats.median(others))
        if len(diffs) >= 2:
            m = sum(diffs) / len(diffs)
            variances.append(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1))
            dofs.append(len(diffs) - 1)
    if not variances:
        return 0.0, 0
    n = len(variances)
    dof = int(stats.median(dofs))
    if n < 6:
        # few configs: the median, over its expected share of the true variance (0.70 at 2 degrees
        # of freedom), so launch-to-launch shifts are not underestimated half the time; its own
        # uncertainty is not priced in (0: a t quantile of 4-10 degrees of freedom would make the
        # check of a session of 2-5 configs blind)
        return math.sqrt(stats.median(variances) / median_chi2_share(dof)), 0
    # the mean of the configs' sample variances without the largest (one odd config), over that
    # trimmed mean's expected share of the true variance: ~1.5x as precise as their median, and the
    # tolerances built on it are only as good as it is
    largest = _chi2_share_quantile(dof, (n - 0.375) / (n + 0.25))
    share = (n - largest) / (n - 1)
    return math.sqrt(sum(sorted(variances)[:-1]) / (n - 1) / share), dof * (n - 1)


def _chi2_share_quantile(dof: int, p: float) -> float:
    """Quantile p of chi^2(dof) / dof (Wilson-Hilferty)."""
    z = _normal_quantile(p)
    h = 2.0 / (9.0 * dof)
    return max(0.0, (1.0 - h + z * math.sqrt(h)) ** 3)


def _normal_quantile(p: float) -> float:
    """Standard normal quantile (bisection on erf: called a few times a session)."""
    low, high = -10.0, 10.0
    for _ in range(80):
        mid = (low + high) / 2.0
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def t_quantile(z: float, dof: int) -> float:
    """The z of a normal tail widened for a standard error known from ``dof`` degrees of freedom
    (Student's t quantile, Cornish-Fisher to second order): a spread estimated from three blessed
    sessions of 18 configs is itself off by ~12%, which at 3.6 standard errors multiplies the false
    alarms several times; unbounded dof (or 0: not estimated) leaves z as it is."""
    if dof <= 0:
        return z
    return z + (z**3 + z) / (4.0 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96.0 * dof**2)


def config_wobble(moves: Sequence[ConfigMove]) -> float:
    """The config-specific spread between blessed sessions (log): per config, the sample standard
    deviation of its blessed sessions' common change against the others' median in the same
    session; pooled over the configs (three sessions say little about one config)."""
    return _wobble(moves)[0]


def _session_reference(c: ConfigMove, members: Sequence[ConfigMove]) -> tuple[float, float, float, tuple[str, ...]]:
    """The other configs' median common change, its standard error, this config's standard error of
    one launch's change against it (log), and the others' names."""
    others = [o for o in members if o is not c]
    ref = stats.median([o.shift for o in others])
    ref_se = _median_se([o.shift_se for o in others])
    k = max(1, len(c.blessed))
    wobble = config_wobble(members)
    se = math.sqrt(c.shift_se**2 + ref_se**2 + wobble**2 * (1.0 + 1.0 / k))
    return ref, ref_se, se, tuple(o.config for o in others)


def _launches_relative(c: ConfigMove, launches: Sequence[ConfigMove], ref: float, ref_se: float,
                       wobble: float) -> tuple[float, float]:
    """The mean of these launches' changes against the session's others (log) and its standard error."""
    n = len(launches)
    k = max(1, len(c.blessed))
    mean = sum(m.shift for m in launches) / n - ref
    se = math.sqrt(sum(m.shift_se**2 for m in launches) / n**2 + ref_se**2 + wobble**2 * (1.0 / n + 1.0 / k))
    return mean, se


def _by_config(relaunched: Sequence[ConfigMove]) -> dict[tuple[str, str, str], list[ConfigMove]]:
    found: dict[tuple[str, str, str], list[ConfigMove]] = {}
    for m in relaunched:
        found.setdefault((m.group, m.metric, m.config), []).append(m)
    return found


def relaunch_candidates(moves: Sequence[ConfigMove], relaunched: Sequence[ConfigMove] = ()) -> list[str]:
    """Configs to launch (once more): beyond the relaunch screen against the session's other configs.

    A config's common change moves with its launch (KV-cache size, CUDA-graph capture, memory
    layout: about as much as a day), so one launch cannot tell a config 10% slower from an unlucky
    launch without failing too many unchanged sweeps. The screen is lenient (``Z_RELAUNCH_SCREEN``
    standard errors, at least half the floor): a flag costs one more launch of the config, measured on
    all its cells. ``relaunched``: the relaunches so far (``config_moves`` of their records); a config
    relaunched fewer than ``MAX_RELAUNCHES`` times is a candidate again while the mean of its launches
    is still beyond the screen but not yet a regression (``judge_session``)."""
    found: set[str] = set()
    again = _by_config(relaunched)
    groups: dict[tuple[str, str], list[ConfigMove]] = {}
    for move in moves:
        groups.setdefault((move.group, move.metric), []).append(move)
    for (group, key), members in groups.items():
        if len(members) < 2:
            continue
        wobble, dof = _wobble(members)
        for c in members:
            ref, ref_se, se, _ = _session_reference(c, members)
            more = again.get((group, key, c.config), [])
            if not more:
                if _screened(c, c.shift - ref, se):
                    found.add(c.config)
                continue
            if len(more) >= MAX_RELAUNCHES or _relaunch_verdict(c, more, ref, ref_se, se, wobble, dof)[0]:
                continue
            mean, se_mean = _launches_relative(c, [c, *more], ref, ref_se, wobble)
            if _screened(c, mean, se_mean):
                found.add(c.config)
    return sorted(found)


def _screened(c: ConfigMove, relative: float, se: float) -> bool:
    return (_worse(c.direction, relative) > max(FLAG_FLOOR_SHARE * c.floor, Z_RELAUNCH_SCREEN * se)
            and _worse(c.direction, c.shift) > FLAG_FLOOR_SHARE * c.floor)


def _relaunch_verdict(c: ConfigMove, more: Sequence[ConfigMove], ref: float, ref_se: float, se: float,
                      wobble: float, dof: int) -> tuple[bool, float, float, float]:
    """A relaunched config: regressed?, the mean of all its launches against the others, the
    tolerance, and the mean of its relaunches alone (log)."""
    both, se_both = _launches_relative(c, [c, *more], ref, ref_se, wobble)
    tolerance = max(c.floor, t_quantile(Z_RELAUNCHED, dof) * se_both)
    later, se_later = _launches_relative(c, more, ref, ref_se, wobble)
    regressed = (_worse(c.direction, both) > tolerance and _screened(c, later, se_later)
                 and _worse(c.direction, both + ref) > FLAG_FLOOR_SHARE * c.floor)
    return regressed, both, tolerance, later


def launch_wobble(moves: Sequence[ConfigMove]) -> float:
    """One launch's own spread (log): ``config_wobble`` without the others' median's share of it
    (against N others the difference moves by 1 + (pi/2)/N launches' worth; 2 with one other)."""
    others = len(moves) - 1
    if others < 1:
        return 0.0
    return config_wobble(moves) / math.sqrt(1.0 + (_MEDIAN_VARIANCE if others > 2 else 1.0) / others)


def judge_session(moves: Sequence[ConfigMove], relaunched: Sequence[ConfigMove] = ()) -> list[SessionFinding]:
    """Each config's common change against the other configs of its session (see above).

    ``relaunched``: the common changes of configs launched again because ``relaunch_candidates``
    flagged them (``config_moves`` of the relaunches' records, in order). Such a config is judged on
    the mean of all its launches (``Z_RELAUNCHED`` standard errors of that mean, at least the floor),
    and its relaunches alone must be beyond the screen too: one slow launch that the relaunch does not
    reproduce is the launch, not the config. A config without a relaunch is judged on its one launch
    by the stricter ``Z_SESSION``."""
    second = _by_config(relaunched)
    groups: dict[tuple[str, str], list[ConfigMove]] = {}
    for move in moves:
        groups.setdefault((move.group, move.metric), []).append(move)
    findings: list[SessionFinding] = []
    for (group, key), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        wobble, dof = _wobble(members)
        for c in sorted(members, key=lambda m: m.config):
            ref, ref_se, se, names = _session_reference(c, members)
            relative = c.shift - ref
            more = second.get((group, key, c.config), [])
            if more:
                regressed, judged, tolerance, later = _relaunch_verdict(c, more, ref, ref_se, se, wobble, dof)
                shown_se = _launches_relative(c, [c, *more], ref, ref_se, wobble)[1]
                launches = (f"; relaunched {len(more)} time(s) (its first launch {_fmt_pct(math.expm1(relative))} "
                            f"relative was beyond the screen): the relaunches {_fmt_pct(math.expm1(later))}, all "
                            f"{len(more) + 1} launches {_fmt_pct(math.expm1(judged))}")
                z = t_quantile(Z_RELAUNCHED, dof)
            else:
                z = t_quantile(Z_SESSION, dof)
                tolerance = max(c.floor, z * se)
                regressed = (_worse(c.direction, relative) > tolerance
                             and _worse(c.direction, c.shift) > FLAG_FLOOR_SHARE * c.floor)
                launches, judged, shown_se = "", relative, se
            what = (f"{c.config}: {key} moved {_fmt_pct(math.expm1(c.shift))} against its baseline (all its cells "
                    f"together) while the session's other {len(names)} config(s) moved "
                    f"{_fmt_pct(math.expm1(ref))} (median): {_fmt_pct(math.expm1(relative))} relative{launches}")
            made_of = (f"tolerance {tolerance:.1%} = max(floor {c.floor:.1%}, {z:.2g} x standard error {shown_se:.1%}"
                       f"{f' (t, {dof} degrees of freedom)' if dof else ''}; this "
                       f"config's change ±{c.shift_se:.1%}, the others' ±{ref_se:.1%}, config-specific spread "
                       f"between blessed sessions (launches) {wobble:.1%})")
            if regressed:
                message = (f"{what}, beyond the {made_of}: a REGRESSION of this config against the rest of the "
                           "session (a config slower as a whole can pass cell by cell: each cell is judged against "
                           f"the config's own common change). Compared with: "
                           f"{', '.join(names)}. Re-run them together to see it again; if the change is intended, "
                           "re-bless the config with --ddtree-update-baselines")
            else:
                message = f"{what}, within the {made_of}"
            findings.append(SessionFinding(c.config, key, REGRESSION if regressed else PASS, math.expm1(c.shift),
                                           math.expm1(ref), math.expm1(judged), tolerance, names, message,
                                           relaunched=bool(more)))
    return findings
