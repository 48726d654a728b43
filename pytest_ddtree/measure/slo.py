"""Latency SLOs, goodput, and the highest request rate a config sustains under one (no pytest import).

Why: the deployment question is not "how many tok/s at concurrency C" but "how much traffic does
this config carry while its users still get their first token in X ms and their tokens every Y ms",
and for speculative decoding the answer moves with load (a bigger tree wins at one request and
loses at many). The definitions follow the tools deployers use:

* **Goodput** is bench_serving's (SGLang 0.5.23 sglang/benchmark/goodput.py ``calculate_goodput``):
  a request is good when it succeeded and met every given target (TTFT, TPOT = (E2E - TTFT) /
  (output tokens - 1), 0 for a one-token answer, and E2E); ``request_goodput`` is good requests per
  second of the benchmark's duration, ``slo_attainment`` good requests over requests sent, and
  ``slo_attainment_by_metric`` each target's share. The targets' keys are bench_serving's
  ``ttft``/``tpot``/``e2el`` in milliseconds.
* **A rate meets the SLO** when, over every request of the rate's counted repeats, each target's
  ``percentile``-th value (p99 by default; vLLM's ``serve_sla`` reads ``p99_e2el_ms<=500`` the
  same way) is within its target and no request failed: a rate at which the service drops or
  cuts requests is not sustained, however fast the rest were.
* **The sustainable rate** of a config is the highest rate that meets the SLO, found by
  :func:`search_rate`: probe rates doubling from ``min_rate`` until one misses (or ``max_rate``
  is reached), then bisect between the last rate that met and the first that missed until the
  bracket is within ``resolution`` of the rate (a bounded number of cells). Where every probe met
  up to ``max_rate``, or ``max_probes`` ran out first, the answer is only a bound, and the search
  says which (``RateSearch.limit``): a rate reported as found that was only the search's ceiling
  would send a deployer to a config's limit that nobody measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_ddtree.metrics import REQUEST_GOODPUT, SLO_LATENCY_SHARE
from pytest_ddtree.measure import stats
from pytest_ddtree.records.rate_shapes import RateProbeData, SLOData, SustainableRateData


class TimedRequest(Protocol):
    """What goodput reads of a request (``generate_stream.RequestResult``; a protocol, so the matrix
    can read an SLO without importing the load generator)."""

    @property
    def ok(self) -> bool: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def e2e_s(self) -> float: ...
    @property
    def completion_tokens(self) -> int: ...


class SLOError(ValueError):
    """An SLO or a rate search was written wrong; the message says how to write it."""


#: The SLO's keys (milliseconds) -> bench_serving's goodput names (GOODPUT_SLO_METRICS).
TARGETS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2e_ms": "e2el"}
#: Each target's per-repeat percentile key in ``CellResult.metrics`` (bench_serving's names).
METRIC_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e_latency"}
DEFAULT_PERCENTILE = 99.0


@dataclass(frozen=True)
class SLO:
    """Latency targets in ms (any of TTFT, TPOT, E2E) at a percentile of the requests."""

    targets: tuple[tuple[str, float], ...]  # bench_serving names (ttft, tpot, e2el) -> ms, in TARGETS order
    percentile: float = DEFAULT_PERCENTILE

    def as_dict(self) -> dict[str, float]:
        """bench_serving's ``goodput_slos_ms``."""
        return dict(self.targets)

    @property
    def label(self) -> str:
        """``p99 ttft<=500ms tpot<=50ms``: how the terminal, results.json and the report name it."""
        return f"p{self.percentile:g} " + " ".join(f"{name}<={ms:g}ms" for name, ms in self.targets)

    def record(self) -> SLOData:
        return {"label": self.label, "goodput_slos_ms": self.as_dict(), "percentile": self.percentile}


def parse_slo(text: str, where: str = "--ddtree-slo") -> SLO:
    """``ttft_ms=500,tpot_ms=50,e2e_ms=4000[,percentile=99]`` -> SLO."""
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise SLOError(f"{where}: {part!r} is not KEY=VALUE; write e.g. ttft_ms=500,tpot_ms=50,percentile=99")
        values[key.strip()] = value.strip()
    return slo_from_mapping(values, where)


def slo_from_mapping(values: Mapping[str, Any], where: str) -> SLO:
    """An SLO from a mapping (a matrix or profile ``slo:`` key, or parsed ``--ddtree-slo``)."""
    if not isinstance(values, Mapping):
        raise SLOError(f"{where}: an SLO is a mapping of {', '.join(TARGETS)} (ms) and percentile, got {values!r}")
    unknown = sorted(set(values) - {*TARGETS, "percentile"})
    if unknown:
        raise SLOError(f"{where}: unknown SLO key(s) {unknown}; valid: {', '.join(TARGETS)}, percentile")
    targets: list[tuple[str, float]] = []
    for key, name in TARGETS.items():
        if key in values:
            targets.append((name, _positive(values[key], f"{where}: {key}")))
    if not targets:
        raise SLOError(f"{where}: an SLO needs at least one of {', '.join(TARGETS)} (milliseconds)")
    percentile = _positive(values.get("percentile", DEFAULT_PERCENTILE), f"{where}: percentile")
    if percentile > 100:
        raise SLOError(f"{where}: percentile must be within (0, 100], got {percentile:g}")
    return SLO(tuple(targets), percentile)


def _positive(value: Any, where: str) -> float:
    try:
        number = float(str(value).removeprefix("p")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        raise SLOError(f"{where} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not (0 < number < math.inf):
        raise SLOError(f"{where} must be a positive number, got {value!r}")
    return number


def _observed_ms(r: TimedRequest) -> dict[str, float]:
    """One request's figures as bench_serving's calculate_goodput sees them (ms)."""
    ttft = r.ttft_s or 0.0
    tpot = (r.e2e_s - ttft) / (r.completion_tokens - 1) if r.completion_tokens > 1 else 0.0
    return {"ttft": ttft * 1000, "tpot": tpot * 1000, "e2el": r.e2e_s * 1000}


def goodput(requests: Sequence[TimedRequest], slo: SLO, duration_s: float) -> dict[str, float | None]:
    """bench_serving's goodput figures of one repeat, flat (``slo_attainment_<name>`` for its
    ``slo_attainment_by_metric``): a metrics dict holds numbers only; and the repeat's
    ``SLO_LATENCY_SHARE`` (how near its requests that succeeded stand to the SLO's edge)."""
    good, met = 0, dict.fromkeys(dict(slo.targets), 0)
    observed = [_observed_ms(r) for r in requests if r.ok]
    for seen in observed:
        passed = [name for name, ms in slo.targets if seen[name] <= ms]
        for name in passed:
            met[name] += 1
        good += len(passed) == len(slo.targets)
    sent = len(requests)
    out: dict[str, float | None] = {
        REQUEST_GOODPUT: good / duration_s if duration_s > 0 else None,
        "slo_attainment": good / sent if sent else None,
    }
    for name, count in met.items():
        out[f"slo_attainment_{name}"] = count / sent if sent else None
    out[SLO_LATENCY_SHARE] = latency_share(observed, slo)
    return out


def latency_share(observed: Sequence[Mapping[str, float]], slo: SLO) -> float | None:
    """The largest, over ``slo``'s targets, of the requests' ``slo.percentile``-th value over its
    target (``observed``: each request's ``_observed_ms``); None without requests. At most 1 where
    these requests meet the SLO (as ``slo_miss`` judges a rate); how far below 1 is how much a slower
    launch or day they can take before they miss it."""
    if not observed:
        return None
    return max(stats.percentile([o[name] for o in observed], slo.percentile) / ms for name, ms in slo.targets)


def slo_miss(requests: Sequence[TimedRequest], slo: SLO) -> str | None:
    """Why these requests (a rate's counted repeats, pooled) miss the SLO, or None when they meet it."""
    if not requests:
        return "no requests were measured"
    failed = sum(1 for r in requests if not r.ok)
    if failed:
        return f"{failed} of {len(requests)} requests failed"
    misses = []
    for name, ms in slo.targets:
        value = stats.percentile([_observed_ms(r)[name] for r in requests], slo.percentile)
        if value > ms:
            misses.append(f"p{slo.percentile:g} {name} {value:.1f} ms > {ms:g} ms")
    return "; ".join(misses) or None


@dataclass(frozen=True)
class RateProbe:
    """One rate measured: whether it met the SLO, why not, and its figures (medians over repeats)."""

    rate: float
    met: bool
    reason: str | None = None
    figures: Mapping[str, float | None] = field(default_factory=dict)


#: Why a search stopped before it had bracketed the rate within its resolution (``RateSearch.limit``).
LIMIT_MAX_RATE = "max_rate"      # every probe met, up to the search's max_rate: the rate is a lower bound
LIMIT_MAX_PROBES = "max_probes"  # its probes ran out: a lower bound, or a bracket wider than the resolution


@dataclass
class RateSearch:
    """The search's outcome: the highest rate that met (None: not even ``min_rate``), the first
    rate above it that missed (None: none did), every probe in the order measured, and what stopped
    the search short of its resolution (``LIMIT_MAX_RATE``, ``LIMIT_MAX_PROBES``; None: nothing)."""

    sustainable: float | None
    missed: float | None
    probes: list[RateProbe]
    resolution: float
    limit: str | None = None

    def bounded(self) -> str | None:
        """The rate found, said as the bound it is, and what to raise (None: it is the search's answer)."""
        return bounded_rate(self.limit, self.sustainable, self.missed)

    @property
    def step(self) -> float | None:
        """The last bracket's width: the rate is known to within this."""
        if self.sustainable is None or self.missed is None:
            return None
        return self.missed - self.sustainable

    def record(self, workload: str, slo: SLO) -> SustainableRateData:
        """What the session records of the search (``RecordKind.SUSTAINABLE_RATE``)."""
        probes: list[RateProbeData] = [{"rate": p.rate, "met": p.met, "reason": p.reason, "figures": dict(p.figures)}
                                       for p in self.probes]
        return {"workload": workload, "slo": slo.record(), "sustainable_rate": self.sustainable,
                "missed_rate": self.missed, "step": self.step, "resolution": self.resolution, "probes": probes,
                "search_limit": self.limit}


def bounded_rate(limit: str | None, sustainable: float | None, missed: float | None) -> str | None:
    """The rate a search stopped by ``limit`` found, said as the bound it is, with the ``rate_search:``
    key to raise (None: no limit stopped it, or no rate met, which is no bound)."""
    if limit not in (LIMIT_MAX_RATE, LIMIT_MAX_PROBES) or sustainable is None:
        return None
    if limit == LIMIT_MAX_RATE:
        return f"at least {sustainable:g} req/s (every probe met the SLO up to rate_search.max_rate: raise it to find the limit)"
    if missed is None:
        return f"at least {sustainable:g} req/s (rate_search.max_probes ran out before a rate missed the SLO: raise it)"
    return (f"{sustainable:g} req/s, below {missed:g} (rate_search.max_probes ran out before the two were within the "
            "search's resolution: raise it)")


@dataclass(frozen=True)
class SearchPlan:
    """How a rate search runs: its range, when it stops, and the most cells it may measure."""

    min_rate: float
    max_rate: float
    resolution: float = 0.10  # stop when (missed - sustained) <= resolution * sustained
    max_probes: int = 12

    def __post_init__(self) -> None:
        if not (0 < self.min_rate < self.max_rate < math.inf):
            raise SLOError(f"a rate search needs 0 < min_rate < max_rate, got {self.min_rate:g} and {self.max_rate:g}")
        if not (0 < self.resolution < 1) or self.max_probes < 2:
            raise SLOError("a rate search needs 0 < resolution < 1 and max_probes >= 2")


def search_rate(measure: Callable[[float], RateProbe], plan: SearchPlan) -> RateSearch:
    """Probe doubling rates from ``plan.min_rate`` until one misses, then bisect; at most
    ``plan.max_probes`` cells, each measured once by ``measure``."""
    probes: list[RateProbe] = []
    good: float | None = None
    bad: float | None = None
    limit: str | None = None
    rate = plan.min_rate
    while len(probes) < plan.max_probes:
        probe = measure(rate)
        probes.append(probe)
        if not probe.met:
            bad = rate
            break
        good = rate
        if rate >= plan.max_rate:
            limit = LIMIT_MAX_RATE
            break
        rate = min(rate * 2, plan.max_rate)
    else:
        limit = LIMIT_MAX_PROBES
    while good is not None and bad is not None and bad - good > plan.resolution * good:
        if len(probes) >= plan.max_probes:
            limit = LIMIT_MAX_PROBES
            break
        mid = (good + bad) / 2
        probe = measure(mid)
        probes.append(probe)
        if probe.met:
            good = mid
        else:
            bad = mid
    return RateSearch(good, bad, probes, plan.resolution, limit)
