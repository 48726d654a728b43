"""Unit tests of the reference engine's parts: tokenizer, automaton, DDTree, faults."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pytest_ddtree.refserver.ddtree import build_tree, verify
from pytest_ddtree.refserver.faults import FaultError, Faults
from pytest_ddtree.refserver.model import MatchState, SuffixAutomaton, TargetModel, build_models
from pytest_ddtree.refserver.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def models():  # type: ignore[no-untyped-def]
    return build_models()


@pytest.mark.parametrize(
    "text",
    ["", "def f(x):\n    return x + 1\n", "héllo  wörld\t\r\n  x  ", "日本語 ok", "a" * 100, " \n\n  \t", "<|eos|> literal"],
)
def test_tokenizer_round_trips_any_text(models, text: str) -> None:  # type: ignore[no-untyped-def]
    tok = models.tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size and not tok.is_special(i) for i in ids)


def test_tokenizer_round_trips_random_text(models) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    alphabet = "ab cd\n\t_().,:;'\"é€😀0123456789    "
    for _ in range(200):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert models.tokenizer.decode(models.tokenizer.encode(s)) == s


def test_vocab_is_a_function_of_the_corpus() -> None:
    a = Tokenizer.from_texts(["x y z", "def f(): pass"])
    b = Tokenizer.from_texts(["x y z", "def f(): pass"])
    assert a.id_to_piece == b.id_to_piece


def test_automaton_counts_and_longest_match() -> None:
    stream = [1, 2, 3, 1, 2, 4, 1, 2, 3]
    sam = SuffixAutomaton(stream)
    target = TargetModel(sam, eos_id=0)
    m = MatchState()
    for t in [1, 2]:
        target.feed(m, t)
    assert m.length == 2
    assert dict(sam.cands(m.state)) == {3: 2, 4: 1}
    assert target.greedy(m.state) == 3
    target.feed(m, 9)  # unseen token: back to the root
    assert (m.state, m.length) == (0, 0)
    assert target.greedy(0) == 1  # most frequent token


def _brute_force_top(dists, budget, topk):  # type: ignore[no-untyped-def]
    """All prefixes (rank tuples), scored by product probability, best ``budget``."""
    scored = []
    for depth in range(1, len(dists) + 1):
        for ranks in itertools.product(range(topk), repeat=depth):
            if any(r >= len(dists[d]) for d, r in enumerate(ranks)):
                continue
            lp = sum(math.log(dists[d][r][1]) for d, r in enumerate(ranks))
            scored.append((-lp, ranks))
    scored.sort()
    return {tuple(dists[d][r][0] for d, r in enumerate(ranks)) for _, ranks in scored[:budget]}


def _paths(tree):  # type: ignore[no-untyped-def]
    out = set()
    for i in range(1, len(tree.tokens)):
        path = []
        j = i
        while j > 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_ddtree_holds_the_budget_most_probable_prefixes(seed: int) -> None:
    rng = random.Random(seed)
    depth, topk, budget = rng.randint(1, 5), rng.randint(1, 4), rng.randint(1, 20)
    dists = []
    for d in range(depth):
        ws = sorted((rng.random() + 1e-3 for _ in range(topk + 1)), reverse=True)
        z = sum(ws)
        dists.append([(100 * d + i, w / z) for i, w in enumerate(ws)])
    tree = build_tree(dists, budget, topk)
    paths = _paths(tree)
    assert tree.n_nodes == min(budget, sum(topk**d for d in range(1, depth + 1)))
    assert paths == _brute_force_top(dists, budget, topk)
    assert all(p[:-1] in paths or len(p) == 1 for p in paths)  # prefix-closed
    assert tree.max_depth() <= depth
    assert all(len(c) <= topk for c in tree.children)


def test_verify_accepts_matched_depth_plus_bonus() -> None:
    dists = [[(10, 0.9), (11, 0.1)], [(20, 0.9), (21, 0.1)], [(30, 1.0)]]
    tree = build_tree(dists, 8, 2)
    truth = [10, 21, 99, 5]
    got: list[int] = []
    res = verify(tree, lambda i: truth[i], got.append, max_tokens=10)
    assert res.tokens == [10, 21, 99] and res.matched_depth == 2 and got == res.tokens
    res = verify(tree, lambda i: truth[i], lambda t: None, max_tokens=1)
    assert res.tokens == [10]
    res = verify(tree, lambda i: [10, 0, 1][i], lambda t: None, max_tokens=10, stop_tokens={10})
    assert res.tokens == [10]


def test_fault_parsing() -> None:
    f = Faults.parse(["exit-after=3,http500-rate=0.25", "slowdown=2", "ignore-config=topk", "crash-on-start"])
    assert (f.exit_after, f.http500_rate, f.slowdown, f.crash_on_start) == (3, 0.25, 2.0, True)
    assert f.ignore_config == {"topk"}
    for bad in ["bogus", "exit-after", "exit-after=x", "http500-rate=2", "ignore-config=budget", "slowdown=0"]:
        with pytest.raises(FaultError):
            Faults.parse([bad])
