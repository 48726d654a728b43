"""The campaign's crossover, measured over HTTP on real engine processes.

At concurrency 1 a bigger tree gives each request more tokens per second; at
concurrency 32 a smaller tree gives more aggregate tokens per second. Wall-clock
figures are converted to simulated seconds (x clock scale).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import requests

from refserver_helpers import RefServer, config_args, start_many

SCALE = 4.0
PROMPTS = ["Write a Python function that reverses a string.", "What is speculative decoding?", "Tell me a short story.", "Hello"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RefServer]]:
    specs = {n: [*config_args(n), "--clock-scale", str(SCALE)] for n in ("bs8_b4_k4", "bs8_b16_k4")}
    s = start_many(specs, tmp_path_factory.mktemp("perf"))
    yield s
    for srv in s.values():
        srv.stop()


def measure(srv: RefServer, concurrency: int, per_client: int, max_tokens: int = 64) -> dict[str, float]:
    """Closed loop; returns simulated aggregate and per-request tok/s, and accounting checks."""
    before = srv.info()["internal_states"][0]  # type: ignore[index]
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with requests.Session() as s:
            for j in range(per_client):
                body = {"model": "m", "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
                        "messages": [{"role": "user", "content": PROMPTS[(i + j) % len(PROMPTS)]}]}
                t0 = time.monotonic()
                r = s.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
                r.raise_for_status()
                with lock:
                    results.append((r.json()["usage"]["completion_tokens"], time.monotonic() - t0))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    after = srv.info()["internal_states"][0]  # type: ignore[index]
    tokens = sum(n for n, _ in results)
    assert len(results) == concurrency * per_client
    assert after["total_output_tokens"] - before["total_output_tokens"] == tokens  # exact accounting
    return {
        "agg": tokens / wall / SCALE,
        "per_req": sum(n / dt for n, dt in results) / len(results) / SCALE,
        "sim_agg": tokens / (after["simulated_busy_seconds"] - before["simulated_busy_seconds"]),
    }


def test_budget_crossover(pair: dict[str, RefServer]) -> None:
    small, big = pair["bs8_b4_k4"], pair["bs8_b16_k4"]
    c1 = {n: measure(s, 1, 3) for n, s in (("small", small), ("big", big))}
    c32 = {n: measure(s, 32, 1) for n, s in (("small", small), ("big", big))}
    assert c1["big"]["per_req"] > 1.05 * c1["small"]["per_req"], c1
    assert c32["small"]["agg"] > 1.1 * c32["big"]["agg"], c32
    # the same ordering from the engine's own simulated clock
    assert c1["big"]["sim_agg"] > c1["small"]["sim_agg"]
    assert c32["small"]["sim_agg"] > c32["big"]["sim_agg"]
