"""How much a cell or a config moves when nothing regressed, pooled over every config blessed on the
hardware profile: the launch and day spread of a config's common change, each cell's repeat noise
(what :func:`.rule.judge_config` takes as ``launch_spread`` and ``cell_noise``), and the blessed
sustainable rates' between-session spread (its ``between_spread``, for the rate gate's one cell)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_ddtree.measure import stats
from pytest_ddtree.gates.throughput.noise import centre_variance, log_centre, median_chi2_share, robust_log_sd
from pytest_ddtree.gates.throughput.rule import MIN_CELLS_FOR_SHIFT, Metric, session_shifts
from pytest_ddtree.gates.throughput.session_check import ConfigMove, launch_wobble
from pytest_ddtree.gates.throughput.verdicts import MetricBaseline, SPECS


def _blessed_metrics(section: Mapping[str, Any] | None) -> Iterator[tuple[str, str, MetricBaseline]]:
    """(cell, metric, its baseline) of every readable gated metric of one config's ``metrics``
    section; an entry that cannot be read is left out (its own cell reports it when judged)."""
    for cell, entry in (section or {}).items():
        if not isinstance(entry, Mapping):
            continue
        for key, gate_entry in (entry.get("gates") or {}).items():
            try:
                yield str(cell), str(key), MetricBaseline.from_entry(key, gate_entry)
            except (KeyError, TypeError, ValueError):
                continue


def blessed_config_shifts(sections: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per metric, each config's common change per blessed session (log; session id -> value)."""
    found: dict[str, list[dict[str, float]]] = {}
    for section in sections:
        by_metric: dict[str, dict[str, Metric]] = {}
        for name, key, base in _blessed_metrics(section):
            centre = log_centre(base.samples)
            if centre is None or len(base.sessions) < 2:
                continue
            by_metric.setdefault(key, {})[name] = Metric(base, [], centre, centre)
        for key, metrics in by_metric.items():
            if len(metrics) >= MIN_CELLS_FOR_SHIFT:
                found.setdefault(key, []).append(session_shifts(metrics))
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
        for cell, key, base in _blessed_metrics(section):
            found = [list(v) for _, v in base.sessions if len(v) >= 2]
            if found:
                groups.setdefault((key, cell), []).extend(found)
                configs[(key, cell)] = configs.get((key, cell), 0) + 1
    out: dict[str, dict[str, float]] = {}
    for (key, cell), found in groups.items():
        if configs[(key, cell)] >= 3:
            out.setdefault(key, {})[cell] = robust_log_sd(found)
    return out


#: Configs whose blessed rate entries (each of 2+ sessions) a pooled between-session spread needs;
#: with fewer, a rate test's own sessions' spread stands.
MIN_POOLED_CONFIGS = 3


@dataclass(frozen=True)
class PooledSpread:
    """A between-session spread (log sd) pooled over ``configs`` configs' blessed entries, with the
    ``dof`` degrees of freedom it rests on (each entry of k sessions gives k - 1)."""

    spread: float
    configs: int
    dof: int


def rate_between_spread(sections: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, PooledSpread]]:
    """How much a blessed rate's goodput moves between blessed sessions beyond its repeats' noise,
    pooled over every config's ``sustainable_rate`` section (``sections``): workload -> metric -> spread.

    Why: the rate gate re-probes the blessed rate, the SLO's edge by construction, where a slower
    launch or day moves goodput more than anywhere else, and its one cell's between-session spread
    comes from the config's own three sessions (2 degrees of freedom): when they happen to agree,
    the tolerance is the floor, and an unchanged sweep's 18 rate tests fail beyond the budget
    (docs/benchmarks.md). Every config's rate sits at its own edge, so the edges' spread pooled over
    the configs (2 degrees of freedom each) is what one config's edge moves by. Each entry's
    sessions' centres about their mean, less what their repeats' noise explains, summed over the
    entries (a pooled variance); an entry that cannot be read, or of one session, is left out;
    None (absent) with fewer than ``MIN_POOLED_CONFIGS`` configs."""
    sums: dict[tuple[str, str], list[float]] = {}  # squares beyond the noise, dof, configs
    for section in sections:
        for workload, entry in (section or {}).items():
            cell = entry.get("cell") if isinstance(entry, Mapping) else None
            for _, key, base in _blessed_metrics({str(workload): cell}):
                centres = [(c, len(v)) for _, v in base.sessions if (c := log_centre(v)) is not None]
                if len(centres) < 2:
                    continue
                k = len(centres)
                mean = sum(c for c, _ in centres) / k
                sigma = robust_log_sd([list(v) for _, v in base.sessions])
                noise = sigma**2 * sum(centre_variance(n) for _, n in centres) * (k - 1) / k
                acc = sums.setdefault((str(workload), key), [0.0, 0.0, 0.0])
                acc[0] += sum((c - mean) ** 2 for c, _ in centres) - noise
                acc[1] += k - 1
                acc[2] += 1
    out: dict[str, dict[str, PooledSpread]] = {}
    for (workload, key), (squares, dof, configs) in sums.items():
        if configs >= MIN_POOLED_CONFIGS:
            out.setdefault(workload, {})[key] = PooledSpread(math.sqrt(max(0.0, squares / dof)), int(configs), int(dof))
    return out
