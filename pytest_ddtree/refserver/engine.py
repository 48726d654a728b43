"""The scheduler: continuous batching over the models, priced by the simulated clock (clock.py),
with exact accounting (request_state.py).

A scheduler thread runs continuous batching (up to ``max_running_requests``); every forward pass
is priced by :class:`~pytest_ddtree.refserver.clock.ClockModel` in simulated seconds and
:class:`~pytest_ddtree.refserver.clock.StepClock` paces the passes against absolute deadlines.
Tokens of a step become visible to clients only when its step ends (its deadline), never earlier.

The cost of a decode step grows with the verify tokens of the whole batch, so a big
tree wins at concurrency 1 (more accepted tokens per nearly fixed-cost step) and
loses at high concurrency (verify cost dominates): the campaign's crossover.
"""

from __future__ import annotations

import queue
import threading
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

from pytest_ddtree.refserver.ddtree import build_tree, verify
from pytest_ddtree.refserver.faults import Faults
from pytest_ddtree.refserver.clock import ClockModel, StepClock
from pytest_ddtree.refserver.drafter import Drafter
from pytest_ddtree.refserver.model import Models, follow_copy, uniform
from pytest_ddtree.refserver.prefix_cache import RadixCache
from pytest_ddtree.refserver.profiler import Profiler
from pytest_ddtree.refserver.request_state import Accounting, FlushJob, Histogram, Request, SpecConfig, StepEvent

VERSION = "refserver-0.1.0"

#: Slack on a flush_cache wait beyond its timeout before the scheduler counts as stuck.
STEP_WAIT_S = 60.0
#: Tokens the prefix cache holds before it evicts (SGLang's --max-total-tokens: the KV pool size).
DEFAULT_MAX_TOTAL_TOKENS = 1 << 20


class Engine:
    """Continuous-batching scheduler over the models, with the simulated clock."""

    def __init__(
        self,
        models: Models,
        spec: SpecConfig,
        *,
        max_running_requests: int = 48,
        clock: ClockModel | None = None,
        clock_scale: float = 1.0,
        seed: int = 0,
        faults: Faults | None = None,
        log: Callable[[str], None] | None = None,
        decode_log_interval: int = 40,
        step_clock: StepClock | None = None,
        max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
    ) -> None:
        self.models = models
        self.spec = spec
        self.max_running = max_running_requests
        self.clock = clock or ClockModel()
        self.clock_scale = clock_scale
        self.step_clock = step_clock or StepClock(clock_scale)
        self.seed = seed
        self.faults = faults or Faults()
        self.flushes = 0  # /flush_cache calls that flushed (the ``stall`` fault counts them)
        self._stall_s = 0.0  # wall seconds the next forward pass stalls (fault ``stall``)
        self.log = log or (lambda _msg: None)
        self.decode_log_interval = max(1, decode_log_interval)
        self.drafter = Drafter(
            models.sam,
            trained_depth=spec.trained_block_size - 1,
            window=spec.window,
            seed=seed,
        )
        self.acct = Accounting()
        self.prefix_cache = RadixCache(max_total_tokens)
        self.profiler = Profiler(self.log)
        self.cached_tokens_total = 0
        self._flush_requests: list[FlushJob] = []
        self._flush_pending: FlushJob | None = None
        self.ttft = Histogram((0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
        self.e2e = Histogram((0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0))
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.step_index = 0
        self.last_gen_throughput = 0.0
        self.cpu_seconds = 0.0  # scheduler CPU time over whole steps, publishing included (benchmark)
        self._thread = threading.Thread(target=self._loop, name="refserver-scheduler", daemon=True)

    # -- public API (called from HTTP threads) ----------------------------------------

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, req: Request) -> Request:
        with self.cond:
            self.waiting.append(req)
            self.step_clock.work_arrived()
            self.cond.notify()
        return req

    def abort(self, req: Request) -> None:
        """Client went away: drop the request at the next step boundary."""
        req.aborted = True

    def busy(self) -> bool:
        with self.lock:
            return bool(self.waiting or self.running)

    def flush_cache(self, timeout_s: float = 0.0) -> tuple[bool, str]:
        """Empty the prefix cache and reset the accept-length averaging, as SGLang's scheduler does
        it (scheduler_components/flush_wrapper.py ``SchedulerFlushWrapper``): the scheduler thread
        takes the request between steps; while a timed flush is pending any other is refused; with
        ``timeout_s`` <= 0 it flushes only if idle right then, else it waits up to ``timeout_s``
        for the first idle moment. Returns (success, message), SGLang's messages ("" for a plain
        refusal). Blocks the caller until the scheduler decided."""
        job = FlushJob(deadline=time.monotonic() + max(0.0, timeout_s), timed=timeout_s > 0)
        with self.cond:
            self._flush_requests.append(job)
            self.cond.notify_all()
        if not job.done.wait(max(0.0, timeout_s) + STEP_WAIT_S):
            with self.cond:  # the scheduler is stuck: give up, as a dead scheduler would never answer
                if job in self._flush_requests:
                    self._flush_requests.remove(job)
                if self._flush_pending is job:
                    self._flush_pending = None
            return False, "Timed out waiting for idle state."
        return job.success, job.message

    def _flush_now(self) -> None:
        """scheduler.py ``flush_cache`` (idle only): the tree cache and the metrics are reset."""
        self.prefix_cache.reset()
        a = self.acct
        a.verify_steps_since_flush = a.decode_tokens_since_flush = 0
        a.forward_ct_decode = a.spec_num_accept_tokens = a.spec_num_forward_ct = 0
        a.spec_total_num_accept_tokens = a.spec_total_num_forward_ct = 0
        self.flushes += 1
        self._stall_s = self.faults.stalls.get(self.flushes, 0.0)
        self.log("Cache flushed successfully!")

    def _serve_flush(self) -> None:
        """The scheduler's side of flush_cache (``handle`` for new requests, then ``check_pending``);
        called under the lock between steps."""
        idle = not self.waiting and not self.running
        while self._flush_requests:
            job = self._flush_requests.pop(0)
            if self._flush_pending is not None:
                job.message = "Another flush_cache is already in progress."
            elif idle:
                self._flush_now()
                job.success = True
            elif job.timed:
                self._flush_pending = job
                continue
            else:
                self.log(f"WARNING:  Cache not flushed because there are pending requests. "
                         f"#queue-req: {len(self.waiting)}, #running-req: {len(self.running)}")
            job.done.set()
        pending = self._flush_pending
        if pending is None:
            return
        if idle:
            self._flush_now()
            pending.success = True
        elif time.monotonic() >= pending.deadline:
            pending.message = "Timed out waiting for idle state."
            self.log("WARNING:  Deferred flush_cache timed out while waiting for idle state.")
        else:
            return
        self._flush_pending = None
        pending.done.set()

    def avg_spec_accept_length(self) -> float:
        """Decode tokens per verify step since the last flush, live (the engine's exact figure)."""
        a = self.acct
        if not a.verify_steps_since_flush:
            return 0.0
        return a.decode_tokens_since_flush / a.verify_steps_since_flush

    def sglang_avg_spec_accept_length(self) -> float | None:
        """SGLang's figure: refreshed every decode_log_interval batches, None until the first refresh."""
        a = self.acct
        if not self.spec.speculative or not a.spec_total_num_forward_ct:
            return None
        return a.spec_total_num_accept_tokens / a.spec_total_num_forward_ct

    # -- scheduler ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.running:
                    self._serve_flush()
                    self.step_clock.idle()
                    self.cond.wait(timeout=1.0)
                self._serve_flush()
                self.running = [r for r in self.running if not self._drop_if_aborted(r)]
                admit: list[Request] = []
                while self.waiting and len(self.running) + len(admit) < self.max_running:
                    r = self.waiting.popleft()
                    if not self._drop_if_aborted(r):
                        admit.append(r)
            if self._stall_s and (admit or self.running):
                stall, self._stall_s = self._stall_s, 0.0
                time.sleep(stall)  # the injected stall itself: wall time the engine's clock did not get
            cpu0 = time.thread_time()
            wall0, sim0 = time.time(), self.acct.simulated_busy_seconds
            if admit:
                self._prefill(admit)
                name, size = "prefill", len(admit)
            elif self.running:
                batch = list(self.running)
                self._decode(batch)
                name, size = "decode", len(batch)
            else:
                continue
            self.cpu_seconds += time.thread_time() - cpu0
            self.profiler.on_step(name, wall0, time.time(), size, self.acct.simulated_busy_seconds - sim0)

    def _drop_if_aborted(self, r: Request) -> bool:
        if r.aborted and r.finish_reason is None:
            r.finish_reason = {"type": "abort", "message": "client disconnected"}
            r.finished_at = time.monotonic()
            self.acct.requests_aborted += 1
            r.done.set()
            r.events.put(StepEvent(len(r.output_ids), True))
            return True
        return r.aborted

    def _step_seconds(self, cost: float) -> float:
        """Simulated cost after the slowdown and clock-jitter faults."""
        cost *= self.faults.slowdown
        jitter = self.faults.clock_jitter
        if jitter:
            u = uniform(self.seed, 0xC10C, self.step_index)
            cost *= max(0.05, 1.0 + jitter * (2.0 * u - 1.0))
        return cost


    def _target_next(self, r: Request) -> int:
        """The target's next token after everything ``r.ctx`` holds (greedy or sampled)."""
        p = r.params
        target = self.models.target
        copied = target.copied(r.target, r.copy, r.ctx, p.ignore_eos)
        if copied >= 0:
            return copied
        if p.temperature <= 0:
            return target.greedy(r.target.state, p.ignore_eos)
        u = uniform(self.seed, p.seed, len(r.ctx))
        return target.sample(r.target.state, p.temperature, u, p.ignore_eos, p.top_p)

    def _target_push(self, r: Request, tok: int) -> None:
        """Append ``tok`` to the sequence and advance the target's view of it."""
        ctx = r.ctx
        ctx.append(tok)
        self.models.target.feed(r.target, tok)
        follow_copy(r.copy, ctx, len(ctx) - 1)

    def _prefill_models(self, r: Request) -> None:
        """Consume the prompt: the target's corpus match follows every token; the copy state
        is chosen once, at the prompt's end, so a long prompt costs one lookup rather than one
        per token; the drafter's capped corpus match needs only the prompt's last tokens."""
        ctx, target = r.ctx, self.models.target
        ctx.extend(r.prompt_ids)
        for tok in r.prompt_ids:
            target.feed(r.target, tok)
        r.copy.src, r.copy.length = ctx.source([], len(ctx))
        if self.spec.speculative:
            drafter = self.drafter
            for tok in r.prompt_ids[-drafter.cap :]:
                drafter.feed(r.draft, tok)
        r.drafted_upto = len(ctx)

    def _drafter_catch_up(self, r: Request) -> None:
        """Let the drafter's corpus match follow the tokens appended since it last looked."""
        drafter, seq, draft = self.drafter, r.ctx.seq, r.draft
        for i in range(r.drafted_upto, len(seq)):
            drafter.feed(draft, seq[i])
        r.drafted_upto = len(seq)

    def _stop_ids(self, r: Request) -> set[int]:
        ids = set(r.params.stop_token_ids)
        if not r.params.ignore_eos:
            ids.add(self.models.tokenizer.eos_id)
        return ids

    def _prefill(self, batch: list[Request]) -> None:
        cache = self.prefix_cache
        n_prompt = 0
        for r in batch:
            # schedule_batch.py _compute_max_prefix_len: one token is always computed (the
            # next-token logits), and input logprobs need their positions computed
            limit = len(r.prompt_ids) - 1
            if r.logprob_start_len >= 0:
                limit = min(limit, r.logprob_start_len)
            r.cached_tokens = cache.match_prefix(r.prompt_ids, limit)
            n_prompt += len(r.prompt_ids) - r.cached_tokens
            r.salt = zlib.crc32(array("q", r.prompt_ids).tobytes())
            self._prefill_models(r)
            if r.params.max_new_tokens > 0:
                tok = self._target_next(r)
                self._target_push(r, tok)
                self._append(r, [tok])
                if self.spec.speculative:
                    self._drafter_catch_up(r)
            self._check_finish(r)
        sim = self._step_seconds(self.clock.prefill_fixed + self.clock.prefill_per_token * n_prompt)
        self.step_index += 1
        deadline = self.step_clock.wait_step_end(sim)
        with self.cond:
            a = self.acct
            a.prefill_forward_passes += 1
            a.simulated_busy_seconds += sim
            for r in batch:
                if not r.internal:
                    a.total_prompt_tokens += len(r.prompt_ids)
                    a.total_output_tokens += len(r.output_ids)
                    self.cached_tokens_total += r.cached_tokens
                if r.finish_reason is None:
                    self.running.append(r)
                    cache.insert(r.prompt_ids)  # checkpoint_kv_cache after the prefill
            self._publish(batch)
            self.step_clock.step_ended(deadline)

    def _decode(self, batch: list[Request]) -> None:
        spec = self.spec
        window = spec.window
        produced: list[int] = []
        ctx_total = 0
        draft_ctx_total = 0  # what the draft attends to: the last min(seq_len, window) tokens
        for r in batch:
            ctx_total += r.context_len
            draft_ctx_total += r.context_len if window is None else min(r.context_len, window)
            before = len(r.output_ids)
            remaining = r.params.max_new_tokens - before
            if spec.speculative:
                accepted = self._spec_step(r, remaining)
                hist = r.accept_histogram
                if len(hist) <= accepted:
                    hist.extend([0] * (accepted + 1 - len(hist)))
                hist[accepted] += 1
            else:
                tok = self._target_next(r)
                self._target_push(r, tok)
                self._append(r, [tok])
            r.verify_ct += 1
            produced.append(len(r.output_ids) - before)
            self._check_finish(r)
        n = len(batch)
        sim = self._step_seconds(self._decode_cost(n, ctx_total, draft_ctx_total))
        self.step_index += 1
        deadline = self.step_clock.wait_step_end(sim)
        with self.cond:
            log_now, interval_accept = self._count_decode(batch, produced, sim)
            self.running = [r for r in self.running if r.finish_reason is None]
            self._publish(batch)
            self.step_clock.step_ended(deadline)
        if log_now:
            self.log(
                f"Decode batch. #running-req: {n}, #queue-req: {len(self.waiting)}, "
                f"accept len: {interval_accept:.2f}, "
                f"gen throughput (token/s): {self.last_gen_throughput:.2f}"
            )

    def _decode_cost(self, n: int, ctx_total: int, draft_ctx_total: int) -> float:
        """The decode step's price before faults: a speculative step verifies the whole tree
        (``budget + 1`` tokens) and drafts a block for each of the ``n`` requests, and its draft
        attends to ``draft_ctx_total`` tokens; that verify term is what makes a big tree lose at
        high concurrency."""
        spec, clock = self.spec, self.clock
        if spec.speculative:
            return (
                clock.decode_fixed
                + clock.per_verify_token * n * (spec.budget + 1)
                + clock.per_draft_token * n * spec.block_size
                + clock.per_context_token * ctx_total
                + clock.per_draft_context_token * draft_ctx_total
            )
        return clock.decode_fixed + clock.per_verify_token * n + clock.per_context_token * ctx_total

    def _count_decode(self, batch: list[Request], produced: list[int], sim: float) -> tuple[bool, float]:
        """Count a decode step's tokens (``produced``, per request) into the accounting; returns
        whether this step writes the decode log and the interval's accept length for it.

        Kept apart from the step because SGLang keeps it apart: the per-interval spec counters are
        summed into the totals and reset every ``decode_log_interval`` batches as
        sglang/srt/managers/scheduler_components/metrics_reporter.py does, so the figure a client
        reads between logs is SGLang's stale one. Internal requests (the start-up warm-up) are not
        counted. The caller holds ``self.cond``."""
        spec, a = self.spec, self.acct
        a.decode_forward_passes += 1
        a.simulated_busy_seconds += sim
        tokens = 0
        for r, k in zip(batch, produced):
            if r.internal:
                continue
            tokens += k
            a.total_verify_steps += 1
            a.verify_steps_since_flush += 1
        a.total_decode_tokens += tokens
        a.decode_tokens_since_flush += tokens
        a.total_output_tokens += tokens
        if spec.speculative:
            a.spec_num_accept_tokens += tokens
            a.spec_num_forward_ct += sum(1 for r in batch if not r.internal)
        a.forward_ct_decode += 1
        log_now = a.forward_ct_decode % self.decode_log_interval == 0
        interval_accept = a.spec_num_accept_tokens / a.spec_num_forward_ct if a.spec_num_forward_ct else 0.0
        if log_now:
            if spec.speculative:
                a.gauges.publish(a.spec_num_accept_tokens, a.spec_num_forward_ct, spec.worker_steps,
                                 spec.worker_draft_tokens or spec.block_size)
            a.spec_total_num_accept_tokens += a.spec_num_accept_tokens
            a.spec_total_num_forward_ct += a.spec_num_forward_ct
            a.spec_num_accept_tokens = a.spec_num_forward_ct = 0
        self.last_gen_throughput = tokens / sim if sim > 0 else 0.0
        return log_now, interval_accept

    def _spec_step(self, r: Request, remaining: int) -> int:
        """Draft, build the tree, verify; append the accepted tokens (bonus included); return
        how many drafted tokens the verify accepted (its matched depth)."""
        spec = self.spec
        depth = spec.block_size - 1
        position = r.context_len
        dists = self.drafter.propose(r.draft, r.copy, r.ctx, r.salt, depth, spec.topk)
        tree = build_tree(dists, spec.budget, spec.topk)

        def target_next(i: int) -> int:
            return self._target_next(r)

        def advance(tok: int) -> None:
            self._target_push(r, tok)

        lossy: Callable[[int], bool] | None = None
        if self.faults.lossy_verify > 0:
            rate = self.faults.lossy_verify

            def lossy_at(d: int) -> bool:
                return uniform(self.seed, 0x1055, r.serial, position, d) < rate

            lossy = lossy_at

        result = verify(tree, target_next, advance, remaining, self._stop_ids(r), lossy)
        self._drafter_catch_up(r)
        self._append(r, result.tokens)
        return result.matched_depth

    def _append(self, r: Request, tokens: list[int]) -> None:
        r.output_ids.extend(tokens)

    def _check_finish(self, r: Request) -> None:
        """Set finish_reason after a step: stop token, stop string, or length."""
        p = r.params
        out = r.output_ids
        stop_ids = self._stop_ids(r)
        if out and out[-1] in stop_ids:
            r.finish_reason = {"type": "stop", "matched": out[-1]}
        elif p.stop and out:
            tok = self.models.tokenizer
            text = tok.decode(out)
            hits = [(text.find(s), s) for s in p.stop if s and s in text]
            if hits:
                at, matched = min(hits)
                # keep the tokens up to the one that completed the stop string
                for k in range(1, len(out) + 1):
                    if matched in tok.decode(out[:k]):
                        del out[k:]
                        break
                r.text_limit = at
                r.finish_reason = {"type": "stop", "matched": matched}
        if r.finish_reason is None and len(out) >= p.max_new_tokens:
            r.finish_reason = {"type": "length", "length": p.max_new_tokens}

    def _publish(self, batch: list[Request]) -> None:
        """Make the step's tokens visible (called at the step's end, under the lock)."""
        now = time.monotonic()
        for r in batch:
            if r.first_token_at is None and r.output_ids:
                r.first_token_at = now
                if not r.internal:
                    self.ttft.observe(now - r.arrival)
            finished = r.finish_reason is not None
            if finished:
                # release_kv_cache: the tokens with KV (all but the last output token) stay cached
                self.prefix_cache.insert(r.prompt_ids + r.output_ids[:-1])
                r.finished_at = now
                self.acct.gauges.verify_calls_total += r.verify_ct  # the start-up warm-up's too, as SGLang counts it
                if not r.internal:
                    self.acct.requests_completed += 1
                    self.e2e.observe(now - r.arrival)
            r.events.put(StepEvent(len(r.output_ids), finished))
            if finished:
                r.done.set()

    # -- reporting ------------------------------------------------------------------

    def accounting(self) -> dict[str, Any]:
        with self.lock:
            a = self.acct
            out: dict[str, Any] = {}
            sglang_avg = self.sglang_avg_spec_accept_length()
            if sglang_avg is not None:  # absent until refreshed, as in SGLang
                out["avg_spec_accept_length"] = round(sglang_avg, 6)
            return out | {
                "exact_accept_length_since_flush": round(self.avg_spec_accept_length(), 6),
                "total_output_tokens": a.total_output_tokens,
                "total_prompt_tokens": a.total_prompt_tokens,
                "total_verify_steps": a.total_verify_steps,
                "total_decode_tokens": a.total_decode_tokens,
                "decode_forward_passes": a.decode_forward_passes,
                "prefill_forward_passes": a.prefill_forward_passes,
                "simulated_busy_seconds": round(a.simulated_busy_seconds, 9),
                "requests_completed": a.requests_completed,
                "requests_aborted": a.requests_aborted,
                "num_running_reqs": len(self.running),
                "num_waiting_reqs": len(self.waiting),
                "last_gen_throughput": round(self.last_gen_throughput, 3),
                "engine_cpu_seconds": round(self.cpu_seconds, 6),
                "prefix_cache_tokens": self.prefix_cache.size,
                "cached_tokens_total": self.cached_tokens_total,
                "clock_overruns": self.step_clock.overruns,
                "clock_overrun_seconds": round(self.step_clock.overrun_seconds, 6),
                "work_wall_seconds": round(self.step_clock.work_wall_seconds(), 6),
            }
