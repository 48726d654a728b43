"""The throughput gate's measurement, between the load generator and the gate's rule (no pytest).

``measure_config`` measures every cell of a config with interleaved repeats and, given its
baseline, judges them together and confirms the flagged ones while the service is up; its
parameters come grouped (``Driving``: how each repeat drives the service; ``Judging``: what the
cells are judged with; ``Recording``: where each repeat goes). The steps around it (the baseline
read once, each cell judged, the bless decision, the records) are ``cells.py``'s one
orchestration, which the suite, the relaunch and the control all run; ``sustainable_rate``
searches the highest rate a config sustains under an SLO with the same measurement.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

from pytest_ddtree.gates.throughput.verdicts import (BLESS_MAX_HALF_WIDTH, BaselineFormatError, CellInput,
                                                     CellVerdict, GATED_METRICS, WHAT_TO_DO, measurement_status,
                                                     repeat_load_problem)
from pytest_ddtree.gates.throughput.baseline import EdgeExemption, RATE_SECTION, validate_rate_section, validate_section
from pytest_ddtree.gates.throughput import baseline as baseline_mod, rule
from pytest_ddtree.service import http, proof
from pytest_ddtree.measure import load, openloop, stats, slo as slo_mod
from pytest_ddtree import progress
from pytest_ddtree.baselines import BaselineError, BaselineStore
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.validated_profile import DEFAULT_MAX_REPEAT_SPREAD
from pytest_ddtree.metrics import OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT, REQUEST_GOODPUT, TOKENS_PER_VERIFY
from pytest_ddtree.measure.slo import SLO, RateProbe, RateSearch, SearchPlan
from pytest_ddtree.records.shapes import RepeatData, WorkloadData
from pytest_ddtree.records.words import Status


#: Repeats beyond --ddtree-repeats that a cell gets while its repeats disagree (pooled).
MAX_EXTRA_REPEATS = 6
#: Repeats agree once the robust spread (scaled MAD / median) of output tok/s is within the profile's
#: ``max_repeat_spread`` (12% by default); a cell whose spread is still above it after the extra
#: repeats is inconclusive (a bless's interval is tightened by ``verdicts.BLESS_MAX_HALF_WIDTH`` besides).
INCONCLUSIVE_REL_CI = DEFAULT_MAX_REPEAT_SPREAD
#: Fresh repeats of a flagged cell in its confirmation run, in two stages (``confirm_in_stages``):
#: after the first ``CONFIRM_FIRST_STAGE`` a cell that is already cleared with room to spare stops.
CONFIRM_REPEATS = 12
CONFIRM_FIRST_STAGE = 2
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


def run_repeat(client: SGLangClient, workload: load.CellLike, cell_timeout_s: float, **kwargs: Any) -> load.CellResult:
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
    verdicts: dict[str, CellVerdict] = dataclasses.field(default_factory=dict)
    confirmations: dict[str, stats.CellRun[load.CellResult]] = dataclasses.field(default_factory=dict)
    gated: tuple[str, ...] | None = None  # the gated metrics judged (None: all of verdicts.GATED_METRICS)
    slo: SLO | None = None  # the SLO its goodput figures were counted against
    slo_edge: bool = True  # whether an open-loop cell blessed at the SLO's edge leaves its goodput unjudged


def repeat_policy(repeats: int, bless: bool = False, max_spread: float = INCONCLUSIVE_REL_CI,
                  bless_half_width: float = BLESS_MAX_HALF_WIDTH) -> stats.RepeatPolicy:
    """At least ``repeats``; more (up to MAX_EXTRA_REPEATS) only while the repeats spread more than
    ``max_spread`` (the profile's ``max_repeat_spread``), and for a bless (``bless``) also while the
    interval is wider than a baseline needs (``bless_half_width``, the profile's ``bless_max_half_width``)."""
    return stats.RepeatPolicy(
        min_repeats=repeats,
        max_repeats=repeats + MAX_EXTRA_REPEATS,
        target_rel_ci=max_spread,
        inconclusive_rel_ci=max_spread,
        target_half_width=bless_half_width if bless else None,
    )


@dataclass(frozen=True)
class Driving:
    """How each repeat drives the service: its prompts (the profile's ``tokenizer_path`` and
    ``vocab_size``, ``--ddtree-dataset``: see ``prompts.py``), the most a verify may accept
    (``accept_bound``: min(block_size - 1, budget) of the config; a request above it makes its repeat
    invalid), whether the launch speculates (``speculative=False``: the control's, whose responses
    carry no verify counts), the SLO each repeat counts bench_serving's goodput against (gated), one
    repeat's deadline as a whole (the profile's ``cell_timeout_s``) and the name in its progress line."""

    tokenizer_path: str | None = None
    vocab_size: int | None = None
    dataset: str | None = None
    accept_bound: int | None = None
    speculative: bool = True
    slo: SLO | None = None
    cell_timeout_s: float = CELL_TIMEOUT_S
    label: str = ""
    max_repeat_spread: float = INCONCLUSIVE_REL_CI
    bless_max_half_width: float = BLESS_MAX_HALF_WIDTH


@dataclass(frozen=True)
class Judging:
    """What a config's cells are judged with beside their baseline: the gated metrics (None: all of
    ``verdicts.GATED_METRICS``; the control gates its output tok/s only), how much a config's common
    change moves between launches and each cell's repeat noise, over every config blessed on this
    hardware (``blessed_judging``), and whether an open-loop cell blessed at the SLO's edge leaves its
    goodput unjudged (``slo_edge.py``; the rate gate's probe sits at the edge by design and judges it).
    ``between_spread`` (metric -> log spread): every cell's between-session spread in place of its
    own; only the rate gate gives it (``rate_gate.pooled_spread``: its one cell at the SLO's edge).
    ``confirm``: whether flagged cells get their confirmation run; a relaunch leaves it out, since
    what it is judged on, the config's common change, is the first pass's and no confirmation moves it."""

    gated: tuple[str, ...] | None = None
    launch_spread: Mapping[str, float] | None = None
    cell_noise: Mapping[str, Mapping[str, float]] | None = None
    slo_edge: bool = True
    between_spread: Mapping[str, float] | None = None
    confirm: bool = True


@dataclass(frozen=True)
class Recording:
    """Where each repeat goes the moment it exists, before anything else can fail: the first pass's
    repeats (``on_sample``) and a flagged cell's confirmation repeats (``on_confirm``)."""

    on_sample: OnSample | None = None
    on_confirm: OnSample | None = None


def measure_config(
    service: str | SGLangClient,
    cells: Sequence[load.CellLike],
    repeats: int,
    driving: Driving = Driving(),
    *,
    baseline: Mapping[str, Any] | None = None,
    judging: Judging = Judging(),
    recording: Recording = Recording(),
    bless: bool = False,
) -> Campaign:
    """Measure every cell of one config: repeat r of every cell before repeat r+1 of any.

    ``service`` is the running service's client (its connections are reused; the service
    manager closes it) or a URL (a client of its own for this call). Interleaving spreads
    slow drift (thermal, a noisy neighbour) over all cells alike instead of biasing whichever
    cell ran last; ``recording`` is called as each repeat exists, so the caller can record it
    before anything else can fail. With ``baseline`` (the config's validated ``metrics``
    section) the cells are judged together (``judging``), and flagged cells get their
    confirmation run now, while this config's service is still up (unless ``judging.confirm`` is
    off). ``bless`` asks the repeats for the interval a baseline needs (``repeat_policy``). A repeat
    not over by ``driving.cell_timeout_s`` raises :class:`CellDeadlineExceeded` (the repeats before
    it are already recorded).
    """
    if isinstance(service, str):
        with SGLangClient(service, timeout=REQUEST_TIMEOUT_S) as own:
            return measure_config(own, cells, repeats, driving, baseline=baseline, judging=judging,
                                  recording=recording, bless=bless)
    client = service
    policy = repeat_policy(repeats, bless, driving.max_repeat_spread, driving.bless_max_half_width)
    maker = load.prompt_maker(client, tokenizer_path=driving.tokenizer_path, vocab_size=driving.vocab_size,
                              dataset=driving.dataset)
    by_name = {w.name: w for w in cells}
    planned = {"repeat": policy.min_repeats}  # the phase's planned repeats (the confirmation's, once it runs)
    label = driving.label

    def measure(name: str, r: int) -> load.CellResult:
        workload = by_name[name]
        (phase, n), = planned.items()
        what = f"{phase} {r + 1}/{n}" if r < n else f"{phase} {r + 1} (an extra one: repeats disagreed or were retaken)"
        with progress.activity(f"{label + ' ' if label else ''}{name}: {what}",
                               requests=workload.requests + workload.warmup_requests):
            return run_repeat(client, workload, driving.cell_timeout_s, prompts=maker, timeout_s=client.timeout,
                              speculative=driving.speculative, accept_bound=driving.accept_bound, slo=driving.slo)

    def noop(name: str, r: int, result: load.CellResult) -> None:
        return None

    runs = stats.run_interleaved(list(by_name), measure, _primary, policy, recording.on_sample or noop, spoiled_reason)
    campaign = Campaign(runs=runs, policy=policy, gated=judging.gated, slo=driving.slo, slo_edge=judging.slo_edge)
    if baseline is not None:
        _judge(campaign, cells, baseline, measure, planned, repeats, recording.on_confirm or noop, judging)
    return campaign


def _judge(campaign: Campaign, cells: Sequence[load.CellLike], baseline: Mapping[str, Any],
           measure: Callable[[str, int], load.CellResult], planned: dict[str, int], repeats: int, on_confirm: OnSample,
           judging: Judging) -> None:
    """Judge the cells together against ``baseline``; flagged ones get their confirmation run
    now (``planned`` names the phase in the progress of each repeat)."""
    inputs = {w.name: cell_input(campaign, w, baseline.get(w.name)) for w in cells}
    first = rule.judge_config(inputs, launch_spread=judging.launch_spread, cell_noise=judging.cell_noise,
                              between_spread=judging.between_spread)
    flagged = [name for name, v in first.items() if v.flagged]
    if not flagged or not judging.confirm:
        campaign.verdicts = first
        return
    planned.clear()
    planned["confirmation repeat"] = CONFIRM_REPEATS
    gated = {w.name: judged_gated(w, campaign.gated, baseline.get(w.name), campaign.slo, campaign.slo_edge) for w in cells}
    _confirm(campaign, inputs, flagged, measure, repeats, on_confirm, judging, gated)


def _confirm(campaign: Campaign, inputs: Mapping[str, CellInput], flagged: list[str],
             measure: Callable[[str, int], load.CellResult], repeats: int, on_confirm: OnSample,
             judging: Judging, gated: Mapping[str, tuple[str, ...] | None]) -> None:
    """The confirmation run of the flagged cells (fresh repeats, same service lifetime), and the
    config judged again with it; a confirmation that measured the machine cannot confirm a flag."""
    def judge(runs: Mapping[str, stats.CellRun[load.CellResult]]) -> dict[str, CellVerdict]:
        confirmations = {name: gate_samples([repeat_metrics(s) for s in run.counted if s.valid], gated.get(name))
                         for name, run in runs.items()}
        return rule.judge_config(inputs, confirmations, launch_spread=judging.launch_spread,
                                 cell_noise=judging.cell_noise, between_spread=judging.between_spread)

    campaign.confirmations, campaign.verdicts = confirm_in_stages(flagged, measure, _primary, judge, on_confirm,
                                                                  spoiled_reason)
    for name, run in campaign.confirmations.items():
        cleared = campaign.verdicts[name].status in (Status.PASS, Status.IMPROVED) and len(run.primary) >= repeats
        if run.short_of_clean and not cleared:
            # a confirmation that measured the machine cannot confirm a flag (nor clear it on a few repeats)
            campaign.verdicts[name] = dataclasses.replace(
                campaign.verdicts[name], status=Status.INCONCLUSIVE,
                reasons=(f"flagged in the first pass, but its confirmation run got only {len(run.primary)} clean "
                         f"repeat(s) of the {CONFIRM_REPEATS} needed: {len(run.spoiled)} measured the machine, not "
                         f"the config ({'; '.join(spoiled_evidence(run)[:8])}); {WHAT_TO_DO}",))
        else:
            loaded = latency_beside_a_loaded_machine(campaign.verdicts[name], campaign.runs[name], run)
            if loaded is not None:
                campaign.verdicts[name] = dataclasses.replace(campaign.verdicts[name], status=Status.INCONCLUSIVE,
                                                              reasons=(loaded,))


#: A rate probe's figures kept with it (medians over its counted repeats).
PROBE_FIGURES = ("request_throughput", OUTPUT_THROUGHPUT, REQUEST_GOODPUT, "slo_attainment", "p99_ttft_ms",
                 "p99_tpot_ms", "p99_e2e_latency_ms", "median_tpot_ms", PER_REQUEST_OUTPUT_THROUGHPUT,
                 TOKENS_PER_VERIFY)


def rate_cell(template: load.CellLike, rate: float) -> load.Cell:
    """The open-loop cell of ``template`` at ``rate`` requests/s (its prompts, lengths, arrival
    process and cap, its endpoint and thinking; a closed-loop template gets Poisson arrivals), named ``<template>@<rate>`` and
    seeded by the template (``load.seed_name``): every rate sends the same prompts and arrival gaps."""
    arrivals = dataclasses.replace(template.open_loop or openloop.Arrivals(rate), request_rate=rate)
    return load.Cell(f"{template.name}@{rate:.4g}", arrivals.max_concurrency or template.requests,
                     template.context_tokens, template.output_tokens, template.requests, template.warmup_requests,
                     template.prompts, arrivals, template.sampling, getattr(template, "api", "generate"),
                     getattr(template, "thinking", None), seed_name=load.seed_name(template))  # a chat template's probes chat


def sustainable_rate(
    service: SGLangClient,
    template: load.CellLike,
    plan: SearchPlan,
    repeats: int,
    driving: Driving,
    recording: Recording = Recording(),
    campaigns: dict[float, Campaign] | None = None,
) -> RateSearch:
    """The highest request rate at which ``template``'s requests meet ``driving.slo`` on this service
    (``slo.search_rate``): each probed rate is a cell measured with the usual repeats and retakes
    (``measure_config``); it meets the SLO when every request of its counted repeats, pooled,
    does (``slo.slo_miss``). ``recording`` records each repeat as it exists; ``campaigns`` (rate ->
    its measured cell) is filled for a bless, which keeps the found rate's goodput samples."""
    if driving.slo is None:
        raise ValueError("sustainable_rate needs an SLO to sustain (Driving.slo)")

    def probe(rate: float) -> RateProbe:
        found, campaign = probe_rate(service, template, rate, repeats, driving, recording)
        if campaigns is not None:
            campaigns[rate] = campaign
        return found

    return slo_mod.search_rate(probe, plan)


def probe_rate(service: SGLangClient, template: load.CellLike, rate: float, repeats: int, driving: Driving,
               recording: Recording = Recording()) -> tuple[RateProbe, Campaign]:
    """One rate of ``template`` measured as an open-loop cell with the usual repeats and retakes,
    against ``driving.slo``: the probe and its measured cell (a bless keeps its goodput samples)."""
    slo = driving.slo
    if slo is None:
        raise ValueError("probe_rate needs an SLO to meet (Driving.slo)")
    cell = rate_cell(template, rate)
    campaign = measure_config(service, [cell], repeats, dataclasses.replace(driving, label=""),
                              recording=Recording(recording.on_sample))
    return rate_probe(campaign.runs[cell.name], rate, slo), campaign


def rate_probe(run: stats.CellRun[load.CellResult], rate: float, slo: SLO) -> RateProbe:
    """One measured rate against ``slo``: met when no repeat had a problem and every request of its
    counted repeats, pooled, meets the SLO (``slo.slo_miss``); its figures are medians over repeats."""
    counted = run.counted
    problems = [p for s in counted for p in s.problems() if "failed" not in p]
    reason = ("; ".join(problems[:3]) if problems else None) or \
        slo_mod.slo_miss([r for s in counted for r in s.requests], slo)
    medians = stats.aggregate_repeats([repeat_metrics(s) for s in counted if s.valid])
    return RateProbe(rate, reason is None, reason, {k: medians.get(k) for k in PROBE_FIGURES})


K = TypeVar("K")
S = TypeVar("S")


def confirm_in_stages(flagged: Sequence[K], measure: Callable[[K, int], S], primary: Callable[[S], float | None],
                      judge: Callable[[Mapping[K, stats.CellRun[S]]], dict[K, CellVerdict]],
                      on_sample: Callable[[K, int, S], None] | None = None,
                      spoiled: Callable[[S], str | None] | None = None,
                      ) -> tuple[dict[K, stats.CellRun[S]], dict[K, CellVerdict]]:
    """The confirmation run of the flagged cells: ``CONFIRM_FIRST_STAGE`` fresh repeats each, judged
    (``judge``: the config with these confirmations); a cell ``cleared_early`` stops there, the others
    take the rest of ``CONFIRM_REPEATS``, and the config is judged on everything measured.

    Why two stages: most flagged cells of an unchanged config are cleared by their confirmation
    with room to spare, and twelve repeats of each were most of a sweep's repeats beyond the first
    pass. The error is spent honestly: only a pass can stop early, so stopping never adds a false
    alarm; it can only lose a regression whose first stage looks better than half its tolerance
    (wider at two repeats than at four, so a cell 10% slower rarely does), which the benchmark
    measures (``benchmarks/bench_gate.py``: one cell -10%, 97.0% of 200 under ``restart3`` at a first
    stage of 2, 98.5% at 3, whose confirmations cost 0.6% more of the configs' GPU time)."""
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


def cleared_early(verdict: CellVerdict) -> bool:
    """Whether a flagged cell's first confirmation stage clears it with room to spare: it passes,
    and every confirmed metric's confirmation (the config's common change removed) is on the bad
    side by at most half its tolerance."""
    if verdict.status not in (Status.PASS, Status.IMPROVED):
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


def latency_beside_a_loaded_machine(verdict: CellVerdict, first: stats.CellRun[load.CellResult],
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
    if verdict.status != Status.REGRESSION:
        return None
    regressed = [m for m in verdict.metrics if m.status == Status.REGRESSION]
    if not regressed or any(m.unit != "ms" for m in regressed):
        return None
    shown = "; ".join(f"{m.metric} {m.change:+.1%}" if m.change is not None else m.metric for m in regressed)
    if first.spoiled or confirmation.spoiled:
        retaken = len(first.spoiled) + len(confirmation.spoiled)
        return (f"{shown} beyond tolerance, but measured while the machine spoiled {retaken} of this cell's repeats "
                f"({'; '.join([*spoiled_evidence(first), *spoiled_evidence(confirmation)][:4])}): latency is delayed by a "
                f"loaded host before the engine falls behind its clock, so this is not a verdict on the config; "
                f"{WHAT_TO_DO}")
    pressure = host_cpu_pressure(first, confirmation)
    if pressure is not None and pressure > MAX_HOST_CPU_PRESSURE:
        return (f"{shown} beyond tolerance, but measured while tasks on this host waited for a CPU {pressure:.0%} of "
                f"the time (median over the cell's repeats, Linux's CPU pressure; above {MAX_HOST_CPU_PRESSURE:.0%}): "
                f"each first token waited for the host, not only for the service, so this is not a verdict on the "
                f"config; {WHAT_TO_DO}")
    return None


def blessed_judging(store: BaselineStore, gated: tuple[str, ...] | None = None) -> Judging:
    """What a config's cells are judged with from every config's baseline file of ``store``'s
    hardware profile, read in one pass: ``baseline.launch_spread`` (how much a config's common change
    moves between launches) and ``baseline.cell_noise`` (each cell's repeat noise); files that cannot be
    read are left out (their own cells report them)."""
    sections = _blessed_sections(store, "metrics", validate_section)
    return Judging(gated, baseline_mod.launch_spread(sections), baseline_mod.cell_noise(sections))


def blessed_rate_sections(store: BaselineStore) -> list[dict[str, Any]]:
    """The ``sustainable_rate`` sections of every config's baseline file of ``store``'s hardware
    profile, read in one pass (``rate_gate.pooled_spread`` pools them); files that cannot be read
    are left out (their own rate test reports them)."""
    return _blessed_sections(store, RATE_SECTION, validate_rate_section)


def _blessed_sections(store: BaselineStore, key: str, validate: Callable[[Any, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Section ``key`` of every config's baseline file of ``store`` (not the control's), each checked
    by ``validate`` (its section's own validator, which names the file in its error)."""
    from pytest_ddtree.gates.throughput.baseline import CONTROL

    sections: list[dict[str, Any]] = []
    directory = store.read_directory
    if not directory.is_dir():
        return sections
    for path in sorted(directory.glob("*.yaml")):
        if path.stem == CONTROL:
            continue
        try:
            data = store.load(path.stem)
            sections.append(validate((data or {}).get(key), str(path)))
        except (BaselineError, BaselineFormatError, OSError):
            continue
    return sections


def _primary(result: load.CellResult) -> float | None:
    value = result.metrics()[OUTPUT_THROUGHPUT]
    return float(value) if result.valid and isinstance(value, (int, float)) else None


def gate_samples(repeats: Sequence[Mapping[str, Any]], gated: Sequence[str] | None = None) -> dict[str, list[float]]:
    """Each gated metric's repeat samples (a metric a repeat did not report is left out); ``gated``
    narrows the metrics (the control gates its output tok/s only)."""
    samples = {
        spec.key: [float(v) for m in repeats if isinstance(v := m.get(spec.key), (int, float))]
        for spec in GATED_METRICS if gated is None or spec.key in gated
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
    """Why a valid repeat measured the machine rather than the config (``verdicts.repeat_load_problem``),
    or None: such a repeat is recorded and retaken, never counted."""
    return repeat_load_problem(repeat_metrics(result)) if result.valid else None


def spoiled_evidence(run: stats.CellRun[load.CellResult]) -> list[str]:
    """Each spoiled repeat of ``run``: its index, output tok/s and why it was not counted."""
    out = []
    for i, why in sorted(run.spoiled.items()):
        tok_s = run.samples[i].metrics().get(OUTPUT_THROUGHPUT)
        shown = f", output tok/s {tok_s:.1f}" if stats.is_number(tok_s) else ""
        out.append(f"repeat {i}{shown}: {why}")
    return out


def _repeat_facts(run: stats.CellRun[load.CellResult]) -> tuple[list[dict[str, Any]], list[str]]:
    """The counted valid repeats' metrics (with the engine's clock overruns, where it reports them)
    and the problems of every repeat."""
    repeats = [repeat_metrics(s) for s in run.counted if s.valid]
    return repeats, [p for s in run.samples for p in s.problems()]


#: Gated metrics that exist only against an SLO: a session without one does not judge them.
SLO_METRICS = (REQUEST_GOODPUT,)
#: Gated metrics an open-loop cell does not gate. While the service keeps up, an open-loop cell's
#: output tok/s is the offered rate's (its rate x its output tokens) whatever the config's speed, as
#: the control is not measured there for (``launches.cells_of``): judged against the config's common
#: change, which its closed-loop cells measure, it fails whenever the launch or the day moves
#: (``benchmarks/bench_rate_gate.py``: 19 open-loop cells in 20 unchanged sweeps under a 2% launch
#: shift), and counted in that common change it dilutes it. Its goodput (under an SLO), TTFT and
#: acceptance are gated as any cell's; its tok/s is still recorded and blessed (the reader's, and
#: the history's), only not judged.
OFFERED_LOAD_METRICS = (OUTPUT_THROUGHPUT,)


def cell_gated(workload: load.CellLike, gated: Sequence[str] | None) -> tuple[str, ...] | None:
    """The metrics ``workload``'s cell gates, of the campaign's ``gated`` (None: all of them): an
    open-loop cell leaves out ``OFFERED_LOAD_METRICS``."""
    if workload.open_loop is None:
        return None if gated is None else tuple(gated)
    keys = [spec.key for spec in GATED_METRICS] if gated is None else list(gated)
    return tuple(k for k in keys if k not in OFFERED_LOAD_METRICS)


def judged_gated(workload: load.CellLike, gated: Sequence[str] | None, baseline_cell: Any, slo: SLO | None,
                 slo_edge: bool = True) -> tuple[str, ...] | None:
    """The metrics ``workload``'s cell judges today (``cell_gated``), less those its baseline says
    it records but does not judge (``edge_exemption``: a judged metric the baseline lacks would be
    reported as new)."""
    judged = cell_gated(workload, gated)
    edge = edge_exemption(baseline_cell, slo, workload) if slo_edge else None
    if edge is None:
        return judged
    keys = [spec.key for spec in GATED_METRICS] if judged is None else list(judged)
    return tuple(k for k in keys if k not in edge.metrics)


def judged_baseline(baseline_cell: Any, slo: SLO | None, workload: load.CellLike | None = None,
                    slo_edge: bool = True) -> dict[str, Any] | None:
    """A cell's baseline as this session judges it: without an SLO, its goodput gates are left out (a
    baseline blessed with an SLO must not fail a session without one for a figure it cannot count).
    With another SLO than the blessed one the goodput figures differ: re-bless (docs/gates/throughput.md).
    An open-loop ``workload``'s output tok/s gates are left out too (``OFFERED_LOAD_METRICS``: a
    baseline blessed before it was left out still holds them), and so is its goodput where it was
    blessed at the SLO's edge (``edge_exemption``; ``slo_edge=False``: judged wherever it was blessed)."""
    if not isinstance(baseline_cell, Mapping):
        return None
    gates = baseline_cell.get("gates")
    edge = edge_exemption(baseline_cell, slo, workload) if slo_edge else None
    dropped = (() if slo is not None else SLO_METRICS) + \
        (OFFERED_LOAD_METRICS if workload is not None and workload.open_loop is not None else ()) + \
        (edge.metrics if edge is not None else ())
    if not isinstance(gates, Mapping) or not any(k in gates for k in dropped):
        return dict(baseline_cell)
    return {**baseline_cell, "gates": {k: v for k, v in gates.items() if k not in dropped}}


def edge_exemption(baseline_cell: Any, slo: SLO | None, workload: load.CellLike | None) -> EdgeExemption | None:
    """What an open-loop ``workload`` blessed at ``slo``'s edge records but does not judge, and why
    (``slo_edge.py``: from its blessed sessions only); None for a closed-loop cell, without an SLO or
    where it was blessed clear of the edge."""
    if slo is None or workload is None or workload.open_loop is None:
        return None
    return baseline_mod.edge_exemption(baseline_cell, slo.percentile)


def cell_input(campaign: Campaign, workload: load.CellLike, baseline_cell: Any) -> CellInput:
    """What the gate needs of one measured cell."""
    run = campaign.runs[workload.name]
    repeats, problems = _repeat_facts(run)
    status, why = measurement_status(campaign.policy, run.primary, run.invalid, repeats, problems,
                                          spoiled=spoiled_evidence(run))
    return CellInput(judged_baseline(baseline_cell, campaign.slo, workload, campaign.slo_edge),
                          gate_samples(repeats, judged_gated(workload, campaign.gated, baseline_cell, campaign.slo,
                                                             campaign.slo_edge)),
                          status, why, measured_workload(run, workload))


def measured_workload(run: stats.CellRun[load.CellResult], workload: load.CellLike) -> WorkloadData:
    """The workload as measured: its numbers and the prompts its repeats really used
    (``documents via /tokenize``), so a baseline made from other prompts does not apply."""
    measured_prompts = sorted({s.prompt_source for s in run.samples if s.prompt_source})
    digests = sorted({d for s in run.samples if (d := s.workload.get("prompts_digest"))})
    return load.workload_dict(workload, measured_prompts[0] if measured_prompts else None, digests[0] if digests else None)


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
