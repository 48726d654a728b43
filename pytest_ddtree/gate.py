"""Throughput/acceptance baselines: entry format, comparison and verdicts (no pytest import).

Why a verdict needs two conditions: a CI gate that fails whenever a median moves by more
than the tolerance fails on noise; one that fails whenever a difference is "significant"
fails on a 0.5% change nobody cares about. So a metric *regresses* only when

1. its median moved in the bad direction by more than the metric's tolerance, AND
2. a one-sided exact Mann-Whitney U test over the repeat samples (baseline vs now) supports
   the move at ``alpha`` (default 0.05 - at 3 vs 3 samples that means the two sample sets
   do not overlap at all, the strongest statement 3 samples can make).

A move beyond tolerance without statistical support is *inconclusive* (reported, not a
pass); a measurement with errors is *invalid* (never a regression, never a pass). The
message says by how much (median change and a seeded bootstrap 95% CI of the ratio of
medians) and how sure (the p-value).

Baseline section layout (``baselines/<hardware-profile>/<config>.yaml``, section
``metrics``), one entry per cell::

    metrics:
      c8_short:
        workload: {concurrency: 8, context_tokens: 128, output_tokens: 64, requests: 16}
        gates:
          output_throughput: {direction: higher, median: 512.3, samples: [..], tolerance: 0.05, unit: tok/s}
          accept_length:     {direction: higher, ...}
          median_ttft_ms:    {direction: lower, ...}

``min_change`` (optional, absolute, in the metric's unit) is a floor below which a move is
never a regression (TTFT of a few ms is timer noise). Tolerances are read from the file, so a reviewer can loosen one metric of one cell by
editing the YAML; an update keeps a tolerance that was edited by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_ddtree import stats

Direction = Literal["higher", "lower"]

#: Verdict vocabulary (cell and metric level).
PASS = "pass"
IMPROVED = "improved"
REGRESSION = "regression"
INCONCLUSIVE = "inconclusive"
INVALID = "invalid"
MISSING = "missing"


class BaselineFormatError(ValueError):
    """A baseline file's ``metrics`` section does not have the expected shape."""


@dataclass(frozen=True)
class MetricSpec:
    """A gated metric: its key in the cell metrics, which way is better, default tolerance."""

    key: str
    direction: Direction
    tolerance: float
    unit: str
    label: str
    min_change: float = 0.0  # absolute floor (same unit): smaller moves are timer noise


#: What the gate checks by default. Throughput is the headline; acceptance catches a
#: drafter/verify change even when the clock hides it; TTFT p50 catches prefill/scheduling
#: regressions (it is noisier, hence the wider tolerance).
GATED_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("output_throughput", "higher", 0.05, "tok/s", "output tok/s"),
    MetricSpec("accept_length", "higher", 0.03, "tok/step", "accept length"),
    # 10 ms floor: a few-ms TTFT (tiny prompts, fast clocks) moves by its own size with
    # scheduler noise; on a GPU service TTFT is tens of ms and the 25% rule decides.
    MetricSpec("median_ttft_ms", "lower", 0.25, "ms", "TTFT p50", min_change=10.0),
)
SPECS: dict[str, MetricSpec] = {s.key: s for s in GATED_METRICS}

DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    status: str
    direction: Direction
    tolerance: float
    baseline_median: float | None
    current_median: float | None
    change: float | None  # signed relative change of the median, (now - base) / base
    p_value: float | None
    ci_low: float | None  # bootstrap CI of the relative change
    ci_high: float | None
    unit: str = ""
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "status": self.status,
            "direction": self.direction,
            "tolerance": self.tolerance,
            "baseline_median": self.baseline_median,
            "current_median": self.current_median,
            "change": self.change,
            "p_value": self.p_value,
            "change_ci": [self.ci_low, self.ci_high] if self.ci_low is not None else None,
            "message": self.message,
        }


@dataclass(frozen=True)
class CellVerdict:
    cell: str
    status: str
    metrics: tuple[MetricVerdict, ...] = ()
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> bool:
        """True when the cell must fail the gate (regression or invalid measurement)."""
        return self.status in (REGRESSION, INVALID)

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


def _fmt_pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def compare_metric(
    key: str,
    entry: Mapping[str, Any],
    current: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    seed: int = stats.DEFAULT_SEED,
) -> MetricVerdict:
    """Compare the current repeat samples of one metric with its baseline entry."""
    direction: Direction = entry["direction"]
    tolerance = float(entry["tolerance"])
    min_change = float(entry.get("min_change", SPECS[key].min_change if key in SPECS else 0.0))
    unit = str(entry.get("unit", SPECS[key].unit if key in SPECS else ""))
    base_samples = [float(v) for v in entry.get("samples") or [entry["median"]]]
    base_median = float(entry["median"])
    if not current:
        return MetricVerdict(key, INCONCLUSIVE, direction, tolerance, base_median, None, None, None, None, None, unit,
                             f"{key}: no current samples")
    cur_median = stats.median(current)
    change = stats.relative_change(base_median, cur_median)
    worse = -change if direction == "higher" else change  # > 0 means worse
    bad_alt: Literal["less", "greater"] = "less" if direction == "higher" else "greater"
    good_alt: Literal["less", "greater"] = "greater" if direction == "higher" else "less"
    _, p_bad = stats.mann_whitney_u(current, base_samples, bad_alt)
    _, p_good = stats.mann_whitney_u(current, base_samples, good_alt)
    lo = hi = None
    if base_median != 0:
        r_lo, r_hi = stats.ratio_ci(base_samples, current, seed=seed)
        lo, hi = r_lo - 1.0, r_hi - 1.0
    ci_txt = f" (95% CI {_fmt_pct(lo)} .. {_fmt_pct(hi)})" if lo is not None and hi is not None else ""
    what = f"{key}: {_fmt(base_median)} -> {_fmt(cur_median)} {unit}, {_fmt_pct(change) if math.isfinite(change) else change}{ci_txt}"
    n_txt = f"{len(base_samples)} vs {len(current)} samples"
    beyond_floor = abs(cur_median - base_median) > min_change
    if worse > tolerance and beyond_floor:
        if p_bad <= alpha:
            status = REGRESSION
            msg = (f"{what}: REGRESSION beyond the {tolerance:.0%} tolerance, "
                   f"Mann-Whitney p={p_bad:.3g} <= {alpha} ({n_txt})")
        else:
            status = INCONCLUSIVE
            msg = (f"{what}: worse than the {tolerance:.0%} tolerance but not statistically supported "
                   f"(Mann-Whitney p={p_bad:.3g} > {alpha}, {n_txt}); rerun with more --ddtree-repeats")
    elif -worse > tolerance and beyond_floor and p_good <= alpha:
        status = IMPROVED
        msg = (f"{what}: improved beyond the {tolerance:.0%} tolerance (p={p_good:.3g}); "
               "bless it with --ddtree-update-baselines")
    else:
        status = PASS
        msg = ""
    return MetricVerdict(key, status, direction, tolerance, base_median, cur_median, change,
                         p_bad if status != IMPROVED else p_good, lo, hi, unit, msg)


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"


def compare_cell(
    cell: str,
    baseline: Mapping[str, Any] | None,
    current: Mapping[str, Sequence[float]],
    *,
    status: str = stats.VALID,
    problems: Sequence[str] = (),
    workload: Mapping[str, Any] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> CellVerdict:
    """Verdict for one cell: invalid > missing > regression > inconclusive > improved > pass.

    ``status`` is the measurement's own status (:meth:`stats.RepeatPolicy.status`): an
    invalid measurement is never compared; an inconclusive one (repeats disagree, or the
    host could not keep up) is compared for the record but is neither a regression nor a
    pass. ``problems`` are the reasons behind an invalid or inconclusive status.
    """
    if status == stats.INVALID:
        return CellVerdict(cell, INVALID, (), tuple(problems) or ("measurement invalid",))
    if baseline is None:
        return CellVerdict(cell, MISSING, (), ("no baseline for this cell",))
    reasons: list[str] = []
    base_workload = baseline.get("workload")
    if workload is not None and isinstance(base_workload, Mapping):
        diff = {k: (base_workload.get(k), v) for k, v in workload.items() if base_workload.get(k) != v}
        if diff:
            changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())
            return CellVerdict(cell, MISSING, (), (
                f"the workload changed since the baseline ({changes}); the old numbers do not apply",))
    gates = baseline.get("gates") or {}
    verdicts: list[MetricVerdict] = []
    for key, entry in sorted(gates.items()):
        samples = list(current.get(key) or [])
        if not samples:
            continue  # e.g. acceptance of a non-speculative run: nothing to compare
        verdicts.append(compare_metric(key, entry, samples, alpha=alpha))
    found = {v.status for v in verdicts}
    if status == stats.INCONCLUSIVE:
        reasons.extend(problems or ["repeats disagree (confidence interval wider than the policy allows)"])
        cell_status = INCONCLUSIVE
    elif REGRESSION in found:
        cell_status = REGRESSION
    elif INCONCLUSIVE in found:
        cell_status = INCONCLUSIVE
    elif IMPROVED in found:
        cell_status = IMPROVED
    else:
        cell_status = PASS
    return CellVerdict(cell, cell_status, tuple(verdicts), tuple(reasons))


#: Below this median engine busy fraction (engines that report their simulated clock: the
#: reference engine) the host, not the config, set the pace: the cell is inconclusive.
MIN_ENGINE_BUSY_FRACTION = 0.85


def measurement_status(
    policy: stats.RepeatPolicy,
    primary: Sequence[float],
    invalid: bool,
    repeats: Sequence[Mapping[str, Any]],
    problems: Sequence[str] = (),
    min_busy_fraction: float = MIN_ENGINE_BUSY_FRACTION,
) -> tuple[str, list[str]]:
    """The status of a measured cell and the reasons behind a non-valid one.

    invalid: errors or wrong token counts in any repeat; inconclusive: the repeats disagree
    (policy), or the engine reports that it could not keep its simulated clock (the
    reference engine's busy time over our wall time is low: an overloaded host or a client
    that cannot keep up - the numbers would describe the machine, not the config).
    """
    status = policy.status(primary, invalid=invalid)
    if status == stats.INVALID:
        return status, list(problems)[:20] or ["measurement invalid"]
    if status == stats.INCONCLUSIVE:
        return status, [f"repeats disagree: output tok/s {[round(p, 1) for p in primary]}"]
    fractions = [float(f) for m in repeats if stats.is_number(f := m.get("engine_busy_fraction"))]
    if fractions and stats.median(fractions) < min_busy_fraction:
        return stats.INCONCLUSIVE, [
            f"the engine was busy only {stats.median(fractions):.0%} of the measured time (host overloaded or "
            "client too slow): the numbers describe the machine, not the config; rerun on a quieter machine"]
    return status, []


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
) -> dict[str, Any]:
    """The ``metrics.<cell>`` entry to write for these samples.

    Keeps a tolerance that is already in ``existing`` (edited by a reviewer); metrics
    without samples (e.g. acceptance of a non-speculative server) are left out.
    """
    old_gates = (existing or {}).get("gates") or {}
    gates: dict[str, Any] = {}
    for spec in specs:
        values = [float(v) for v in samples.get(spec.key) or [] if v is not None]
        if not values:
            continue
        old = old_gates.get(spec.key) or {}
        tolerance = old.get("tolerance", spec.tolerance)
        gates[spec.key] = {
            "direction": spec.direction,
            **({"min_change": float(old.get("min_change", spec.min_change))} if spec.min_change else {}),
            "median": _round(stats.median(values)),
            "samples": [_round(v) for v in values],
            "tolerance": float(tolerance),
            "unit": spec.unit,
        }
    return {"workload": dict(workload), "gates": gates}


def validate_section(section: Any, where: str) -> dict[str, Any]:
    """Check a loaded ``metrics`` section; raise BaselineFormatError saying what to fix."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise BaselineFormatError(f"{where}: 'metrics' must be a mapping of cell -> entry, got {type(section).__name__}")
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
            if "min_change" in gate and not stats.is_number(gate["min_change"]):
                raise BaselineFormatError(f"{w}.min_change must be a number (absolute, in the metric's unit)")
            if float(gate["tolerance"]) < 0:
                raise BaselineFormatError(f"{w}.tolerance must be >= 0 (a fraction: 0.05 = 5%)")
            samples = gate.get("samples", [])
            if not isinstance(samples, list) or not all(stats.is_number(s) for s in samples):
                raise BaselineFormatError(f"{w}.samples must be a list of numbers")
    return dict(section)
