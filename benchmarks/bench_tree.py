"""The engine's DDTree builder against PR 27509's, on identical draft distributions.

Run (where torch is installed, e.g. a GPU host; the PR's builder runs on the CPU):

    python3 benchmarks/bench_tree.py --ddtree-utils PATH/TO/ddtree_utils.py [--device cuda]

``PATH`` is PR 27509's ``python/sglang/srt/speculative/ddtree_utils.py`` (fork
Rancy-Wang/sglang, branch ``ddtree-v2`` or ``ddtree``: the tree builder is the same on both).
The file is loaded on its own, not as part of an SGLang install: its top level imports
only ``heapq``, ``numpy`` and ``torch``; its ``sglang`` imports (Triton kernels) sit inside
the GPU functions, which this benchmark never calls, so nothing is stubbed. Should a
version import ``sglang`` at the top, stand-in modules are installed for ``sglang.*``
while it loads (and the run says so); the two functions used here are pure.

For each case (tree depth L = block_size - 1, budget B, topk K) and each of ``--trees``
random draft distributions (per depth: K distinct token ids of a 32k vocabulary with
descending log-probabilities of a softmax over seeded normal logits; the same numbers for
both builders), it builds the tree with

* the engine: ``pytest_ddtree.refserver.ddtree.build_tree`` (per tree);
* the PR: ``_build_single_tree`` (its per-tree heap, numpy in and out, the CPU path the
  worker runs per request) and ``build_ddtree_tree`` (the whole batched entry point with
  ``draft_top_log_probs`` / ``draft_top_token_ids``, padded output tensors on ``--device``);

and checks that the trees are the same: node tokens, parents and depths in insertion
order (both insert best-first, so the order is part of the contract). It prints the
mismatches (expected 0) and microseconds per tree build for each.

Without ``--ddtree-utils`` (or without torch, with ``--stub-torch``), it checks and times
the engine side alone: every tree is prefix-closed, holds at most B nodes of depth <= L, and
a bigger budget's tree is a superset; ``--stub-torch`` also runs the PR's
``_build_single_tree`` on numpy arrays through a minimal stand-in ``torch`` module (only
``Tensor`` and ``device`` names for its annotations), so the identical-tree check can run on
a machine with numpy and no torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import math
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_ddtree.refserver.ddtree import DraftTree, build_tree  # noqa: E402

VOCAB = 32000
#: (tree depth L, budget B, topk K): the campaign's block size 8 (L = 7) at its budgets and
#: topks, then block size 16 (L = 15) as in the matrix.
CASES: tuple[tuple[int, int, int], ...] = (
    (7, 4, 4), (7, 8, 4), (7, 12, 4), (7, 16, 4), (7, 8, 6), (7, 16, 6),
    (15, 16, 4), (15, 32, 8), (15, 64, 8),
)
Tree = tuple[list[int], list[int], list[int]]  # tokens, parents (root included), depths


# ----------------------------------------------------------------------------------
# loading the PR's file on its own
# ----------------------------------------------------------------------------------


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of ``sglang`` and its submodules with empty modules."""

    def __init__(self) -> None:
        self.stubbed: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "sglang" or fullname.startswith("sglang."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        self.stubbed.append(spec.name)
        module = types.ModuleType(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextmanager
def sglang_stubs() -> Iterator[_StubFinder]:
    finder = _StubFinder()
    sys.meta_path.append(finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)


def install_torch_stub() -> None:
    """A stand-in ``torch`` with just the names the PR file's annotations evaluate."""
    torch = types.ModuleType("torch")
    torch.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    torch.device = type("device", (), {})  # type: ignore[attr-defined]
    sys.modules["torch"] = torch


def load_pr_module(path: Path) -> tuple[types.ModuleType, list[str]]:
    """Import the PR's ddtree_utils.py from ``path``; (module, names of stubbed modules)."""
    if not path.is_file():
        raise SystemExit(f"--ddtree-utils {path}: no such file (PR 27509's python/sglang/srt/speculative/ddtree_utils.py)")
    spec = importlib.util.spec_from_file_location("pr27509_ddtree_utils", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--ddtree-utils {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    with sglang_stubs() as finder:
        spec.loader.exec_module(module)
    for name in ("_build_single_tree",):
        if not hasattr(module, name):
            raise SystemExit(f"--ddtree-utils {path}: has no {name}(); is it PR 27509's ddtree_utils.py?")
    return module, finder.stubbed


# ----------------------------------------------------------------------------------
# identical draft distributions
# ----------------------------------------------------------------------------------


class Draft:
    """One request's per-depth top-K: token ids and float32-rounded log-probabilities
    (what the PR's builder sees after ``.to(torch.float32)``), best first."""

    def __init__(self, token_ids: list[list[int]], log_probs: list[list[float]]) -> None:
        self.token_ids = token_ids
        self.log_probs = log_probs

    def engine_dists(self) -> list[list[tuple[int, float]]]:
        """The engine takes probabilities; ``math.log`` of them gives back the same log-probs
        (to the last bit or within one ulp: only an exact tie could order differently)."""
        return [[(t, math.exp(lp)) for t, lp in zip(ids, lps)] for ids, lps in zip(self.token_ids, self.log_probs)]


def make_drafts(np: Any, depth: int, topk: int, count: int, seed: int) -> list[Draft]:
    rng = np.random.default_rng(seed)
    drafts = []
    for _ in range(count):
        ids_rows: list[list[int]] = []
        lp_rows: list[list[float]] = []
        for d in range(depth):
            # sharper near the root, flatter deeper, as a drafter's confidence falls with depth
            logits = rng.standard_normal(VOCAB) * (6.0 - 4.0 * d / max(1, depth - 1))
            top = np.argpartition(-logits, topk)[:topk]
            top = top[np.argsort(-logits[top], kind="stable")]
            log_z = float(np.log(np.exp(logits - logits.max()).sum()) + logits.max())
            lps = (logits[top] - log_z).astype(np.float32).astype(np.float64)
            ids_rows.append([int(t) for t in top])
            lp_rows.append([float(x) for x in lps])
        drafts.append(Draft(ids_rows, lp_rows))
    return drafts


# ----------------------------------------------------------------------------------
# the two builders, as (tokens, parents, depths)
# ----------------------------------------------------------------------------------


def engine_tree(draft: Draft, budget: int, topk: int) -> Tree:
    tree: DraftTree = build_tree(draft.engine_dists(), budget, topk)
    return tree.tokens[1:], tree.parents, tree.depths[1:]


class _NumpyTensor:
    """What ``_build_single_tree`` needs of a CPU tensor: ``.numpy()``."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def numpy(self) -> Any:
        return self.array


def pr_single(pr: types.ModuleType, np: Any, torch: Any | None, draft: Draft, budget: int, topk: int) -> Callable[[], Tree]:
    """A closure that runs the PR's per-tree builder on this draft (inputs made once)."""
    lps = np.asarray(draft.log_probs, dtype=np.float32)
    ids = np.asarray(draft.token_ids, dtype=np.int64)
    if torch is not None:
        lp_in: Any = torch.from_numpy(lps)
        id_in: Any = torch.from_numpy(ids)
    else:
        lp_in, id_in = _NumpyTensor(lps), _NumpyTensor(ids)
    depth = len(draft.token_ids)

    def build() -> Tree:
        tokens, depths, parents, _child_maps, _vis, _n = pr._build_single_tree(lp_in, id_in, topk, depth, budget)
        return [int(t) for t in tokens], [int(p) for p in parents], [int(d) for d in depths]

    return build


def pr_batched(pr: types.ModuleType, np: Any, torch: Any, drafts: Sequence[Draft], budget: int, device: str) -> Callable[[], list[Tree]]:
    """A closure that runs the PR's batched entry point over all drafts at once."""
    lps = torch.from_numpy(np.asarray([d.log_probs for d in drafts], dtype=np.float32)).to(device)
    ids = torch.from_numpy(np.asarray([d.token_ids for d in drafts], dtype=np.int64)).to(device)
    dev = torch.device(device)

    def build() -> list[Tree]:
        tokens, depths, parents, _maps, _vis, _sizes_t, sizes = pr.build_ddtree_tree(
            None, budget, dev, draft_top_log_probs=lps, draft_top_token_ids=ids)
        if device != "cpu":
            torch.cuda.synchronize()
        out = []
        tokens, depths, parents = tokens.cpu().tolist(), depths.cpu().tolist(), parents.cpu().tolist()
        for b, size in enumerate(sizes):
            n = int(size) - 1
            out.append(([int(t) for t in tokens[b][:n]], [int(p) for p in parents[b][: n + 1]],
                        [int(d) for d in depths[b][:n]]))
        return out

    return build


# ----------------------------------------------------------------------------------
# checks and timing
# ----------------------------------------------------------------------------------


def check_engine_tree(tree: Tree, budget: int, depth: int) -> str | None:
    tokens, parents, depths = tree
    if len(tokens) > budget:
        return f"{len(tokens)} nodes > budget {budget}"
    for i, (p, d) in enumerate(zip(parents[1:], depths), 1):
        if not 0 <= p < i:
            return f"node {i}: parent {p} not inserted before it"
        parent_depth = 0 if p == 0 else depths[p - 1]
        if d != parent_depth + 1 or d > depth:
            return f"node {i}: depth {d} under a parent of depth {parent_depth} (limit {depth})"
    return None


def paths(tree: Tree) -> set[tuple[int, ...]]:
    tokens, parents, _ = tree
    out: set[tuple[int, ...]] = set()
    path_of: dict[int, tuple[int, ...]] = {0: ()}
    for i, tok in enumerate(tokens, 1):
        path_of[i] = path_of[parents[i]] + (tok,)
        out.add(path_of[i])
    return out


def time_us(fn: Callable[[], Any], per_call: int, min_seconds: float) -> float:
    """Median microseconds per item over repeated rounds of ``fn`` (which builds ``per_call`` trees)."""
    rounds: list[float] = []
    start = time.perf_counter()
    while len(rounds) < 5 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        rounds.append((time.perf_counter() - t0) / per_call * 1e6)
        if len(rounds) >= 200:
            break
    return statistics.median(rounds)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddtree-utils", type=Path, help="PR 27509's ddtree_utils.py (omit: engine side only)")
    ap.add_argument("--stub-torch", action="store_true",
                    help="no torch here: load the PR file with a stand-in torch and compare _build_single_tree only")
    ap.add_argument("--device", default="cpu", help="device of build_ddtree_tree's output tensors (default: cpu)")
    ap.add_argument("--trees", type=int, default=64, help="draft distributions per case (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-seconds", type=float, default=0.3, help="timing time per builder and case")
    ns = ap.parse_args(argv)
    try:
        import numpy as np
    except ImportError:
        raise SystemExit("bench_tree needs numpy (pip install numpy)") from None
    torch: Any | None = None
    pr: types.ModuleType | None = None
    if ns.ddtree_utils is not None:
        if ns.stub_torch:
            install_torch_stub()
        else:
            try:
                torch_module = importlib.import_module("torch")
            except ImportError:
                raise SystemExit("the PR's ddtree_utils.py imports torch: run where torch is installed, "
                                 "or pass --stub-torch to compare its per-tree builder without it") from None
            torch = torch_module
        pr, stubbed = load_pr_module(ns.ddtree_utils)
        print(f"PR builder: {ns.ddtree_utils}" + (f" (stand-ins for {', '.join(sorted(set(stubbed)))})" if stubbed else "")
              + (" with a stand-in torch: _build_single_tree only" if ns.stub_torch else f"; torch {torch.__version__ if torch else ''}"))
    print(f"{ns.trees} random draft distributions per case, vocabulary {VOCAB}, seed {ns.seed}; "
          f"microseconds per tree (median of rounds); Python {sys.version.split()[0]}")
    header = f"{'L':>3} {'B':>3} {'K':>3} {'mismatch':>9} {'engine us':>10}"
    if pr is not None:
        header += f" {'PR single us':>13}"
        if torch is not None:
            header += f" {'PR batched us/tree':>19}"
    print(header)
    failures = 0
    for depth, budget, topk in CASES:
        drafts = make_drafts(np, depth, topk, ns.trees, ns.seed + 1000 * depth + budget + 7 * topk)
        engine_trees = [engine_tree(d, budget, topk) for d in drafts]
        problems = [p for t in engine_trees if (p := check_engine_tree(t, budget, depth))]
        smaller = [engine_tree(d, max(1, budget // 2), topk) for d in drafts]
        problems += [f"budget {budget // 2}'s tree is not inside budget {budget}'s"
                     for s, t in zip(smaller, engine_trees) if not paths(s) <= paths(t)]
        mismatch = len(problems)
        for p in problems[:3]:
            print(f"  engine L={depth} B={budget} K={topk}: {p}")
        row = f"{depth:>3} {budget:>3} {topk:>3}"
        dists = [d.engine_dists() for d in drafts]
        engine_us = time_us(lambda: [build_tree(x, budget, topk) for x in dists], len(dists), ns.min_seconds)
        cells = f" {engine_us:>10.1f}"
        if pr is not None:
            singles = [pr_single(pr, np, torch, d, budget, topk) for d in drafts]
            pr_trees = [build() for build in singles]
            diff = [i for i, (a, b) in enumerate(zip(engine_trees, pr_trees)) if a != b]
            if torch is not None:
                batched = pr_batched(pr, np, torch, drafts, budget, ns.device)
                diff += [i for i, (a, b) in enumerate(zip(engine_trees, batched())) if a != b and i not in diff]
            for i in diff[:3]:
                print(f"  tree {i} L={depth} B={budget} K={topk}: engine {engine_trees[i]} vs PR {pr_trees[i]}")
            mismatch += len(diff)
            cells += f" {time_us(lambda: [b() for b in singles], len(singles), ns.min_seconds):>13.1f}"
            if torch is not None:
                cells += f" {time_us(batched, len(drafts), ns.min_seconds):>19.1f}"
        failures += mismatch
        print(f"{row} {mismatch:>9}{cells}", flush=True)
    what = "engine and PR trees identical" if pr is not None else "engine trees well formed and nested"
    print(f"\n{what}: {'yes' if failures == 0 else f'NO ({failures} mismatches)'}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
