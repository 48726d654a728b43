"""The data that crosses the sandbox wall and the parent's judgement, without processes:
step parsing, the value form (round trip, deep values, cycles, forged data) and comparison
by type and value."""

from __future__ import annotations

import functools
import math

import pytest

from pytest_ddtree.sandbox.calls import StepError, judge_outcome, parse_tests
from pytest_ddtree.sandbox.values import Opaque, decode, difference, encode


def test_step_forms() -> None:
    plan = parse_tests(
        'assert f(1, "a") == (2, "a"), "pairs"\n'
        "f(-1) raises ValueError\n"
        "f(0)\n"
        "c = Box(2)\n"
        "c.get() == 2\n"
        "len(c) == 1\n"
        "data = [3, 1, 2]\n"
        "sorted(data) == [1, 2, 3]\n"
        "[f(k) for k in range(3)] == [1, 2, 3]\n"
        'f("x satisfies y") satisfies result > 0\n',
        "f",
    )
    kinds = [(c.fn, c.bind, c.loop, c.raises) for c in plan.calls]
    assert kinds[0] == (("call", "f"), None, None, None) and plan.calls[0].expect == (2, "a") and plan.calls[0].message == "pairs"
    assert kinds[1][3] == "ValueError" and not plan.calls[2].has_expect
    assert kinds[3] == (("call", "Box"), "c", None, None)
    assert kinds[4][0] == ("method", "c", "get") and kinds[5][0] == ("builtin", "len")
    assert plan.inputs == {"data": [3, 1, 2]} and plan.calls[6].args[0].ref == "data"  # data stays data
    assert kinds[7][2] == ("k", 0, 3, 1)
    assert plan.calls[8].args[0].value == "x satisfies y" and plan.calls[8].satisfies == "result > 0"
    job = plan.to_job()
    assert "expect" not in str(job) and "(2, 'a')" not in str(job)  # expectations never enter the run


@pytest.mark.parametrize("line", ["f(", "x.y.z(1)", "f(*a)", "a = b = f(1)", "f(1) == 2 raises X", "for i in []: f(i)"])
def test_bad_steps_say_which_line(line: str) -> None:
    with pytest.raises(StepError, match="f\\(|x\\.y|a = b|for"):
        parse_tests(line)


def test_values_round_trip_deep_and_cyclic() -> None:
    value = {"a": [1, 2.5, float("nan"), -3j, None, True], (1, "t"): frozenset({b"x"}), "s": {1, 2}, "big": 3**500}
    back = decode(encode(value))
    assert back.keys() == value.keys() and back["big"] == 3**500 and math.isnan(back["a"][2])
    assert difference(value, back) is None
    innermost: list[object] = [7]
    deep = functools.reduce(lambda acc, _: [acc], range(20_000), innermost)
    assert difference(deep, decode(encode(deep))) is None
    cyclic: list[object] = [1]
    cyclic.append(cyclic)
    assert isinstance(decode(encode(cyclic))[1], Opaque)

    class Sub(int):
        pass

    assert isinstance(decode(encode(Sub(3))), Opaque) and difference(3, Opaque("Sub")) is not None


@pytest.mark.parametrize("forged", [[], [["L", [0]]], [["I", "zz"]], [["Q"]], [["D", [1]], ["N"]], [["E", [1]], ["L", []]], "x"])
def test_forged_values_are_value_errors(forged: object) -> None:
    with pytest.raises(ValueError):
        decode(forged)


def test_comparison_by_type_and_value() -> None:
    assert difference(1, True) is not None and difference(True, 1) is not None
    assert difference((1, 2), [1, 2]) is not None
    assert difference(2.0, 2) is None and difference(2, 2.0) is not None
    assert difference(0.1 + 0.2, 0.3) is None and difference(1.0, 1.01) is not None
    assert "at [1]" in (difference([1, [2]], [1, [3]]) or "")


def test_judgement_of_outcomes() -> None:
    plan = parse_tests("f(2) == 4\nf(-1) raises ValueError\nf(3) satisfies result % 2 == 1", "f")
    ok = {"steps": [{"v": encode(4)}, {"raised": {"type": "ValueError", "mro": ["ValueError", "Exception"]}}, {"v": encode(9)}]}
    assert judge_outcome(plan, ok).verdict == "passed"
    wrong = {"steps": [{"v": encode(5)}, *ok["steps"][1:]]}
    assert judge_outcome(plan, wrong).verdict == "failed"
    not_raised = {"steps": [ok["steps"][0], {"v": encode(None)}, ok["steps"][2]]}
    assert "to be raised" in judge_outcome(plan, not_raised).message
    assert judge_outcome(plan, {"steps": ok["steps"][:2]}).verdict == "error"  # cut short
    assert judge_outcome(plan, {"verdict": "passed"}).verdict == "error"  # the old forged form
    assert judge_outcome(plan, {"steps": [{"v": [["I", "nope"]]}, *ok["steps"][1:]]}).verdict == "error"
    assert judge_outcome(plan, {"load_error": "SyntaxError"}).verdict == "error"


def test_decode_refuses_shared_deep_hashed_and_colliding_values() -> None:
    """Bounds proven before anything is hashed: a shared node (the 1 KB document whose set
    hashed 2**64 tuples), a tuple nested deeper than MAX_HASHED_DEPTH inside a set (hashing
    it recursed in C), ints that share one hash (a quadratic set), unreferenced nodes."""
    from pytest_ddtree.sandbox import values

    hash_bomb = [["E", [1]]] + [["T", [k + 1, k + 1]] for k in range(1, 64)] + [["N"]]
    dict_key_bomb = [["D", [1, 2]], ["T", [3, 3]], ["N"]] + [["T", [k + 1, k + 1]] for k in range(3, 64)] + [["N"]]
    repr_bomb = [["L", [k + 1, k + 1]] for k in range(0, 26)] + [["N"]]
    deep_in_set = [["E", [1]]] + [["T", [k + 1]] for k in range(1, 5000)] + [["T", []]]
    p = 2**61 - 1
    colliding = [["G", list(range(1, 2001))]] + [["I", hex(k * p)] for k in range(1, 2001)]
    orphan = [["L", [1]], ["N"], ["N"]]
    for nodes, why in [(hash_bomb, "shared"), (dict_key_bomb, "shared"), (repr_bomb, "shared"), (deep_in_set, "nested 5000 levels"),
                       (colliding, "share one hash value"), (orphan, "not part of the value")]:
        with pytest.raises(ValueError, match=why):
            decode(nodes)
    # honest values on the edges still decode: a deep list, a tuple key within the depth cap, a few equal hashes
    deep: list[object] = [1]
    for _ in range(5000):
        deep = [deep]
    assert difference(deep, decode(encode(deep))) is None
    empty: tuple[object, ...] = ()
    key = functools.reduce(lambda acc, _: (acc,), range(values.MAX_HASHED_DEPTH - 1), empty)
    assert decode(encode({key: 1, -1: 2, -2: 3})) == {key: 1, -1: 2, -2: 3}


def test_short_prints_any_value_within_its_budget() -> None:
    from pytest_ddtree.sandbox.values import short

    huge = list(range(2_000_000))
    assert short(huge, 40) == repr(huge)[:40] + "..."
    deep: list[object] = []
    for _ in range(50_000):
        deep = [deep]
    assert short(deep, 20) == "[" * 20 + "..."
    assert short("x" * 10**7, 10).startswith("'xxxxxxxxx") and len(short("x" * 10**7, 10)) <= 13
    assert short(10**5000, 80) == f"<int of {(10**5000).bit_length()} bits>"
    value = {(1, "a"): frozenset({b"x"}), "s": set(), "t": (1,), "f": [1.5, None, True, 2j]}
    assert short(value, 10_000) == repr(value)
    assert difference(1.5, 10**400) is not None  # an int too large for a float is not close, and does not raise
