"""The harness under hostile data, end to end: the real coding gate (pytester, a real reference
engine, the real sandbox) fed answers and results built to hang, crash or fool the harness
process itself rather than the sandbox.

Each test asserts on outcomes: the gate finishes (the generous pytester timeout is only a
guard), every problem gets a verdict, none passes, the failure names what was wrong, no
traceback of the harness, and no sandbox process survives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates import coding_problems
from pytest_ddtree import sandbox
from pytest_ddtree.sandbox.processes import proc_table
from tests.polling import wait_until
from tests.suite_helpers import reference_profile, run_suite

FENCE = "```"
HARNESS_TRACE = 'pytest_ddtree/'  # a traceback of the harness names its files

pytestmark = pytest.mark.skipif(not sandbox.isolation().strong, reason=f"needs a namespace tier with a uid drop: {sandbox.isolation().describe()}")


def coding_records(directory: Path) -> list[dict[str, Any]]:
    out = []
    for path in (directory / "results").glob("records-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "coding":
                out.append(rec)
    return out


def forged(nodes_expr: str) -> str:
    """Short code (the engine's answers are bounded by max_tokens) that builds a node list in
    the run and writes it to the result pipe as the value of one step, then leaves."""
    return (
        "import json, os, sys\n"
        f"NODES = {nodes_expr}\n"
        "with os.fdopen(sys._getframe(1).f_locals['out_fd'], 'wb') as out:  # the runner's result pipe\n"
        "    out.write(json.dumps({'steps': [{'v': NODES}]}).encode())\n"
        "os._exit(0)\n"
    )


HOSTILE_RESULTS = {
    # the 1 KB document that froze the gate: a set of tuples, each listing its child twice, 64 deep
    "slugify": forged("[['E', [1]]] + [['T', [k + 1, k + 1]] for k in range(1, 64)] + [['N']]"),
    # the same through a dict key
    "parse_duration": forged("[['D', [1, 2]], ['T', [3, 3]], ['N']] + [['T', [k + 1, k + 1]] for k in range(3, 64)] + [['N']]"),
    # the repr bomb: a shared list 26 deep (printing it built 2**26 leaves)
    "merge_intervals": forged("[['L', [k + 1, k + 1]] for k in range(26)] + [['N']]"),
    # 60,000 ints with one hash value in a set (quadratic to build)
    "int_to_roman": forged("[['E', list(range(1, 60_001))]] + [['I', hex(k * (2**61 - 1))] for k in range(1, 60_001)]"),
    # an honest but wrong 10 MB value: printed as a short summary
    "lru_cache": "CALLS = []\nclass LRUCache:\n    def __init__(self, n):\n        pass\n    def get(self, k):\n        CALLS.append(k)\n        return 'x' * 10_000_000 if len(CALLS) == 1 else -1\n    def put(self, k, v):\n        pass\n    def __len__(self):\n        return 0\n",
}


def test_hash_repr_and_collision_bombs_end_in_verdicts(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    uid_base = sandbox.UID_BASE + 200_000_000  # a uid range of its own for the leftover check
    monkeypatch.setenv("DDTREE_SANDBOX_UID_BASE", str(uid_base))
    corpus = pytester.path / "hostile-corpus"
    corpus.mkdir()
    lines = [json.dumps({"prompt": coding_problems.user_message(p), "response": f"{FENCE}python\n{HOSTILE_RESULTS[p.id]}{FENCE}"})
             for p in coding_problems.select_problems("default")]
    (corpus / "coding.jsonl").write_text("\n".join(lines) + "\n")
    profile = reference_profile(pytester.path, f"--corpus-dir {corpus}", clock_scale=100, hardware_profile="testhw", pool=1)

    result = run_suite(pytester, profile, suite="test_coding.py", timeout=300)

    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert HARNESS_TRACE not in out and "INTERNALERROR" not in out
    (rec,) = coding_records(pytester.path)
    problems = {p["id"]: p for p in rec["problems"]}
    assert set(problems) == set(HOSTILE_RESULTS) and rec["passed"] == 0
    for pid in ("slugify", "parse_duration", "merge_intervals"):
        assert problems[pid]["verdict"] == "error" and "shared or cyclic structure is refused" in problems[pid]["message"], problems[pid]
    assert problems["int_to_roman"]["verdict"] == "error" and "hash-collision bomb" in problems["int_to_roman"]["message"]
    wrong = problems["lru_cache"]
    assert wrong["verdict"] == "failed" and "xxxx..." in wrong["message"] and len(wrong["message"]) < 3000, wrong["message"][:500]
    wait_until(lambda: not leftovers(uid_base), timeout=15, what="sandbox processes to be gone")


#: Each malformed body, and the words its "invalid response" verdict must contain.
MALFORMED = {
    "message-not-object": "'choices[0].message' is a str, not an object",
    "no-choices": "'choices' is missing",
    "content-not-string": "'choices[0].message.content' is a list, not a string",
    "usage-not-object": "'usage' is a str, not an object",
    "error-body": "a success status with an error body: injected fault chat-body=error-body",
    "invalid-utf8": "the body is not valid UTF-8",
    "truncated-json": "the body is not JSON",
    "huge-body": "the body is larger than 16,777,216 bytes",
    "huge-answer": "'choices[0].message.content': the answer has 2,000,014 characters",
}
#: Well-formed bodies whose answers took minutes to extract code from: now a verdict at once.
HOSTILE_ANSWERS = ("think-bomb", "fence-bomb")


def test_malformed_and_hostile_chat_bodies_get_a_verdict_each(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    uid_base = sandbox.UID_BASE + 300_000_000  # a uid range of its own for the leftover check
    monkeypatch.setenv("DDTREE_SANDBOX_UID_BASE", str(uid_base))
    kinds = [*MALFORMED, *HOSTILE_ANSWERS]
    profile = reference_profile(pytester.path, f"--fault chat-body={'+'.join(kinds)}", clock_scale=100, hardware_profile="testhw", pool=1)

    result = run_suite(pytester, profile, "--ddtree-coding-set=full", f"--ddtree-coding-limit={len(kinds)}", suite="test_coding.py", timeout=300)

    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert HARNESS_TRACE not in out and "INTERNALERROR" not in out
    (rec,) = coding_records(pytester.path)
    problems = rec["problems"]
    assert len(problems) == len(kinds) and rec["passed"] == 0
    invalid = sorted(p["message"] for p in problems if p["message"].startswith("invalid response: "))
    assert len(invalid) == len(MALFORMED), [p["message"][:200] for p in problems]
    for words in MALFORMED.values():
        assert sum(words in message for message in invalid) == 1, (words, invalid)
    # the two bomb answers were extracted and judged: no pass, a verdict of the sandbox's
    others = [p for p in problems if not p["message"].startswith("invalid response: ")]
    assert len(others) == len(HOSTILE_ANSWERS) and all(p["verdict"] in ("error", "no_code", "failed") for p in others), others
    wait_until(lambda: not leftovers(uid_base), timeout=15, what="sandbox processes to be gone")


def leftovers(uid_base: int) -> list[int]:
    return [pid for pid, (_pp, uid, _cwd) in proc_table().items() if uid_base <= uid < uid_base + 64 * 100_000]


def test_hostile_predicate_work_is_cut_at_the_deadline() -> None:
    """A satisfies predicate on a result built to be slow for it (ints that share one hash,
    then set(result)) runs in a worker that is killed at the deadline: an error, not a hang."""
    code = "def f(x):\n    return [k * (2**61 - 1) for k in range(1, 200_001)]\n"
    res = sandbox.run_code(code, "f(1) satisfies len(set(result)) == 1", "f", sandbox.Limits(wall_s=3.0, cpu_s=3.0), scale=False)
    assert res.verdict is sandbox.Verdict.ERROR and "did not finish within 3.0 s" in res.message, res.message
    honest = sandbox.run_code("def f(x):\n    return [x] * 3\n", "f(1) satisfies len(set(result)) == 1", "f", sandbox.Limits(wall_s=10.0, cpu_s=5.0))
    assert honest.verdict is sandbox.Verdict.PASSED, honest.message


def test_a_document_of_millions_of_empty_arrays_is_not_parsed() -> None:
    """16 MiB of "[]," parses into ~400 MB of lists: counted in the bytes first, refused."""
    code = forged("None").replace("json.dumps({'steps': [{'v': NODES}]}).encode()", "b'[' + b'[],' * 5_000_000 + b'[]]'")
    res = sandbox.run_code(code, "f(1) == 1", "f", sandbox.Limits(wall_s=10.0, cpu_s=5.0))
    assert res.verdict is sandbox.Verdict.ERROR and "5,000,002 JSON arrays and objects" in res.message, res.message


@pytest.mark.parametrize(("body", "words"), [
    ({"text": "x", "meta_info": "oops"}, "'meta_info' is a str, not an object"),
    ({"text": ["x"]}, "'text' is a list, not a string"),
    ({"text": "x", "output_ids": [1, "2"]}, "'output_ids' is not a list of token ids"),
])
def test_generate_answers_of_the_wrong_shape_fail_their_prompt(body: dict[str, Any], words: str) -> None:
    """The lossless gate's /generate answers: a wrong type is that prompt's 'invalid response'
    (the gate fails it and goes on), not an AttributeError out of the gate."""
    from pytest_ddtree.gates import lossless

    prompt = lossless.Prompt("p", "hello", "text")
    transcript = lossless._transcript(prompt, body, 8)
    assert transcript.error == f"invalid response: {words}" and transcript.output_ids is None
