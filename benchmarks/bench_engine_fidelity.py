"""The reference engine's acceptance per cell: monotone in the budget, and what the window does.

Run: ``python benchmarks/bench_engine_fidelity.py [--requests N] [--cells c1_4k,c1_long]``

In process and without the simulated clock's pacing: each cell of ``suites/configs.yaml``
gets the prompts the gate sends it (the same source, exact length and seed, tokenized by
the engine's own tokenizer as its ``/tokenize`` does), and the real :class:`Engine` runs
them through prefill and decode steps, greedy with ``ignore_eos`` and the cell's output
length. Printed per cell: the accept length sum(completion_tokens) / sum(spec_verify_ct)
at budgets 4, 8, 12, 16 (block size 8, topk 4) with the shipped default window (2048) and
with none, and the simulated decode milliseconds per step at budget 8 (steps of the cell's
concurrency). Deterministic: the figures are the
engine's, not a measurement of this machine. tests/test_refserver_fidelity.py uses the
same driver.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_ddtree.measure.matrix import Cell, load_matrix  # noqa: E402
from pytest_ddtree.measure.prompts import exact_prompts, stable_seed  # noqa: E402
from pytest_ddtree.refserver.engine import Engine  # noqa: E402
from pytest_ddtree.refserver.request_state import Request, SamplingParams, SpecConfig  # noqa: E402
from pytest_ddtree.refserver.model import Models, build_models  # noqa: E402

BUDGETS = (4, 8, 12, 16)
WINDOWS: tuple[int | None, ...] = (2048, None)
#: Never paces: every step's deadline has passed when it is reached.
NO_PACING = 1e12


class EngineTokenizer:
    """The engine's tokenizer as the prompt maker's encoder (what its /tokenize answers)."""

    method = "/tokenize"

    def __init__(self, models: Models) -> None:
        self.models = models
        self.key = f"refserver:{models.corpus.digest}"

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.models.tokenizer.encode(t) for t in texts]


def cell_prompts(models: Models, workload: Cell, limit: int | None = None) -> list[list[int]]:
    """The measured requests' prompts of a cell, as the gate makes them (load.py: seed 0)."""
    count = workload.requests if limit is None else min(limit, workload.requests)
    prompts, _ = exact_prompts(EngineTokenizer(models), workload.prompts or "documents",
                               workload.context_tokens, workload.requests, stable_seed(workload.name, 0))
    return [list(p.input_ids or ()) for p in prompts[:count]]


@dataclass(frozen=True)
class Run:
    accept_length: float
    decode_seconds_per_step: float  # simulated, per decode forward pass
    output_ids: tuple[tuple[int, ...], ...]


def run(models: Models, spec: SpecConfig, prompts: list[list[int]], output_tokens: int, batch: int) -> Run:
    """Generate every prompt in batches of ``batch`` (a cell's concurrency) through the engine's
    own steps; the accept length does not depend on the batching, the step time does."""
    engine = Engine(models, spec, clock_scale=NO_PACING)
    completion = verify = 0
    outputs: list[tuple[int, ...]] = []
    decode_seconds = 0.0
    for start in range(0, len(prompts), batch):
        reqs = [Request(p, SamplingParams(max_new_tokens=output_tokens, temperature=0.0, ignore_eos=True))
                for p in prompts[start:start + batch]]
        engine._prefill(reqs)
        prefilled = engine.acct.simulated_busy_seconds
        while engine.running:
            engine._decode(list(engine.running))
        decode_seconds += engine.acct.simulated_busy_seconds - prefilled
        for r in reqs:
            completion += len(r.output_ids)
            verify += r.verify_ct
            outputs.append(tuple(r.output_ids))
    steps = engine.acct.decode_forward_passes
    return Run(completion / verify, decode_seconds / max(1, steps), tuple(outputs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs-yaml", type=Path, default=ROOT / "suites" / "configs.yaml")
    ap.add_argument("--cells", default="", help="comma list of cell names (default: all)")
    ap.add_argument("--requests", type=int, default=None, help="at most this many requests per cell")
    ns = ap.parse_args()
    models = build_models()
    matrix = load_matrix(ns.configs_yaml)
    wanted = [c for c in ns.cells.split(",") if c]
    print(f"accept length (block size 8, topk 4) per budget; simulated decode ms per step; {ns.configs_yaml.name}")
    print(f"{'cell':<10} {'window':>6} " + " ".join(f"{'b' + str(b):>6}" for b in BUDGETS) + f" {'ms/step b8':>11}")
    for workload in matrix.cells:
        if wanted and workload.name not in wanted:
            continue
        prompts = cell_prompts(models, workload, ns.requests)
        for window in WINDOWS:
            runs = [run(models, SpecConfig(block_size=8, budget=b, topk=4, window=window), prompts,
                        workload.output_tokens, workload.concurrency) for b in BUDGETS]
            label = "none" if window is None else str(window)
            print(f"{workload.name:<10} {label:>6} " + " ".join(f"{r.accept_length:>6.2f}" for r in runs)
                  + f" {1000 * runs[1].decode_seconds_per_step:>11.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
