"""The throughput gate's rule: a config's cells against their baselines, and the arithmetic it is made of (no pytest).

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
   again, until it is a regression, a sequential test on its relaunches rules one out, or
   ``MAX_RELAUNCHES``, and judged on all its launches.
7. **The session's control** (``pytest_ddtree/gates/throughput/control.py``, at session end): a non-speculative
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

The arithmetic is on log values: robust centres and spreads, their variances, and the quantiles of
the chi-square, normal and t distributions the tolerances use (``robust_log_sd``, ``t_widened_z``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_ddtree.measure import stats
from pytest_ddtree.gates.throughput.verdicts import (CellInput, CellVerdict, Direction, MIN_BASELINE_SAMPLES,
                                                     MetricBaseline, MetricVerdict, SPECS, fmt, fmt_pct)
from pytest_ddtree.records.words import MeasurementStatus, Status, Verdict


#: Variance factor of a median against a mean under normal noise (pi / 2).
MEDIAN_VARIANCE = math.pi / 2.0


def log_centre(values: Sequence[float]) -> float | None:
    """The centre the rule uses, of log values (None when a value is not positive)."""
    if not values or min(values) <= 0:
        return None
    return centre_of_logs([math.log(v) for v in values])


def centre_of_logs(logs: Sequence[float]) -> float:
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


def centre_variance(n: int) -> float:
    """Variance of ``log_centre`` over n samples, in units of sigma^2 (normal noise)."""
    if n <= 1:
        return 1.0
    if n <= 4:
        return {2: 0.5, 3: 0.449, 4: 0.298}[n]
    return 1.1 / n


def robust_log_sd(groups: Sequence[Sequence[float]]) -> float:
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


def median_chi2_share(dof: int) -> float:
    """Median of chi^2(dof) / dof (Wilson-Hilferty): a sample variance's median share of the true one."""
    return (1.0 - 2.0 / (9.0 * dof)) ** 3 if dof > 0 else 1.0


def chi2_share_quantile(dof: int, p: float) -> float:
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


def t_widened_z(z: float, dof: int) -> float:
    """The z of a normal tail widened for a standard error known from ``dof`` degrees of freedom:
    the t quantile of the same tail, from z (Cornish-Fisher to second order; not
    ``stats.t_inverse_cdf``, which takes a probability): a spread estimated from three blessed
    sessions of 18 configs is itself off by ~12%, which at 3.6 standard errors multiplies the false
    alarms several times; unbounded dof (or 0: not estimated) leaves z as it is."""
    if dof <= 0:
        return z
    return z + (z**3 + z) / (4.0 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96.0 * dof**2)


#: Cells a config needs before its common shift is estimated and removed.
MIN_CELLS_FOR_SHIFT = 3


#: z (standard errors) of the first pass's flag, of the confirmation's verdict, and of the
#: config-wide tolerance. The flag is a screen (only flagged cells are measured again); the
#: confirmation decides, and carries the sweep-level false-alarm budget. The screen's price is the
#: confirmation's repeats, on a GPU box a minute each: at 1.0 an unchanged sweep of 18 configs under
#: 3% repeat noise flagged about 12 cells' output tok/s and their confirmations cost 14% of the
#: configs' own GPU time; at 1.75, 4% (``bench_gate.py``, ``restart3``), and a cell 10% slower,
#: about 3.6 standard errors, is still flagged nearly always (one cell -10% caught 99.0% of 200 at
#: 1.0, 98.0% of 400 at 1.75).
Z_FLAG = 1.75


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


@dataclass
class Metric:
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
        within = noise**2 * (centre_variance(len(self.base.samples)) + centre_variance(n_current))
        k = max(1, len(self.base.sessions))
        return math.sqrt(within + self.between**2 * (1.0 + 1.0 / k) + self.shift_variance)


def worse_by(direction: Direction, log_change: float) -> float:
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


def session_shifts(metrics: Mapping[str, Metric]) -> dict[str, float]:
    """Each blessed session's common shift over the config's cells (log), by session id."""
    per_session: dict[str, list[float]] = {}
    for m in metrics.values():
        for sid, values in m.base.sessions:
            lm = log_centre(values) if values else None
            if lm is not None:
                per_session.setdefault(sid, []).append(lm - m.base_log)
    return {sid: _common_shift(v) for sid, v in per_session.items()}


def _confirmation_sigma(m: Metric, confirmation: Sequence[float]) -> float:
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
    between_spread: Mapping[str, float] | None = None,
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
    blessed on this hardware, which replaces the config's own thin estimate of it. ``between_spread``
    (metric -> log spread, ``rate_between_spread``): every cell's between-session spread, pooled over
    every config's blessed entry of the same kind, where wider than the cell's own (the rate gate's one
    re-probed cell, whose own three sessions say little; closed-loop cells take the config's median).
    """
    verdicts: dict[str, CellVerdict] = {}
    judged: dict[str, CellInput] = {}
    for name, cell in cells.items():
        early = _early_verdict(name, cell)
        if early is not None:
            verdicts[name] = early
        else:
            judged[name] = cell
    by_metric = _metrics_of(judged)
    shifts: dict[str, float] = {}
    config_flags: dict[str, tuple[float, float]] = {}
    for key, metrics in by_metric.items():
        session_shift = session_shifts(metrics)
        _estimate_noise(metrics, session_shift, (cell_noise or {}).get(key) or {}, (between_spread or {}).get(key))
        shifts[key], flag = _config_shift(key, metrics, session_shift, (launch_spread or {}).get(key))
        if flag is not None:
            config_flags[key] = flag
    for name, cell in judged.items():
        verdicts[name] = _judge_config_cell(name, cell, by_metric, shifts, config_flags, confirmations)
    return {name: verdicts[name] for name in cells}


def _metrics_of(judged: Mapping[str, CellInput]) -> dict[str, dict[str, Metric]]:
    """Each gated metric's cells that can be judged: a baseline with enough samples, and a log
    centre on both sides."""
    by_metric: dict[str, dict[str, Metric]] = {}
    for name, cell in judged.items():
        gates = (cell.baseline or {}).get("gates") or {}
        for key, entry in gates.items():
            base = MetricBaseline.from_entry(key, entry)
            current = [float(v) for v in cell.current.get(key) or [] if v is not None]
            if not current or len(base.samples) < MIN_BASELINE_SAMPLES:
                continue
            b, c = log_centre(base.samples), log_centre(current)
            if b is None or c is None:
                continue
            by_metric.setdefault(key, {})[name] = Metric(base, current, b, c)
    return by_metric


def _estimate_noise(metrics: Mapping[str, Metric], session_shift: Mapping[str, float], pooled_noise: Mapping[str, float],
                    pooled_between: float | None = None) -> None:
    """Each cell's baseline centre, repeat noise and between-session spread (steps 1 and 3), held
    within the config's typical noise, and replaced by the noise (and the between-session spread)
    pooled over the hardware profile where given."""
    # the level every cell's baseline is put at: the config's blessed sessions on average. A cell
    # that lacks a session (its bless refused there) would otherwise sit at the average of its own
    # sessions, off the other cells' by that session's share of the launch shift, and be judged
    # against the config's common change with that offset (bench_gate.py: most unchanged cells that
    # failed under a per-launch shift lacked a session)
    level = sum(session_shift.values()) / len(session_shift) if session_shift else 0.0
    for m in metrics.values():
        # Pool the blessed sessions after taking out each one's config-wide shift (that
        # day's machine): otherwise trimming would weigh the sessions differently per cell.
        own = [session_shift.get(sid, 0.0) for sid, _ in m.base.sessions]
        aligned = [math.log(v) - shift for (_, values), shift in zip(m.base.sessions, own) for v in values]
        m.base_log = centre_of_logs(aligned) + level
        groups = [list(v) for _, v in m.base.sessions] + [m.current]
        m.sigma = robust_log_sd(groups)
        residuals = []
        for sid, values in m.base.sessions:
            lm = log_centre(values) if values else None
            if lm is not None:
                residuals.append((lm - m.base_log - session_shift.get(sid, 0.0), len(values)))
        if len(residuals) >= 2:
            raw = sum(r * r for r, _ in residuals) / (len(residuals) - 1)
            expected = stats.mean([m.sigma**2 * centre_variance(n) for _, n in residuals])
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
    for name, m in metrics.items():
        pooled = pooled_noise.get(name)
        if pooled is not None and pooled > 0:
            # the same cell in every config blessed on this hardware: dozens of groups of repeats
            m.sigma = m.typical_sigma = pooled
        if pooled_between is not None:
            # the larger: a rate entry holds only sessions that sustained its rate, so the pool is
            # biased low (docs/benchmarks.md); an entry whose own sessions disagree keeps its own
            m.between = max(m.between, pooled_between)


def _config_shift(key: str, metrics: Mapping[str, Metric], session_shift: Mapping[str, float],
                  launch_spread: float | None) -> tuple[float, tuple[float, float] | None]:
    """The config's common change of one metric (step 2) with its standard error on each cell, and
    the config-wide flag (step 5: the shift and the tolerance it went beyond), if raised."""
    # Each cell's change for the shift uses the plain mean of today's logs (less noisy than
    # a median of three; a cell with a wild repeat is trimmed away as a whole).
    shift = _common_shift([sum(math.log(v) for v in m.current) / len(m.current) - m.base_log
                           for m in metrics.values()])
    if len(metrics) >= MIN_CELLS_FOR_SHIFT:
        # a mean of n cells' changes without the outlying ones: ~1.2 / n of one change's variance
        typical = stats.median([m.sigma**2 * (centre_variance(len(m.base.samples)) + 1.0 / len(m.current))
                                + m.between**2 for m in metrics.values()])
        for m in metrics.values():
            m.shift_variance = typical * 1.2 / len(metrics)
            m.shift_se = math.sqrt(m.shift_variance)
            m.blessed_shifts = tuple(sorted(session_shift.items()))
    if len(metrics) >= MIN_CELLS_FOR_SHIFT:
        tolerance = _config_tolerance(key, metrics, session_shift, launch_spread)
        direction = next(iter(metrics.values())).base.direction
        if worse_by(direction, shift) > tolerance:
            return shift, (shift, tolerance)
    return shift, None


def _config_tolerance(key: str, metrics: Mapping[str, Metric], session_shift: Mapping[str, float],
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
    shift_se = stats.median(ses) * math.sqrt(MEDIAN_VARIANCE / len(ses))
    return max(floor, Z_CONFIG * math.sqrt(day**2 * (1.0 + 1.0 / k) + shift_se**2))


def _early_verdict(name: str, cell: CellInput) -> CellVerdict | None:
    """Invalid, missing and changed-workload cells are never compared."""
    if cell.status == Status.INVALID:
        return CellVerdict(name, Status.INVALID, (), tuple(cell.problems) or ("measurement invalid",))
    if cell.baseline is None:
        return CellVerdict(name, Status.MISSING, (), ("no baseline for this cell",))
    base_workload = cell.baseline.get("workload")
    if cell.workload is not None and isinstance(base_workload, Mapping):
        # a baseline blessed before prompts had a digest cannot say which prompts it measured: judged as before
        diff = {k: (base_workload.get(k), v) for k, v in cell.workload.items()
                if base_workload.get(k) != v and not (k == "prompts_digest" and k not in base_workload)}
        if diff:
            changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())
            why = (" (the prompts sent differ from the blessed ones: the prompt text or the service's tokenizer changed, "
                   "and acceptance follows the prompts)") if "prompts_digest" in diff else ""
            return CellVerdict(name, Status.MISSING, (), (
                f"the workload changed since the baseline ({changes}){why}; the old numbers do not apply: re-bless it",))
    return None


def _judge_config_cell(
    name: str,
    cell: CellInput,
    by_metric: Mapping[str, Mapping[str, Metric]],
    shifts: Mapping[str, float],
    config_flags: Mapping[str, tuple[float, float]],
    confirmations: Mapping[str, Mapping[str, Sequence[float]]] | None,
) -> CellVerdict:
    gates = (cell.baseline or {}).get("gates") or {}
    verdicts: list[MetricVerdict] = []
    # what to do with a better or a new number: bless it, unless the measurement is not trusted
    advice = ("; bless it with --ddtree-update-baselines" if cell.status != Status.INCONCLUSIVE
              else " (not to be blessed: the measurement is inconclusive)")
    for key, entry in sorted(gates.items()):
        base = MetricBaseline.from_entry(key, entry)
        current = [float(v) for v in cell.current.get(key) or [] if v is not None]
        m = by_metric.get(key, {}).get(name)
        if not current:
            verdicts.append(MetricVerdict(
                key, Status.METRIC_MISSING, base.direction, base.tolerance, stats.median(base.samples), None, None,
                unit=base.unit, baseline_samples=len(base.samples), baseline_sessions=len(base.sessions),
                message=f"{key}: gated in the baseline but not produced by this run (did speculation stop? "
                        "a service that no longer reports it?); if that is intended, re-bless the config"))
            continue
        if m is None:
            verdicts.append(MetricVerdict(
                key, Status.THIN, base.direction, base.tolerance, stats.median(base.samples) if base.samples else None,
                stats.median(current), None, unit=base.unit, baseline_samples=len(base.samples),
                baseline_sessions=len(base.sessions),
                message=f"{key}: the baseline holds {len(base.samples)} sample(s), the gate needs at least "
                        f"{MIN_BASELINE_SAMPLES}: not trusted; re-bless with --ddtree-update-baselines"))
            continue
        confirmation = None
        if confirmations is not None:
            confirmation = [float(v) for v in (confirmations.get(name) or {}).get(key) or [] if v is not None]
        verdicts.append(_judge_config_metric(key, m, shifts.get(key, 0.0), config_flags.get(key), confirmation, advice))
    for key in sorted(set(cell.current) - set(gates)):
        values = [float(v) for v in cell.current.get(key) or [] if v is not None]
        if values and key in SPECS:
            spec = SPECS[key]
            verdicts.append(MetricVerdict(
                key, Status.NEW, spec.direction, spec.tolerance, None, stats.median(values), None, unit=spec.unit,
                message=f"{key}: new (measured {fmt(stats.median(values))} {spec.unit}, not in the baseline)"
                        + advice))
    if cell.status == Status.INCONCLUSIVE:
        # Compared for the record, but a measurement that could not be trusted is neither a
        # regression nor a pass, and is not worth a confirmation run.
        verdicts = [dataclasses.replace(v, status=Status.INCONCLUSIVE) if v.status in (Status.FLAGGED, Status.REGRESSION, Status.IMPROVED) else v
                    for v in verdicts]
        return CellVerdict(name, Status.INCONCLUSIVE, tuple(verdicts), tuple(cell.problems or ["repeats disagree"]))
    found = {v.status for v in verdicts}
    worst_first: tuple[Verdict, ...] = (Status.REGRESSION, Status.METRIC_MISSING, Status.FLAGGED, Status.THIN, Status.IMPROVED)
    status: Verdict = next((s for s in worst_first if s in found), Status.PASS)
    return CellVerdict(name, status, tuple(verdicts), ())


def _judge_config_metric(
    key: str,
    m: Metric,
    shift: float,
    config_flag: tuple[float, float] | None,
    confirmation: list[float] | None,
    advice: str,
) -> MetricVerdict:
    base = m.base
    direction = base.direction
    tolerance = max(base.tolerance, Z_CELL * m.std_error(len(m.current)))
    worse = worse_by(direction, m.change_log - shift)
    flagged_why = _flagged_why(m, shift, config_flag)
    base_median = stats.median(base.samples)
    cur_median = stats.median(m.current)
    interval = stats.log_ratio_interval(base.samples, m.current)
    ci = (f" ({interval.label} {fmt_pct(interval.low - 1)} .. {fmt_pct(interval.high - 1)})"
          if interval is not None else "")
    what = (f"{key}: {fmt(base_median)} -> {fmt(cur_median)} {base.unit}, "
            f"{fmt_pct(math.expm1(m.change_log))}{ci}")

    first_change: float | None = None
    confirm_change: float | None = None
    status: Verdict
    if flagged_why and confirmation is None:
        status, msg = Status.FLAGGED, f"{what}: flagged: {flagged_why}; a confirmation run decides"
    elif flagged_why and not confirmation:
        status = Status.REGRESSION
        msg = (f"{what}: REGRESSION beyond the {tolerance:.1%} tolerance: {flagged_why}; no confirmation run was "
               f"possible ({_made_of(m, tolerance, len(m.current), base.tolerance, Z_CELL, m.sigma)})")
    elif flagged_why and confirmation is not None:
        first_change = math.expm1(m.change_log)
        status, msg, tolerance, confirm_change = _judge_confirmation(m, what, flagged_why, shift, config_flag,
                                                                     confirmation)
    elif -worse > tolerance:
        status = Status.IMPROVED
        msg = f"{what}: improved beyond the {tolerance:.1%} tolerance{advice}"
    else:
        status, msg = Status.PASS, ""
    return MetricVerdict(
        key, status, direction, tolerance, base_median, cur_median, math.expm1(m.change_log),
        (interval.low - 1) if interval else None, (interval.high - 1) if interval else None, base.unit, msg,
        shift=math.expm1(shift), ci_label=interval.label if interval else "", first_change=first_change,
        baseline_samples=len(base.samples), baseline_sessions=len(base.sessions), shift_se=m.shift_se,
        blessed_shifts=m.blessed_shifts, floor=base.tolerance, confirm_change=confirm_change)


def _flagged_why(m: Metric, shift: float, config_flag: tuple[float, float] | None) -> str:
    """The first pass's screen: why this cell needs a confirmation run ("" when it does not). A cell
    is flagged by its own move beyond the config's common change, or by its whole config moving."""
    flag_at = max(FLAG_FLOOR_SHARE * m.base.tolerance, Z_FLAG * m.std_error(len(m.current)))
    relative = m.change_log - shift
    if worse_by(m.base.direction, relative) > flag_at:
        return (f"{fmt_pct(math.expm1(relative))} relative to the config's common change "
                f"{fmt_pct(math.expm1(shift))}, beyond the first pass's {flag_at:.1%} screen")
    if config_flag is not None:
        return (f"the whole config moved {fmt_pct(math.expm1(config_flag[0]))}, beyond the config-wide "
                f"{config_flag[1]:.1%} tolerance (day-to-day spread)")
    return ""


def _made_of(m: Metric, tol: float, n_now: int, floor: float, z: float, noise: float) -> str:
    """What a tolerance is made of, so a reader of a regression can check the arithmetic."""
    return (f"tolerance {tol:.1%} = max(floor {floor:.1%}, {z} x standard error; "
            f"noise {noise:.1%}, between sessions {m.between:.1%}); {len(m.base.samples)} baseline samples "
            f"from {len(m.base.sessions)} session(s) vs {n_now} now")


def _judge_confirmation(m: Metric, what: str, flagged_why: str, shift: float, config_flag: tuple[float, float] | None,
                        confirmation: list[float]) -> tuple[Verdict, str, float, float | None]:
    """A flagged cell's second look: the fresh repeats decide, against their own (tighter-floored)
    tolerance; a config-wide flag is reproduced by the confirmation moving beyond the config-wide
    tolerance too. Returns the status, its message, the tolerance applied and the confirmation's
    change relative to the config's common change."""
    base = m.base
    conf_log = log_centre(confirmation)
    conf_sigma = _confirmation_sigma(m, confirmation)
    conf_floor = CONFIRM_FLOOR_SHARE * base.tolerance
    tolerance = max(conf_floor, Z_CONFIRM * m.std_error(len(confirmation), conf_sigma))
    conf_rel = (conf_log - m.base_log - shift) if conf_log is not None else 0.0
    reproduced = worse_by(base.direction, conf_rel) > tolerance
    if config_flag is not None and conf_log is not None and not reproduced:
        reproduced = worse_by(base.direction, conf_log - m.base_log) > config_flag[1]
    confirm_change = math.expm1(conf_rel) if conf_log is not None else None
    conf_txt = (f"confirmation ({len(confirmation)} fresh repeats): {fmt(stats.median(confirmation))} "
                f"{base.unit}, {fmt_pct(math.expm1(conf_log - m.base_log)) if conf_log is not None else '?'}"
                f" ({fmt_pct(math.expm1(conf_rel))} relative)")
    if reproduced:
        msg = (f"{what}: REGRESSION beyond the {tolerance:.1%} tolerance: {flagged_why}; reproduced by the "
               f"{conf_txt} ({_made_of(m, tolerance, len(confirmation), conf_floor, Z_CONFIRM, conf_sigma)})")
        return Status.REGRESSION, msg, tolerance, confirm_change
    msg = (f"{what}: flagged ({flagged_why}) but not reproduced by the {conf_txt}, "
           f"within its {tolerance:.1%} tolerance: pass")
    return Status.PASS, msg, tolerance, confirm_change


def judge_metric_alone(key: str, entry: Mapping[str, Any], current: Sequence[float]) -> MetricVerdict:
    """One metric of two finished sessions (reports): judged alone, today's samples standing as
    their own confirmation, since there is no service left to measure again."""
    verdict = judge_cell_alone("cell", {"gates": {key: entry}}, {key: current}, confirmation={key: current})
    found = verdict.metric(key)
    assert found is not None
    return found


def judge_cell_alone(
    cell: str,
    baseline: Mapping[str, Any] | None,
    current: Mapping[str, Sequence[float]],
    *,
    status: MeasurementStatus = Status.VALID,
    problems: Sequence[str] = (),
    workload: Mapping[str, Any] | None = None,
    confirmation: Mapping[str, Sequence[float]] | None = None,
) -> CellVerdict:
    """One cell judged alone (no config shift to remove): the first pass, or with its confirmation."""
    cells = {cell: CellInput(baseline, current, status, problems, workload)}
    return judge_config(cells, None if confirmation is None else {cell: confirmation})[cell]
