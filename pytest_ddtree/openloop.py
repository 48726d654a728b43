"""Open-loop load: requests sent on an arrival schedule, whatever the service does (no pytest import).

Why: a closed loop at concurrency C sends the next request only when one finishes, so a slow
service is offered less load and never builds a queue; deployments meet requests that arrive on
their own clock. An open-loop cell takes bench_serving's ``--request-rate`` (requests/s) and
``--max-concurrency``: the schedule is drawn before the first request is sent, each request is
sent at its time on a thread of its own, and a request the client could not send on time is sent
late and recorded with its lateness (``send_lag_s``), never skipped or re-timed.

Arrivals follow bench_serving. SGLang 0.5.23's ``get_request`` (sglang/benchmark/serving.py:1092)
yields the first request at once and then sleeps ``np.random.exponential(1 / request_rate)``
between requests (Poisson arrivals); it has no burstiness. ``gamma`` with ``burstiness`` is vLLM's
``benchmarks/serve.py`` spelling (gamma intervals of shape ``burstiness`` and mean ``1 / rate``:
1 is Poisson, below 1 burstier, above 1 more even); ``constant`` sends every ``1 / rate`` s.
``max_concurrency`` is bench_serving's semaphore (serving.py:1432): a request past it waits in the
client for a free slot, and its latency is timed from when it is really sent, as there.

Bounded: the whole cell has a deadline (``Arrivals.deadline_s``; by default the schedule's span
plus the per-request timeout). At the deadline every connection still open is shut, and each
request not finished by then is a failed request saying so, so a service that stops answering
costs one deadline, not one timeout per queued request.
"""

from __future__ import annotations

import http.client
import math
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.generate_stream import RequestResult, stream_request
from pytest_ddtree.http import ServiceHTTP
from pytest_ddtree.prompts import PromptSet

#: The arrival processes an open-loop cell can ask for (bench_serving's Poisson, vLLM's gamma).
ARRIVALS = ("poisson", "constant", "gamma")
#: A request sent this much later than its scheduled time counts as late (``ddtree_late_requests``).
LATE_S = 0.010


class ArrivalError(ValueError):
    """An open-loop schedule was asked for with values that cannot make one (the message says which)."""


@dataclass(frozen=True)
class Arrivals:
    """How an open-loop cell's requests arrive: ``request_rate`` requests/s on ``arrival``."""

    request_rate: float
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        rate = self.request_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0 < rate < math.inf):
            raise ArrivalError(f"request_rate must be a positive finite number of requests/s, got {rate!r} "
                               "(leave it out for a closed-loop cell at its concurrency)")
        if self.arrival not in ARRIVALS:
            raise ArrivalError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if not (isinstance(self.burstiness, (int, float)) and self.burstiness > 0):
            raise ArrivalError(f"burstiness must be a positive number (1: Poisson), got {self.burstiness!r}")
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise ArrivalError(f"burstiness {self.burstiness} needs arrival: gamma (it is the gamma shape)")
        cap = self.max_concurrency
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ArrivalError(f"max_concurrency must be a positive integer, got {cap!r}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ArrivalError(f"deadline_s must be positive, got {self.deadline_s!r}")

    def offsets(self, n: int, seed: int) -> list[float]:
        """The send times of ``n`` requests in seconds after the first (which is sent at 0).

        Drawn from ``seed`` alone, so every repeat and every session of a cell offers the service
        the same schedule and repeats differ only by what the service did."""
        rng = random.Random(seed)
        rate = float(self.request_rate)
        out, t = [], 0.0
        for i in range(n):
            if i:
                if self.arrival == "constant":
                    t += 1.0 / rate
                elif self.arrival == "gamma":
                    t += rng.gammavariate(self.burstiness, 1.0 / (rate * self.burstiness))
                else:
                    t += rng.expovariate(rate)
            out.append(t)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The keys a measured workload carries (bench_serving's ``request_rate``, ``max_concurrency``)."""
        out: dict[str, Any] = {"request_rate": float(self.request_rate), "arrival": self.arrival,
                               "max_concurrency": self.max_concurrency}
        if self.arrival == "gamma":
            out["burstiness"] = float(self.burstiness)
        return out


@dataclass
class OpenLoopRun:
    """What an open-loop phase measured: every request (in schedule order), its duration, and how
    late each request was sent against its schedule (seconds; slot waits under
    ``max_concurrency`` included)."""

    requests: list[RequestResult]
    duration_s: float
    send_lag_s: list[float] = field(default_factory=list)
    unfinished: int = 0  # requests the cell's deadline cut (failed, saying so)


def run_open_loop(
    service: ServiceHTTP,
    prompts: PromptSet,
    output_tokens: int,
    arrivals: Arrivals,
    seed: int,
    extra_sampling_params: Mapping[str, Any] | None,
    timeout_s: float,
) -> OpenLoopRun:
    """Send ``prompts`` on ``arrivals``' schedule, each on its own thread and connection; never raises
    for what the service does (failures land in the requests)."""
    n = len(prompts.prompts)
    offsets = arrivals.offsets(n, seed)
    deadline_s = arrivals.deadline_s if arrivals.deadline_s is not None else (offsets[-1] if offsets else 0.0) + timeout_s
    results: list[RequestResult | None] = [None] * n
    lags: list[float | None] = [None] * n
    open_conns: dict[int, http.client.HTTPConnection] = {}
    socks: dict[int, socket.socket] = {}
    lock = threading.Lock()
    cut = threading.Event()
    slots = threading.BoundedSemaphore(arrivals.max_concurrency) if arrivals.max_concurrency else None
    clock = time.perf_counter

    def send(index: int, due: float) -> None:
        if slots is not None:
            while not slots.acquire(timeout=0.05):
                if cut.is_set():
                    return
        try:
            conn = service.connect(timeout_s)
            with lock:
                if cut.is_set():
                    return
                open_conns[index] = conn
            try:
                conn.connect()  # now, so the deadline can shut its socket (http.client drops it on a closing response)
                socks[index] = conn.sock
            except OSError:
                pass  # stream_request connects again and records the failure
            result = stream_request(service, index, prompts.prompts[index], output_tokens, extra_sampling_params, conn,
                                    prompts.tolerance)
            lags[index] = max(0.0, result.start - due)
            results[index] = result
        finally:
            with lock:
                own = open_conns.pop(index, None)
                socks.pop(index, None)
            if own is not None:
                own.close()
            if slots is not None:
                slots.release()

    t0 = clock()
    end_by = t0 + deadline_s
    threads: list[threading.Thread] = []
    for index, offset in enumerate(offsets):
        due = t0 + offset
        while (delay := due - clock()) > 0 and clock() < end_by:
            time.sleep(min(delay, 0.5))
        if clock() >= end_by:
            break
        thread = threading.Thread(target=send, args=(index, due), name=f"ddtree-open-{index}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, end_by - clock()))
    unfinished = _cut_at_deadline(threads, socks, lock, cut)
    out: list[RequestResult] = []
    for index, result in enumerate(results):
        if result is None:
            result = RequestResult(index=index, expected_prompt_tokens=prompts.prompts[index].target_tokens,
                                   expected_output_tokens=output_tokens, start=t0 + offsets[index], end=clock(),
                                   error=f"not finished by the open-loop cell's deadline of {deadline_s:.1f} s "
                                         f"(scheduled at +{offsets[index]:.2f} s)")
        out.append(result)
    end = max((r.end for r in out), default=t0)
    return OpenLoopRun(out, end - t0, [lag for lag in lags if lag is not None], unfinished)


def _cut_at_deadline(threads: Sequence[threading.Thread], socks: dict[int, socket.socket], lock: threading.Lock,
                     cut: threading.Event) -> int:
    """Shut every connection still streaming at the cell's deadline (a blocked read then fails at
    once) and wait briefly for its thread; returns how many requests were cut."""
    alive = [t for t in threads if t.is_alive()]
    if not alive:
        return 0
    cut.set()
    with lock:
        streaming = list(socks.values())
    for sock in streaming:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    for thread in alive:
        thread.join(5.0)
    return len(alive)


def lag_figures(lags: Sequence[float]) -> dict[str, float | int | None]:
    """How far the client kept its schedule: the latest send (ms) and the requests sent more than
    ``LATE_S`` late (a client that could not keep the schedule offered the service less than the
    rate names; with ``max_concurrency`` a wait for a slot is by design)."""
    return {
        "ddtree_max_send_lag_ms": max(lags) * 1000 if lags else None,
        "ddtree_late_requests": sum(1 for lag in lags if lag > LATE_S),
    }
