"""What the scheduler works on and counts: a request with its sampling parameters and step events,
the speculative config in effect, and the engine's exact accounting (with SGLang's lagging
accept-length counters) and latency histograms.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.refserver.model import Context, CopyState, MatchState
from pytest_ddtree.refserver.spec_gauges import SpecGauges


@dataclass(frozen=True)
class SpecConfig:
    """The speculative configuration actually in effect."""

    algorithm: str = "DFLASH"  # or "NONE"
    block_size: int = 8
    budget: int = 8
    topk: int = 4
    window: int | None = None
    trained_block_size: int = 8
    #: what the worker reports to SGLang's metrics (spec_gauges.py): upstream DFLASH steps 1 and its
    #: block size; EAGLE its steps and its tree's node count (the root counted)
    worker_steps: int = 1
    worker_draft_tokens: int | None = None

    @property
    def speculative(self) -> bool:
        return self.algorithm != "NONE"


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int = 0


@dataclass
class StepEvent:
    """Sent to a request's listener at the end of each step that touched it."""

    n_visible: int
    finished: bool


_ids = itertools.count(1)


@dataclass
class Request:
    """One generation, with its incremental model state (O(1) per new token)."""

    prompt_ids: list[int]
    params: SamplingParams
    rid: str = ""
    internal: bool = False
    output_ids: list[int] = field(default_factory=list)
    text_limit: int | None = None  # output text is cut here (a matched stop string)
    finish_reason: dict[str, Any] | None = None
    verify_ct: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at prefill
    logprob_start_len: int = -1  # >= 0: input logprobs from there on (caps the prefix match)
    #: verifies by drafts accepted: ``accept_histogram[k]`` verifies accepted exactly k drafted tokens
    #: (the bonus token not counted), grown on demand, as SGLang's ``Req.spec_correct_drafts_histogram``
    #: (python/sglang/srt/managers/schedule_batch.py ``update_spec_correct_drafts_histogram``).
    accept_histogram: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    target: MatchState = field(default_factory=MatchState)
    draft: MatchState = field(default_factory=MatchState)
    #: the sequence as the models have consumed it (prompt, then accepted tokens)
    ctx: Context = field(default_factory=Context)
    #: the sequence's repeat of its own text, shared by the target and the drafter (the
    #: drafter's window decides how well it sees it: model.Drafter)
    copy: CopyState = field(default_factory=CopyState)
    drafted_upto: int = 0  # tokens of ctx the drafter has followed
    salt: int = 0  # decorrelates the drafter noise of different prompts (set at prefill)
    events: queue.Queue[StepEvent] = field(default_factory=queue.Queue)
    done: threading.Event = field(default_factory=threading.Event)
    serial: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self) -> None:
        if not self.rid:
            self.rid = f"req-{self.serial:06d}"

    @property
    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def accept_length(self) -> float:
        return len(self.output_ids) / self.verify_ct if self.verify_ct else 0.0

    def e2e_latency(self) -> float:
        end = self.finished_at if self.finished_at is not None else time.monotonic()
        return end - self.arrival


class Histogram:
    """A Prometheus-style cumulative histogram."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, x: float) -> None:
        self.total += 1
        self.sum += x
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1


@dataclass
class FlushJob:
    """A /flush_cache request waiting for the scheduler (scheduler_components/flush_wrapper.py)."""

    deadline: float  # monotonic
    timed: bool  # timeout > 0: wait for idle until the deadline; else flush only if idle right now
    done: threading.Event = field(default_factory=threading.Event)
    success: bool = False
    message: str = ""


@dataclass
class Accounting:
    """Exact counters, plus SGLang's lagging accept-length counters.

    ``spec_*`` follow sgl-project/sglang python/sglang/srt/managers/scheduler_components/
    metrics_reporter.py: each decode batch adds (tokens, requests) to the interval counters; every
    ``decode_log_interval`` decode batches they are folded into the lifetime totals that
    /server_info's ``avg_spec_accept_length`` divides (scheduler.py ``get_internal_state``: absent
    until the totals have a forward); ``/flush_cache`` zeroes all of them (``reset_metrics``).
    """

    total_output_tokens: int = 0
    total_prompt_tokens: int = 0
    total_verify_steps: int = 0  # decode forward passes x requests in them
    total_decode_tokens: int = 0  # tokens produced by decode (verify) steps
    decode_forward_passes: int = 0
    prefill_forward_passes: int = 0
    simulated_busy_seconds: float = 0.0
    requests_completed: int = 0
    requests_aborted: int = 0
    verify_steps_since_flush: int = 0
    decode_tokens_since_flush: int = 0
    forward_ct_decode: int = 0
    spec_num_accept_tokens: int = 0
    spec_num_forward_ct: int = 0
    spec_total_num_accept_tokens: int = 0
    spec_total_num_forward_ct: int = 0
    #: the ``sglang:spec_*`` series with SGLang's cadence (spec_gauges.py); /flush_cache does not reset them
    gauges: SpecGauges = field(default_factory=SpecGauges)
