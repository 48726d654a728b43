"""How many requests a closed loop really kept in flight, as the client and as the service saw them,
and bench_serving's per-second peaks (:meth:`load.CellResult.metrics` reads them)."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_ddtree.measure.generate_stream import RequestResult


def loaded_concurrency(requests: Sequence[RequestResult], concurrency: int | None = None) -> float | None:
    """Requests in flight while requests were still waiting to be sent (first start to last start;
    with the cell's ``concurrency``, from the start that completed the ramp, the concurrency-th,
    to the last start).

    bench_serving's ``concurrency`` (sum of latencies / duration) includes the drain at the end
    of a finite closed loop, where fewer requests remain than clients: 16 requests at
    concurrency 8 end with a tail in which a healthy engine shows 6.4-7.2. Before the last
    request is sent, a closed loop that keeps up has every client's request in flight, so a
    figure well below the configured concurrency there means the client (a starved or
    overloaded load generator) did not, and the engine saw a lighter load than the cell says.
    None with fewer than two requests or no time between the first and the last start, and where
    the cell sends no more requests than its concurrency (one wave): then no request ever waits
    for a client, and the ramp alone (requests in flight climbing 1, 2, ..., n while they are
    sent) would read as a client that kept half of them.
    """
    if len(requests) < 2:
        return None
    starts = sorted(r.start for r in requests)
    if concurrency is not None and concurrency > 0:
        if len(starts) <= concurrency:
            return None
        first = starts[concurrency - 1]
    else:
        first = starts[0]
    last = starts[-1]
    if last <= first:
        return None
    busy = sum(max(0.0, min(r.end, last) - max(r.start, first)) for r in requests)
    return busy / (last - first)


def served_concurrency(requests: Sequence[RequestResult], loaded: float | None) -> float | None:
    """The requests the service itself held while requests were waiting to be sent: ``loaded``
    (:func:`loaded_concurrency`, the client's count) times the share of the client's in-flight
    time that the service had each request (sum of meta_info.e2e_latency over sum of the client's
    end-to-end latencies).

    A client starved of CPU (threads waiting for the interpreter, another process on the cores)
    counts a request in flight from before it is sent until after it has read the last chunk; the
    service holds it only in between, and runs smaller batches than the cell names, while the
    client's own count, the engine's busy time and its clock all look fine. SGLang's meta_info
    carries e2e_latency (tokenizer_manager.py: from receiving the request to its last output),
    so the service's count needs nothing but its responses. None when ``loaded`` is None or a
    response has no e2e_latency.
    """
    if loaded is None or not requests or any(r.server_e2e_s is None for r in requests):
        return None
    client = sum(r.e2e_s for r in requests)
    if client <= 0:
        return None
    return loaded * min(1.0, sum(r.server_e2e_s or 0.0 for r in requests) / client)


def peak_rates(requests: Sequence[RequestResult]) -> tuple[float, int]:
    """Peak output tokens per second and peak concurrent requests over one-second buckets from
    the first request's start, as bench_serving's ``calculate_metrics`` computes
    ``max_output_tokens_per_s`` / ``max_concurrent_requests`` (token times: start + TTFT, then the
    ITLs; a request counts in every second from its start to its end)."""
    if not requests:
        return 0.0, 0
    t0 = min(r.start for r in requests)
    seconds = int(max(r.end for r in requests) - t0) + 2
    tokens = [0] * seconds
    running = [0] * seconds
    for r in requests:
        if r.ttft_s is not None:
            t = r.start + r.ttft_s
            for gap in [0.0, *r.itl_s]:
                t += gap
                bucket = int(t - t0)
                if 0 <= bucket < seconds:
                    tokens[bucket] += 1
        for second in range(int(r.start - t0), min(int(r.end - t0) + 1, seconds)):
            running[second] += 1
    return float(max(tokens)), int(max(running))
