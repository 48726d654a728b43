"""The reference engine behaves like a real DFlash/DDTree build where the gate looks.

In process (the engine's own prefill and decode steps, no clock pacing), on the prompts
the gate sends each cell of suites/configs.yaml (benchmarks/bench_engine_fidelity.py is
the driver and prints the figures docs/reference-engine.md quotes):

* acceptance never falls as the budget grows: best-first trees of a bigger budget are
  supersets, and the drafter's noise belongs to a token's position, not to where a step
  started, so a bigger tree cannot lose acceptance to a different draw;
* the draft window is seen: at 128-token contexts ``_w2048`` and ``_wnone`` are the same
  run; at 4k the windowed drafter's steps are cheaper; at 16k it also accepts a little less.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.refserver.request_state import SpecConfig
from pytest_ddtree.refserver.model import Context, Models, build_models

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_engine_fidelity as fidelity  # noqa: E402  (the benchmark's driver, not a copy of it)

MATRIX = load_matrix(Path(__file__).resolve().parent.parent / "suites" / "configs.yaml")
CELLS = {w.name: w for w in MATRIX.cells}
#: Requests per cell here (the cells' own counts, capped: the property holds per request set).
MAX_REQUESTS = 12


@pytest.fixture(scope="module")
def models() -> Models:
    return build_models()


@pytest.mark.parametrize("window", [2048, None], ids=["w2048", "wnone"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_acceptance_does_not_fall_with_the_budget(models: Models, cell: str, window: int | None) -> None:
    workload = CELLS[cell]
    prompts = fidelity.cell_prompts(models, workload, MAX_REQUESTS)
    accepts = [fidelity.run(models, SpecConfig(block_size=8, budget=b, topk=4, window=window), prompts,
                            workload.output_tokens, workload.concurrency).accept_length for b in fidelity.BUDGETS]
    assert accepts == sorted(accepts), f"{cell}: accept length by budget {fidelity.BUDGETS}: {accepts}"
    assert accepts[-1] > accepts[0] * 1.15, f"{cell}: the budget barely matters: {accepts}"


def window_pair(models: Models, cell: str) -> tuple[fidelity.Run, fidelity.Run]:
    workload = CELLS[cell]
    prompts = fidelity.cell_prompts(models, workload, MAX_REQUESTS)
    windowed, full = (fidelity.run(models, SpecConfig(block_size=8, budget=8, topk=4, window=w), prompts,
                                   workload.output_tokens, workload.concurrency) for w in (2048, None))
    return windowed, full


def test_window_changes_nothing_at_short_context(models: Models) -> None:
    windowed, full = window_pair(models, "c32_short")
    assert windowed == full


def test_window_makes_long_context_steps_cheaper(models: Models) -> None:
    windowed, full = window_pair(models, "c8_4k")
    assert windowed.output_ids == full.output_ids  # lossless either way: the same greedy text
    assert windowed.accept_length <= full.accept_length
    # the draft attends to 2048 of the 4096+ tokens: 0.15 us x ~2100 tokens x 8 requests saved per step
    assert windowed.decode_seconds_per_step < full.decode_seconds_per_step * 0.98


def test_window_costs_acceptance_at_16k(models: Models) -> None:
    """One of c1_long's prompts is continued from a passage ~9000 tokens back: the windowed
    drafter recalls it less well (a little less acceptance), and its steps are cheaper."""
    windowed, full = window_pair(models, "c1_long")
    assert windowed.output_ids == full.output_ids
    assert windowed.accept_length < full.accept_length, (windowed.accept_length, full.accept_length)
    assert windowed.decode_seconds_per_step < full.decode_seconds_per_step * 0.98


def test_context_index_finds_the_occurrence_sharing_the_longest_context() -> None:
    ctx = Context()
    ctx.extend([1, 2, 3, 4, 5, 9, 9, 7, 2, 3, 4, 5, 8])  # "2 3 4 5" ends at index 4 (after 1) and 11 (after 7)
    for tok in [0, 1, 2, 3, 4]:
        ctx.append(tok)
    # the sequence ends "1 2 3 4", which occurred once before, ending at index 3
    assert ctx.source([], len(ctx)) == (3, 4)
    # with a drafter's guess 5 it ends "1 2 3 4 5": of the two earlier "2 3 4 5", the one after 1 shares 5 tokens
    assert ctx.source([5], len(ctx)) == (4, 5)
    one_by_one = Context()
    for tok in ctx.seq:
        one_by_one.append(tok)
    assert one_by_one.ends == ctx.ends


def test_target_continues_a_passage_the_sequence_repeats(models: Models) -> None:
    """Like a real LLM, the target copies: text the corpus has never seen, once repeated,
    is continued from its earlier occurrence (greedy, with or without speculation)."""
    passage = models.tokenizer.encode(" zq9 frobnicate the quux; wibble(7) -> wobble[3] ~ zork % plugh!")
    prompt = passage + [models.tokenizer.eos_id] + passage[:6]
    for spec in (SpecConfig(algorithm="NONE"), SpecConfig(block_size=8, budget=8, topk=4)):
        out = fidelity.run(models, spec, [prompt], len(passage) - 6, 1).output_ids[0]
        assert list(out) == passage[6:]


def test_tree_benchmark_engine_side_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/bench_tree.py (the comparison with PR 27509's builder, run where torch is)
    keeps working here on its engine side: well-formed, nested trees."""
    pytest.importorskip("numpy")
    import bench_tree

    assert bench_tree.main(["--trees", "3", "--min-seconds", "0"]) == 0
    assert "engine trees well formed and nested: yes" in capsys.readouterr().out
