"""DDTree: best-first draft-tree construction and tree verification.

Why a separate module: this is the algorithm under test. It follows the DDTree
description exactly (docs/reference-engine.md): one drafter pass gives per-depth distributions;
the tree holds the ``budget`` most probable prefixes under the product of per-depth
probabilities, built best-first with a max-heap over rank tuples (pop the best prefix,
push its next sibling and its first child), at most ``topk`` candidates per depth and
depth <= block_size - 1. Verification checks all budget + 1 tokens (root + nodes)
against the target in one pass: walk from the root following the child whose token
is the target's choice; the first position with no matching child yields the target's
own token (the bonus). Accepted tokens per step = matched depth + 1.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

Dist = Sequence[tuple[int, float]]


@dataclass
class DraftTree:
    """Nodes in insertion (best-first) order; node 0 is the root (the last context
    token, already verified). ``children[i]`` maps a token to its child's index."""

    tokens: list[int] = field(default_factory=lambda: [-1])
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    log_probs: list[float] = field(default_factory=lambda: [0.0])
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])

    @property
    def n_nodes(self) -> int:
        """Non-root nodes (the budget actually used)."""
        return len(self.tokens) - 1

    def max_depth(self) -> int:
        return max(self.depths)


def build_tree(dists: Sequence[Dist], budget: int, topk: int) -> DraftTree:
    """Best-first tree over per-depth distributions ``dists[d-1]`` (best first).

    A heap entry is ``(-log_prob, ranks)``: ``ranks[i]`` is the rank of the token
    chosen at depth i+1. Popping the most probable prefix adds it as a node; its next
    sibling (same prefix, next rank at the last depth) and its first child (rank 0 at
    the next depth) are pushed. Because a child is less probable than its parent and a
    next sibling less probable than its elder, the popped prefixes are exactly the
    ``budget`` most probable ones, always prefix-closed. Ties break on the rank tuple,
    so the tree is deterministic.
    """
    tree = DraftTree()
    max_depth = len(dists)
    if budget <= 0 or max_depth == 0 or topk <= 0:
        return tree
    logs = [
        [math.log(p) if p > 0 else -1e9 for _, p in dist[:topk]] for dist in dists
    ]
    if not logs[0]:
        return tree
    node_of: dict[tuple[int, ...], int] = {(): 0}
    heap: list[tuple[float, tuple[int, ...]]] = [(-logs[0][0], (0,))]
    while heap and tree.n_nodes < budget:
        neg_lp, ranks = heapq.heappop(heap)
        depth = len(ranks)
        parent = node_of[ranks[:-1]]
        token = dists[depth - 1][ranks[-1]][0]
        if token in tree.children[parent]:
            # the drafter listed the same token twice at one depth; keep the first
            continue
        idx = len(tree.tokens)
        node_of[ranks] = idx
        tree.tokens.append(token)
        tree.parents.append(parent)
        tree.depths.append(depth)
        tree.log_probs.append(-neg_lp)
        tree.children.append({})
        tree.children[parent][token] = idx
        parent_lp = -neg_lp - logs[depth - 1][ranks[-1]]
        sib = ranks[-1] + 1
        if sib < len(logs[depth - 1]):
            heapq.heappush(heap, (-(parent_lp + logs[depth - 1][sib]), ranks[:-1] + (sib,)))
        if depth < max_depth and logs[depth]:
            heapq.heappush(heap, (neg_lp - logs[depth][0], ranks + (0,)))
    return tree


@dataclass
class VerifyResult:
    tokens: list[int]
    matched_depth: int


def verify(
    tree: DraftTree,
    target_next: Callable[[int], int],
    advance: Callable[[int], None],
    max_tokens: int,
    stop_tokens: Container[int] = (),
    lossy: Callable[[int], bool] | None = None,
) -> VerifyResult:
    """Walk the tree against the target and return the accepted tokens.

    ``target_next(i)`` gives the target's choice after the context plus the ``i``
    tokens accepted so far in this step; ``advance(tok)`` appends a token to the
    target's state. The walk emits at most ``max_tokens`` tokens and stops after
    a token of ``stop_tokens`` (EOS), so output limits cut a step short without changing a token.
    ``lossy(depth)`` emulates a broken verify kernel: when the target disagrees with
    every child, it may accept the drafter's best child anyway.
    """
    out: list[int] = []
    node = 0
    matched = 0
    while len(out) < max_tokens:
        want = target_next(len(out))
        child = tree.children[node].get(want)
        if child is None and lossy is not None and tree.children[node]:
            if lossy(tree.depths[node] + 1):
                child = next(iter(tree.children[node].values()))
                want = tree.tokens[child]
        out.append(want)
        advance(want)
        if child is None or want in stop_tokens:
            break
        node = child
        matched += 1
    return VerifyResult(out, matched)
