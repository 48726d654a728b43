"""A step's ``satisfies`` predicate, evaluated on the run's result in a child with a deadline.

Why a child: the predicate is the problem author's trusted expression, but it runs on the
candidate's result, and no bound on that work can be proven: ``set(result)`` of ints that
share one hash is quadratic, ``sorted`` of tuples nested 100,000 deep recurses in C.  The
decoding and the comparison with expected values are bounded in the harness
(:mod:`.values`); this one open-ended step runs in a worker process (a fresh ``python -I``
holding only :mod:`.values` and the loop below, with an address-space limit), which the
harness kills when the deadline passes; the step is then an ``error`` naming the deadline.

Workers are kept and reused (one per thread that needs one at a time), so an honest
predicate costs a pipe round trip, not a process start.  A worker reads requests from its
stdin and exits at EOF, so none outlives the harness.  Standard library only.
"""

from __future__ import annotations

import ast
import atexit
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_ddtree.sandbox.values import encode

__all__ = ["PredicateError", "evaluate", "names_in", "shutdown"]

#: Address-space limit of a worker: room for honest results (the pipe caps them at 16 MiB).
WORKER_MEMORY_BYTES = 2 * 1024**3
#: Largest reply a worker may send (its message is cut to 1,000 characters).
_REPLY_CAP = 64 * 1024

_WORKER_LOOP = '''
import builtins as _b, json as _j, math as _m, resource as _r, sys as _s
try:
    _r.setrlimit(_r.RLIMIT_AS, (int(_s.argv[1]), int(_s.argv[1])))
except (ValueError, OSError):
    pass
for _line in _s.stdin:
    _req = _j.loads(_line)
    _pred = _req["predicate"]
    try:
        _env = {"__builtins__": _b, "math": _m}
        for _k, _nodes in _req["env"].items():
            _env[_k] = decode(_nodes)
        _env["result"] = decode(_req["result"])
        _ok = eval(compile(_pred, "<predicate>", "eval"), _env)
        _why = None if _ok is True else "the result does not satisfy " + _pred
    except BaseException as _exc:  # noqa: BLE001 - a result of the wrong shape
        try:
            _why = f"the check {_pred!r} raised {type(_exc).__name__}: {_exc}"[:1000]
        except BaseException:  # noqa: BLE001
            _why = f"the check {_pred!r} raised {type(_exc).__name__}"
    _env = _ok = None
    _s.stdout.write(_j.dumps({"why": _why}) + "\\n")
    _s.stdout.flush()
'''


@functools.lru_cache(maxsize=1)
def _worker_source() -> str:
    text = (Path(__file__).resolve().parent / "values.py").read_text(encoding="utf-8")
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("from __future__")) + "\n" + _WORKER_LOOP


class _Timeout(Exception):
    pass


class PredicateError(RuntimeError):
    """The predicate could not be decided: its process passed the deadline or failed."""


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _worker_source(), str(WORKER_MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    def ask(self, request: bytes, deadline_s: float) -> str | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        end = time.monotonic() + deadline_s
        writer_error: list[BaseException] = []

        def write() -> None:  # a large request must not block the deadline
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(request)
                self.proc.stdin.flush()
            except (OSError, ValueError) as exc:
                writer_error.append(exc)

        threading.Thread(target=write, daemon=True).start()
        fd = self.proc.stdout.fileno()
        reply = bytearray()
        while not reply.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0:
                raise _Timeout()
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise OSError(f"the predicate process ended ({'; '.join(map(str, writer_error)) or 'no reply'})")
            reply += chunk
            if len(reply) > _REPLY_CAP:
                raise OSError("the predicate process sent an oversized reply")
        answer = json.loads(bytes(reply))
        why = answer.get("why") if isinstance(answer, dict) else "malformed reply"
        return None if why is None else str(why)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed above
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _take() -> _Worker:
    with _idle_lock:
        while _idle:
            worker = _idle.pop()
            if worker.proc.poll() is None:
                return worker
            worker.kill()
    return _Worker()


def _give_back(worker: _Worker) -> None:
    with _idle_lock:
        _idle.append(worker)


@atexit.register
def shutdown() -> None:
    """End every idle worker (they also end by themselves when the harness's pipe closes)."""
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
    for worker in workers:
        worker.kill()


@functools.lru_cache(maxsize=256)
def names_in(predicate: str) -> frozenset[str]:
    """The names a predicate reads, so only those values travel to the worker."""
    try:
        tree = ast.parse(predicate, mode="eval")
    except SyntaxError:
        return frozenset()
    return frozenset(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))


def evaluate(predicate: str, env: Mapping[str, Any], result_nodes: Any, deadline_s: float) -> str | None:
    """None when ``predicate`` is true of the result (``result_nodes``, the run's node list),
    else why not.  ``env`` holds the trusted values the predicate may name (inputs, args).
    A worker that fails or passes the deadline is killed: :class:`PredicateError`."""
    used = names_in(predicate)
    try:
        request = json.dumps({
            "predicate": predicate,
            "env": {name: encode(value) for name, value in env.items() if name in used},
            "result": result_nodes,
        }).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise PredicateError(f"the check {predicate!r} could not be sent to its process: {exc}") from None
    worker = _take()
    try:
        why = worker.ask(request, deadline_s)
    except _Timeout:
        worker.kill()
        raise PredicateError(f"the check {predicate!r} did not finish within {deadline_s:.1f} s (a result built to be slow to check?); its process was killed") from None
    except (OSError, ValueError) as exc:
        worker.kill()
        raise PredicateError(f"the check {predicate!r} failed in its process: {exc}") from None
    _give_back(worker)
    return why
