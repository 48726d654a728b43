"""Unit tests of the reference engine's parts: tokenizer, automaton, DDTree, faults."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pytest_ddtree.refserver.clock import StepClock
from pytest_ddtree.refserver.ddtree import Dist, DraftTree, build_tree, verify
from pytest_ddtree.refserver.engine import Engine
from pytest_ddtree.refserver.faults import FaultError, Faults
from pytest_ddtree.refserver.model import MatchState, SuffixAutomaton, TargetModel, build_models
from pytest_ddtree.refserver.request_state import Request, SamplingParams, SpecConfig
from pytest_ddtree.refserver.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def models():  # type: ignore[no-untyped-def]
    return build_models()


@pytest.mark.parametrize(
    "text",
    ["", "def f(x):\n    return x + 1\n", "héllo  wörld\t\r\n  x  ", "日本語 ok", "a" * 100, " \n\n  \t", "<|eos literal"],
)
def test_tokenizer_round_trips_any_text(models, text: str) -> None:  # type: ignore[no-untyped-def]
    tok = models.tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size and not tok.is_special(i) for i in ids)


def test_special_tokens_in_text_are_matched_as_a_hugging_face_tokenizer_matches_them(models) -> None:  # type: ignore[no-untyped-def]
    """Added special tokens are matched in text (tokenizers' AddedVocabulary) and skipped by decode."""
    tok = models.tokenizer
    ids = tok.encode("a<|eos|> literal<|user|>")
    assert ids.count(tok.eos_id) == 1 and tok.is_special(ids[-1])
    assert tok.decode(ids, skip_special_tokens=False) == "a<|eos|> literal<|user|>"
    assert tok.decode(ids) == "a literal"


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


def _brute_force_top(dists: list[Dist], budget: int, topk: int) -> set[tuple[int, ...]]:
    """All prefixes (rank tuples), scored by product probability, best ``budget``."""
    scored: list[tuple[float, tuple[int, ...]]] = []
    for depth in range(1, len(dists) + 1):
        for ranks in itertools.product(range(topk), repeat=depth):
            if any(r >= len(dists[d]) for d, r in enumerate(ranks)):
                continue
            lp = sum(math.log(dists[d][r][1]) for d, r in enumerate(ranks))
            scored.append((-lp, ranks))
    scored.sort()
    return {tuple(dists[d][r][0] for d, r in enumerate(ranks)) for _, ranks in scored[:budget]}


def _paths(tree: DraftTree) -> set[tuple[int, ...]]:
    out: set[tuple[int, ...]] = set()
    for i in range(1, len(tree.tokens)):
        path: list[int] = []
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
    dists: list[Dist] = []
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
    g = Faults.parse(["serve-block-size=4,serve-budget=8", "unused-config=topk", "unused-config=window"])
    assert (g.serve_block_size, g.serve_budget, g.unused_config) == (4, 8, {"topk", "window"})
    assert Faults.parse(["trickle=health:0,trickle=stream:3"]).trickle == {"health": 0, "stream": 3}
    for bad in ["bogus", "exit-after", "exit-after=x", "http500-rate=2", "ignore-config=budget", "slowdown=0",
                "serve-block-size=1", "serve-budget=0", "unused-config=budget", "trickle=tokenize:0", "trickle=health",
                "trickle=health:-1"]:
        with pytest.raises(FaultError):
            Faults.parse([bad])


class FakeTime:
    """A monotonic clock that only moves when told to (CPU work) or slept on."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s > 0
        self.sleeps.append(s)
        self.t += s + 0.0001  # every sleep overshoots by 0.1 ms


def _clock(ft: FakeTime, scale: float = 10.0, max_debt_s: float = 0.050) -> StepClock:
    return StepClock(scale, max_debt_s=max_debt_s, now=ft.now, sleep=ft.sleep)


def test_step_clock_deadlines_chain_and_lateness_is_carried_over() -> None:
    ft = FakeTime()
    c = _clock(ft)
    c.work_arrived()
    t0 = ft.t
    ends = []
    for i in range(50):
        ft.t += 0.001 if i != 10 else 0.012  # CPU work; step 10 overruns its 4 ms step by 8 ms
        d = c.wait_step_end(0.040)  # 4 ms of wall time at scale 10
        assert ft.t >= d  # never visible before the deadline
        ft.t += 0.0002  # publishing
        c.step_ended(d)
        ends.append(d)
    # deadline n+1 = deadline n + sim/scale, whatever happened in between
    assert ends == pytest.approx([t0 + 0.004 * (i + 1) for i in range(50)])
    # the late step is made up by the next ones: the busy period lasts exactly sim/scale
    assert ft.t - t0 == pytest.approx(50 * 0.004 + 0.0001 + 0.0002, abs=1e-9)
    assert c.overruns == 0
    # the steps after the late one did not sleep until the debt was repaid
    assert len(ft.sleeps) < 50


def test_step_clock_sleeps_only_until_the_deadline() -> None:
    ft = FakeTime()
    c = _clock(ft)
    c.work_arrived()
    ft.t += 0.001  # 1 ms of CPU work
    d = c.wait_step_end(0.040)
    assert ft.sleeps == [pytest.approx(0.003)]  # 4 ms step - 1 ms of work
    assert d == pytest.approx(100.004)


def test_step_clock_resets_when_idle_no_catching_up() -> None:
    ft = FakeTime()
    c = _clock(ft)
    c.work_arrived()
    d = c.wait_step_end(0.040)
    c.step_ended(d)
    c.idle()
    ft.t += 5.0  # idle gap
    c.work_arrived()
    arrived = ft.t
    c.work_arrived()  # more work while busy does not move the start
    ft.t += 0.0005
    d = c.wait_step_end(0.040)
    assert d == pytest.approx(arrived + 0.004)
    assert ft.sleeps[-1] == pytest.approx(0.0035)
    assert c.overruns == 0


def test_step_clock_caps_the_debt_and_counts_overruns() -> None:
    ft = FakeTime()
    c = _clock(ft)
    c.work_arrived()
    d = c.wait_step_end(0.040)
    c.step_ended(d)
    ft.t += 0.200  # a 200 ms stall (overloaded host)
    d = c.wait_step_end(0.040)
    assert c.overruns == 1 and c.overrun_seconds == pytest.approx(0.200 - 0.004 + 0.0001, abs=1e-9)
    assert d == pytest.approx(ft.t)  # the debt is dropped: the step ends now...
    c.step_ended(d)
    ft.t += 0.001
    d2 = c.wait_step_end(0.040)
    assert d2 == pytest.approx(d + 0.004)  # ...and the next one is paced from there
    # lateness under the cap is carried, not counted
    c.step_ended(d2)
    ft.t = d2 + 0.030
    d3 = c.wait_step_end(0.040)
    assert d3 == pytest.approx(d2 + 0.004) and c.overruns == 1


def test_step_clock_counts_the_wall_time_it_had_work_so_lateness_under_the_cap_shows() -> None:
    ft = FakeTime()
    c = _clock(ft)
    c.work_arrived()
    for _ in range(8):  # a host that needs 6 ms for each 4 ms pass: 2 ms later each time, 16 ms in all
        ft.t += 0.006
        c.step_ended(c.wait_step_end(0.040))
    assert c.overruns == 0 and c.overrun_seconds == 0  # under the 50 ms cap: no overrun says anything
    assert c.work_wall_seconds() == pytest.approx(0.048)  # counted while the engine still has work
    c.idle()  # the busy period ends with its debt unpaid
    ft.t += 5.0  # idle: not work
    c.work_arrived()
    ft.t += 0.001
    c.step_ended(c.wait_step_end(0.040))  # a pass that keeps its time
    c.idle()
    assert c.work_wall_seconds() == pytest.approx(0.048 + 0.004, abs=2e-4)  # (the fake sleep overshoots 0.1 ms)
    # the harness's clock share, simulated busy / scale over the work time, shows the lost third
    assert 9 * 0.040 / 10 / c.work_wall_seconds() == pytest.approx(0.036 / 0.052, rel=0.01)


def test_step_clock_rejects_a_bad_scale() -> None:
    with pytest.raises(ValueError):
        StepClock(0.0)


def test_measurement_turn_reaches_the_processes_a_test_starts(measurement_turn: None) -> None:
    """The timing tests' engines and nested sessions inherit the raised priority (tests/machine_share.py)."""
    import os
    import subprocess
    import sys

    from tests.machine_share import RAISED_NICE

    if os.geteuid() != 0:
        pytest.skip("raising CPU priority needs root (CAP_SYS_NICE); the timing tests then run at the default")
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                           capture_output=True, text=True, check=True, timeout=60)
    assert int(child.stdout) == RAISED_NICE


class _RecordingClock(StepClock):
    """The engine's own clock, with each pass written down: (start, simulated seconds, deadline), or
    ``None`` where the engine went idle."""

    def __init__(self, scale: float) -> None:
        super().__init__(scale)
        self.passes: list[tuple[float, float, float] | None] = []

    def wait_step_end(self, sim_seconds: float) -> float:
        start = self.start
        deadline = super().wait_step_end(sim_seconds)
        assert start is not None  # the engine paces only passes that work arrived for
        self.passes.append((start, sim_seconds, deadline))
        return deadline

    def idle(self) -> None:
        super().idle()
        self.passes.append(None)


def test_engine_publishes_at_deadlines_and_keeps_the_rate(models) -> None:  # type: ignore[no-untyped-def]
    """In-process engine at clock scale 20: tokens never show before their pass's deadline, and the
    busy period lasts the simulated time (not sim + overhead per step): each pass starts at the last
    one's deadline, not at the time it really ended, so the deadlines add up to the simulated time
    exactly, plus only the lateness the clock dropped and counted (on a host too slow to keep it)."""
    clock = _RecordingClock(20.0)
    eng = Engine(models, SpecConfig(), clock_scale=20.0, step_clock=clock)
    eng.start()
    reqs = [eng.submit(Request(list(range(10, 138)), SamplingParams(max_new_tokens=96, temperature=0, ignore_eos=True)))
            for _ in range(2)]
    for r in reqs:
        assert r.done.wait(30)
    acct = eng.accounting()
    assert acct["total_output_tokens"] == 192
    periods: list[list[tuple[float, float, float]]] = [[]]
    for entry in clock.passes:
        if entry is None:
            periods.append([])
        else:
            periods[-1].append(entry)
    periods = [p for p in periods if p]
    paced = [entry for period in periods for entry in period]
    assert sum(sim for _, sim, _ in paced) == pytest.approx(acct["simulated_busy_seconds"])  # every pass paced
    for period in periods:
        for (_, _, deadline), (start, _, _) in itertools.pairwise(period):
            assert start == deadline  # chained: the next pass starts at this one's deadline
    dropped = sum(deadline - start - sim / 20.0 for start, sim, deadline in paced)
    assert dropped == pytest.approx(clock.overrun_seconds, abs=1e-6)  # lateness only where counted
    last_deadline = max(deadline for _, _, deadline in paced)
    assert max(r.finished_at or 0.0 for r in reqs) >= last_deadline  # never early
    assert acct["engine_cpu_seconds"] > 0


@pytest.mark.parametrize(("flags", "algorithm", "reported", "budget"), [
    ([], "NONE", None, None),  # the shipped plain launch: no speculative flag, as SGLang serves it
    (["--speculative-algorithm", "DFLASH"], "DFLASH", "DFLASH", 8),  # bs8_b8_k4
    (["--speculative-num-draft-tokens", "12"], "DFLASH", "DFLASH", 12),  # a config flag implies DFLASH (older profiles)
    (["--speculative-draft-window-size", "2048"], "DFLASH", "DFLASH", 8),
    (["--speculative-algorithm", "none", "--speculative-num-draft-tokens", "12"], "NONE", None, None),  # older profiles' NONE
])
def test_the_reference_dialect_serves_plainly_without_the_algorithm_flag(
        flags: list[str], algorithm: str, reported: str | None, budget: int | None) -> None:
    """SGLang serves plainly only where --speculative-algorithm is absent (its NONE is an algorithm
    named "NONE"): the engine takes the shipped plain launch the same way and reports it as SGLang."""
    from pytest_ddtree.refserver.cli import parse_args
    from pytest_ddtree.refserver.dialects import resolve

    ns, _ = parse_args(["--port", "0", *flags])
    resolved = resolve(ns.declared_dialect, ns, {}, drafter_block_size=8)
    assert resolved.algorithm == algorithm
    assert resolved.server_args["speculative_algorithm"] == reported
    assert resolved.server_args["speculative_num_draft_tokens"] == budget
