"""The deployment answer: which config to run for an SLO at a load, each config's sustainable rate,
and the Pareto frontier of per-request against aggregate speed (no pytest import).

Why: the sweep table answers "which config is fastest in this cell"; a deployer asks "what do I
run for my SLO at my traffic" and "which configs are ever worth running". A config is on the
frontier of a context when no other measured point of that context is at least as fast for each
request *and* in aggregate (tok/s per request, ``ddtree_median_request_output_throughput``,
against output tok/s): vLLM's ``plot_pareto`` draws the same two axes (tokens/s per user against
tokens/s per GPU). Every config off the frontier is beaten on both at some load by one on it.

The SLO check of a cell reads the cell's percentile figures (``p99_ttft_ms`` ...: the median over
its repeats of each repeat's percentile), the rate search's reads every request pooled
(``slo.slo_miss``); both are in ``docs/gates/throughput.md``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT, REQUEST_GOODPUT, SLO_LATENCY_SHARE
from pytest_ddtree.measure import stats
from pytest_ddtree.records.rate_shapes import REBLESS, SLOData
from pytest_ddtree.records.shapes import RawRecord, ThroughputRecord
from pytest_ddtree.measure.slo import METRIC_KEYS, bounded_rate
from pytest_ddtree.records.words import RecordKind, Status

T = TypeVar("T")

#: The frontier's axes: aggregate output tok/s (x) and the median request's own tok/s (y).
AGGREGATE, PER_REQUEST = OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT


def pareto_front(points: Sequence[tuple[float, float, T]]) -> list[tuple[float, float, T]]:
    """The points no other point dominates (at least as high on both axes, higher on one), by x."""
    front = [p for p in points
             if not any(q[0] >= p[0] and q[1] >= p[1] and (q[0] > p[0] or q[1] > p[1]) for q in points)]
    return sorted(front, key=lambda p: (p[0], p[1]))


def load_label(record: Mapping[str, Any]) -> str:
    """``c8_short (concurrency 8, context 128)`` or ``r4_short (4 req/s, context 128)``."""
    w = record.get("workload") or {}
    rate = w.get("request_rate")
    load = f"{rate:g} req/s" if stats.is_number(rate) else f"concurrency {w.get('concurrency')}"
    return f"{record.get('cell')} ({load}, context {w.get('context_tokens')})"


def cell_meets(metrics: Mapping[str, Any], slo: SLOData) -> bool | None:
    """Whether a cell's figures meet the SLO (None: the figures to say are missing). Percentiles
    the cell reports (90, 95, 99) are read as they are; another percentile is judged on the share
    of requests that met every target (``slo_attainment``)."""
    q = float(slo["percentile"])
    if q not in (90.0, 95.0, 99.0):
        share = metrics.get("slo_attainment")
        return float(share) >= q / 100 if stats.is_number(share) else None
    if stats.is_number(failed := metrics.get("ddtree_failed")) and failed > 0:
        return False
    share = cell_latency_share(metrics, slo)
    return None if share is None else share <= 1


def cell_latency_share(metrics: Mapping[str, Any], slo: SLOData) -> float | None:
    """The largest, over the SLO's targets, of the cell's percentile figure over its target (None:
    a percentile the cell does not report, or a figure missing): how far the cell stands from the
    SLO's edge, 1 being the edge."""
    q = float(slo["percentile"])
    if q not in (90.0, 95.0, 99.0):
        return None
    shares: list[float] = []
    for name, ms in slo["goodput_slos_ms"].items():
        value = metrics.get(f"p{q:g}_{METRIC_KEYS.get(name, name)}_ms")
        if not stats.is_number(value):
            return None
        shares.append(float(value) / float(ms))
    return max(shares, default=None)


def _deploy_key(record: ThroughputRecord, slo: SLOData) -> tuple[float, ...]:
    """How the configs that meet a cell's SLO rank (the highest first). At a closed-loop cell, by
    goodput then output tok/s: a fixed number of users gets more good answers a second from the
    faster one. At an open-loop cell every config that meets the SLO serves the offered rate, so its
    goodput is the schedule's and differs by the last request's finish alone; there the one with the
    most headroom (the lowest latency share: the most load or slower days it can take before it
    misses) ranks first, then goodput."""
    m = record["metrics"]
    share = cell_latency_share(m, slo) if _open_loop(record) else None
    return (-math.inf if share is None else -share, m.get(REQUEST_GOODPUT) or 0.0, m.get(AGGREGATE) or 0.0)


def _open_loop(record: Mapping[str, Any]) -> bool:
    return stats.is_number((record.get("workload") or {}).get("request_rate"))


def _valid(records: Iterable[ThroughputRecord]) -> list[ThroughputRecord]:
    return [r for r in records if r.get("measurement_status") != Status.INVALID]


def at_load(throughput: Sequence[ThroughputRecord]) -> list[dict[str, Any]]:
    """Per cell with an SLO: the configs that meet it and the one to deploy (``_deploy_key``: the
    most headroom at an open-loop cell, the highest goodput at a closed-loop one), or none."""
    by_cell: dict[str, list[ThroughputRecord]] = defaultdict(list)
    for r in _valid(throughput):
        if r.get("slo"):
            by_cell[r["cell"]].append(r)
    out = []
    for cell, recs in by_cell.items():
        slo = recs[0]["slo"]
        meeting = [r for r in recs if cell_meets(r["metrics"], slo)]
        best = max(meeting, key=lambda r: _deploy_key(r, slo), default=None)
        share = cell_latency_share(best["metrics"], slo) if best is not None else None
        out.append({"cell": cell, "load": load_label(recs[0]), "slo": slo["label"],
                    "meeting": sorted(str(r["config"]) for r in meeting), "configs": len(recs),
                    "deploy": str(best["config"]) if best is not None else None,
                    "chosen_by": ("headroom" if _open_loop(recs[0]) and share is not None else REQUEST_GOODPUT)
                    if best is not None else None,
                    SLO_LATENCY_SHARE: share,
                    REQUEST_GOODPUT: best["metrics"].get(REQUEST_GOODPUT) if best is not None else None,
                    OUTPUT_THROUGHPUT: best["metrics"].get(AGGREGATE) if best is not None else None})
    return out


def frontier(throughput: Sequence[ThroughputRecord]) -> list[dict[str, Any]]:
    """Per context: the measured points (config, cell) on the Pareto frontier, slowest aggregate first."""
    by_ctx: dict[int, list[tuple[float, float, tuple[str, str]]]] = defaultdict(list)
    for r in _valid(throughput):
        m = r["metrics"]
        x, y = m.get(AGGREGATE), m.get(PER_REQUEST)
        if stats.is_number(x) and stats.is_number(y):
            by_ctx[int(r["workload"]["context_tokens"])].append((float(x), float(y), (str(r["config"]), str(r["cell"]))))
    return [{"context_tokens": ctx, "points": [{"config": c, "cell": cell, AGGREGATE: x, PER_REQUEST: y}
                                               for x, y, (c, cell) in pareto_front(points)]}
            for ctx, points in sorted(by_ctx.items())]


def sustainable_rates(records: Iterable[RawRecord]) -> list[dict[str, Any]]:
    """Each config's sustainable-rate search (``RecordKind.SUSTAINABLE_RATE``), highest rate first."""
    out = [dict(r) for r in records if r.get("kind") == RecordKind.SUSTAINABLE_RATE]
    return sorted(out, key=lambda r: -(r.get("sustainable_rate") or 0.0))


def _reprobed(record: Mapping[str, Any]) -> bool:
    """A sustainable-rate record of a blessed rate re-probed (one cell), not of a search."""
    gate = record.get("gate")
    return isinstance(gate, Mapping) and gate.get("status") != REBLESS and stats.is_number(gate.get("blessed_rate"))


def _searched_rate(record: Mapping[str, Any]) -> tuple[str, bool]:
    """One config's searched rate as the deployment sentence says it (a bound says it is one), and
    whether it is a rate the search bracketed within its resolution."""
    config, rate, missed = record.get("config"), record.get("sustainable_rate"), record.get("missed_rate")
    if not stats.is_number(rate):
        return f"{config} none", False
    limit = record.get("search_limit")
    bound = bounded_rate(limit if isinstance(limit, str) else None, float(rate),
                         float(missed) if stats.is_number(missed) else None)
    return f"{config} {bound or f'{float(rate):g} req/s'}", bound is None


def deployment(throughput: Sequence[ThroughputRecord], records: Iterable[RawRecord]) -> dict[str, Any]:
    """results.json's ``deployment``: the answer at each load, the sustainable rates, the frontier,
    and the sentences the terminal and the report show (empty dict: nothing to say)."""
    loads, rates, front = at_load(throughput), sustainable_rates(records), frontier(throughput)
    sentences = []
    for entry in loads:
        if entry["deploy"]:
            why = (f"the most headroom: its latency at {entry[SLO_LATENCY_SHARE]:.0%} of the SLO's target; "
                   if entry["chosen_by"] == "headroom" else "")
            sentences.append(f"For SLO {entry['slo']} at load {entry['load']}: deploy {entry['deploy']} "
                             f"({why}goodput {entry[REQUEST_GOODPUT] or 0:.2f} req/s, {entry[OUTPUT_THROUGHPUT] or 0:.1f} "
                             f"output tok/s; {len(entry['meeting'])} of {entry['configs']} configs meet it).")
        else:
            sentences.append(f"For SLO {entry['slo']} at load {entry['load']}: no measured config meets it.")
    searched = [r for r in rates if not _reprobed(r)]
    if searched:
        slo_label = (searched[0].get("slo") or {}).get("label", "?")
        said = [_searched_rate(r) for r in searched]
        sentences.append(f"Sustainable request rate under SLO {slo_label} on {searched[0].get('workload')}: "
                         f"{', '.join(text for text, _ in said)}"  # a word of the resolution only where a rate met it
                         + (" (the highest rate that met it, within the search's resolution of the first that missed, "
                            "unless said)." if any(bracketed for _, bracketed in said) else "."))
    for r in (r for r in rates if _reprobed(r)):
        held = {Status.PASS.value: "still holds", Status.IMPROVED.value: "still holds (goodput improved)",
                Status.REGRESSION.value: "no longer holds"}
        gate = r["gate"]
        verdict = held.get(gate["status"], "could not be judged (" + str(gate["status"]) + ")")
        # the last probe decided: a fresh launch's, where the first launch failed (rate_gate.Relaunch)
        decided = [p for p in r.get("probes") or [] if isinstance(p, Mapping)][-1:]
        missed = [p.get("reason") for p in decided if p.get("reason")]
        if missed and gate["status"] in (Status.PASS.value, Status.IMPROVED.value):
            verdict = f"held its goodput but missed the SLO on this probe ({missed[0]})"
        if gate.get("first_launch") is not None:
            verdict += f" on a fresh launch (its first launch: {gate['first_launch']})"
        sentences.append(f"{r.get('config')}: its blessed sustainable rate {gate['blessed_rate']:g} req/s under SLO "
                         f"{(r.get('slo') or {}).get('label', '?')} on {r.get('workload')}, re-probed, {verdict}.")
    for ctx in front:  # a recommendation compares configs: a context one config measured recommends nothing
        compared = {r["config"] for r in throughput if r["workload"].get("context_tokens") == ctx["context_tokens"]}
        if len(compared) >= 2 and len(ctx["points"]) >= 2:
            shown = ", ".join(f"{p['config']} at {p['cell']}" for p in ctx["points"])
            sentences.append(f"Pareto frontier at context {ctx['context_tokens']} (tok/s per request against aggregate "
                             f"tok/s): {shown}; every other config is beaten on both somewhere on it.")
    if not (loads or rates or any(len(c["points"]) >= 2 for c in front)):
        return {}
    return {"at_load": loads, "sustainable_rates": rates, "frontier": front, "sentences": sentences}
