"""Adaptive sweep advisor: measure a few configs, predict the rest, recommend measured ones.

Why a model and not interpolation: a full sweep costs one service restart per config (minutes
each on a GPU), yet the throughput surface has a known shape. Tokens per step (accept length)
saturate with the tree budget (each extra node is a less probable prefix), and the cost of a
step grows with the verify width (budget + 1) times the batch, plus the context read. So
``tok/s = concurrency * accept / step_cost`` with a handful of parameters shared by all
configs and cells: a few measured configs pin them down, and the rest follow with intervals.

What it cannot see: SGLang exposes only the mean accept length per request (no per-depth
acceptance), so the accept curve is fitted from its means; the draft window does not enter
the model (configs that differ only by window are predicted alike); a cost shape outside
this family (e.g. acceptance that falls with budget) shows up as wide residuals, not as a
different curve. Recommendations are therefore always measured configs.

Pytest-free; needs numpy and scipy (the optional extra ``advisor``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

EXTRA_HINT = "the adaptive sweep needs numpy and scipy: pip install 'pytest-ddtree[advisor]'"


class AdvisorUnavailable(RuntimeError):
    """numpy/scipy are missing (the optional extra ``advisor`` is not installed)."""


def _np_scipy() -> tuple[Any, Any]:
    try:
        import numpy
        from scipy import optimize
    except ImportError as exc:
        raise AdvisorUnavailable(f"{EXTRA_HINT} ({exc})") from exc
    return numpy, optimize


@dataclass(frozen=True)
class ConfigPoint:
    """The knobs of a config the model sees (the window is invisible to it)."""

    name: str
    block_size: int
    budget: int
    topk: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.block_size, self.budget, self.topk)

    @classmethod
    def of(cls, config: Any) -> ConfigPoint:
        """From a :class:`pytest_ddtree.configs.DDTreeConfig` (or anything with those fields)."""
        return cls(str(config.name), int(config.block_size), int(config.budget), int(config.topk))


@dataclass(frozen=True)
class CellPoint:
    """A throughput cell: closed-loop concurrency x prompt length x output length."""

    name: str
    concurrency: int
    context_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, workload: Any) -> CellPoint:
        return cls(str(workload.name), int(workload.concurrency), int(workload.context_tokens), int(workload.output_tokens))


@dataclass(frozen=True)
class Measurement:
    config: str
    cell: str
    tok_s: float
    accept_length: float | None = None


@dataclass(frozen=True)
class Prediction:
    tok_s: float
    low: float
    high: float


# Parameter vector (log-scale where a parameter must be positive):
#   0 log A      accept gain: accept = 1 + A * topk_gain * depth_gain * (1 - exp(-budget / tau))
#   1 log tau    budget at which acceptance saturates
#   2 gamma      topk gain per extra candidate beyond 4      (prior 0 +- 0.15)
#   3 eta        block-size gain per doubling beyond 8       (prior 0 +- 0.3)
#   4 log f      fixed decode step cost
#   5 log v      cost per verify token (budget + 1) per request
#   6 rho        draft cost per block position = v * exp(rho) (prior log 0.2 +- 1.5)
#   7 log p      cost per context token per request
#   8 log P0     fixed prefill cost per wave
#   9 log P1     prefill cost per prompt token
N_PARAMS = 10
PRIOR_CENTER = (math.log(2.5), math.log(6.0), 0.0, 0.0, math.log(0.04), math.log(3e-4),
                math.log(0.2), math.log(5e-7), math.log(0.02), math.log(5e-5))
#: Prior widths: the topk/block-size gains and the draft cost are unidentified until a config
#: that varies them is measured; the rest are effectively free (wide priors).
PRIOR_SIGMA = (3.0, 3.0, 0.15, 0.3, 6.0, 6.0, 1.5, 6.0, 6.0, 6.0)
TOPK_REF = 4
#: Measurements this close to a cell's best are a tie the fit decides (about a repeat's spread).
PICK_TIE = 0.02
BLOCK_REF = 8
#: A candidate counts only when it may beat a cell's best measurement by more than this.
CHANGE_MARGIN = 0.01
#: Choices the planner keeps after measuring the whole default budget axis (else: its ends only).
AXIS_SPARE_CHOICES = 2


def _accept(theta: Any, np: Any, bs: Any, b: Any, k: Any) -> Any:
    gain = np.exp(theta[0]) * np.maximum(0.05, 1.0 + theta[2] * (k - TOPK_REF)) * np.maximum(
        0.05, 1.0 + theta[3] * np.log2(bs / BLOCK_REF)
    )
    return 1.0 + gain * (1.0 - np.exp(-b / np.exp(theta[1])))


def _log_tok_s(theta: Any, np: Any, bs: Any, b: Any, k: Any, c: Any, ctx: Any, out: Any) -> tuple[Any, Any]:
    acc = _accept(theta, np, bs, b, k)
    v = np.exp(theta[5])
    step = np.exp(theta[4]) + c * (v * (b + 1) + v * np.exp(theta[6]) * bs + np.exp(theta[7]) * (ctx + out / 2.0))
    wave = np.exp(theta[8]) + np.exp(theta[9]) * c * ctx + (out / acc) * step
    return np.log(c * out / wave), acc


@dataclass
class Fit:
    """A fitted model: parameters, their covariance, and the residual scale (log tok/s)."""

    theta: Any
    cov: Any
    sigma: float
    n_obs: int

    def _rows(self, configs: Sequence[ConfigPoint], cells: Sequence[CellPoint]) -> tuple[Any, ...]:
        np, _ = _np_scipy()
        grid = [(c, w) for c in configs for w in cells]
        cols = (
            np.array([float(c.block_size) for c, _ in grid]),
            np.array([float(c.budget) for c, _ in grid]),
            np.array([float(c.topk) for c, _ in grid]),
            np.array([float(w.concurrency) for _, w in grid]),
            np.array([float(w.context_tokens) for _, w in grid]),
            np.array([float(w.output_tokens) for _, w in grid]),
        )
        return cols

    def predict(self, configs: Sequence[ConfigPoint], cells: Sequence[CellPoint], z: float = 1.96) -> dict[tuple[str, str], Prediction]:
        """Point predictions with intervals: parameter uncertainty (delta method) plus the
        residual scatter of the fit, both on log tok/s."""
        np, _ = _np_scipy()
        cols = self._rows(configs, cells)
        mean, _ = _log_tok_s(self.theta, np, *cols)
        grad = np.zeros((len(mean), N_PARAMS))
        for i in range(N_PARAMS):
            step = 1e-5
            t = self.theta.copy()
            t[i] += step
            grad[:, i] = (_log_tok_s(t, np, *cols)[0] - mean) / step
        var = np.einsum("ij,jk,ik->i", grad, self.cov, grad) + self.sigma**2
        sd = np.sqrt(np.maximum(var, 0.0))
        out: dict[tuple[str, str], Prediction] = {}
        i = 0
        for c in configs:
            for w in cells:
                out[(c.name, w.name)] = Prediction(
                    float(np.exp(mean[i])), float(np.exp(mean[i] - z * sd[i])), float(np.exp(mean[i] + z * sd[i]))
                )
                i += 1
        return out

    def sample_log_tok_s(self, configs: Sequence[ConfigPoint], cells: Sequence[CellPoint], draws: int, seed: int) -> Any:
        """Draws of the whole grid from the parameter posterior: shape (draws, configs, cells)."""
        np, _ = _np_scipy()
        rng = np.random.default_rng(seed)
        cols = self._rows(configs, cells)
        thetas = rng.multivariate_normal(self.theta, self.cov, size=draws, check_valid="ignore")
        grid = np.stack([_log_tok_s(t, np, *cols)[0] for t in thetas])
        return grid.reshape(draws, len(configs), len(cells))


def fit(
    configs: Mapping[str, ConfigPoint],
    cells: Mapping[str, CellPoint],
    measurements: Sequence[Measurement],
    prior: Fit | None = None,
) -> Fit:
    """Least-squares fit of log tok/s (and of accept length where measured) with Gaussian
    priors as extra residuals, so unidentified parameters stay at their prior instead of
    wandering. ``prior`` (an earlier session's fit on the same hardware) replaces the built-in
    prior centers and narrows the cost parameters to what that session found."""
    np, optimize = _np_scipy()
    if not measurements:
        raise ValueError("the advisor needs at least one measured cell to fit")
    ms = [m for m in measurements if m.tok_s > 0]
    bs = np.array([float(configs[m.config].block_size) for m in ms])
    b = np.array([float(configs[m.config].budget) for m in ms])
    k = np.array([float(configs[m.config].topk) for m in ms])
    c = np.array([float(cells[m.cell].concurrency) for m in ms])
    ctx = np.array([float(cells[m.cell].context_tokens) for m in ms])
    out = np.array([float(cells[m.cell].output_tokens) for m in ms])
    y = np.log(np.array([m.tok_s for m in ms]))
    acc_idx = np.array([i for i, m in enumerate(ms) if m.accept_length])
    acc_y = np.array([m.accept_length for m in ms if m.accept_length], dtype=float)
    center = np.array(prior.theta if prior is not None else PRIOR_CENTER, dtype=float)
    sigma_p = np.array(PRIOR_SIGMA, dtype=float)
    if prior is not None:
        sigma_p = np.minimum(sigma_p, np.maximum(0.03, 3.0 * np.sqrt(np.clip(np.diag(prior.cov), 0, None))))
    # accept lengths are noisier per unit than log tok/s; weight them as ~5% relative error vs ~2%
    acc_w = 0.4

    def residuals(theta: Any) -> Any:
        pred, acc = _log_tok_s(theta, np, bs, b, k, c, ctx, out)
        parts = [pred - y]
        if len(acc_idx):
            parts.append(acc_w * (np.log(acc[acc_idx]) - np.log(acc_y)))
        parts.append((theta - center) / sigma_p * 0.02)
        return np.concatenate(parts)

    best = None
    for start in (center, center + np.array([0, 0, 0, 0, -1, -1, 0, 0, 0, 0.0])):
        r = optimize.least_squares(residuals, start, method="trf", x_scale="jac", max_nfev=2000)
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    n = len(y)
    data_res = best.fun[:n]
    dof = max(1, n - 4)  # the cost parameters a sweep over budget x cells identifies
    sigma = max(0.01, float(np.sqrt(np.sum(data_res**2) / dof)))
    jac = best.jac
    # covariance in units of the data scatter; prior rows carry weight 0.02/sigma_p
    jtj = jac.T @ jac
    cov = np.linalg.pinv(jtj) * sigma**2
    return Fit(best.x, cov, sigma, n)


@dataclass
class Recommendation:
    cell: str
    config: str
    tok_s: float
    #: the best unmeasured config by prediction, when its interval reaches above the pick: its
    #: predicted tok/s (what it was chosen by) and its interval's top
    challenger: str | None = None
    challenger_high: float | None = None
    challenger_tok_s: float | None = None
    #: the measured config with the highest figure in the cell, where the fit chose another within
    #: ``PICK_TIE`` of it (the line says so: the figure printed is not the cell's highest)
    measured_best: str | None = None
    measured_best_tok_s: float | None = None


@dataclass
class Planner:
    """Chooses the configs to measure one by one and recommends measured configs per cell.

    Order: the two corners (smallest and largest budget at the default block size and topk) and
    the matrix default (the incumbent every pick must beat), and the rest of that budget axis
    when at least two choices remain after it; then the config with the highest chance of
    changing some cell's recommendation, until the restarts are spent or every cell's best
    measured value clears every unmeasured config's upper bound.
    Configs that differ only by window count as one shape: once one is measured its twins are
    not worth a restart (the model cannot tell them apart).
    """

    configs: Sequence[ConfigPoint]
    cells: Sequence[CellPoint]
    max_restarts: int
    default: str | None = None
    prior: Fit | None = None
    draws: int = 300
    seed: int = 0
    measured: dict[tuple[str, str], Measurement] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    #: configs whose restart measured nothing (a failed start): spent, never chosen again
    failed: list[str] = field(default_factory=list)
    _fit: Fit | None = None

    def __post_init__(self) -> None:
        if self.max_restarts < 1:
            raise ValueError(f"max_restarts must be at least 1, got {self.max_restarts}")
        self.by_name = {c.name: c for c in self.configs}
        self.cell_by_name = {w.name: w for w in self.cells}

    # -- measurements ------------------------------------------------------------------
    def record(self, m: Measurement) -> None:
        if m.config not in self.order:
            self.order.append(m.config)
        self.measured[(m.config, m.cell)] = m
        self._fit = None

    def fail(self, name: str) -> None:
        """A config whose restart measured nothing: it counts as spent and is not chosen again."""
        if name not in self.failed and name not in self.order:
            self.failed.append(name)

    def invalidate(self) -> None:
        """Forget the fit (after the prior changed)."""
        self._fit = None

    @property
    def restarts_spent(self) -> int:
        return len(self.order) + len(self.failed)

    def measured_shapes(self) -> set[tuple[int, int, int]]:
        return {self.by_name[n].shape for n in self.order}

    def _spent_shapes(self) -> set[tuple[int, int, int]]:
        return self.measured_shapes() | {self.by_name[n].shape for n in self.failed}

    def model(self) -> Fit:
        if self._fit is None:
            self._fit = fit(self.by_name, self.cell_by_name, list(self.measured.values()), self.prior)
        return self._fit

    # -- choice ------------------------------------------------------------------------
    def _corners(self) -> list[str]:
        """The design points measured before any choice: the budget axis at the default block
        size and topk. Its two ends and the incumbent (the config every pick must beat); and,
        when the restarts leave at least two choices after it, every budget of that axis: on the
        served engine acceptance is not monotone in the budget (a bigger tree can accept less
        per step over a whole request), so a saturating curve through three points can miss an
        interior peak that only a measurement finds."""
        ref = self.by_name.get(self.default or "") or self.configs[0]
        same = [c for c in self.configs if c.block_size == ref.block_size and c.topk == ref.topk]
        if not same:
            return []
        low = min(same, key=lambda c: (c.budget, c.name != ref.name, len(c.name), c.name))
        high = min(same, key=lambda c: (-c.budget, c.name != ref.name, len(c.name), c.name))
        picks = [low.name, high.name, ref.name]  # the incumbent too: the config to beat
        axis: dict[int, ConfigPoint] = {}
        for c in sorted(same, key=lambda c: (c.name != ref.name, len(c.name), c.name)):
            axis.setdefault(c.budget, c)
        if len(axis) <= self.max_restarts - AXIS_SPARE_CHOICES:
            picks += [c.name for _, c in sorted(axis.items())]
        return list(dict.fromkeys(picks))

    def candidates(self) -> list[ConfigPoint]:
        """One config per unmeasured shape (the default window first, i.e. the shortest name)."""
        done = self._spent_shapes()
        seen: dict[tuple[int, int, int], ConfigPoint] = {}
        for c in sorted(self.configs, key=lambda c: (len(c.name), c.name)):
            if c.shape not in done and c.shape not in seen:
                seen[c.shape] = c
        return list(seen.values())

    def chances(self) -> dict[str, float]:
        """Per unmeasured candidate: its highest chance over cells of beating that cell's best
        measurement by more than ``CHANGE_MARGIN``, i.e. of changing a recommendation.

        Not "the chance of being the best candidate": that splits a crowded region's chance
        among its look-alikes (topk 4 and 6 at one budget), so a cell with many near twins lost
        to a lone candidate elsewhere; and a margin of about a repeat's spread keeps a config
        that can only tie the measured best from costing a restart."""
        np, _ = _np_scipy()
        cands = self.candidates()
        if not cands:
            return {}
        model = self.model()
        draws = model.sample_log_tok_s(cands, self.cells, self.draws, self.seed + len(self.order))
        noise = np.random.default_rng(self.seed + 7).normal(0.0, model.sigma, draws.shape)
        draws = draws + noise
        best_measured = np.array([self._best_measured(w.name)[1] for w in self.cells])
        floor = np.log(np.maximum(best_measured, 1e-12)) + math.log1p(CHANGE_MARGIN)
        p = (draws > floor[None, None, :]).mean(axis=0)  # (cands, cells)
        return {c.name: float(p[i].max()) for i, c in enumerate(cands)}

    def _best_measured(self, cell: str) -> tuple[str | None, float]:
        best: tuple[str | None, float] = (None, 0.0)
        for (cfg, w), m in self.measured.items():
            if w == cell and m.tok_s > best[1]:
                best = (cfg, m.tok_s)
        return best

    def decided(self) -> bool:
        """Every cell's best measured value is above every unmeasured prediction's interval."""
        cands = self.candidates()
        if not cands:
            return True
        preds = self.model().predict(cands, self.cells)
        for w in self.cells:
            top = self._best_measured(w.name)[1]
            if any(preds[(c.name, w.name)].high > top for c in cands):
                return False
        return True

    def next_config(self) -> str | None:
        """The next config to measure, or None when the restarts are spent or all is decided."""
        if self.restarts_spent >= self.max_restarts:
            return None
        for name in self._corners():
            if name not in self.order and self.by_name[name].shape not in self._spent_shapes():
                return name
        if not self.order:
            return None  # nothing measured to fit yet (both corners failed): stop, say so
        if not self.candidates() or self.decided():
            return None
        chances = self.chances()
        return max(chances, key=lambda n: (chances[n], -len(n))) if chances else None

    # -- reporting ---------------------------------------------------------------------
    def predictions(self) -> dict[tuple[str, str], Prediction]:
        """Predictions for every config not measured (all configs, twins included)."""
        unmeasured = [c for c in self.configs if c.name not in self.order]
        return self.model().predict(unmeasured, self.cells) if unmeasured else {}

    def _pick_measured(self, cell: str) -> tuple[str | None, float, str | None]:
        """The measured config to recommend in ``cell``, its measurement, and the config measured
        highest there (the same one, unless the tie was broken): the best measurement, except that
        among the measurements within ``PICK_TIE`` of it the model's fit breaks the tie (it pools
        all cells of a config, so one noisy sample does not flip a near tie; a misfit model
        cannot override a clear measured difference). The value reported is the measurement."""
        names = [n for n in self.order if (n, cell) in self.measured]
        if not names:
            return None, 0.0, None
        highest = max(names, key=lambda n: self.measured[(n, cell)].tok_s)
        top = self.measured[(highest, cell)].tok_s
        close = [n for n in names if self.measured[(n, cell)].tok_s >= (1 - PICK_TIE) * top]
        fitted = self.model().predict([self.by_name[n] for n in close], [self.cell_by_name[cell]])
        best = max(close, key=lambda n: fitted[(n, cell)].tok_s)
        return best, self.measured[(best, cell)].tok_s, highest

    def recommendations(self) -> list[Recommendation]:
        """Per cell a *measured* config; a predicted config whose interval reaches above it
        is named as the challenger (measure it, or run the full sweep)."""
        preds = self.predictions()
        recs: list[Recommendation] = []
        measured_shapes = self.measured_shapes()
        for w in self.cells:
            cfg, val, highest = self._pick_measured(w.name)
            if cfg is None:
                continue
            rec = Recommendation(w.name, cfg, val)
            if highest is not None and highest != cfg:
                rec.measured_best, rec.measured_best_tok_s = highest, self.measured[(highest, w.name)].tok_s
            rival = [
                (p.tok_s, p.high, name)
                for (name, cell), p in preds.items()
                if cell == w.name and self.by_name[name].shape not in measured_shapes and p.high > val
            ]
            if rival:
                # the most likely rival; among window twins (predicted alike) the default window
                predicted, high, name = max(rival, key=lambda r: (round(r[0], 6), round(r[1], 6), -len(r[2])))
                rec.challenger, rec.challenger_high, rec.challenger_tok_s = name, high, predicted
            recs.append(rec)
        return recs

    def summary(self) -> str:
        return (
            f"adaptive sweep: {self.restarts_spent} restarts spent of {len(self.configs)} for a full sweep "
            f"(limit {self.max_restarts})"
        )
