"""An open-loop cell at its SLO's edge: its goodput recorded, not judged (no pytest import).

Why: an open-loop cell offers a fixed rate. Below the config's edge (the rate where the SLO's
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from pytest_ddtree.measure import stats
from pytest_ddtree.metrics import REQUEST_GOODPUT, SLO_LATENCY_SHARE

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
