"""In-sandbox runner: runs the solution, makes the calls it is given, reports what came back.

Started as ``python -I -c SOURCE JOB_FD OUT_FD`` where SOURCE is
:mod:`pytest_ddtree.sandbox.values` followed by this file (so it needs nothing but the
standard library and no file of the project in its view).  It reads the job (JSON: the code,
the input values, the call steps, the limits) from the inherited pipe ``JOB_FD``, closes it,
lowers the rlimits, runs the code as module ``solution`` (so an ``if __name__ ==
"__main__":`` block does not run), then makes each call and writes one JSON document to the
inherited pipe ``OUT_FD``: per step the value as data (``{"v": nodes}``), ``{"bound": true}``
for a name bound in the sandbox, or the exception (``{"raised": {...}}``).

The runner decides nothing: it never sees an expected value, so code that patches it, reads
its frames or writes to ``OUT_FD`` itself can only report values, which the parent then
compares (:func:`pytest_ddtree.sandbox.calls.judge_outcome`).
"""

import builtins as _builtins
import json as _json
import os as _os
import resource as _resource
import signal as _signal
import sys as _sys
import traceback as _traceback
from typing import Any, NoReturn

try:  # under the type checker and in-process tests; in the sandbox the text is prepended
    from pytest_ddtree.sandbox.values import decode, encode
except ImportError:  # pragma: no cover - the sandbox has no project files in its view
    pass

_TAIL = 2000
_LIMIT_KEYS = {
    "cpu_s": "RLIMIT_CPU",
    "memory_bytes": "RLIMIT_AS",
    "file_size_bytes": "RLIMIT_FSIZE",
    "open_files": "RLIMIT_NOFILE",
    "processes": "RLIMIT_NPROC",
    "core": "RLIMIT_CORE",
}


def _set_limits(limits: dict[str, int]) -> None:
    """Lower rlimits (soft and hard); a limit this OS lacks is skipped."""
    for key, name in _LIMIT_KEYS.items():
        if key not in limits or not hasattr(_resource, name):
            continue
        res = getattr(_resource, name)
        value = int(limits[key])
        try:
            _soft, hard = _resource.getrlimit(res)
            if hard != _resource.RLIM_INFINITY and value > hard:
                value = hard
            # CPU: a hard limit one second above the soft one turns an ignored SIGXCPU into SIGKILL.
            new_hard = value + 1 if key == "cpu_s" and (hard == _resource.RLIM_INFINITY or value + 1 <= hard) else value
            _resource.setrlimit(res, (value, new_hard))
        except (ValueError, OSError):
            pass


def _tail(text: str) -> str:
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]


def _trace(exc: BaseException) -> str:
    """The traceback without the runner's frames: only solution lines matter."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "solution.py":
        tb = tb.tb_next
    try:
        return _tail("".join(_traceback.format_exception(type(exc), exc, tb)))
    except BaseException:  # noqa: BLE001 - a hostile exception must not break the report
        return type(exc).__name__


def _raised(exc: BaseException) -> dict[str, Any]:
    try:
        message = str(exc)[:500]
    except BaseException:  # noqa: BLE001
        message = "<str() of the exception failed>"
    mro = [c.__name__ for c in type(exc).__mro__ if isinstance(getattr(c, "__name__", None), str)]
    return {"raised": {"type": type(exc).__name__, "mro": mro, "message": message, "trace": _trace(exc)}}


def _write(fd: int, document: dict[str, Any]) -> NoReturn:
    try:
        _sys.stdout.flush()
        _sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    try:
        data = _json.dumps(document).encode()
    except BaseException as exc:  # noqa: BLE001
        data = _json.dumps({"load_error": f"the results could not be written: {type(exc).__name__}"}).encode()
    try:
        view = memoryview(data)
        while view:
            view = view[_os.write(fd, view):]
        _os.close(fd)
    except BaseException:  # noqa: BLE001 - no result: the parent reports an error
        _os._exit(3)
    _os._exit(0)


def _lookup(fn: list[str], ns: dict[str, Any], names: dict[str, Any]) -> Any:
    kind = fn[0]
    if kind == "method":
        return getattr(names[fn[1]], fn[2])
    if kind == "builtin":
        return getattr(_builtins, fn[1])
    if fn[1] not in ns:
        raise NameError(f"the solution does not define {fn[1]!r}")
    return ns[fn[1]]


def _step(step: dict[str, Any], ns: dict[str, Any], names: dict[str, Any]) -> dict[str, Any]:
    def value(arg: dict[str, Any]) -> Any:
        return names[arg["ref"]] if "ref" in arg else decode(arg["v"])

    try:
        target = _lookup(step["fn"], ns, names)
        loop = step.get("loop")
        if loop:
            var, start, stop, stride = loop
            results = []
            for i in range(start, stop, stride):
                names[var] = i
                results.append(target(*[value(a) for a in step["args"]], **{k: value(a) for k, a in step["kwargs"].items()}))
            result: Any = results
        else:
            result = target(*[value(a) for a in step["args"]], **{k: value(a) for k, a in step["kwargs"].items()})
        if step.get("bind"):
            names[step["bind"]] = result
            return {"bound": True}
        return {"v": encode(result)}
    except BaseException as exc:  # noqa: BLE001 - every outcome is reported, also SystemExit
        return _raised(exc)


def main(job_fd: int, out_fd: int) -> NoReturn:
    with _os.fdopen(job_fd, "rb") as fh:
        job = _json.loads(fh.read())
    _set_limits(job.get("limits", {}))

    def on_xcpu(_signum: int, _frame: Any) -> None:
        _write(out_fd, {"cpu_limit": True})

    if hasattr(_signal, "SIGXCPU"):
        _signal.signal(_signal.SIGXCPU, on_xcpu)
    _sys.argv = ["solution.py"]
    ns: dict[str, Any] = {"__name__": "solution", "__builtins__": _builtins}
    stage = "compiling the solution"
    try:
        code = compile(job["code"], "solution.py", "exec")
        stage = "running the solution"
        exec(code, ns)  # noqa: S102 - this is the point of the sandbox
    except SystemExit as exc:
        _write(out_fd, {"load_error": f"the solution called exit({exc.code!r}) while {stage}"})
    except BaseException as exc:  # noqa: BLE001
        _write(out_fd, {"load_error": f"{stage}:\n{_trace(exc)}"})
    entry = job.get("entry_point")
    if entry and not callable(ns.get(entry)):
        _write(out_fd, {"load_error": f"the solution does not define a function or class named {entry!r}"})
    names = {name: decode(nodes) for name, nodes in job.get("inputs", {}).items()}
    steps = [_step(step, ns, names) for step in job["steps"]]
    _write(out_fd, {"steps": steps})


if __name__ == "__main__":
    main(int(_sys.argv[1]), int(_sys.argv[2]))
