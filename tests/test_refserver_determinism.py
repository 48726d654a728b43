"""The reference engine's greedy acceptance is a property of the prompts and the config alone.

Greedy SGLang accepts the same drafts whatever the host, the batch a request shares or the
time a step takes (up to numerics). The engine's drafter and target are keyed by the
sequence and its positions (model.py), never by the step, the batch or the clock, so one
cell measured through the harness's own load generator must give the same tokens per verify,
request by request, at two clock scales, with the host's CPUs taken by busy processes, and
with the same prompts sent one at a time (batches of one instead of eight).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.measure import load
from tests.refserver_helpers import RefServer, config_args

MATRIX = load_matrix(Path(__file__).resolve().parent.parent / "suites" / "configs.yaml")
#: The cell whose committed baseline once disagreed with every other machine (8 requests at once, 4k prompts).
CELL = next(w for w in MATRIX.cells if w.name == "c8_4k")
CONFIG = "bs8_b16_k4_w2048"


@contextmanager
def busy_cpus() -> Iterator[None]:
    """One spinning process per CPU of this host for the duration of the block."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait(10)


def per_request(tmp_path: Path, clock_scale: str, concurrency: int, loaded: bool = False) -> tuple[float | None, list[tuple[int, int, int | None]]]:
    """(tokens per verify, each request's (index, completion tokens, verifies)) of the cell's measured prompts."""
    engine = RefServer(["--clock-scale", clock_scale, *config_args(CONFIG)], tmp_path, name=f"s{clock_scale}c{concurrency}").wait_ready()
    try:
        cell = load.Cell(CELL.name, concurrency, CELL.context_tokens, CELL.output_tokens, CELL.requests, prompts=CELL.prompts)
        if loaded:
            with busy_cpus():
                result = load.run_cell(engine.url, cell, warmup=False, speculative=True)
        else:
            result = load.run_cell(engine.url, cell, warmup=False, speculative=True)
    finally:
        engine.stop()
    assert result.valid, result.problems()
    rows = sorted((r.index, r.completion_tokens, r.spec_verify_ct) for r in result.requests)
    return result.metrics()["ddtree_tokens_per_verify"], rows


@pytest.mark.slow
def test_greedy_acceptance_is_the_same_at_any_clock_scale_under_load_and_in_any_batch(tmp_path: Path) -> None:
    fast = per_request(tmp_path, "20", CELL.concurrency)
    slow = per_request(tmp_path, "2", CELL.concurrency)
    loaded = per_request(tmp_path, "20", CELL.concurrency, loaded=True)
    alone = per_request(tmp_path, "20", 1)
    assert fast[0] is not None and len(fast[1]) == CELL.requests
    assert slow == fast, f"clock scale 2 against 20: {slow} != {fast}"
    assert loaded == fast, f"with every CPU busy: {loaded} != {fast}"
    assert alone == fast, f"one request at a time against {CELL.concurrency}: {alone} != {fast}"
