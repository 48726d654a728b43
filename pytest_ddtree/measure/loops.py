"""How a phase's requests go out (no pytest import): the closed loop at a fixed concurrency, or the
open loop on an arrival schedule; each request through /generate or, for a chat cell,
/v1/chat/completions (``chat_stream.py``).

Neither raises for what the service does: a request that failed (or that a deadline cut) is a failed
result with its reason, never a lost one (``accounting.py`` counts them), and a stalled request
stops the phase: the server is hung, not slow. ``load.run_cell`` runs the phases of a cell.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.measure import openloop
from pytest_ddtree.measure.chat_stream import stream_chat
from pytest_ddtree.measure.generate_stream import RequestResult, guarded, stream_request
from pytest_ddtree.measure.prompts import Prompt, PromptSet
from pytest_ddtree.service.http import ServiceHTTP, phase_expired, thread_in_phase

#: One streamed request, sent and timed: /generate's (stream_request) or a chat cell's (stream_chat).
Sender = Callable[[ServiceHTTP, int, Prompt, int, "Mapping[str, Any] | None", "http.client.HTTPConnection | None", float],
                  RequestResult]


def sender(workload: object) -> Sender:
    """How ``workload``'s requests go out: /generate, or /v1/chat/completions for ``api: chat`` (with its thinking)."""
    if getattr(workload, "api", "generate") != "chat":
        return stream_request
    thinking = getattr(workload, "thinking", None)
    return lambda svc, i, p, n, extra, conn, tol: stream_chat(svc, i, p, n, extra, conn, tol, thinking)


def run_closed_loop(
    service: ServiceHTTP,
    concurrency: int,
    prompts: PromptSet,
    output_tokens: int,
    extra_sampling_params: Mapping[str, Any] | None,
    timeout_s: float,
    send: Sender = stream_request,
) -> tuple[list[RequestResult], float, int]:
    """C workers pull the next request index until all are sent; returns results, duration and how
    many were sent (each one has a result: a send that raised is a failed request, never a lost one)."""
    results: list[RequestResult | None] = [None] * len(prompts.prompts)
    lock = threading.Lock()
    counter = iter(range(len(prompts.prompts)))
    sent, stalled = [0], threading.Event()  # a stalled request stops the loop: the server is hung, not slow

    def worker() -> None:
        conn = service.connect(timeout_s)  # one kept-alive connection per closed-loop client
        try:
            while True:
                with lock:
                    index = None if phase_expired() or stalled.is_set() else next(counter, None)
                    sent[0] += index is not None
                if index is None:
                    return
                results[index] = result = guarded(send, service, index, prompts.prompts[index], output_tokens,
                                                  extra_sampling_params, conn, prompts.tolerance)
                if result.failure == "stall":
                    stalled.set()
                if not result.ok:
                    conn.close()  # http.client reconnects on the next request
        finally:
            conn.close()

    threads = [thread_in_phase(worker, name=f"ddtree-load-{i}") for i in range(max(1, concurrency))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in results if r is not None]
    end = max((r.end for r in done), default=t0)
    return done, end - t0, sent[0]


@dataclass
class OpenLoopRun:
    """What an open-loop phase measured: every request (in schedule order), its duration, and how
    late each request was sent against its schedule (seconds; slot waits under
    ``max_concurrency`` included)."""

    requests: list[RequestResult]
    duration_s: float
    send_lag_s: list[float] = field(default_factory=list)
    unfinished: int = 0  # requests the cell's deadline cut (failed, saying so)
    sent: int = 0  # requests whose thread started (each has a result; the rest were not sent by the deadline)


def run_open_loop(
    service: ServiceHTTP,
    prompts: PromptSet,
    output_tokens: int,
    arrivals: openloop.Arrivals,
    seed: int,
    extra_sampling_params: Mapping[str, Any] | None,
    timeout_s: float,
    request: Sender = stream_request,
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
    cut, stalled = threading.Event(), threading.Event()
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
            result = guarded(request, service, index, prompts.prompts[index], output_tokens, extra_sampling_params, conn,
                             prompts.tolerance)
            lags[index] = max(0.0, result.start - due)
            results[index] = result
            if result.failure == "stall":
                stalled.set()
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
    threads = _start_on_schedule(offsets, t0, end_by, stalled, send)
    for thread in threads:
        thread.join(max(0.0, end_by - clock()))
    unfinished = _cut_at_deadline(threads, socks, lock, cut)
    out = [result if result is not None else _not_finished(
        RequestResult(index=i, expected_prompt_tokens=prompts.prompts[i].target_tokens, expected_output_tokens=output_tokens,
                      start=t0 + offsets[i], end=clock()), offsets[i], i < len(threads), stalled.is_set(), deadline_s)
        for i, result in enumerate(results)]
    end = max((r.end for r in out), default=t0)
    return OpenLoopRun(out, end - t0, [lag for lag in lags if lag is not None], unfinished, sent=len(out))


def _start_on_schedule(offsets: Sequence[float], t0: float, end_by: float, stalled: threading.Event,
                       send: Callable[[int, float], None]) -> list[threading.Thread]:
    """Start each request's thread at its arrival (``t0 + offset``), late rather than early, and
    return the started threads in schedule order. Sending stops at the cell's deadline and after a
    stalled request: an arrival process does not wait for the server, so only those end it."""
    clock = time.perf_counter
    threads: list[threading.Thread] = []
    for index, offset in enumerate(offsets):
        due = t0 + offset
        while (delay := due - clock()) > 0 and clock() < end_by:
            time.sleep(min(delay, 0.5))
        if clock() >= end_by or stalled.is_set():
            break
        thread = thread_in_phase(send, index, due, name=f"ddtree-open-{index}")
        thread.start()
        threads.append(thread)
    return threads


def _not_finished(result: RequestResult, offset: float, started: bool, stalled: bool, deadline_s: float) -> RequestResult:
    """An open-loop request without a result (a send that failed has one): cut at the cell's deadline
    (its thread ran on), or not sent, by that deadline or because an earlier request stalled."""
    if not started and stalled:
        result.error, result.failure = f"not sent: an earlier request stalled (scheduled at +{offset:.2f} s)", "stall"
    else:
        result.error, result.failure = (f"{'sent but not finished' if started else 'not sent'} by the open-loop cell's "
                                        f"deadline of {deadline_s:.1f} s (scheduled at +{offset:.2f} s)"), "deadline"
    return result


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
