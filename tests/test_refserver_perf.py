"""The campaign's crossover, measured over HTTP on real engine processes.

At concurrency 1 a bigger tree gives each request more tokens per second; at
concurrency 32 a smaller tree gives more aggregate tokens per second. Wall-clock
figures are converted to simulated seconds (x clock scale).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.refserver_helpers import RefServer, config_args, start_many

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_refserver  # noqa: E402  (the benchmark's closed loop, not a copy of it)

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py

# Real time (clock scale 1): at 4x a step of the small tree is a few wall milliseconds, and on a
# busy 2-core runner the 32 clients' requests and the engine's own work took longer than that, so
# batches ran part-empty and the host, not the model, set the aggregate (ratio ~1.0 instead of ~1.4).
SCALE = 1.0
PROMPTS = ["Write a Python function that reverses a string.", "What is speculative decoding?", "Tell me a short story.", "Hello"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RefServer]]:
    specs = {n: [*config_args(n), "--clock-scale", str(SCALE)] for n in ("bs8_b4_k4", "bs8_b16_k4")}
    s = start_many(specs, tmp_path_factory.mktemp("perf"))
    yield s
    for srv in s.values():
        srv.stop()


def measure(srv: RefServer, concurrency: int, per_client: int, max_tokens: int = 64) -> dict[str, float]:
    """Closed loop (the benchmark's own); simulated aggregate and per-request tok/s."""
    fig = bench_refserver.run_cell(srv.url, concurrency, per_client, max_tokens, prompts=PROMPTS)
    assert fig["tokens"] == fig["engine_tokens"]  # exact accounting
    return {"agg": fig["agg"] / SCALE, "per_req": fig["per_req"] / SCALE, "sim_agg": fig["tokens"] / fig["sim_busy"],
            "mean_batch": fig["mean_batch"]}


def full_batches(small: RefServer, big: RefServer, attempts: int = 3) -> dict[str, dict[str, float]]:
    """Concurrency 32 on both engines, retaken while either engine batched < 80% of 32 requests.

    The crossover holds for full batches; on a busy machine the 32 clients can reach an engine
    late and it runs part-empty batches, which is a different measurement (the gate calls such a
    repeat starved and retakes it, and so does this test).
    """
    seen: list[dict[str, float]] = []
    for _ in range(attempts):
        c32 = {n: measure(s, 32, 1) for n, s in (("small", small), ("big", big))}
        if min(c32["small"]["mean_batch"], c32["big"]["mean_batch"]) >= 0.8 * 32:
            return c32
        seen.append({n: c32[n]["mean_batch"] for n in c32})
    pytest.fail(f"no attempt batched >= 80% of 32 requests on both engines (mean batch per attempt: {seen})")


def test_budget_crossover(pair: dict[str, RefServer]) -> None:
    small, big = pair["bs8_b4_k4"], pair["bs8_b16_k4"]
    c1 = {n: measure(s, 1, 2) for n, s in (("small", small), ("big", big))}
    c32 = full_batches(small, big)
    assert c1["big"]["per_req"] > 1.05 * c1["small"]["per_req"], c1
    assert c32["small"]["agg"] > 1.1 * c32["big"]["agg"], c32
    # the same ordering from the engine's own simulated clock
    assert c1["big"]["sim_agg"] > c1["small"]["sim_agg"]
    assert c32["small"]["sim_agg"] > c32["big"]["sim_agg"]
