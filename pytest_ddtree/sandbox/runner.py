"""In-sandbox runner: executes one solution and its tests, writes a verdict file.

Copied into the run's private work dir and started as ``python -I runner.py``
with the work dir as cwd (see :mod:`pytest_ddtree.sandbox`).  Standard library only.

Protocol (files in the work dir, all written by the parent):

* ``job.json``: ``{"entry_point": str | null, "limits": {...}}``
* ``solution.py``: the extracted code; ``tests.py``: the problem's tests
* ``.nonce``: a random token; read and deleted before any untrusted code runs, and echoed in
  ``.result.json`` so a verdict file the code wrote itself (without the token) is rejected.

The solution runs with ``__name__ == "solution"`` so an ``if __name__ == "__main__":``
block (a common habit of chat models) does not run and block on stdin.  The tests run in
the solution's namespace: they call the entry point by name (``candidate`` is an alias).
An ``AssertionError`` is a *failed* verdict whose message names the failing assert line
and, for a bare ``assert a == b``, the two values; any other exception is an *error*.
This guards against accidents and sloppy answers, not against code written to forge a
verdict by inspecting this process: the sandbox contains harm, not cheating.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any, NoReturn

_TAIL = 2000


def _set_limits(limits: dict[str, int]) -> None:
    """Lower rlimits (soft and hard).  Failures are ignored: not every OS has every limit."""
    table = {
        "cpu_s": resource.RLIMIT_CPU,
        "memory_bytes": resource.RLIMIT_AS,
        "file_size_bytes": resource.RLIMIT_FSIZE,
        "open_files": resource.RLIMIT_NOFILE,
        "processes": resource.RLIMIT_NPROC,
        "core": resource.RLIMIT_CORE,
    }
    for key, res in table.items():
        if key not in limits:
            continue
        value = int(limits[key])
        try:
            _soft, hard = resource.getrlimit(res)
            if hard != resource.RLIM_INFINITY and value > hard:
                value = hard
            # CPU: the hard limit one second above the soft one turns SIGXCPU into SIGKILL
            # if the code ignores SIGXCPU.
            new_hard = value + 1 if key == "cpu_s" and (hard == resource.RLIM_INFINITY or value + 1 <= hard) else value
            resource.setrlimit(res, (value, new_hard))
        except (ValueError, OSError):
            pass


def _tail(text: str) -> str:
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]


def _format_exc(stage: str) -> str:
    """The traceback without the runner's own frame: only solution/tests lines matter."""
    etype, value, tb = sys.exc_info()
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return _tail(f"{stage}:\n" + "".join(traceback.format_exception(etype, value, tb)))


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a hostile __repr__ must not break the runner
        text = f"<repr failed: {type(exc).__name__}>"
    return text if len(text) <= 300 else text[:300] + "..."


def _assert_message(exc: AssertionError, tests_src: str, ns: dict[str, Any]) -> str:
    """Describe a failed assert: its source line, its message, and for ``a == b`` both sides."""
    lineno = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "tests.py":
            lineno = line
    parts: list[str] = []
    detail = str(exc)
    node: ast.Assert | None = None
    if lineno is not None:
        try:
            for candidate in ast.walk(ast.parse(tests_src)):
                if isinstance(candidate, ast.Assert) and candidate.lineno <= lineno <= (candidate.end_lineno or lineno):
                    node = candidate
        except SyntaxError:
            node = None
        if node is not None:
            parts.append(f"tests.py:{node.lineno}: {ast.get_source_segment(tests_src, node) or ''}".strip())
        else:
            parts.append(f"tests.py:{lineno}: {tests_src.splitlines()[lineno - 1].strip()}")
    if detail:
        parts.append(f"message: {detail}")
    if node is not None and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 and not detail:
        try:
            left = eval(compile(ast.Expression(node.test.left), "tests.py", "eval"), ns)  # noqa: S307
            right = eval(compile(ast.Expression(node.test.comparators[0]), "tests.py", "eval"), ns)  # noqa: S307
            parts.append(f"left:  {_short(left)}\nright: {_short(right)}")
        except BaseException:  # noqa: BLE001 - best effort only
            pass
    return _tail("\n".join(parts) or "AssertionError")


def main() -> None:
    with open(".nonce", encoding="utf-8") as fh:
        nonce = fh.read().strip()
    os.unlink(".nonce")
    with open("job.json", encoding="utf-8") as fh:
        job = json.load(fh)
    with open("solution.py", encoding="utf-8") as fh:
        solution_src = fh.read()
    with open("tests.py", encoding="utf-8") as fh:
        tests_src = fh.read()
    entry_point: str | None = job.get("entry_point")
    _set_limits(job.get("limits", {}))
    sys.argv = ["solution.py"]
    result_path = os.path.abspath(".result.json")

    def finish(verdict: str, message: str) -> NoReturn:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        try:
            fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, json.dumps({"nonce": nonce, "verdict": verdict, "message": message}).encode())
            os.close(fd)
        except BaseException:  # noqa: BLE001 - no verdict file: the parent reports an error
            os._exit(3)
        os._exit(0)

    def on_xcpu(_signum: int, _frame: Any) -> None:
        finish("timeout", f"CPU time limit of {job.get('limits', {}).get('cpu_s')} s exceeded")

    if hasattr(signal, "SIGXCPU"):
        signal.signal(signal.SIGXCPU, on_xcpu)

    ns: dict[str, Any] = {"__name__": "solution", "__builtins__": __builtins__}
    stage = "compiling the solution"
    try:
        code = compile(solution_src, "solution.py", "exec")
        stage = "running the solution"
        exec(code, ns)  # noqa: S102 - this is the point of the sandbox
    except SystemExit as exc:
        finish("error", f"the solution called exit({exc.code!r}) while {stage}")
    except BaseException:  # noqa: BLE001
        finish("error", _format_exc(stage))
    if entry_point:
        fn = ns.get(entry_point)
        if not callable(fn):
            finish("error", f"the solution does not define a function named {entry_point!r}")
        ns["candidate"] = fn
    try:
        tests_code = compile(tests_src, "tests.py", "exec")
        exec(tests_code, ns)  # noqa: S102
    except AssertionError as exc:
        finish("failed", _assert_message(exc, tests_src, ns))
    except SystemExit as exc:
        finish("error", f"exit({exc.code!r}) was called while running the tests")
    except BaseException:  # noqa: BLE001
        finish("error", _format_exc("running the tests"))
    finish("passed", "")


if __name__ == "__main__":
    main()
