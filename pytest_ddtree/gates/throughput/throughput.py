"""The throughput gate's logic, between the load generator and the suite's pass/fail.

``suites/test_throughput.py`` stays a thin pytest file users can read and adapt; what it does
for a config lives here, without pytest: measure every cell of the config with interleaved
repeats (``measure_config``), then judge one cell against its baseline and build the record
that results.json and the sweep table are made of (``evaluate_cell``). The same functions
serve scripts that want the gate's verdict without pytest.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from pytest_ddtree.gates import throughput as gate
from pytest_ddtree.service import http, proof
from pytest_ddtree.measure import load, openloop, stats
from pytest_ddtree import progress
from pytest_ddtree.report import text as report
from pytest_ddtree.measure import slo as slo_mod
from pytest_ddtree.baselines import BaselineError, BaselineStore
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.metrics import TOKENS_PER_VERIFY
from pytest_ddtree.measure.slo import SLO, RateProbe, RateSearch, SearchPlan
from pytest_ddtree.records.shapes import RelaunchCellData, RelaunchFailureData, RepeatData, ThroughputData, WorkloadData
from pytest_ddtree.records.words import MeasurementStatus, RecordKind, Status

if TYPE_CHECKING:
    from pytest_ddtree.session import DDTreeSession

#: Repeats beyond --ddtree-repeats that a cell gets while its repeats disagree (pooled).
MAX_EXTRA_REPEATS = 6
#: Repeats agree once the robust spread (scaled MAD / median) of output tok/s is within 12%; a cell
#: whose spread is still above it after the extra repeats is inconclusive (one bound for both: a
#: tighter stopping bound would spend extra repeats on noise the gate's tolerances already absorb;
#: a bless's interval is tightened by ``gate.BLESS_MAX_HALF_WIDTH`` instead).
INCONCLUSIVE_REL_CI = 0.12
#: Fresh repeats of a flagged cell in its confirmation run, in two stages (``confirm_in_stages``):
#: after the first ``CONFIRM_FIRST_STAGE`` a cell that is already cleared with room to spare stops.
CONFIRM_REPEATS = 12
CONFIRM_FIRST_STAGE = 4
#: Each request's deadline as a whole where the gate makes its own client (a URL): the profile's
#: ``request_timeout_s`` default.
REQUEST_TIMEOUT_S = http.REQUEST_TIMEOUT_S

OnSample = Callable[[str, int, load.CellResult], None]
#: One repeat's deadline as a whole (warm-up, flush, measured loop, /server_info) unless the
#: profile's ``cell_timeout_s`` says otherwise: each request has its own (``request_timeout_s``);
#: this one ends a cell whose requests each stay just inside theirs.
CELL_TIMEOUT_S = 3600.0


class CellDeadlineExceeded(load.LoadError):
    """One repeat of a cell was not over by ``cell_timeout_s``: the service is too slow or wedged to
    measure; the message says what had finished and what to raise."""


def run_repeat(client: SGLangClient, workload: load.WorkloadLike, cell_timeout_s: float, **kwargs: Any) -> load.CellResult:
    """``load.run_cell`` as a whole by its deadline (``http.phase``): past it no request is sent
    and those in flight are cut; :class:`CellDeadlineExceeded` then says what had finished."""
    deadline = http.Deadline.after(cell_timeout_s, f"cell {workload.name}", "cell_timeout_s")
    try:
        with http.phase(deadline):
            result = load.run_cell(client, workload, **kwargs)
    except load.LoadError as exc:  # e.g. the prompts' /tokenize cut by the deadline
        if deadline.expired:
            raise CellDeadlineExceeded(f"{workload.name}: {deadline.describe()} passed making the prompts ({exc}); "
                                       f"{deadline.advice()}") from None
        raise
    if deadline.expired:
        done = sum(1 for r in result.requests if r.ok)
        cut = next((r.error for r in result.requests if not r.ok and r.error), None)
        raise CellDeadlineExceeded(
            f"{workload.name}: {deadline.describe()} passed with {done} of {workload.requests} measured requests done"
            + (f" ({cut})" if cut else "") + f"; {deadline.advice()}")
    return result



@dataclass
class Campaign:
    """All measured cells of one config in this process, and their verdicts once judged."""

    runs: dict[str, stats.CellRun[load.CellResult]]
    policy: stats.RepeatPolicy
    verdicts: dict[str, gate.CellVerdict] = dataclasses.field(default_factory=dict)
    confirmations: dict[str, stats.CellRun[load.CellResult]] = dataclasses.field(default_factory=dict)
    gated: tuple[str, ...] | None = None  # the gated metrics judged (None: all of gate.GATED_METRICS)
    slo: SLO | None = None  # the SLO its goodput figures were counted against


def repeat_policy(repeats: int, bless: bool = False) -> stats.RepeatPolicy:
    """At least ``repeats``; more (up to MAX_EXTRA_REPEATS) only while the repeats disagree, and
    for a bless (``bless``) also while the interval is wider than a baseline needs
    (``gate.BLESS_MAX_HALF_WIDTH``)."""
    return stats.RepeatPolicy(
        min_repeats=repeats,
        max_repeats=repeats + MAX_EXTRA_REPEATS,
        target_rel_ci=INCONCLUSIVE_REL_CI,
        inconclusive_rel_ci=INCONCLUSIVE_REL_CI,
        target_half_width=gate.BLESS_MAX_HALF_WIDTH if bless else None,
    )


def measure_config(
    service: str | SGLangClient,
    cells: Sequence[load.WorkloadLike],
    repeats: int,
    on_sample: OnSample | None = None,
    baseline: Mapping[str, Any] | None = None,
    on_confirm: OnSample | None = None,
    *,
    tokenizer_path: str | None = None,
    vocab_size: int | None = None,
    dataset: str | None = None,
    accept_bound: int | None = None,
    speculative: bool = True,
    bless: bool = False,
    launch_spread: Mapping[str, float] | None = None,
    gated: Sequence[str] | None = None,
    cell_noise: Mapping[str, Mapping[str, float]] | None = None,
    slo: SLO | None = None,
    label: str = "",
    cell_timeout_s: float = CELL_TIMEOUT_S,
) -> Campaign:
    """Measure every cell of one config: repeat r of every cell before repeat r+1 of any.

    ``service`` is the running service's client (its connections are reused; the service
    manager closes it) or a URL (a client of its own for this call). Interleaving spreads
    slow drift (thermal, a noisy neighbour) over all cells alike instead of biasing whichever
    cell ran last; ``on_sample`` is called as each repeat exists, so the caller can record it
    before anything else can fail. With ``baseline`` (the config's validated ``metrics``
    section) the cells are judged together, and flagged cells get their confirmation run now,
    while this config's service is still up (``on_confirm`` records those repeats).
    ``tokenizer_path`` and ``vocab_size`` are the profile's, ``dataset`` is ``--ddtree-dataset``
    (see ``prompts.py``). ``accept_bound`` is min(block_size - 1, budget) of the config: a
    measured request whose acceptance histogram goes above it makes its repeat invalid.
    ``speculative=False`` measures a non-speculative launch (the session's
    control: its responses carry no verify counts); ``bless`` asks the repeats for the interval a
    baseline needs (``repeat_policy``); ``launch_spread`` is ``blessed_launch_spread`` of the
    baseline store (how much a config's common change moves between launches), ``cell_noise`` its
    ``blessed_cell_noise`` (each cell's repeat noise over every config blessed on this hardware).
    ``slo``: every repeat counts bench_serving's goodput against it (``request_goodput``, gated).
    ``label`` names the config in the progress of each repeat (progress.py).
    ``cell_timeout_s`` is the profile's: a repeat not over by then raises
    :class:`CellDeadlineExceeded` (the repeats before it are already recorded).
    """
    if isinstance(service, str):
        with SGLangClient(service, timeout=REQUEST_TIMEOUT_S) as own:
            return measure_config(own, cells, repeats, on_sample, baseline, on_confirm, tokenizer_path=tokenizer_path,
                                  vocab_size=vocab_size, dataset=dataset, accept_bound=accept_bound,
                                  speculative=speculative, bless=bless, launch_spread=launch_spread, gated=gated,
                                  cell_noise=cell_noise, slo=slo, label=label, cell_timeout_s=cell_timeout_s)
    client = service
    policy = repeat_policy(repeats, bless)
    maker = load.prompt_maker(client, tokenizer_path=tokenizer_path, vocab_size=vocab_size, dataset=dataset)
    by_name = {w.name: w for w in cells}
    planned = {"repeat": policy.min_repeats}  # the phase's planned repeats (the confirmation's, once it runs)

    def measure(name: str, r: int) -> load.CellResult:
        workload = by_name[name]
        (phase, n), = planned.items()
        what = f"{phase} {r + 1}/{n}" if r < n else f"{phase} {r + 1} (an extra one: repeats disagreed or were retaken)"
        with progress.activity(f"{label + ' ' if label else ''}{name}: {what}",
                               requests=workload.requests + workload.warmup_requests):
            return run_repeat(client, workload, cell_timeout_s, prompts=maker, timeout_s=client.timeout,
                              speculative=speculative, accept_bound=accept_bound, slo=slo)

    def noop(name: str, r: int, result: load.CellResult) -> None:
        return None

    runs = stats.run_interleaved(list(by_name), measure, _primary, policy, on_sample or noop, spoiled_reason)
    campaign = Campaign(runs=runs, policy=policy, gated=tuple(gated) if gated is not None else None, slo=slo)
    if baseline is not None:
        _judge(campaign, cells, baseline, measure, planned, repeats, on_confirm or noop, launch_spread, cell_noise)
    return campaign


def _judge(campaign: Campaign, cells: Sequence[load.WorkloadLike], baseline: Mapping[str, Any],
           measure: Callable[[str, int], load.CellResult], planned: dict[str, int], repeats: int, on_confirm: OnSample,
           launch_spread: Mapping[str, float] | None, cell_noise: Mapping[str, Mapping[str, float]] | None) -> None:
    """Judge the cells together against ``baseline``; flagged ones get their confirmation run
    now (``planned`` names the phase in the progress of each repeat)."""
    inputs = {w.name: cell_input(campaign, w, baseline.get(w.name)) for w in cells}
    first = gate.judge_config(inputs, launch_spread=launch_spread, cell_noise=cell_noise)
    flagged = [name for name, v in first.items() if v.flagged]
    if not flagged:
        campaign.verdicts = first
        return
    planned.clear()
    planned["confirmation repeat"] = CONFIRM_REPEATS
    _confirm(campaign, inputs, flagged, measure, repeats, on_confirm, launch_spread, cell_noise)


def _confirm(campaign: Campaign, inputs: Mapping[str, gate.CellInput], flagged: list[str],
             measure: Callable[[str, int], load.CellResult], repeats: int, on_confirm: OnSample,
             launch_spread: Mapping[str, float] | None, cell_noise: Mapping[str, Mapping[str, float]] | None) -> None:
    """The confirmation run of the flagged cells (fresh repeats, same service lifetime), and the
    config judged again with it; a confirmation that measured the machine cannot confirm a flag."""
    def judge(runs: Mapping[str, stats.CellRun[load.CellResult]]) -> dict[str, gate.CellVerdict]:
        confirmations = {name: gate_samples([repeat_metrics(s) for s in run.counted if s.valid], campaign.gated)
                         for name, run in runs.items()}
        return gate.judge_config(inputs, confirmations, launch_spread=launch_spread, cell_noise=cell_noise)

    campaign.confirmations, campaign.verdicts = confirm_in_stages(flagged, measure, _primary, judge, on_confirm,
                                                                  spoiled_reason)
    for name, run in campaign.confirmations.items():
        cleared = campaign.verdicts[name].status in (gate.PASS, gate.IMPROVED) and len(run.primary) >= repeats
        if run.short_of_clean and not cleared:
            # a confirmation that measured the machine cannot confirm a flag (nor clear it on a few repeats)
            campaign.verdicts[name] = dataclasses.replace(
                campaign.verdicts[name], status=gate.INCONCLUSIVE,
                reasons=(f"flagged in the first pass, but its confirmation run got only {len(run.primary)} clean "
                         f"repeat(s) of the {CONFIRM_REPEATS} needed: {len(run.spoiled)} measured the machine, not "
                         f"the config ({'; '.join(spoiled_evidence(run)[:8])}); {gate.WHAT_TO_DO}",))
        else:
            loaded = latency_beside_a_loaded_machine(campaign.verdicts[name], campaign.runs[name], run)
            if loaded is not None:
                campaign.verdicts[name] = dataclasses.replace(campaign.verdicts[name], status=gate.INCONCLUSIVE,
                                                              reasons=(loaded,))


#: A rate probe's figures kept with it (medians over its counted repeats).
PROBE_FIGURES = ("request_throughput", "output_throughput", "request_goodput", "slo_attainment", "p99_ttft_ms",
                 "p99_tpot_ms", "p99_e2e_latency_ms", "median_tpot_ms", "ddtree_median_request_output_throughput",
                 TOKENS_PER_VERIFY)


def rate_cell(template: load.WorkloadLike, rate: float) -> load.Cell:
    """The open-loop cell of ``template`` at ``rate`` requests/s (its prompts, lengths, arrival
    process and cap; a closed-loop template gets Poisson arrivals), named ``<template>@<rate>``."""
    arrivals = dataclasses.replace(template.open_loop or openloop.Arrivals(rate), request_rate=rate)
    return load.Cell(f"{template.name}@{rate:.4g}", arrivals.max_concurrency or template.requests,
                     template.context_tokens, template.output_tokens, template.requests, template.warmup_requests,
                     template.prompts, arrivals, template.sampling)


def sustainable_rate(
    service: SGLangClient,
    template: load.WorkloadLike,
    slo: SLO,
    plan: SearchPlan,
    repeats: int,
    on_sample: OnSample | None = None,
    *,
    tokenizer_path: str | None = None,
    vocab_size: int | None = None,
    dataset: str | None = None,
    accept_bound: int | None = None,
    speculative: bool = True,
    campaigns: dict[float, Campaign] | None = None,
) -> RateSearch:
    """The highest request rate at which ``template``'s requests meet ``slo`` on this service
    (``slo.search_rate``): each probed rate is a cell measured with the usual repeats and retakes
    (``measure_config``); it meets the SLO when every request of its counted repeats, pooled,
    does (``slo.slo_miss``). ``on_sample`` records each repeat as it exists; ``campaigns`` (rate ->
    its measured cell) is filled for a bless, which keeps the found rate's goodput samples."""

    def probe(rate: float) -> RateProbe:
        cell = rate_cell(template, rate)
        campaign = measure_config(service, [cell], repeats, on_sample, tokenizer_path=tokenizer_path,
                                  vocab_size=vocab_size, dataset=dataset, accept_bound=accept_bound,
                                  speculative=speculative, slo=slo)
        if campaigns is not None:
            campaigns[rate] = campaign
        return rate_probe(campaign.runs[cell.name], rate, slo)

    return slo_mod.search_rate(probe, plan)


def rate_probe(run: stats.CellRun[load.CellResult], rate: float, slo: SLO) -> RateProbe:
    """One measured rate against ``slo``: met when no repeat had a problem and every request of its
    counted repeats, pooled, meets the SLO (``slo.slo_miss``); its figures are medians over repeats."""
    counted = run.counted
    problems = [p for s in counted for p in s.problems() if "failed" not in p]
    reason = ("; ".join(problems[:3]) if problems else None) or \
        slo_mod.slo_miss([r for s in counted for r in s.requests], slo)
    medians = report.aggregate_repeats([repeat_metrics(s) for s in counted if s.valid])
    return RateProbe(rate, reason is None, reason, {k: medians.get(k) for k in PROBE_FIGURES})


K = TypeVar("K")
S = TypeVar("S")


def confirm_in_stages(flagged: Sequence[K], measure: Callable[[K, int], S], primary: Callable[[S], float | None],
                      judge: Callable[[Mapping[K, stats.CellRun[S]]], dict[K, gate.CellVerdict]],
                      on_sample: Callable[[K, int, S], None] | None = None,
                      spoiled: Callable[[S], str | None] | None = None,
                      ) -> tuple[dict[K, stats.CellRun[S]], dict[K, gate.CellVerdict]]:
    """The confirmation run of the flagged cells: ``CONFIRM_FIRST_STAGE`` fresh repeats each, judged
    (``judge``: the config with these confirmations); a cell ``cleared_early`` stops there, the others
    take the rest of ``CONFIRM_REPEATS``, and the config is judged on everything measured.

    Why two stages: most flagged cells of an unchanged config are cleared by their confirmation
    with room to spare, and twelve repeats of each were most of a sweep's repeats beyond the first
    pass. The error is spent honestly: only a pass can stop early, so stopping never adds a false
    alarm; it can only lose a regression whose first six repeats look better than half its
    tolerance, which the benchmark measures (``benchmarks/bench_gate.py``: one cell -10%)."""
    def stage(cells: Sequence[K], offset: Mapping[K, int], policy: stats.RepeatPolicy) -> dict[K, stats.CellRun[S]]:
        record = None if on_sample is None else (lambda c, r, x: on_sample(c, r + offset.get(c, 0), x))
        return stats.run_interleaved(cells, measure, primary, policy, record, spoiled)

    first_policy = stats.RepeatPolicy(min_repeats=CONFIRM_FIRST_STAGE, max_repeats=CONFIRM_FIRST_STAGE,
                                      max_attempts=CONFIRM_FIRST_STAGE + MAX_EXTRA_REPEATS // 2)
    runs = stage(flagged, {}, first_policy)
    verdicts = judge(runs)
    rest = [c for c in flagged if not runs[c].invalid and not cleared_early(verdicts[c])]
    if not rest:
        return runs, verdicts
    more = CONFIRM_REPEATS - CONFIRM_FIRST_STAGE
    second = stage(rest, {c: len(runs[c].samples) for c in rest},
                   stats.RepeatPolicy(min_repeats=more, max_repeats=more, max_attempts=more + MAX_EXTRA_REPEATS // 2))
    for c, run in second.items():
        runs[c] = _joined(runs[c], run)
    return runs, judge(runs)


def _joined(first: stats.CellRun[S], second: stats.CellRun[S]) -> stats.CellRun[S]:
    """Two stages of one cell's confirmation run as one run (the second's spoiled indices moved on)."""
    offset = len(first.samples)
    return stats.CellRun(samples=[*first.samples, *second.samples], primary=[*first.primary, *second.primary],
                         invalid=first.invalid or second.invalid, stopped_early=second.stopped_early,
                         spoiled={**first.spoiled, **{i + offset: why for i, why in second.spoiled.items()}},
                         min_clean=CONFIRM_REPEATS)


def cleared_early(verdict: gate.CellVerdict) -> bool:
    """Whether a flagged cell's first confirmation stage clears it with room to spare: it passes,
    and every confirmed metric's confirmation (the config's common change removed) is on the bad
    side by at most half its tolerance."""
    if verdict.status not in (gate.PASS, gate.IMPROVED):
        return False
    for m in verdict.metrics:
        if m.confirm_change is None:
            continue
        log_change = math.log1p(max(m.confirm_change, -0.999999))
        if (-log_change if m.direction == "higher" else log_change) > m.tolerance / 2.0:
            return False
    return True


#: Above this median share of a cell's measured time in which some task on the host waited for a
#: CPU (``ddtree_host_cpu_pressure``, Linux's PSI), latency measured there describes the host. Set
#: on the 2-core box: concurrency-1 cells read 3-10% quiet and beside one busy loop, 18-23% beside
#: two (c1_short's TTFT then 4.9-8.5 ms against 4.5 quiet), so 15% sits between; a concurrency-8
#: cell there reads 23-30% quiet (its own client and engine threads outnumber the cores, and its
#: TTFT is bimodal: 8.7 and 18.9 ms in three quiet repeats), so its latency is not judged there.
MAX_HOST_CPU_PRESSURE = 0.15


def host_cpu_pressure(*runs: stats.CellRun[load.CellResult]) -> float | None:
    """The median share of the measured time in which some task on this host waited for a CPU, over
    the repeats that count of ``runs``; None where the kernel does not report it."""
    shares = [p for run in runs for s in run.counted if (p := s.host_cpu_pressure) is not None]
    return stats.median(shares) if shares else None


def latency_beside_a_loaded_machine(verdict: gate.CellVerdict, first: stats.CellRun[load.CellResult],
                                    confirmation: stats.CellRun[load.CellResult]) -> str | None:
    """Why a confirmed regression of latency only (TTFT) is the machine's, or None.

    A host loaded enough to spoil some of a cell's repeats delays the repeats beside them too:
    a request's first token waits for the client's and the service's threads (on the 2-core box
    at clock scale 10, c1_short's 3.7 ms TTFT became 4.2-11 ms, the service's own TTFT 2.9-5.4 ms)
    long before the engine falls behind its clock by the 5% that spoils a repeat. Throughput is
    judged on the clean repeats as they are; a latency regression measured in a cell that needed
    retakes is not a verdict on the config. Nor is one measured while the host's CPUs were
    contended (``MAX_HOST_CPU_PRESSURE``): there every repeat can be clean, the engine on its
    clock and the client at its concurrency, while each first token waits for a CPU (CI: the main
    job's c8_short TTFT +46%, +61% in its confirmation, beside other timing-sensitive tests)."""
    if verdict.status != gate.REGRESSION:
        return None
    regressed = [m for m in verdict.metrics if m.status == gate.REGRESSION]
    if not regressed or any(m.unit != "ms" for m in regressed):
        return None
    shown = "; ".join(f"{m.metric} {m.change:+.1%}" if m.change is not None else m.metric for m in regressed)
    if first.spoiled or confirmation.spoiled:
        retaken = len(first.spoiled) + len(confirmation.spoiled)
        return (f"{shown} beyond tolerance, but measured while the machine spoiled {retaken} of this cell's repeats "
                f"({'; '.join([*spoiled_evidence(first), *spoiled_evidence(confirmation)][:4])}): latency is delayed by a "
                f"loaded host before the engine falls behind its clock, so this is not a verdict on the config; "
                f"{gate.WHAT_TO_DO}")
    pressure = host_cpu_pressure(first, confirmation)
    if pressure is not None and pressure > MAX_HOST_CPU_PRESSURE:
        return (f"{shown} beyond tolerance, but measured while tasks on this host waited for a CPU {pressure:.0%} of "
                f"the time (median over the cell's repeats, Linux's CPU pressure; above {MAX_HOST_CPU_PRESSURE:.0%}): "
                f"each first token waited for the host, not only for the service, so this is not a verdict on the "
                f"config; {gate.WHAT_TO_DO}")
    return None


def blessed_launch_spread(store: BaselineStore) -> dict[str, float]:
    """``gate.launch_spread`` over every config's baseline file of this hardware profile; files
    that cannot be read are left out (their own cells report them)."""
    return gate.launch_spread(_blessed_sections(store))


def blessed_cell_noise(store: BaselineStore) -> dict[str, dict[str, float]]:
    """``gate.cell_noise`` over every config's baseline file of this hardware profile."""
    return gate.cell_noise(_blessed_sections(store))


def _blessed_sections(store: BaselineStore) -> list[dict[str, Any]]:
    """The ``metrics`` sections of every config's baseline file of ``store`` (not the control's)."""
    from pytest_ddtree.gates.throughput.baseline_format import CONTROL

    sections: list[dict[str, Any]] = []
    directory = store.directory
    if not directory.is_dir():
        return sections
    for path in sorted(directory.glob("*.yaml")):
        if path.stem == CONTROL:
            continue
        try:
            data = store.load(path.stem)
            sections.append(gate.validate_section((data or {}).get("metrics"), str(path)))
        except (BaselineError, gate.BaselineFormatError, OSError):
            continue
    return sections


def _primary(result: load.CellResult) -> float | None:
    value = result.metrics()["output_throughput"]
    return float(value) if result.valid and isinstance(value, (int, float)) else None


def gate_samples(repeats: Sequence[Mapping[str, Any]], gated: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Each gated metric's repeat samples (a metric a repeat did not report is left out); ``gated``
    narrows the metrics (the control gates its output tok/s only)."""
    samples = {
        spec.key: [float(v) for m in repeats if isinstance(v := m.get(spec.key), (int, float))]
        for spec in gate.GATED_METRICS if gated is None or spec.key in gated
    }
    return {k: v for k, v in samples.items() if v}


def repeat_metrics(result: load.CellResult) -> dict[str, Any]:
    """One repeat's metrics, with the service's clock overruns during it where it reports them."""
    m: dict[str, Any] = dict(result.metrics())
    before, after = result.server_state_before.get("clock_overruns"), result.server_state.get("clock_overruns")
    if stats.is_number(before) and stats.is_number(after):
        m["clock_overruns"] = after - before
    return m


def spoiled_reason(result: load.CellResult) -> str | None:
    """Why a valid repeat measured the machine rather than the config (``gate.repeat_load_problem``),
    or None: such a repeat is recorded and retaken, never counted."""
    return gate.repeat_load_problem(repeat_metrics(result)) if result.valid else None


def spoiled_evidence(run: stats.CellRun[load.CellResult]) -> list[str]:
    """Each spoiled repeat of ``run``: its index, output tok/s and why it was not counted."""
    out = []
    for i, why in sorted(run.spoiled.items()):
        tok_s = run.samples[i].metrics().get("output_throughput")
        shown = f", output tok/s {tok_s:.1f}" if stats.is_number(tok_s) else ""
        out.append(f"repeat {i}{shown}: {why}")
    return out


def _repeat_facts(run: stats.CellRun[load.CellResult]) -> tuple[list[dict[str, Any]], list[str]]:
    """The counted valid repeats' metrics (with the engine's clock overruns, where it reports them)
    and the problems of every repeat."""
    repeats = [repeat_metrics(s) for s in run.counted if s.valid]
    return repeats, [p for s in run.samples for p in s.problems()]


#: Gated metrics that exist only against an SLO: a session without one does not judge them.
SLO_METRICS = ("request_goodput",)


def judged_baseline(baseline_cell: Any, slo: SLO | None) -> dict[str, Any] | None:
    """A cell's baseline as this session judges it: without an SLO, its goodput gates are left out (a
    baseline blessed with an SLO must not fail a session without one for a figure it cannot count).
    With another SLO than the blessed one the goodput figures differ: re-bless (docs/gates/throughput.md)."""
    if not isinstance(baseline_cell, Mapping):
        return None
    gates = baseline_cell.get("gates")
    if slo is not None or not isinstance(gates, Mapping) or not any(k in gates for k in SLO_METRICS):
        return dict(baseline_cell)
    return {**baseline_cell, "gates": {k: v for k, v in gates.items() if k not in SLO_METRICS}}


def cell_input(campaign: Campaign, workload: load.WorkloadLike, baseline_cell: Any) -> gate.CellInput:
    """What the gate needs of one measured cell."""
    run = campaign.runs[workload.name]
    repeats, problems = _repeat_facts(run)
    status, why = gate.measurement_status(campaign.policy, run.primary, run.invalid, repeats, problems,
                                          spoiled=spoiled_evidence(run))
    return gate.CellInput(judged_baseline(baseline_cell, campaign.slo),
                          gate_samples(repeats, campaign.gated),
                          status, why, measured_workload(run, workload))


def measured_workload(run: stats.CellRun[load.CellResult], workload: load.WorkloadLike) -> WorkloadData:
    """The workload as measured: its numbers and the prompts its repeats really used
    (``documents via /tokenize``), so a baseline made from other prompts does not apply."""
    measured_prompts = sorted({s.prompt_source for s in run.samples if s.prompt_source})
    return load.workload_dict(workload, measured_prompts[0] if measured_prompts else None)


def sample_record(name: str, repeat: int, result: load.CellResult) -> RepeatData:
    """What one measured repeat contributes to the session's records (``throughput-repeat``)."""
    return {
        "cell": name,
        "repeat": repeat,
        "workload": result.workload,
        "metrics": result.metrics(),
        "problems": result.problems()[:20],
        "notes": result.notes,
        "spoiled": spoiled_reason(result),  # why it was retaken, not counted (None: it counts)
        "prompts": result.prompt_source,
        "accept_histogram": result.accept_histogram(),
    }


def cell_histogram(samples: Sequence[load.CellResult]) -> list[int] | None:
    """The valid repeats' acceptance histograms summed (None unless each has one)."""
    hists = [s.accept_histogram() for s in samples if s.valid]
    if not hists or any(h is None for h in hists):
        return None
    total: list[int] = []
    for h in hists:
        total = proof.add_histograms(total, h or [])
    return total


@dataclass
class CellEvaluation:
    """One cell judged against its baseline: what the suite reports and records."""

    status: MeasurementStatus
    verdict: gate.CellVerdict
    record: ThroughputData
    samples: dict[str, list[float]]
    durations: list[float]
    repeats: int
    primary: list[float]
    baseline_cell: Any
    baseline_problem: str | None
    status_reasons: list[str] = dataclasses.field(default_factory=list)  # why not valid (inconclusive, invalid)

    def bless_refusal(self) -> str | None:
        """Why this cell must not be blessed (``gate.bless_refusal``), or None."""
        return gate.bless_refusal(self.status, self.status_reasons, self.primary)


def evaluate_cell(
    config: str,
    workload: load.WorkloadLike,
    campaign: Campaign,
    baseline: Mapping[str, Any] | None,
    baseline_path: Path,
    hardware_profile: str,
    update_mode: bool,
    baseline_error: str | None = None,
) -> CellEvaluation:
    """Status of the measurement, verdict against the baseline, and the result record.

    ``baseline`` is the parsed baseline file (None when missing); ``baseline_error`` a
    problem reading it, which the caller fails on after recording the measurement.
    """
    run = campaign.runs[workload.name]
    valid = [s for s in run.counted if s.valid]
    repeats, problems = _repeat_facts(run)
    notes = sorted({n for s in run.samples for n in s.notes})
    spoiled = spoiled_evidence(run)
    if spoiled:
        notes.append(f"{len(spoiled)} repeat(s) retaken, not counted (they measured the machine): " + "; ".join(spoiled))
    status, why = gate.measurement_status(campaign.policy, run.primary, run.invalid, repeats, problems,
                                          spoiled=spoiled)
    samples = gate_samples(repeats, campaign.gated)
    workload_info = measured_workload(run, workload)
    section: dict[str, Any] = {}
    problem = baseline_error
    if baseline is not None and problem is None:
        try:
            section = gate.validate_section(baseline.get("metrics"), str(baseline_path))
        except (BaselineError, gate.BaselineFormatError) as exc:
            problem = str(exc)
    cell_base = section.get(workload.name)  # as blessed (a bless merges into it) ...
    judged = judged_baseline(cell_base, campaign.slo)  # ... and as this session judges it
    verdict = campaign.verdicts.get(workload.name) or gate.compare_cell(
        workload.name, judged, samples, status=status, problems=why, workload=workload_info)
    if update_mode and gate.bless_refusal(status, why, run.primary) is None:
        verdict = dataclasses.replace(verdict, status=Status.UPDATED)  # the table shows what was blessed
    confirmation = campaign.confirmations.get(workload.name)
    if confirmation is not None:
        notes.append(f"confirmation run: {len(confirmation.primary)} fresh clean repeats, output tok/s "
                     f"{[round(p, 1) for p in confirmation.primary]}")
        retaken = spoiled_evidence(confirmation)
        if retaken:
            notes.append(f"confirmation run: {len(retaken)} repeat(s) retaken, not counted: " + "; ".join(retaken))
    record = report.throughput_record(
        config=config,
        cell=workload.name,
        workload=workload_info,
        repeats=repeats,
        samples=samples,
        measurement_status=status,
        verdict=verdict.as_dict(),
        problems=problems[:20],
        notes=notes,
        hardware_profile=hardware_profile,
        baseline=(judged or {}).get("gates"),
        server_info=next((s.server_info for s in reversed(valid) if s.server_info), None),
    )
    _complete_record(record, run, campaign.slo)
    return CellEvaluation(
        status=status,
        verdict=verdict,
        record=record,
        samples=samples,
        durations=[s.duration_s for s in valid],
        repeats=len(repeats),
        primary=list(run.primary),
        baseline_cell=cell_base,
        baseline_problem=problem,
        status_reasons=list(why),
    )


def _complete_record(record: ThroughputData, run: stats.CellRun[load.CellResult], slo: SLO | None) -> None:
    """The record's retaken repeats, its SLO (where the session has one), its acceptance per prompt
    category (a labelled dataset's) and its acceptance histograms."""
    record["spoiled_repeats"] = [{"repeat": i, "reason": r} for i, r in sorted(run.spoiled.items())]
    if slo is not None:
        record["slo"] = slo.record()
    pooled: dict[str, list[int]] = {}
    for sample in (s for s in run.samples if s.valid):
        for category, (tokens, steps) in sample.category_counts().items():
            pooled.setdefault(category, [0, 0])[0] += tokens
            pooled[category][1] += steps
    if pooled:  # a labelled dataset's acceptance per category, over every valid repeat
        record["acceptance_by_category"] = {c: tokens / steps for c, (tokens, steps) in sorted(pooled.items()) if steps}
    # acceptance from every valid repeat, retaken ones too: greedy acceptance ignores the host's speed
    hist = cell_histogram(run.samples)
    if hist is not None:  # acceptance by depth: share of verifies that accepted at least d drafts
        record["accept_histogram"] = hist
        record["acceptance_by_depth"] = proof.acceptance_by_depth(hist)
        # each repeat's own: configs compared on the same prompts compare these, whatever their repeat counts
        record["repeat_histograms"] = [s.accept_histogram() for s in run.samples if s.valid]


#: Record kinds of a flagged config's relaunch (``relaunch_flagged``): one per cell, and its repeats.
RELAUNCH_RECORD = RecordKind.THROUGHPUT_RELAUNCH
RELAUNCH_REPEAT = RecordKind.THROUGHPUT_RELAUNCH_REPEAT


def relaunch_flagged(session: DDTreeSession, items: Sequence[Any]) -> list[str]:
    """At the end of a process: launch each config that ``gate.relaunch_candidates`` flags once more,
    measure all its cells again and record them (``RELAUNCH_RECORD``), so the session end judges it on
    both launches (``gate.judge_session``). Returns the relaunched configs.

    Why: a launch of a GPU server moves a config's speed as a whole (KV-cache size, CUDA-graph
    capture, memory layout) about as much as a day does, so one launch cannot tell a config that is
    10% slower from an unlucky launch without failing too many unchanged sweeps; a second launch has a
    shift of its own. ``session`` is the process's ``DDTreeSession``, ``items`` the collected tests
    (their ``ddtree_config`` and ``workload`` parameters). The screen compares the configs measured in
    this process (the plugin keeps a config's tests on one worker). Nothing here raises: a relaunch
    that fails is recorded with the reason, and the config keeps its one-launch verdict.
    """
    if not session.profile.relaunch_flagged or session.settings.update_baselines:
        return []
    recorder = session.recorder
    moves = gate.config_moves(report.normalize(recorder.records))
    configs: dict[str, DDTreeConfig] = {}
    cells: dict[str, list[load.WorkloadLike]] = {}
    for item in items:
        spec = getattr(item, "callspec", None)
        params = spec.params if spec is not None else {}
        config, workload = params.get("ddtree_config"), params.get("workload")
        if isinstance(config, DDTreeConfig) and workload is not None and workload not in cells.setdefault(config.name, []):
            configs[config.name] = config
            cells[config.name].append(workload)
    done: list[str] = []
    failed: set[str] = set()
    while True:
        relaunched = gate.config_moves(records_mod.throughput_records(recorder.records, RELAUNCH_RECORD))
        flagged = [n for n in gate.relaunch_candidates(moves, relaunched) if n in configs and n not in failed]
        if not flagged:
            return done
        for name in flagged:
            index = 1 + len({r.get("relaunch") for r in recorder.records
                             if r.get("kind") == RELAUNCH_RECORD and r.get("config") == name})
            if _relaunch(session, name, configs[name], cells[name], index):
                done.append(name)
            else:
                failed.add(name)


def _relaunch(session: DDTreeSession, name: str, config: DDTreeConfig, cells: Sequence[load.WorkloadLike], index: int) -> bool:
    """Relaunch ``index`` of a flagged config, all its cells measured and recorded; False when it
    failed (recorded with the reason)."""
    from pytest_ddtree.configs import ConfigError
    from pytest_ddtree.service.base import ServiceError

    profile, settings, recorder = session.profile, session.settings, session.recorder
    try:
        session.manager.release()  # a fresh launch, not the one still running
        service = session.manager.ensure(config)
        baselines = session.baselines(service.server_info)
        section = gate.validate_section((baselines.load(name) or {}).get("metrics"), str(baselines.path_for(name)))
        campaign = measure_config(
            service.client, cells, settings.repeats,
            lambda cell, r, result: recorder.record(RELAUNCH_REPEAT, name, _relaunched_repeat(cell, r, result, index)),
            baseline=section, tokenizer_path=profile.tokenizer_path(), vocab_size=profile.vocab_size,
            dataset=str(settings.dataset) if settings.dataset else None, accept_bound=service.accept_bound(),
            launch_spread=blessed_launch_spread(baselines), cell_noise=blessed_cell_noise(baselines),
            label=f"{name} relaunch {index} (its session check flagged it)",
            cell_timeout_s=profile.cell_timeout_s)
        for workload in cells:
            ev = evaluate_cell(name, workload, campaign, baselines.load(name), baselines.path_for(name),
                               baselines.hardware_profile, False)
            recorded: RelaunchCellData = {**ev.record, "relaunch": index}
            recorder.record(RELAUNCH_RECORD, name, recorded)
    except (ServiceError, ConfigError, BaselineError, gate.BaselineFormatError, load.LoadError) as exc:
        failure: RelaunchFailureData = {"error": f"the relaunch of {name} failed: {exc}", "relaunch": index}
        recorder.record(RELAUNCH_RECORD, name, failure)
        return False
    return True


def _relaunched_repeat(cell: str, repeat: int, result: load.CellResult, relaunch: int) -> RepeatData:
    record = sample_record(cell, repeat, result)
    record["relaunch"] = relaunch
    return record
