"""Load generator for SGLang's streaming ``/generate`` (or, for a chat cell, ``/v1/chat/completions``:
``chat_stream.py``): closed loop, or open loop on an arrival schedule (no pytest import).

Why it is written this way (see "Measuring serving performance without fooling yourself"):

* **Tokens come from the server's accounting, never from chunk counts.** Under speculative
  decoding one stream chunk carries several tokens (an accepted run of the tree); counting
  chunks as tokens is the ITL / peak-throughput bug SGLang's and llmperf's benchmarks had.
  Every chunk's ``meta_info.completion_tokens`` is cumulative, so the delta is exact.
* **ITL spreads a chunk's inter-arrival time evenly over the tokens it carries**, so the
  sum of a request's ITLs equals its decode time and TPOT and ITL agree.
* **Closed loop at fixed concurrency**: C worker threads each send the next request as soon
  as their previous one finished, which is how the campaign's "concurrency 32" was meant.
  An open-loop cell (``openloop.Arrivals``: bench_serving's request rate) is sent on its
  schedule instead (``loops.run_open_loop``), one thread and connection per request.
* **Real text of exact length** (``prompts.py``): prompts are real text cut to the cell's
  token count by the service's own tokenizer and sent as ``input_ids``, so a "4k" cell really
  sends 4096 tokens; the server's ``prompt_tokens`` is checked against it, and the output
  length is forced with ``ignore_eos`` and checked.
* **Warm-up at the measured concurrency, excluded**, then ``/flush_cache`` so the server's
  ``avg_spec_accept_length`` covers the measured requests only.
* **Failures are counted, never hidden**: every request sent is completed or failed with a named
  reason (``accounting.py``); any failed request, wrong prompt length, short output or impossible
  count makes the cell *invalid*; the gate reports invalid cells as such, never as a regression or a pass.

Requests go through the one HTTP layer (``pytest_ddtree.service.http``): each closed-loop client
streams on a kept-alive connection of its own, on bare ``http.client`` so the client's own CPU
cost per token stays low. SGLang's bench_serving does not keep connections: in 0.5.23
(python/sglang/benchmark/serving.py) every request function opens its own ``aiohttp``
session (``async with _create_bench_client_session()``), so each request pays a TCP connect and
the server an accept. ``benchmarks/bench_harness.py`` measures our client's cost;
``benchmarks/bench_client.py`` measures both clients against the truth.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_ddtree.measure import accounting, loops, openloop, slo as slo_mod
from pytest_ddtree.measure.matrix import Cell as Cell  # the cell tests and benchmarks make
from pytest_ddtree.service import proof
from pytest_ddtree.measure import prompts as prompts_mod, stats
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.measure.generate_stream import RequestResult as RequestResult, apply_chunk as apply_chunk
from pytest_ddtree.measure.generate_stream import stream_request as stream_request
from pytest_ddtree.service.http import ServiceHTTPError, phase_expired
from pytest_ddtree.measure.prompts import PromptMaker, PromptSet, stable_seed
from pytest_ddtree.metrics import ACCEPT_LENGTH, OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT, TOKENS_PER_VERIFY
from pytest_ddtree.records.shapes import WorkloadData
from pytest_ddtree.measure.server_state import merge_internal_states, server_accept_length as server_accept_length
from pytest_ddtree.measure.host_pressure import cpu_stall_seconds as cpu_stall_seconds, stall_since
from pytest_ddtree.measure.chat_stream import chat_prompts
from pytest_ddtree.measure.concurrency import loaded_concurrency as loaded_concurrency, peak_rates
from pytest_ddtree.measure.concurrency import served_concurrency as served_concurrency

#: Metric keys of :meth:`CellResult.metrics`, named like SGLang's bench_serving output.
DIST_METRICS = ("ttft", "tpot", "itl", "e2e_latency")
#: Percentiles reported for every distribution (bench_serving reports p90, p95 and p99).
DIST_PERCENTILES = (90, 95, 99)
class LoadError(RuntimeError):
    """The cell could not be run at all (its prompts cannot be made: unknown source, no service)."""


class CellLike(Protocol):
    """What a throughput cell needs; ``pytest_ddtree.measure.matrix.Cell`` satisfies it."""

    @property
    def name(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def requests(self) -> int: ...
    @property
    def warmup_requests(self) -> int: ...
    @property
    def prompts(self) -> str: ...
    @property
    def open_loop(self) -> openloop.Arrivals | None: ...
    @property
    def sampling(self) -> tuple[tuple[str, float], ...]: ...



def seed_name(workload: CellLike) -> str:
    """What ``workload``'s prompts and arrivals are seeded by: its ``seed_name`` where it has one, else
    its name. A rate search's probes (``<template>@<rate>``) send their template's prompts at every rate,
    as bench_serving's one ``--seed`` does across a ``--request-rate`` sweep; else each probe's acceptance
    (so its TPOT) moves with its prompts, and the highest passing rate is the luckiest prompt set's."""
    return getattr(workload, "seed_name", "") or workload.name


def workload_dict(workload: CellLike, prompts: str | None = None, digest: str | None = None) -> WorkloadData:
    """The workload's defining numbers and its prompts (``documents via /tokenize``, as measured; ``digest``:
    exactly what was sent, where known); stored with baselines so a changed workload is seen."""
    out: WorkloadData = {"concurrency": workload.concurrency, "context_tokens": workload.context_tokens,
                         "output_tokens": workload.output_tokens, "requests": workload.requests,
                         "prompts": prompts or f"{prompts_mod.source_name(workload.prompts)}"}
    if digest:
        out["prompts_digest"] = digest
    if getattr(workload, "api", "generate") == "chat":  # only chat cells: a /generate cell's dict is unchanged
        out["api"] = "chat"
        thinking = getattr(workload, "thinking", None)
        out["thinking"] = None if thinking is None else ("on" if thinking else "off")
    if workload.sampling:  # only sampled cells: a greedy cell's dict (and its baseline) is unchanged
        out["sampling"] = dict(workload.sampling)
    arrivals = workload.open_loop
    if arrivals is not None:  # only open-loop cells: a closed-loop cell's dict (and its baseline) is unchanged
        out["request_rate"] = float(arrivals.request_rate)
        out["arrival"] = arrivals.arrival
        out["max_concurrency"] = arrivals.max_concurrency
        if arrivals.arrival == "gamma":
            out["burstiness"] = float(arrivals.burstiness)
    return out


# --------------------------------------------------------------------------------------
# A cell


@dataclass
class CellResult:
    """One repeat of one cell: every request, the wall duration, and the server's view."""

    cell: str
    workload: WorkloadData
    requests: list[RequestResult]
    duration_s: float
    warmup_failed: int = 0
    server_accept_length: float | None = None
    server_info: dict[str, object] = field(default_factory=dict)  # /server_info after the measured loop (bench_serving's)
    server_state: dict[str, Any] = field(default_factory=dict)
    server_state_before: dict[str, Any] = field(default_factory=dict)
    #: seconds in which some task on this host waited for a CPU during the measured loop (cpu_stall_seconds)
    host_cpu_stall_s: float | None = None
    notes: list[str] = field(default_factory=list)
    prompt_source: str = ""  # e.g. "documents via /tokenize": which text, tokenized how
    speculative: bool = False  # the config speculates: every response must carry spec_verify_ct
    #: min(block_size - 1, budget) of the config: a request whose histogram goes above it proves
    #: the service serves another tree than it reports (None: not checked)
    accept_bound: int | None = None
    #: an open-loop cell's lateness of each sent request against its schedule (None: closed loop)
    send_lag_s: list[float] | None = None
    #: the latency SLO its goodput is counted against (None: no goodput figures)
    slo: slo_mod.SLO | None = None
    #: each measured request's prompt category, by request index (None: its prompt carries none)
    categories: list[str | None] = field(default_factory=list)
    #: requests its loop sent (None: not counted); every one must have a result (``accounting.account``)
    sent: int | None = None

    @property
    def ok_requests(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def failed(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    def problems(self) -> list[str]:
        """Reasons the repeat is invalid; empty when it is a valid measurement."""
        out = accounting.account(self.requests, self.sent)
        for r in self.requests:
            out.extend(r.problems())
        if not self.requests:
            out.append("no requests were sent")
        top = None if self.accept_bound is None else self.accept_bound + 1
        for r in self.ok_requests:
            if (impossible := accounting.verify_problem(r, top)) is not None:
                out.append(impossible)
            if r.accept_histogram is not None:
                violation = proof.bound_violation(r.accept_histogram, self.accept_bound, f"request {r.index}")
                if violation is not None:
                    out.append(f"the config did not apply: {violation}")
        ok = self.ok_requests
        silent = sum(1 for r in ok if not r.spec_verify_ct)
        if self.speculative and silent:
            out.append(
                f"{silent} of {len(ok)} responses carry no spec_verify_ct on their finished chunk: the server does not speculate "
                "(was the service started without its speculative flags, or did the build ignore them?); "
                "no accept length can be measured"
            )
        return out

    @property
    def valid(self) -> bool:
        return not self.problems()

    def accept_histogram(self) -> list[int] | None:
        """The measured requests' histograms summed (None unless every one sent one: a sum
        over a subset would not describe the cell)."""
        ok = self.ok_requests
        if not ok or any(r.accept_histogram is None for r in ok):
            return None
        total: list[int] = []
        for r in ok:
            total = proof.add_histograms(total, r.accept_histogram or [])
        return total

    def category_counts(self) -> dict[str, tuple[int, int]]:
        """Per prompt category, the valid requests' (completion tokens, verify steps): SPEED-Bench's
        acceptance per category, summed so repeats pool (empty without categories or verify counts)."""
        out: dict[str, tuple[int, int]] = {}
        for r in self.ok_requests:
            category = self.categories[r.index] if 0 <= r.index < len(self.categories) else None
            if category is not None and r.spec_verify_ct:
                tokens, steps = out.get(category, (0, 0))
                out[category] = (tokens + r.completion_tokens, steps + r.spec_verify_ct)
        return out

    @property
    def host_cpu_pressure(self) -> float | None:
        """The share of the measured loop in which some task on this host waited for a CPU, or None."""
        if self.host_cpu_stall_s is None or self.duration_s <= 0:
            return None
        return self.host_cpu_stall_s / self.duration_s

    def engine_accounting(self) -> dict[str, float] | None:
        """The engine's own view of the measured phase, where it reports one (refserver).

        ``ddtree_exact_output_throughput``: output tokens the engine produced / the wall time its
        simulated clock says it was busy (simulated busy seconds / clock scale);
        ``ddtree_engine_busy_fraction``: that busy time / our measured duration. A fraction well
        below 1 means the engine could not keep its simulated clock (the host is overloaded,
        or the client could not keep up): the measurement says more about the machine than
        about the configuration. ``ddtree_engine_clock_share``: that busy time / the wall time the
        engine had work (``work_wall_seconds``, where it reports it): the busy fraction without the
        gaps in which the engine had nothing to run (a single client's turn-around, long prompts
        travelling), so it is near 1 for every cell on a host that keeps up and below it exactly
        when the engine's passes ran late, however little each.
        """
        b, a = self.server_state_before, self.server_state
        keys = ("simulated_busy_seconds", "total_output_tokens")
        if not all(stats.is_number(b.get(k)) and stats.is_number(a.get(k)) for k in keys) or not stats.is_number(a.get("clock_scale")):
            return None
        busy = (float(a["simulated_busy_seconds"]) - float(b["simulated_busy_seconds"])) / float(a["clock_scale"])
        tokens = float(a["total_output_tokens"]) - float(b["total_output_tokens"])
        if busy <= 0 or self.duration_s <= 0:
            return None
        out = {
            "ddtree_engine_busy_seconds": busy,
            "ddtree_engine_output_tokens": tokens,
            "ddtree_exact_output_throughput": tokens / busy,
            "ddtree_engine_busy_fraction": busy / self.duration_s,
        }
        if stats.is_number(b.get("work_wall_seconds")) and stats.is_number(a.get("work_wall_seconds")):
            worked = float(a["work_wall_seconds"]) - float(b["work_wall_seconds"])
            if worked > 0:
                out["ddtree_engine_clock_share"] = busy / worked
        return out

    def metrics(self) -> dict[str, float | int | None]:
        """Aggregates under SGLang bench_serving's key names (times in ms); ours start ``ddtree_``.

        bench_serving's: ``total_input_tokens`` is the tokens sent (the server's count for text
        prompts); ``total_throughput`` is (input + output) tokens / duration; mean, median,
        std, p90, p95, p99 of every distribution; ``concurrency`` is the *achieved*
        concurrency (sum of latencies / duration), ``max_concurrency`` the configured one;
        ``max_output_tokens_per_s`` and ``max_concurrent_requests`` the peaks over one-second
        buckets, computed as bench_serving's ``calculate_metrics`` does. Counts are integers.
        ``total_output_tokens_retokenized`` is the server's exact count: bench_serving re-encodes
        the generated text because it has nothing better; this harness counts from meta_info.
        ``accept_length`` means what bench_serving means: the server's ``avg_spec_accept_length``
        (``internal_states`` of /server_info after the measured loop, every dp rank's: :func:`merge_internal_states`), or None when absent;
        information only, never gated: SGLang zeroes it on /flush_cache, omits it until decode
        batches ran and refreshes it every 40 batches. The gated figure is
        ``ddtree_tokens_per_verify`` (:data:`TOKENS_PER_VERIFY`): sum(completion_tokens) /
        sum(spec_verify_ct) over the measured requests' finished chunks.
        """
        ok = self.ok_requests
        dur = self.duration_s if self.duration_s > 0 else float("nan")
        sent = [r.sent_prompt_tokens if r.sent_prompt_tokens is not None else (r.prompt_tokens or 0) for r in ok]
        out: dict[str, float | int | None] = {
            "duration": self.duration_s,
            "completed": len(ok),
            "max_concurrency": self.workload.get("concurrency"),
            "total_input_tokens": int(sum(sent)),
            "total_input_text_tokens": int(sum(sent)),
            "total_input_vision_tokens": 0,
            "total_output_tokens": int(sum(r.completion_tokens for r in ok)),
        }
        out["total_output_tokens_retokenized"] = out["total_output_tokens"]
        out["request_throughput"] = len(ok) / dur
        out["input_throughput"] = float(out["total_input_tokens"] or 0) / dur
        out[OUTPUT_THROUGHPUT] = float(out["total_output_tokens"] or 0) / dur
        out["total_throughput"] = (float(out["total_input_tokens"] or 0) + float(out["total_output_tokens"] or 0)) / dur
        out.update(_distributions(ok))
        out["concurrency"] = sum(r.e2e_s for r in ok) / dur if ok else None
        configured = self.workload.get("concurrency")
        out["ddtree_loaded_concurrency"] = loaded_concurrency(
            ok, configured if isinstance(configured, int) and not isinstance(configured, bool) else None)
        out["ddtree_served_concurrency"] = served_concurrency(ok, out["ddtree_loaded_concurrency"])
        if self.send_lag_s is not None:
            self._open_loop_metrics(out)
        if self.slo is not None:  # bench_serving's goodput: over every request sent, failed ones too
            out.update(slo_mod.goodput(self.requests, self.slo, self.duration_s))
        out["max_output_tokens_per_s"], out["max_concurrent_requests"] = peak_rates(ok)
        verify = [r for r in ok if r.spec_verify_ct]
        total_verify = sum(r.spec_verify_ct or 0 for r in verify)
        # Only when every measured response says how many verify steps it took: a partial sum
        # would be a ratio over a subset (and such a cell is invalid, see problems()).
        complete = bool(ok) and len(verify) == len(ok)
        out[TOKENS_PER_VERIFY] = sum(r.completion_tokens for r in ok) / total_verify if complete and total_verify else None
        out[ACCEPT_LENGTH] = self.server_accept_length
        # ours
        out["ddtree_failed"] = self.failed
        out["ddtree_server_input_tokens"] = sum(r.prompt_tokens or 0 for r in ok)
        out["ddtree_spec_verify_ct"] = total_verify if verify else None
        ratios = [a for r in verify if (a := r.accept_length) is not None]
        out["ddtree_mean_request_accept_length"] = stats.mean(ratios) if ratios else None
        per_request = [r.completion_tokens / r.e2e_s for r in ok if r.e2e_s > 0]
        out[PER_REQUEST_OUTPUT_THROUGHPUT] = stats.median(per_request) if per_request else None
        out["ddtree_host_cpu_pressure"] = self.host_cpu_pressure
        engine = self.engine_accounting()
        if engine is not None:
            out.update(engine)
        return out

    def _open_loop_metrics(self, out: dict[str, float | int | None]) -> None:
        """An open-loop repeat's figures: bench_serving's ``request_rate`` and ``max_concurrency`` (the
        rate offered and the cap, None when uncapped) and how well the client kept its schedule. The
        closed loop's loaded and served concurrency mean nothing here: requests in flight follow
        the rate and the service, not a client count, so they are left out."""
        rate = self.workload.get("request_rate")
        out["request_rate"] = float(rate) if stats.is_number(rate) else None
        cap = self.workload.get("max_concurrency")
        out["max_concurrency"] = cap if isinstance(cap, int) and not isinstance(cap, bool) else None
        out["ddtree_loaded_concurrency"] = out["ddtree_served_concurrency"] = None
        out.update(openloop.lag_figures(self.send_lag_s or []))


def _distributions(ok: Sequence[RequestResult]) -> dict[str, float | None]:
    """bench_serving's latency distributions (ms) of the completed requests: mean, median, std and
    :data:`DIST_PERCENTILES` of each of :data:`DIST_METRICS`, and the longest ITL."""
    series: dict[str, list[float]] = {
        "ttft": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        "tpot": [t * 1000 for r in ok if (t := r.tpot_s) is not None],
        "itl": [x * 1000 for r in ok for x in r.itl_s],
        "e2e_latency": [r.e2e_s * 1000 for r in ok],
    }
    out: dict[str, float | None] = {}
    for name in DIST_METRICS:
        values = series[name]
        out[f"mean_{name}_ms"] = stats.mean(values) if values else None
        out[f"median_{name}_ms"] = stats.median(values) if values else None
        out[f"std_{name}_ms"] = stats.stdev(values) if values else None
        for q in DIST_PERCENTILES:
            out[f"p{q}_{name}_ms"] = stats.percentile(values, q) if values else None
    out["max_itl_ms"] = max(series["itl"]) if series["itl"] else None
    return out


def _internal_state(client: SGLangClient, notes: list[str], keep: dict[str, object] | None = None) -> dict[str, Any]:
    """``internal_states`` of /server_info, every dp rank's merged (:func:`merge_internal_states`;
    empty, with a note, when unavailable); ``keep``
    receives the whole answer (bench_serving's ``server_info`` key)."""
    try:
        info = client.server_info()
    except (OSError, ServiceHTTPError) as exc:
        notes.append(f"/server_info unavailable: {exc}")
        return {}
    if keep is not None:
        keep.update(info)
    out: dict[str, Any] = {}
    states = info.get("internal_states")
    if isinstance(states, list) and any(isinstance(s, dict) for s in states):
        out = merge_internal_states(states)
    else:
        value = server_accept_length(info)
        if value is not None:
            out["avg_spec_accept_length"] = value
    if stats.is_number(scale := info.get("clock_scale")):
        out["clock_scale"] = float(scale)
    return out


def prompt_maker(
    client: SGLangClient,
    *,
    tokenizer_path: str | None = None,
    vocab_size: int | None = None,
    dataset: str | None = None,
) -> PromptMaker:
    """The prompt maker of one service: its /tokenize, its prompt_tokens for calibration."""

    def tokenize(texts: Sequence[str]) -> list[list[int]]:
        try:
            return client.tokenize(texts)
        except ServiceHTTPError as exc:
            if exc.status in (404, 405):
                raise LookupError(f"{client.base_url} has no /tokenize") from None
            raise

    def count_prompt_tokens(text: str) -> int:
        meta = client.generate(text=text, sampling_params={"max_new_tokens": 1, "temperature": 0.0}).get("meta_info") or {}
        count = meta.get("prompt_tokens")
        if not isinstance(count, int):
            raise LoadError(f"{client.base_url}: /generate reports no meta_info.prompt_tokens (cannot size text prompts)")
        return count

    key = client.base_url
    try:
        info = client.model_info()
        key = f"{info.get('model_path')}|{info.get('tokenizer_path')}" if info.get("model_path") else key
    except (OSError, ServiceHTTPError):
        pass
    return PromptMaker(tokenize, count_prompt_tokens, key, tokenizer_path=tokenizer_path, vocab_size=vocab_size,
                       dataset=dataset)


def flush_cache(client: SGLangClient, deadline_s: float = 10.0) -> bool:
    """POST /flush_cache, retrying while the server says it is busy (SGLang answers 400)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            if client.flush_cache(timeout=max(1.0, deadline_s)):
                return True
        except (OSError, ServiceHTTPError):
            pass
        if time.monotonic() >= end or phase_expired():
            return False
        time.sleep(0.05)


def run_cell(
    service: str | SGLangClient,
    workload: CellLike,
    *,
    prompts: PromptMaker | None = None,
    seed: int = 0,
    timeout_s: float = 300.0,
    warmup: bool = True,
    flush: bool = True,
    flush_deadline_s: float = 10.0,
    extra_sampling_params: Mapping[str, Any] | None = None,
    speculative: bool = False,
    accept_bound: int | None = None,
    slo: slo_mod.SLO | None = None,
) -> CellResult:
    """Measure one repeat of ``workload`` against the SGLang service (its client, or a URL).

    Order: warm-up (``warmup_requests`` at the cell's concurrency, excluded), /flush_cache
    (resets the server's acceptance counter), the measured closed loop, /server_info.
    ``internal_states[0]`` is read right before and after the measured loop, so exact
    engine counters (the reference engine's token and simulated busy-time accounting) can
    be differenced over the measured phase: see :meth:`CellResult.engine_accounting`.
    Prompts (``prompts``, default: :func:`prompt_maker` of the service) depend only on the
    cell's source, length, request index and ``seed``, so every repeat and every session sends
    the same prompts: the flush keeps prefix caching out of the numbers and identical prompts
    keep acceptance comparable with the baseline. A URL gets a client of its own for this
    call, closed at the end; a client is the caller's to close. A request ends by its deadline as a whole (the
    client's) or its phase's (``http.phase``), past which none is sent. ``speculative``: the service runs a speculative config,
    so a response without ``spec_verify_ct`` makes the cell invalid (the server does not speculate).
    ``accept_bound``: min(block_size - 1, budget) of the config; a request whose acceptance
    histogram goes above it makes the cell invalid with the histogram as evidence. ``slo``: count goodput against it.
    """
    if isinstance(service, str):
        with SGLangClient(service, timeout=timeout_s) as own:
            return run_cell(own, workload, prompts=prompts, seed=seed, timeout_s=timeout_s, warmup=warmup,
                            flush=flush, flush_deadline_s=flush_deadline_s, extra_sampling_params=extra_sampling_params,
                            speculative=speculative, accept_bound=accept_bound, slo=slo)
    client, extra_sampling_params = service, {**dict(workload.sampling), **(extra_sampling_params or {})}
    measured, warm = _cell_prompts(client, prompts if prompts is not None else prompt_maker(client), workload, seed, warmup)
    notes = list(measured.notes)
    warmup_failed = 0 if warm is None else _warm_up(client, workload, warm, extra_sampling_params, timeout_s, notes)
    if flush and not flush_cache(client, flush_deadline_s):
        notes.append("/flush_cache did not succeed: the server's accept length covers more than this cell")
    before = _internal_state(client, notes)
    stall_before = cpu_stall_seconds()
    requests, duration, lags, sent = _run_measured(client, workload, measured, seed, extra_sampling_params, timeout_s, notes)
    stall = stall_since(stall_before)
    server_info: dict[str, object] = {}
    server_state = _internal_state(client, notes, keep=server_info)
    accept = server_accept_length({"internal_states": [server_state]}) if server_state else None
    return CellResult(
        cell=workload.name,
        workload=workload_dict(workload, measured.label, measured.digest),
        requests=requests,
        duration_s=duration,
        warmup_failed=warmup_failed,
        server_accept_length=accept,
        server_info=server_info,
        server_state=server_state,
        server_state_before=before,
        host_cpu_stall_s=stall,
        notes=notes,
        prompt_source=measured.label,
        speculative=speculative, accept_bound=accept_bound, send_lag_s=lags, slo=slo,
        categories=[p.category for p in measured.prompts], sent=sent,
    )


def _warm_up(client: SGLangClient, workload: CellLike, warm: PromptSet, extra_sampling_params: Mapping[str, Any],
             timeout_s: float, notes: list[str]) -> int:
    """Run the excluded warm-up at the cell's concurrency and return how many of its requests failed.

    The warm-up only fills the server's graphs and caches, so a failed request is a note, not a
    verdict; a stalled one is different: the server stops answering, and measuring after it would
    only time the stall, so it ends the cell here.
    """
    warm_results, _, _ = loops.run_closed_loop(client.http, workload.concurrency, warm, workload.output_tokens,
                                               extra_sampling_params, timeout_s, loops.sender(workload))
    failed = sum(1 for r in warm_results if not r.ok)
    if (stalled := next((r for r in warm_results if r.failure == "stall"), None)) is not None:
        raise LoadError(f"{workload.name}: warm-up request {stalled.index} failed: {stalled.error}")
    if failed:
        notes.append(f"{failed} of {len(warm_results)} warm-up requests failed")
    return failed


def _cell_prompts(client: SGLangClient, maker: PromptMaker, workload: CellLike, seed: int,
                  warmup: bool) -> tuple[PromptSet, PromptSet | None]:
    """The measured phase's prompts and the warm-up's (None: no warm-up); a chat cell's as message text."""
    try:
        measured = maker.build(workload.prompts, workload.context_tokens, workload.requests, stable_seed(seed_name(workload), seed))
        warm = maker.build(workload.prompts, workload.context_tokens, workload.warmup_requests,
                           stable_seed(seed_name(workload), seed, "warmup")) if warmup and workload.warmup_requests > 0 else None
        if getattr(workload, "api", "generate") == "chat":  # a chat message is text: the exact ids, decoded
            return chat_prompts(measured, client.detokenize), chat_prompts(warm, client.detokenize) if warm else None
        return measured, warm
    except prompts_mod.PromptError as exc:
        raise LoadError(f"{workload.name}: {exc}") from None
    except (OSError, ServiceHTTPError) as exc:
        raise LoadError(f"{workload.name}: cannot make the prompts: {exc}") from None


def _run_measured(client: SGLangClient, workload: CellLike, measured: PromptSet, seed: int,
                  extra_sampling_params: Mapping[str, Any] | None, timeout_s: float,
                  notes: list[str]) -> tuple[list[RequestResult], float, list[float] | None, int]:
    """The measured phase: the closed loop at the cell's concurrency, or the open loop on its
    arrival schedule (then also each request's lateness, and a note where the deadline cut some)."""
    arrivals = workload.open_loop
    if arrivals is None:
        requests, duration, sent = loops.run_closed_loop(client.http, workload.concurrency, measured, workload.output_tokens,
                                                    extra_sampling_params, timeout_s, loops.sender(workload))
        return requests, duration, None, sent
    run = loops.run_open_loop(client.http, measured, workload.output_tokens, arrivals,
                        stable_seed(seed_name(workload), seed, "arrivals"), extra_sampling_params, timeout_s, loops.sender(workload))
    if run.unfinished:
        notes.append(f"{run.unfinished} request(s) still running at the open-loop cell's deadline were cut")
    late = openloop.lag_figures(run.send_lag_s)["ddtree_late_requests"]
    if late and arrivals.max_concurrency is None:
        notes.append(f"{late} of {len(run.requests)} requests were sent more than {openloop.LATE_S * 1000:.0f} ms after "
                     "their scheduled time (the client could not keep the schedule: the service saw less than the rate)")
    return run.requests, run.duration_s, run.send_lag_s, run.sent
