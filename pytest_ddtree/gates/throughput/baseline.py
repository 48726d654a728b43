"""A throughput baseline entry: what a bless writes and a session reads back, and what the blessed
entries say about noise (no pytest).

The baseline file's ``metrics`` and ``sustainable_rate`` sections: the entries a bless writes, and
a section read back and checked (a file without a section reads as an empty one: files written
before a section existed keep loading unchanged).

Layout of a config's ``metrics`` section (``baselines/<hardware-profile>/<config>.yaml``, ``metrics``)::

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

**The noise pooled over blessed entries**: how much a cell or a config moves when nothing regressed, pooled over every config blessed on the
hardware profile: the launch and day spread of a config's common change, each cell's repeat noise
(what ``rule.judge_config`` takes as ``launch_spread`` and ``cell_noise``), and the blessed
sustainable rates' between-session spread (its ``between_spread``, for the rate gate's one cell).

**An open-loop cell at its SLO's edge**: its goodput recorded, not judged. Why: an open-loop cell offers a fixed rate. Below the config's edge (the rate where the SLO's
percentile latency reaches its target) every request is good and goodput is the offered rate,
whatever the config's speed; at the edge a launch or a day a little slower pushes the tail over the
target and goodput falls off a cliff. ``benchmarks/bench_rate_gate.py`` measured it: the 4 req/s cell
of configs that sustain 2-4 req/s lost 9-45% of its goodput on a 2% slower launch while its three
blessed sessions agreed within 0-2%, so no tolerance made from those sessions holds it, and the
open-loop cells' goodput failed 17.5% of 40 unchanged ``restart3`` sweeps. What goodput at the
edge would catch, a config that carries less traffic, is the sustainable rate's gate's question
(``rate_gate.py``), which re-probes the config's own blessed rate.

The evidence is the blessed side's only: a bless keeps, per blessed session, the worst
``SLO_LATENCY_SHARE`` of its counted repeats (the SLO's percentile latency over its target, the
largest over its targets) beside the goodput samples (``slo_latency_share`` of the session in
``gates.request_goodput.sessions``). A judged session never exempts a cell by what it measured
itself, so a regression that only this session shows at the edge still fails through what is
judged (goodput, if the cell was blessed clear of the edge). A cell is at the edge when its worst
blessed share is within ``EDGE_MARGIN`` of 1, or past it (the blessed repeats missed the SLO:
attainment below the percentile, where goodput is the cliff's slope). Baselines blessed before the
share was kept have no evidence: their goodput is judged as before (a gate does not stop judging
on an old file by itself); the next bless records it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Iterator
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from pytest_ddtree.measure import stats
from pytest_ddtree.metrics import REQUEST_GOODPUT, SLO_LATENCY_SHARE
from pytest_ddtree.gates.throughput.verdicts import (BaselineFormatError, DEFAULT_SESSIONS_KEPT, GATED_METRICS,
                                                     MetricBaseline, MetricSpec, RENAMED_GATES, SPECS)
from pytest_ddtree.gates.throughput.rule import (centre_variance, log_centre, median_chi2_share, robust_log_sd,
                                                 MIN_CELLS_FOR_SHIFT, Metric, session_shifts)
from pytest_ddtree.gates.throughput.session_check import ConfigMove, launch_wobble


#: The key of a blessed session's worst ``SLO_LATENCY_SHARE`` in its goodput gate's ``sessions`` entry.
SESSION_KEY = "slo_latency_share"

#: How much the SLO's percentile latency moves between a blessed session and a judged one at the
#: same offered rate, sd of the log ratio: measured at each config's blessed rate (its edge),
#: unchanged configs, 9.3% / 7.6% / 7.7% under ``restart3`` / ``restart1`` / ``repeat3``
#: (``benchmarks/bench_rate_gate.py``, 40 worlds of 18 configs each, docs/benchmarks.md); the
#: largest. Below the edge the queue is shorter and the latency moves less, so it bounds them.
SLO_LATENCY_BETWEEN_SESSIONS_SD = 0.093

#: A config's share of the sweep's false-alarm budget (2% over its 18 configs), as a one-sided z
#: (3.06): how many of those sds a cell's latency must stand below its target for an unchanged
#: config to cross it no more often than the budget allows.
Z_EDGE = NormalDist().inv_cdf(1 - 0.02 / 18)

#: A cell whose worst blessed share is above ``1 - EDGE_MARGIN`` (0.752) is at the SLO's edge.
EDGE_MARGIN = 1 - math.exp(-Z_EDGE * SLO_LATENCY_BETWEEN_SESSIONS_SD)

#: The metrics an open-loop cell at the edge records but does not judge.
EDGE_METRICS = (REQUEST_GOODPUT,)


class SLOEdgeError(ValueError):
    """A blessed session's ``slo_latency_share`` is not a positive number."""


def session_share(repeats: Sequence[Mapping[str, Any]]) -> float | None:
    """The worst (largest) ``SLO_LATENCY_SHARE`` of a session's counted repeats' metrics; None
    where none has one (no SLO, or no request succeeded)."""
    shares = [float(v) for m in repeats if stats.is_number(v := m.get(SLO_LATENCY_SHARE)) and math.isfinite(float(v))]
    return max(shares) if shares else None


def validate_share(value: Any, where: str) -> None:
    """Check a blessed session's ``slo_latency_share`` as read from a file (hostile: a hand edit)."""
    if isinstance(value, bool) or not stats.is_number(value) or not 0 < float(value) < math.inf:
        raise SLOEdgeError(f"{where}.{SESSION_KEY} must be a positive number (the session's worst ratio of the "
                           f"SLO's percentile latency to its target), got {value!r}: fix it, or delete it and bless "
                           f"the cell again")


def blessed_share(baseline_cell: Any) -> float | None:
    """The worst share over the blessed sessions of the cell's goodput gate that kept one (None: none did)."""
    gates = baseline_cell.get("gates") if isinstance(baseline_cell, Mapping) else None
    goodput = gates.get(REQUEST_GOODPUT) if isinstance(gates, Mapping) else None
    sessions = goodput.get("sessions") if isinstance(goodput, Mapping) else None
    shares = [float(s[SESSION_KEY]) for s in sessions or [] if isinstance(s, Mapping)
              and stats.is_number(s.get(SESSION_KEY)) and not isinstance(s.get(SESSION_KEY), bool)]
    return max(shares) if shares else None


@dataclass(frozen=True)
class EdgeExemption:
    """Which metrics an open-loop cell records but does not judge, and why (its verdict's reason)."""

    metrics: tuple[str, ...]
    share: float
    reason: str


def edge_exemption(baseline_cell: Any, percentile: float) -> EdgeExemption | None:
    """Whether an open-loop cell's blessed measurement stood at (or past) the SLO's edge, and what it
    then does not judge; None where it stood clear of it or the baseline kept no share (judged)."""
    share = blessed_share(baseline_cell)
    if share is None or share < 1 - EDGE_MARGIN:
        return None
    where = ("past the SLO's edge when blessed (its blessed repeats missed the SLO: attainment below the "
             f"percentile): the SLO's p{percentile:g} latency at {share:.0%} of its target" if share > 1 else
             f"at the SLO's edge when blessed: the SLO's p{percentile:g} latency at {share:.0%} of its target")
    reason = (f"{', '.join(EDGE_METRICS)} recorded, not judged: {where} in its worst blessed repeat; within "
              f"{EDGE_MARGIN:.0%} of its target a slower launch or day crosses it and goodput falls off a cliff "
              f"(docs/gates/throughput.md), so the sustainable rate's gate judges the config's capacity instead")
    return EdgeExemption(EDGE_METRICS, share, reason)


#: The control's name in baselines/ (its baseline file) and in the records (gates/throughput/control.py).
CONTROL = "control"


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
    launches: int | None = None,
    slo_share: float | None = None,
) -> dict[str, Any]:
    """The ``metrics.<cell>`` entry after blessing this session's samples.

    The session is appended to the sessions already there (an old single-session entry
    counts as one) and only the last ``keep`` are kept; a workload change starts over, since
    the old numbers measured something else. A tolerance already in ``existing`` (edited by a
    reviewer) is kept; metrics without samples (e.g. acceptance of a non-speculative server)
    are left out. ``launches``: how many launches of the service the session's samples pool (the
    control's, ``gates/throughput/control.py``), kept with the session as ``launches`` (and kept for the sessions
    already there), so a judged session knows how much launch-to-launch noise each blessed one averaged.
    ``slo_share``: an open-loop cell's worst ``SLO_LATENCY_SHARE`` this session (``slo_edge.py``), kept
    with its goodput session as ``slo_latency_share`` (and kept for the sessions already there).
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
        share = slo_share if spec.key == REQUEST_GOODPUT else None
        if "direction" in old:
            counts, shares = launch_counts(old), _session_shares(old)
            history = [{"session": sid, "samples": list(v), **({"launches": counts[sid]} if sid in counts else {}),
                        **({SESSION_KEY: shares[sid]} if sid in shares else {})}
                       for sid, v in MetricBaseline.from_entry(spec.key, old).sessions if v and sid != session]
        history.append({"session": session, "samples": [_round(v) for v in values],
                        **({"launches": int(launches)} if launches is not None else {}),
                        **({SESSION_KEY: _round(share)} if share is not None else {})})
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


def launch_counts(gate: Mapping[str, Any]) -> dict[str, int]:
    """Session id -> ``launches`` of a gate entry's blessed sessions that say it."""
    sessions = gate.get("sessions")
    return {str(s.get("session", i)): int(s["launches"]) for i, s in enumerate(sessions if isinstance(sessions, list) else [])
            if isinstance(s, Mapping) and isinstance(s.get("launches"), int) and not isinstance(s.get("launches"), bool)}


def _session_shares(gate: Mapping[str, Any]) -> dict[str, float]:
    """Session id -> ``slo_latency_share`` of a gate entry's blessed sessions that kept one."""
    sessions = gate.get("sessions")
    return {str(s.get("session", i)): float(s[SESSION_KEY]) for i, s in enumerate(sessions if isinstance(sessions, list) else [])
            if isinstance(s, Mapping) and stats.is_number(s.get(SESSION_KEY))}


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
            for i, s in enumerate(sessions):
                n = s.get("launches", 1)
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise BaselineFormatError(
                        f"{w}.sessions[{i}].launches must be a whole number >= 1 (how many launches the session's "
                        f"samples pool), got {n!r}: fix it or leave it out (one launch)")
                if SESSION_KEY in s:
                    try:
                        validate_share(s[SESSION_KEY], f"{w}.sessions[{i}]")
                    except SLOEdgeError as exc:
                        raise BaselineFormatError(str(exc)) from None
    return dict(section)


#: The baseline file's section of blessed sustainable rates: workload -> ``rate_entry``.
RATE_SECTION = "sustainable_rate"


def rate_entry(rate: float, slo: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sustainable_rate.<workload>`` entry: the rate a bless found, the SLO it was found under
    (``SLO.record()``) and that rate's cell (``baseline_cell_entry`` of its goodput samples), which a
    later session's re-probe of the rate is judged against (``rate_gate.py``). The rate is kept
    exact: it is the re-probed cell's ``request_rate``, which its cell's workload must match."""
    return {"rate": float(rate), "slo": dict(slo), "cell": dict(cell)}


def validate_rate_section(section: Any, where: str) -> dict[str, dict[str, Any]]:
    """Check a loaded ``sustainable_rate`` section; raise BaselineFormatError saying what to fix."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise BaselineFormatError(f"{where}: {RATE_SECTION!r} must be a mapping of workload -> entry, "
                                  f"got {type(section).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for workload, entry in section.items():
        w = f"{where}: {RATE_SECTION}.{workload}"
        if not isinstance(entry, Mapping):
            raise BaselineFormatError(f"{w} must be a mapping with 'rate', 'slo' and 'cell'")
        rate = entry.get("rate")
        if not stats.is_number(rate) or not 0 < float(rate) < math.inf:
            raise BaselineFormatError(f"{w}.rate must be a positive number (requests/s), got {rate!r}")
        slo = entry.get("slo")
        if not isinstance(slo, Mapping) or not isinstance(slo.get("goodput_slos_ms"), Mapping) \
                or not all(stats.is_number(v) for v in slo["goodput_slos_ms"].values()) \
                or not stats.is_number(slo.get("percentile")):
            raise BaselineFormatError(f"{w}.slo must be a mapping with goodput_slos_ms (target -> ms) and percentile")
        if not isinstance(entry.get("cell"), Mapping):
            raise BaselineFormatError(f"{w}.cell must be a mapping with 'workload' and 'gates' (the rate's goodput)")
        cell = validate_section({"cell": entry["cell"]}, w)["cell"]
        out[str(workload)] = {"rate": float(rate), "slo": dict(slo), "cell": dict(cell)}
    return out


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
