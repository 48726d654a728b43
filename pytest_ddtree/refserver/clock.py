"""The simulated accelerator clock: what a forward pass costs (:class:`ClockModel`) and how the
scheduler's passes are paced against absolute deadlines (:class:`StepClock`).

Why a simulated clock: the point of the engine is that configurations change throughput the way
they do on a GPU, on a CPU-only CI machine. Every forward pass is priced in simulated seconds and
its tokens become visible when its deadline (simulated seconds / ``clock_scale`` after the
previous pass's) is reached, so wall-clock measurements by the harness see GPU-like behaviour at
exactly the simulated rate, while the engine's CPU work stays a small fraction of each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: Most wall-clock lateness the scheduler carries over to later steps (see StepClock).
MAX_CLOCK_DEBT_S = 0.050


@dataclass(frozen=True)
class ClockModel:
    """Simulated cost of forward passes, in seconds (before slowdown and clock-scale).

    decode step = decode_fixed
                  + per_verify_token  * sum over the batch of (budget + 1)   [1 without speculation]
                  + per_draft_token   * sum over the batch of block_size     [0 without speculation]
                  + per_context_token * sum over the batch of context length
                  + per_draft_context_token * sum over the batch of min(context length, window)
                                                                             [0 without speculation]
    prefill step = prefill_fixed + prefill_per_token * sum of prompt tokens admitted

    Prompt tokens found in the prefix cache (``cached_tokens``) are not prefilled again, so
    they cost nothing (radix_cache.py: the KV of a cached prefix is reused).

    The defaults put a bs8_b8_k4 step at concurrency 1 near 42 ms (~110 tok/s per
    request) and make the budget crossover appear between concurrency 1 and 32. The draft
    block attends to the draft's own KV of the last ``min(seq_len, window)`` tokens (SGLang
    dflash_worker.py ``_compute_compact_draft_seq_lens``; the whole sequence without a
    window): a few draft layers against the target's many, so a context token costs the
    draft 0.3 of what it costs the target's verify, and a window makes long-context steps
    cheaper.
    """

    decode_fixed: float = 0.040
    per_verify_token: float = 0.00025
    per_draft_token: float = 0.00005
    per_context_token: float = 0.0000005
    per_draft_context_token: float = 0.00000015
    prefill_fixed: float = 0.020
    prefill_per_token: float = 0.00005


class StepClock:
    """Paces the scheduler's forward passes against absolute deadlines on a monotonic clock.

    Why: a pass that sleeps its simulated duration counted from "now" (after the engine's
    own CPU work, or after the previous pass really ended) adds the sleep overshoot, the
    publishing of tokens and the loop's bookkeeping to every pass; the harness then
    measured 1-2.5% (clock scale 1) to 6-10% (clock scale 10) less throughput than the
    engine's exact accounting. Here a busy period starts when work arrives; each pass ends
    at ``deadline = previous deadline + simulated seconds / scale`` and the scheduler sleeps
    only until then. A pass that ends late (CPU work, sleep overshoot, a GIL hand-off) is
    made up by the next ones, because the next deadline is computed from this deadline and
    not from the time the pass really ended: over a busy period, wall time equals simulated
    time / scale up to the last pass's overshoot.

    Limits: an idle engine starts afresh when work arrives (no catching up across idle
    gaps: idle time is not busy time), and lateness beyond ``max_debt_s`` of wall time is
    dropped and counted (``overruns``, ``overrun_seconds``): the engine could not keep its
    clock there (overloaded host, huge clock scale), and racing through passes to repay a
    long stall would distort the measurement more than the stall itself. The harness sees
    such a stall as simulated busy time short of its measured time.

    Threading: ``idle``, ``work_arrived`` and ``step_ended`` are called under the engine's
    lock; ``wait_step_end`` only by the scheduler thread, while ``start`` is set.
    """

    def __init__(
        self,
        scale: float,
        max_debt_s: float = MAX_CLOCK_DEBT_S,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not scale > 0:
            raise ValueError(f"clock scale must be > 0, got {scale}")
        self.scale = scale
        self.max_debt_s = max_debt_s
        self.now = now
        self.sleep = sleep
        self.start: float | None = None  # wall time the next pass starts at; None while idle
        self.overruns = 0
        self.overrun_seconds = 0.0
        self._work_since: float | None = None  # wall time the current busy period began
        self._work_seconds = 0.0  # wall time of the busy periods that ended

    def work_wall_seconds(self) -> float:
        """Wall seconds during which the engine had work (requests waiting or running), so far.

        Simulated busy seconds / scale over this is how well the clock was kept while there was
        something to run: 1.0 on a host that keeps up, whatever the client's gaps between
        requests; below it when passes ended late, including lateness too small to count as an
        overrun (an engine that is always a few ms late never drops its debt, and the debt
        left when a busy period ends is never counted at all)."""
        ongoing = self.now() - self._work_since if self._work_since is not None else 0.0
        return self._work_seconds + ongoing

    def idle(self) -> None:
        """No work left: the next busy period starts when work arrives."""
        self.start = None
        if self._work_since is not None:
            self._work_seconds += self.now() - self._work_since
            self._work_since = None

    def work_arrived(self) -> None:
        """A request was submitted: an idle clock starts counting from now."""
        if self.start is None:
            self.start = self.now()
        if self._work_since is None:
            self._work_since = self.start

    def wait_step_end(self, sim_seconds: float) -> float:
        """Sleep until the deadline of a pass of ``sim_seconds`` simulated seconds; return it.

        Returns at or after the deadline, never before. When the pass is more than
        ``max_debt_s`` behind its deadline, the debt is dropped (the deadline becomes now)
        and counted as an overrun.
        """
        start = self.start
        if start is None:  # not reached through submit (direct use): start now
            start = self.now()
        deadline = start + sim_seconds / self.scale
        late = self.now() - deadline
        if late > self.max_debt_s:
            self.overruns += 1
            self.overrun_seconds += late
            deadline += late
        while (delay := deadline - self.now()) > 0:
            self.sleep(delay)
        return deadline

    def step_ended(self, deadline: float) -> None:
        """The pass's tokens are published: the next pass starts at its deadline."""
        self.start = deadline
