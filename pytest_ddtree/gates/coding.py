"""The coding-correctness gate: the service asked for each problem, its code judged in the sandbox,
the verdicts against the baseline.

Why: a faster speculative-decoding configuration that writes wrong code is a regression.
This module asks the service under test to solve the problems (:mod:`pytest_ddtree.gates.coding_problems`;
temperature 0, so the answer is a function of the configuration), extracts the code
(:mod:`pytest_ddtree.gates.coding_answers`), runs it with the problem's tests in
:mod:`pytest_ddtree.sandbox`, and compares the per-problem verdicts with the baseline.  It does
not import pytest; ``suites/test_coding.py`` is a thin wrapper.

Gate rule (:func:`compare`)
    With a baseline (``coding: {<set>: [passed ids]}`` in the config's baseline file) the
    gate fails when a problem that passed in the baseline does not pass now; new passes are
    reported, never failed.  Without one it holds the profile's floor ``coding_min_pass``
    (None: every problem of the set), so a hostile or broken answer never passes for lack
    of history.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pytest_ddtree import sandbox
from pytest_ddtree.gates.coding_answers import InvalidAnswer, answer_of, extract_code
from pytest_ddtree.gates.coding_problems import CORPUS_PATH, Problem, ProblemError, build_messages, check_corpus, load_problems, sync_corpus
from pytest_ddtree.service.http import InvalidResponse
from pytest_ddtree.records.shapes import ProblemRecord
from pytest_ddtree.sandbox import Job, Limits, Verdict

__all__ = [
    "CodingOutcome",
    "ProblemResult",
    "compare",
    "failure_details",
    "judge",
    "render_table",
    "solve",
]


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
