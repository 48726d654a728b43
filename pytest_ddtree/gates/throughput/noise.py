"""The gate's arithmetic on log values: robust centres and spreads, their variances, and the quantiles
of the chi-square, normal and t distributions its tolerances use."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pytest_ddtree.measure import stats


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
