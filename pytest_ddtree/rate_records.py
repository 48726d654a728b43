"""The shapes of the deployment answer's records: an SLO, a rate search and its probes.

Why a module of their own: ``records.py`` holds every kind's shape and stays one readable page;
these three are re-exported there (``records.SHAPES`` checks a ``sustainable-rate`` record
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


class SustainableRateData(TypedDict):
    """``RecordKind.SUSTAINABLE_RATE``: one config's highest rate under the SLO (``slo.RateSearch``;
    None: not even the search's lowest rate), the first rate above it that missed, and every probe."""

    workload: str
    slo: SLOData
    sustainable_rate: float | None
    missed_rate: float | None
    step: float | None
    resolution: float
    probes: list[RateProbeData]
