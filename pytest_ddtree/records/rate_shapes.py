"""The shapes of the deployment answer's records: an SLO, a rate search and its probes.

Why a module of their own: ``records.py`` holds every kind's shape and stays one readable page;
these are re-exported there (``records.SHAPES`` checks a ``sustainable-rate`` record
against :class:`SustainableRateData`) and written by ``slo.py``.
"""

from __future__ import annotations

from typing import TypedDict


class SLOData(TypedDict):
    """The latency SLO goodput was counted against (``slo.SLO``): bench_serving's ``goodput_slos_ms``."""

    label: str
    goodput_slos_ms: dict[str, float]
    percentile: float


class RateProbeData(TypedDict):
    """One rate of a sustainable-rate search (``slo.RateProbe``)."""

    rate: float
    met: bool
    reason: str | None
    figures: dict[str, float | None]


#: A rate gate's status where the session's SLO is not the blessed one: searched, not judged.
REBLESS = "rebless"


class _RateGateRequired(TypedDict):

    blessed_rate: float
    status: str
    message: str | None


class RateGateData(_RateGateRequired, total=False):
    """The blessed rate's re-probe (``gates/throughput/rate_gate.py``): the rate the bless stored, the
    gate's status (pass, improved, regression, inconclusive, ...; ``rebless`` for a changed SLO) and
    why; ``first_launch``: the first launch's status where a fresh launch decided (its probe is the
    record's first, the fresh launch's the second)."""

    first_launch: str


class _SustainableRateRequired(TypedDict):

    workload: str
    slo: SLOData
    sustainable_rate: float | None
    missed_rate: float | None
    step: float | None
    resolution: float
    probes: list[RateProbeData]


class SustainableRateData(_SustainableRateRequired, total=False):
    """``RecordKind.SUSTAINABLE_RATE``: one config's highest rate under the SLO (``slo.RateSearch``;
    None: not even the search's lowest rate), the first rate above it that missed, and every probe.
    ``search_limit``: what stopped the search short of its resolution (``max_rate``: every probe met,
    so the rate is a lower bound; ``max_probes``; None: nothing; absent in records written before it).
    A session that judged a blessed rate re-probed that one rate and says so in ``gate``."""

    search_limit: str | None
    gate: RateGateData
