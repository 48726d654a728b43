"""The sustainable rate's gate: a blessed rate re-probed as one open-loop cell (no pytest import).

Why not search again and compare the answers: a search is several cells, and its answer moves by
a bisection step from session to session on noise alone, so comparing two searches' rates would
either alarm often or need a tolerance as wide as the step. Whether a config still carries the
traffic it carried when blessed is one question that one cell answers. So a bless stores, in the
config's baseline file (section ``sustainable_rate``, ``baseline.rate_entry``), the rate its search
found, the SLO it was found under and that rate's goodput samples as a cell entry; a later
session measures that rate as one open-loop cell with the usual repeats and judges its goodput
against those samples by the throughput gate's own rule, tolerance and confirmation run
(``measurement.measure_config`` with the entry as the cell's baseline). Goodput at a fixed offered
rate is the rate's own test: below capacity it is the offered rate whatever the speed, and it falls
as requests start missing the SLO. Measured (``benchmarks/bench_rate_gate.py``, docs/benchmarks.md):
its false alarms are within output tok/s's budget, its power is not: under a p99 SLO the requests
that cross the line on a slower config are the tail's, so its goodput moves little (a config 25%
slower is caught about 93% of the time, 10% slower 12%; the tok/s gate catches those).

The rule's between-session spread of that one cell is not its own three blessed sessions' (2 degrees
of freedom: when they happen to agree, the floor is all that is left, and an unchanged sweep's 18
rate tests failed 2-3% of sweeps against the budget's 2%) but the spread pooled over every config's
blessed rate on this hardware profile under the same SLO (``pooled_spread``), as output tok/s pools
the launch spread, where wider than its own; the config's own where fewer than
``baseline.MIN_POOLED_CONFIGS`` configs' entries hold two sessions or more. The message says which.

A failure on the config's launch is judged again on a fresh launch (``Relaunch``, where the profile
can relaunch: ``relaunch_flagged``) and stands only where it reproduces there: at the SLO's edge one
slow launch crosses the line that the config does not. With it an unchanged sweep's 18 rate tests
fail 1.6% of sweeps (docs/benchmarks.md), within the budget's 2%.

A session with another SLO than the blessed one cannot judge the rate (its goodput counts other
requests as good): it says "bless again" and searches as an unblessed session does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_ddtree.metrics import REQUEST_GOODPUT
from pytest_ddtree.gates.throughput.baseline import (MIN_POOLED_CONFIGS, PooledSpread, baseline_cell_entry,
                                                     rate_between_spread, rate_entry)
from pytest_ddtree.gates.throughput import verdicts, measurement
from pytest_ddtree.baselines import BaselineStore
from pytest_ddtree.measure import load, stats
from pytest_ddtree.service.base import ServiceError
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.records.rate_shapes import REBLESS, RateGateData, SustainableRateData
from pytest_ddtree.measure.slo import SLO, RateProbe, RateSearch
from pytest_ddtree.records.words import GateDecision, Status


#: The gated metric of a blessed rate: bench_serving's request_goodput (good requests per second).
GOODPUT = REQUEST_GOODPUT


def same_slo(blessed: Mapping[str, Any], slo: SLO) -> bool:
    """Whether the blessed entry's SLO (``SLO.record()``) is ``slo``: the same targets and percentile."""
    targets = blessed.get("goodput_slos_ms")
    if not isinstance(targets, Mapping) or not stats.is_number(blessed.get("percentile")):
        return False
    return {str(k): float(v) for k, v in targets.items()} == slo.as_dict() \
        and float(blessed["percentile"]) == slo.percentile


def pooled_spread(store: BaselineStore, slo: SLO) -> dict[str, PooledSpread]:
    """The blessed rates' goodput between-session spread per workload, pooled over every config's
    baseline file of ``store``'s hardware profile whose entry was blessed under ``slo`` (another
    SLO's edge is another rate's); read once per session by the suite (files that cannot be read
    are left out: their own rate test reports them)."""
    sections = [{w: e for w, e in section.items() if same_slo(e.get("slo") or {}, slo)}
                for section in measurement.blessed_rate_sections(store)]
    return {w: by_metric[GOODPUT] for w, by_metric in rate_between_spread(sections).items() if GOODPUT in by_metric}


def bless_rate(search: RateSearch, existing: Mapping[str, Any] | None, slo: SLO) -> float | None:
    """The rate a bless stores: the blessed entry's rate where it was blessed under ``slo`` and this
    session sustained at least it, else the rate this search found (None: it found none).

    Why not always the found rate: a search's answer moves by a bisection step from session to
    session on noise alone, and an entry blessed at a new rate starts over with this session's
    samples only, so most entries held one session and their tolerance never saw a day (bench_rate_gate.py:
    70-75% of blessed entries). A rate that every blessed session met gathers their samples; a
    session that did not sustain it moves the entry down to what it did sustain."""
    found = search.sustainable
    if existing is None or found is None or not same_slo(existing.get("slo") or {}, slo):
        return found
    kept = existing.get("rate")
    return float(kept) if stats.is_number(kept) and 0 < float(kept) <= found else found


def bless_entry(rate: float | None, campaigns: Mapping[float, measurement.Campaign], template: load.CellLike,
                slo: SLO, existing: Mapping[str, Any] | None, session: str) -> tuple[dict[str, Any] | None, str]:
    """The ``sustainable_rate.<workload>`` entry a bless proposes at ``rate`` (``bless_rate``; None and
    why when it proposes none).

    The rate's own probe gives the samples (``campaigns[rate]``); a probe whose measurement is not
    valid is not blessed, as a cell's is not. The blessed sessions of ``existing`` are kept (the
    last three, as a cell's) while the rate and the SLO stay; a new rate or SLO starts over."""
    if rate is None:
        return None, f"no rate met {slo.label}: there is no sustainable rate to bless"
    cell = measurement.rate_cell(template, rate)
    facts = measurement.cell_input(campaigns[rate], cell, None)
    if facts.status != Status.VALID:
        return None, (f"the measurement at {rate:g} req/s is {facts.status}: "
                      + ("; ".join(facts.problems) or "see its repeats in the records"))
    goodput = list(facts.current.get(GOODPUT) or [])
    if not goodput or min(goodput) <= 0:
        return None, f"a repeat at {rate:g} req/s had no request meeting {slo.label} (goodput {goodput})"
    old = existing.get("cell") if existing is not None and same_slo(existing.get("slo") or {}, slo) else None
    entry = baseline_cell_entry(facts.workload or {}, {GOODPUT: goodput}, existing=old,
                                     specs=[verdicts.SPECS[GOODPUT]], session=session)
    return rate_entry(rate, slo.record(), entry), f"{rate:g} req/s under {slo.label} proposed for the baseline"


@dataclass(frozen=True)
class RateGateOutcome:
    """The gate's decision for a blessed rate, its message, and the sustainable-rate record."""

    decision: GateDecision
    message: str
    record: SustainableRateData


@dataclass(frozen=True)
class Relaunch:
    """How the rate test gets a fresh launch of its config when the blessed rate failed on the first
    (the profile's ``relaunch_flagged``), and where that launch's repeats are recorded.

    Why: the blessed rate is the SLO's edge, where a launch a few percent slower (KV-cache size,
    CUDA-graph capture: it moves a config's speed as a whole about as much as a day) makes requests
    queue and goodput fall past the tolerance. Measured (``benchmarks/bench_rate_gate.py``, 800
    unchanged ``restart3`` sweeps, docs/benchmarks.md): 21 of the 25 rate tests that failed ran on a
    launch 4-11% slow (the day's and its own shift together), where 1-12% of the tests failed against
    0.05% within 2%; one launch cannot tell that from a config that got slower, so a fresh launch
    decides, as it does for output tok/s at the session's end. ``launch`` raises ``ServiceError``
    where the relaunch fails (then the first launch's failure stands, saying so)."""

    launch: Callable[[], SGLangClient]
    recording: measurement.Recording = measurement.Recording()


@dataclass(frozen=True)
class _Judged:
    """One launch's re-probe of the blessed rate: the gate's status, its evidence and the probe."""

    status: Status
    details: str
    shown: str
    probe: RateProbe


def judge_rate(service: str | SGLangClient, template: load.CellLike, blessed: Mapping[str, Any], repeats: int,
               resolution: float, driving: measurement.Driving, *, config: str, create_command: str, require: bool,
               recording: measurement.Recording = measurement.Recording(),
               pooled: PooledSpread | None = None, relaunch: Relaunch | None = None) -> RateGateOutcome:
    """Re-probe the blessed rate of ``blessed`` (a validated ``sustainable_rate.<workload>`` entry
    under this session's SLO, ``driving.slo``) and judge its goodput; ``driving`` is how each repeat
    drives the service (prompts, accept bound, cell deadline). ``require`` (``--ddtree-require-baselines``)
    makes an inconclusive or untrusted judgement a failure, as it does a cell's. ``pooled``: the
    between-session spread pooled over the hardware profile's blessed rates (``pooled_spread``; None:
    the entry's own sessions' spread). ``relaunch``: a failure is re-judged on a fresh launch and
    stands only where it reproduces there (``Relaunch``; None: the first launch decides)."""
    slo = driving.slo
    if slo is None:
        raise ValueError("judge_rate needs the SLO the rate was blessed under (Driving.slo)")
    rate = float(blessed["rate"])
    where = f"{config}: its blessed sustainable rate {rate:g} req/s on {template.name} under SLO {slo.label}"
    first = _judge_launch(service, template, blessed, repeats, driving, config, recording, pooled)
    judged, before = first, ""
    if first.status in verdicts.FAILING and relaunch is not None:
        try:
            client = relaunch.launch()
        except ServiceError as exc:
            before = f"\n  - a fresh launch would have decided it, but the relaunch failed: {exc}"
        else:
            judged = _judge_launch(client, template, blessed, repeats, driving, f"{config} relaunched",
                                   relaunch.recording, pooled)
            before = f"\n  - its first launch failed: {first.shown}{first.details.replace(chr(10), chr(10) + '  ')}"
    relaunched = judged is not first
    status, shown, details = judged.status, judged.shown, judged.details
    decision: GateDecision
    if status in verdicts.FAILING:
        decision = Status.FAIL
        message = (f"{where} no longer holds{' on a fresh launch either' if relaunched else ''}: {shown}.{details}"
                   f"{before}\n  If the change is intended, bless again: "
                   f"{create_command} (a session without the blessed rate searches the rate this build sustains)")
    elif status in (Status.INCONCLUSIVE, Status.THIN, Status.MISSING):
        decision = Status.FAIL if require else Status.SKIP
        message = (f"{where}: {str(status).upper()}, not judged{' on a fresh launch' if relaunched else ''}: "
                   f"{shown}{details}{before}" + (" (--ddtree-require-baselines)" if require else ""))
    elif relaunched:
        decision = Status.PASS
        message = (f"{where} held on a fresh launch: {shown}{before}\n  A launch that much slower misses the SLO's "
                   "edge where the config does not: the fresh launch decides (docs/gates/throughput.md)")
    elif judged.probe.reason:
        # goodput is what is gated; the blessed rate is the highest that met the SLO, so a launch a
        # little slower misses it there while its goodput holds: say both, not "still holds"
        decision = Status.PASS
        message = (f"{where}: its goodput held ({shown}), but this probe missed the SLO at that rate: the blessed "
                   "rate sits at the SLO's edge, where a slower launch or day misses it; goodput is what is gated "
                   "(its error budget: docs/benchmarks.md)")
    else:
        decision = Status.PASS
        message = f"{where} still holds: {shown}"
    held = decision is Status.PASS
    probes = [first.probe, judged.probe] if relaunched else [first.probe]
    record = RateSearch(rate if held else None, None if held else rate, probes, resolution).record(template.name, slo)
    record["gate"] = {"blessed_rate": rate, "status": str(status), "message": message}
    if relaunched:
        record["gate"]["first_launch"] = str(first.status)
    return RateGateOutcome(decision, message, record)


def _judge_launch(service: str | SGLangClient, template: load.CellLike, blessed: Mapping[str, Any], repeats: int,
                  driving: measurement.Driving, label: str, recording: measurement.Recording,
                  pooled: PooledSpread | None) -> _Judged:
    """The blessed rate measured as one open-loop cell on this launch, its goodput judged against the
    entry by the throughput gate's rule, tolerance and confirmation run (``measurement.measure_config``)."""
    slo = driving.slo
    assert slo is not None  # judge_rate checked it
    rate = float(blessed["rate"])
    cell = measurement.rate_cell(template, rate)
    campaign = measurement.measure_config(service, [cell], repeats, dataclasses.replace(driving, label=label),
                                         baseline={cell.name: blessed["cell"]},
                                         judging=measurement.Judging(gated=(GOODPUT,), slo_edge=False, between_spread=(
                                             None if pooled is None else {GOODPUT: pooled.spread})), recording=recording)
    probe = measurement.rate_probe(campaign.runs[cell.name], rate, slo)
    verdict = campaign.verdicts[cell.name]
    base = (blessed["cell"].get("gates") or {}).get(GOODPUT) or {}
    base_median, tolerance = base.get("median"), float(base.get("tolerance", verdicts.SPECS[GOODPUT].tolerance))
    judged = verdict.metric(GOODPUT)
    status = verdict.status
    details = "".join(f"\n  - {line}" for line in verdict.message(label).split("\n  - ")[1:])
    measured = list(measurement.cell_input(campaign, cell, None).current.get(GOODPUT) or [])
    if status not in verdicts.FAILING and measured and min(measured) <= 0 and stats.is_number(base_median) \
            and stats.median(measured) < float(base_median) * (1 - tolerance):
        # the rule works on logs and leaves a repeat with no good request unjudged: at a rate the
        # blessed repeats all met, a median beyond the tolerance below them is the regression itself
        status = Status.REGRESSION
        details = (f"\n  - {sum(1 for v in measured if v <= 0)} of {len(measured)} repeat(s) had no request meeting "
                   f"the SLO (goodput per repeat {[round(v, 3) for v in measured]})")
    shown = (f"goodput {_num(probe.figures.get(GOODPUT))} req/s against the blessed {_num(base_median)} req/s "
             f"({_tolerance(judged.tolerance if judged is not None else tolerance, pooled, blessed)}), "
             f"SLO attainment {_pct(probe.figures.get('slo_attainment'))}"
             + (f"; {probe.reason}" if probe.reason else f"; {slo.label} met"))
    return _Judged(status, details, shown, probe)


def rebless_note(blessed: Mapping[str, Any], slo: SLO) -> RateGateData:
    """The record's ``gate`` of a session whose SLO is not the blessed one (searched, not judged)."""
    return {"blessed_rate": float(blessed["rate"]), "status": REBLESS,
            "message": f"blessed under SLO {(blessed.get('slo') or {}).get('label', '?')}, this session's is {slo.label}: "
                       "bless again to gate the rate under it"}


def unjudged(config: str, workload: str, blessed: Mapping[str, Any] | None, slo: SLO, path: str, create_command: str,
             require: bool) -> tuple[GateDecision, str]:
    """What a searched, ungated rate says: no blessed rate, or one blessed under another SLO ("bless
    again"); a warning, a failure under ``--ddtree-require-baselines`` (as a cell without a baseline)."""
    if blessed is not None:
        why = (f"{config}: its sustainable rate on {workload} was blessed under SLO "
               f"{(blessed.get('slo') or {}).get('label', '?')}, this session's is {slo.label}: a rate is not judged "
               f"against another SLO's goodput (searched and reported instead); bless again: {create_command}")
    else:
        why = (f"{config}: no blessed sustainable rate on {workload} in {path}: searched and reported, not gated; "
               f"bless it with: {create_command}")
    if require:
        return Status.FAIL, why + " (--ddtree-require-baselines)"
    return Status.WARN, why


def _tolerance(tolerance: float, pooled: PooledSpread | None, blessed: Mapping[str, Any]) -> str:
    """The tolerance and the between-session spread it holds: pooled over how many configs, or its own."""
    if pooled is not None:
        return (f"tolerance {tolerance:.1%}, its between-session spread its own or, where wider, {pooled.spread:.1%} "
                f"pooled over {pooled.configs} configs' blessed rates on this hardware")
    sessions = len(((blessed["cell"].get("gates") or {}).get(GOODPUT) or {}).get("sessions") or [])
    return (f"tolerance {tolerance:.1%}, its between-session spread its own {sessions} blessed session(s)' "
            f"(fewer than {MIN_POOLED_CONFIGS} configs' rates blessed in 2+ sessions to pool)")


def _num(value: Any) -> str:
    return f"{float(value):.3g}" if stats.is_number(value) else "n/a"


def _pct(value: Any) -> str:
    return f"{float(value):.1%}" if stats.is_number(value) else "n/a"
