"""Small-sample statistics for the throughput gate (pure Python, deterministic).

Why this module exists: a serving benchmark gives a handful of numbers per cell (one per
repeat), and a CI gate built on them must neither cry wolf on noise nor wave a real
slowdown through. Everything here is written for n = 3..10 samples:

* the median and the MAD (median absolute deviation) instead of mean/stddev, because one
  slow repeat (a GC pause, a noisy neighbour) must not move the centre;
* the order-statistic interval of the median with its true (binomial) coverage, and the
  t-interval of a mean, so "how sure" is a number and two runs on the same data give the
  same verdict (no resampling, no hidden randomness in CI);
* the interleaved repeat scheduler with early stop (AIPerf-style): repeat r of every cell
  runs before repeat r+1 of any cell, so a slow drift of the machine spreads over all cells
  instead of biasing the last one, and a cell whose interval is already tight stops early.

No numpy/scipy: the harness must run wherever pytest runs, and these sizes are tiny.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeGuard, TypeVar

from pytest_ddtree.records.shapes import SpreadData
from pytest_ddtree.records.words import MeasurementStatus, Status

CellStatus = MeasurementStatus


def is_number(value: object) -> TypeGuard[int | float]:
    """A value a statistic can use: an int or a float (not a bool), and finite.

    Metrics reach the gate and the report from JSON records written by other processes (and
    older versions), so any of them may be missing, null, a string or NaN; every reader
    filters with this one check.
    """
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))



def fmt_pct(value: object) -> str:
    """A relative change as a signed percent (0.031 -> ``+3.1%``): the one format of a change in the
    gate's messages, the terminal tables and the HTML page; ``-`` where there is no number."""
    return f"{float(value) * 100:+.1f}%" if is_number(value) else "-"

def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default.

    bench_serving computes its p90/p99 with numpy's default method, so ours match.
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * frac)


def median(values: Sequence[float]) -> float:
    """Median (the 50th percentile)."""
    return percentile(values, 50.0)


def aggregate_repeats(repeats: Sequence[Mapping[str, object]]) -> dict[str, float | None]:
    """Median of every numeric metric over the repeats (the number a table shows)."""
    keys: list[str] = []
    for r in repeats:
        keys.extend(k for k in r if k not in keys)
    out: dict[str, float | None] = {}
    for k in keys:
        values = [float(v) for r in repeats if is_number(v := r.get(k))]
        out[k] = median(values) if values else None
    return out


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return float(sum(values) / len(values))


def stdev(values: Sequence[float]) -> float:
    """Population standard deviation (numpy's default, as bench_serving's std_* keys)."""
    if not values:
        raise ValueError("stdev of an empty sequence")
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled).

    Multiply by 1.4826 for a normal-consistent sigma; we keep the raw value because it is
    what a reader can check by hand against the samples in a baseline file.
    """
    m = median(values)
    return median([abs(v - m) for v in values])


#: MAD x this = a normal-consistent estimate of sigma (1 / Phi^-1(3/4)).
NORMAL_MAD_SCALE = 1.4826


def scaled_mad(values: Sequence[float]) -> float:
    """Robust sigma: one wild repeat of three does not move it (unlike the standard deviation)."""
    return NORMAL_MAD_SCALE * mad(values)


def binomial_cdf(k: int, n: int, p: float = 0.5) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    return float(sum(math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(min(k, n) + 1)))


@dataclass(frozen=True)
class Interval:
    """An interval with the coverage it really has (not the one we wished for)."""

    low: float
    high: float
    coverage: float
    method: str

    @property
    def label(self) -> str:
        return f"{self.coverage:.0%} {self.method}"


def median_interval(samples: Sequence[float], confidence: float = 0.95) -> Interval:
    """Distribution-free interval of the median from order statistics, with its exact coverage.

    [x_(j), x_(n+1-j)] covers the true median with probability 1 - 2 P(Bin(n, 1/2) <= j-1),
    whatever the distribution. We take the narrowest such interval that reaches
    ``confidence``; when n is too small for that (n = 3 gives at most 75%, [min, max]) the
    widest one is returned and its coverage says so, instead of calling it "95%".
    """
    if not samples:
        raise ValueError("median_interval of an empty sequence")
    ordered = sorted(float(v) for v in samples)
    n = len(ordered)
    best = Interval(ordered[0], ordered[-1], 1.0 - 2.0 * binomial_cdf(0, n), "order-statistic interval of the median")
    for j in range(2, n // 2 + 1):
        coverage = 1.0 - 2.0 * binomial_cdf(j - 1, n)
        if coverage < confidence:
            break
        best = Interval(ordered[j - 1], ordered[n - j], coverage, best.method)
    return best


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function (df > 0)."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def _normal_quantile(p: float) -> float:
    """Acklam's rational approximation of the standard normal quantile (|error| < 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def _t_pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                    - (df + 1) / 2 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=4096)
def t_inverse_cdf(p: float, df: float) -> float:
    """The t quantile at probability ``p`` (inverse of :func:`t_cdf`): Newton steps from the normal
    quantile, bisection as a fallback. (The gate's ``rule.t_widened_z`` takes a z instead.)
    Cached: the gate asks the same few (z, degrees of freedom) for every cell of a sweep."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_inverse_cdf needs 0 < p < 1, got {p}")
    t = _normal_quantile(p)
    for _ in range(50):
        step = (t_cdf(t, df) - p) / max(_t_pdf(t, df), 1e-300)
        t -= step
        if abs(step) < 1e-10 * max(1.0, abs(t)):
            return t
    lo, hi = -1e4, 1e4
    while hi - lo > 1e-7 * max(1.0, abs(lo)):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def log_mean_half_width(samples: Sequence[float], confidence: float = 0.95) -> float:
    """Relative half-width of the t-interval of the mean of log samples (0.05 = "+-5%").

    Not robust on purpose: it is what a bless asks of a cell, where two slow repeats of three
    must widen the interval (the robust spread of [1330, 870, 870] is 0). From five samples on,
    the lowest and the highest are left out, as the gate's centre leaves them out: one wild
    repeat of nine does not refuse a cell. inf with fewer than two samples or a value that is
    not positive.
    """
    if len(samples) < 2 or min(samples) <= 0:
        return math.inf
    logs = sorted(math.log(v) for v in samples)
    if len(logs) >= 5:
        logs = logs[1:-1]
    m = mean(logs)
    sd = math.sqrt(sum((v - m) ** 2 for v in logs) / (len(logs) - 1))
    return math.expm1(t_inverse_cdf(0.5 + confidence / 2.0, len(logs) - 1) * sd / math.sqrt(len(logs)))


def log_ratio_interval(baseline: Sequence[float], current: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """Welch t-interval of mean(log current) - mean(log baseline), returned as a ratio interval.

    Throughput and latency noise is multiplicative, so on log values it is close to normal and
    this interval's stated coverage holds (unlike a bootstrap of three numbers). None when a
    side has fewer than two samples, a value is not positive, or neither side varies.
    """
    if len(baseline) < 2 or len(current) < 2 or min(*baseline, *current) <= 0:
        return None
    lb = [math.log(v) for v in baseline]
    lc = [math.log(v) for v in current]
    vb = sum((v - mean(lb)) ** 2 for v in lb) / (len(lb) - 1) / len(lb)
    vc = sum((v - mean(lc)) ** 2 for v in lc) / (len(lc) - 1) / len(lc)
    diff = mean(lc) - mean(lb)
    if vb + vc == 0:
        return Interval(math.exp(diff), math.exp(diff), 1.0, "t-interval on log values")
    df = (vb + vc) ** 2 / ((vb**2 / (len(lb) - 1) if vb else 0.0) + (vc**2 / (len(lc) - 1) if vc else 0.0))
    half = t_inverse_cdf(0.5 + confidence / 2.0, df) * math.sqrt(vb + vc)
    return Interval(math.exp(diff - half), math.exp(diff + half), confidence, "t-interval on log values")


@dataclass(frozen=True)
class Summary:
    """Centre and spread of one metric's repeat samples."""

    n: int
    median: float
    mad: float
    ci_low: float
    ci_high: float
    coverage: float = 0.0

    @property
    def rel_spread(self) -> float:
        """Scaled MAD relative to the median: the robust "how much do repeats disagree"."""
        if self.median == 0:
            return 0.0 if self.mad == 0 else math.inf
        return NORMAL_MAD_SCALE * self.mad / abs(self.median)

    @property
    def rel_half_width(self) -> float:
        """Half the interval's width relative to the median (0.02 = "+-2%"); inf when median is 0."""
        if self.median == 0:
            return 0.0 if self.ci_low == self.ci_high else math.inf
        return (self.ci_high - self.ci_low) / 2.0 / abs(self.median)

    def as_dict(self) -> SpreadData:
        return {
            "n": self.n,
            "median": self.median,
            "mad": self.mad,
            "rel_spread": self.rel_spread,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "ci_coverage": self.coverage,
            "rel_half_width": self.rel_half_width,
        }


def summarize(samples: Sequence[float], *, confidence: float = 0.95) -> Summary:
    """Median, MAD and the order-statistic interval of the median with its true coverage."""
    interval = median_interval(samples, confidence)
    return Summary(n=len(samples), median=median(samples), mad=mad(samples), ci_low=interval.low,
                   ci_high=interval.high, coverage=interval.coverage)


@dataclass(frozen=True)
class RepeatPolicy:
    """How many repeats a cell gets, and when its repeats count as agreeing.

    ``min_repeats`` (>= 3 by default) always run; after that a cell stops as soon as the
    robust spread (scaled MAD / median) of its primary metric is within ``target_rel_ci``,
    or at ``max_repeats``. A cell whose spread ends above ``inconclusive_rel_ci`` is
    ``inconclusive``: reported, never counted as a pass. The scaled MAD, not an interval of
    three numbers, decides: one wild repeat of three does not make a cell inconclusive.
    """

    min_repeats: int = 3
    max_repeats: int = 6
    target_rel_ci: float = 0.02
    inconclusive_rel_ci: float = 0.10
    confidence: float = 0.95
    #: When set (a bless), a cell is tight only when the t-interval of its mean (log values) is
    #: also within this relative half-width: unlike the robust spread it sees two slow repeats of three.
    target_half_width: float | None = None
    #: Repeats a cell may take in all, spoiled ones included (see :func:`run_interleaved`); None:
    #: ``max_repeats`` (a spoiled repeat then takes the place of an extra one).
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.min_repeats < 1:
            raise ValueError(f"min_repeats must be >= 1, got {self.min_repeats}")
        if self.max_repeats < self.min_repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) must be >= min_repeats ({self.min_repeats})")
        if self.max_attempts is not None and self.max_attempts < self.max_repeats:
            raise ValueError(f"max_attempts ({self.max_attempts}) must be >= max_repeats ({self.max_repeats})")

    @property
    def attempts(self) -> int:
        """Repeats a cell may take in all, spoiled ones included."""
        return self.max_repeats if self.max_attempts is None else self.max_attempts

    def spread(self, samples: Sequence[float]) -> float:
        m = median(samples)
        return scaled_mad(samples) / abs(m) if m else (0.0 if scaled_mad(samples) == 0 else math.inf)

    def is_tight(self, samples: Sequence[float]) -> bool:
        if len(samples) < self.min_repeats:
            return False
        if self.target_half_width is not None and log_mean_half_width(samples, self.confidence) > self.target_half_width:
            return False
        return self.spread(samples) <= self.target_rel_ci

    def status(self, samples: Sequence[float], invalid: bool = False) -> CellStatus:
        """valid / inconclusive / invalid for a finished cell's primary-metric samples."""
        if invalid or not samples:
            return Status.INVALID
        if len(samples) < min(3, self.min_repeats):
            return Status.INCONCLUSIVE
        if self.spread(samples) > self.inconclusive_rel_ci:
            return Status.INCONCLUSIVE
        return Status.VALID


K = TypeVar("K", bound=Hashable)
S = TypeVar("S")


@dataclass
class CellRun(Generic[S]):
    """Everything measured for one cell by :func:`run_interleaved`.

    ``samples`` holds every repeat taken, in order; ``primary`` the primary values of the clean
    valid ones (those that count); ``spoiled`` the repeats that measured the machine instead of
    the config (index in ``samples`` -> why), kept as evidence, never counted.
    """

    samples: list[S] = field(default_factory=list)
    primary: list[float] = field(default_factory=list)
    invalid: bool = False
    stopped_early: bool = False
    spoiled: dict[int, str] = field(default_factory=dict)
    min_clean: int = 0  # the clean repeats the cell needed (the policy's min_repeats)

    @property
    def counted(self) -> list[S]:
        """The repeats that count: every sample but the spoiled ones (invalid ones included, so
        their problems are seen)."""
        return [s for i, s in enumerate(self.samples) if i not in self.spoiled]

    @property
    def short_of_clean(self) -> bool:
        """Spoiled repeats left the cell without the clean repeats it needed (see :func:`run_interleaved`)."""
        return bool(self.spoiled) and not self.invalid and len(self.primary) < self.min_clean


def run_interleaved(
    cells: Sequence[K],
    measure: Callable[[K, int], S],
    primary: Callable[[S], float | None],
    policy: RepeatPolicy = RepeatPolicy(),
    on_sample: Callable[[K, int, S], None] | None = None,
    spoiled: Callable[[S], str | None] | None = None,
) -> dict[K, CellRun[S]]:
    """Run repeats round by round: repeat r of every active cell before repeat r+1.

    ``measure(cell, r)`` performs one repeat; ``primary(sample)`` returns the value that
    decides early stop, or None when the repeat is invalid (errors, wrong token counts): an
    invalid cell is dropped from later rounds at once, since more repeats cannot make it
    valid. ``on_sample`` is called after every repeat (the suite records each one, so a crash
    loses nothing).

    ``spoiled(sample)`` says why a valid repeat measured the machine rather than the config (the
    service fell behind its clock, the client kept too few requests in flight), or None. Such a
    repeat is kept in ``samples`` and ``CellRun.spoiled`` but does not count: the cell takes
    another repeat in its place, so a passing disturbance (another process's burst) costs a
    repeat instead of deciding the cell. A cell takes at most ``policy.attempts`` repeats in all;
    one that could not get ``policy.min_repeats`` clean ones is ``short_of_clean``.
    """
    runs: dict[K, CellRun[S]] = {c: CellRun(min_clean=policy.min_repeats) for c in cells}
    active = list(cells)
    for r in range(policy.attempts):
        if not active:
            break
        still: list[K] = []
        for cell in active:
            sample = measure(cell, r)
            run = runs[cell]
            run.samples.append(sample)
            if on_sample is not None:
                on_sample(cell, r, sample)
            value = primary(sample)
            if value is None:
                run.invalid = True
                continue
            reason = spoiled(sample) if spoiled is not None else None
            if reason is not None:
                run.spoiled[len(run.samples) - 1] = reason
            else:
                run.primary.append(value)
            if len(run.primary) >= policy.max_repeats:
                continue
            if len(run.primary) >= policy.min_repeats and policy.is_tight(run.primary):
                run.stopped_early = True
                continue
            still.append(cell)
        active = still
    return runs


def describe(values: Mapping[str, float]) -> str:
    """Compact "k=v" rendering for messages."""
    return ", ".join(f"{k}={v:.4g}" for k, v in values.items())
