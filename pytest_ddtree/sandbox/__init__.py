"""Run untrusted, model-generated Python code and its tests in a sandbox.

Why this module exists: the coding gate executes whatever the service under test answers.
A broken or hostile answer (a fork bomb, a memory bomb, an output flood, a write to the
harness's files, a daemon that outlives the run) must end with a clear verdict and leave
nothing behind.  The guards of human-eval/evalplus (a fork of the big process with some
functions nulled) are not a sandbox; this module follows their issue trackers' lessons
instead: a fresh interpreter per run, its own session and process group, stdin from
/dev/null, bounded output capture, a private temp dir, a scrubbed environment, rlimits, a
wall-clock limit that kills everything, and OS isolation where the machine offers it.

The verdict is decided here, not in the run: only the code, the calls and their input
values enter the sandbox, and the results come back as data that
:func:`pytest_ddtree.sandbox.calls.judge_outcome` compares with the expected values.

Isolation tiers (detected once per process by a probe run, see :func:`isolation`; the
README's Sandbox section lists what each guarantees and the test that proves it):

``bwrap`` (Linux, root, bubblewrap installed): the root stage (:mod:`.stage`) joins the
    run's cgroup and drops to a per-run unprivileged uid; bubblewrap (:mod:`.bwrap`) builds a
    root of read-only ``/usr`` and interpreter, tmpfs work dir and ``/tmp``, new
    user/PID/network/IPC/UTS/cgroup namespaces, ``no_new_privs`` and the seccomp filter
    (:mod:`.seccomp`).
``unshare`` (Linux, root, util-linux ``unshare``, no bubblewrap): the same view, built by
    the stage itself as PID 1 of new namespaces (``pivot_root`` into a fresh tmpfs), the
    same cgroup, uid drop, ``no_new_privs`` and filter.
``userns`` (Linux, not root, unprivileged user namespaces): the ``unshare`` stage inside a
    user namespace, without a uid drop or cgroup.
``plain`` (anything else): a session, rlimits, a uid drop where the interpreter is
    reachable; the coding gate refuses it unless the user opts in, and never runs code as
    root (:func:`refusal`).

The per-run uid makes ``RLIMIT_NPROC`` effective (root ignores it) and every file it does
not own read-only; the PID namespace means nothing survives (the kernel kills the rest when
its first process dies, also children that called ``setsid``).  In every tier, after the
run (and at once on a timeout or an output flood) the process group is SIGKILLed, then every
process still owned by the run's uid or descended from it, and the run's cgroup is removed.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_ddtree.sandbox import bwrap, cgroup, plain, seccomp, unshare
from pytest_ddtree.sandbox.calls import StepError, TestPlan, judge_outcome, parse_tests
from pytest_ddtree.sandbox.values import MAX_NODES

__all__ = [
    "Isolation",
    "StepError",
    "TIERS",
    "refusal",
    "TestPlan",
    "parse_tests",
    "Job",
    "Limits",
    "RunResult",
    "Verdict",
    "default_workers",
    "find_leftovers",
    "hidden_paths",
    "isolation",
    "run_code",
    "run_many",
    "speed_factor",
]

_PKG_DIR = Path(__file__).resolve().parent
#: Most JSON arrays and objects a run's result document may hold (see :func:`_execute`).
MAX_RESULT_CONTAINERS = 2 * MAX_NODES + 100_000
_STAGE = _PKG_DIR / "stage.py"

#: First uid of the per-run uid range used when running as root.  Far above any real
#: account so the sandbox owns no file on the host and shares no process count.
UID_BASE = int(os.environ.get("DDTREE_SANDBOX_UID_BASE", "1500000000"))


class Verdict(str, enum.Enum):
    """Outcome of one problem.  ``str`` subclass so it serializes as its value."""

    PASSED = "passed"
    FAILED = "failed"  # an assertion of the tests failed
    ERROR = "error"  # an exception, a crash, a flood of output, a missing entry point
    TIMEOUT = "timeout"  # wall-clock or CPU limit
    NO_CODE = "no_code"  # nothing to run was extracted from the answer


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.  ``wall_s`` and ``cpu_s`` are *base* seconds: they are
    multiplied by :func:`speed_factor` unless ``run_code(..., scale=False)``."""

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_bytes: int = 512 * 1024 * 1024
    file_size_bytes: int = 16 * 1024 * 1024
    open_files: int = 64
    processes: int = 8
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    output_kill_bytes: int = 4 * 1024 * 1024  # total read before the run is killed as a flood
    tmp_size: str = "32m"  # size of each private tmpfs (work dir, /tmp; namespace tiers)
    result_bytes: int = 16 * 1024 * 1024  # results larger than this end the run as an error

    def scaled(self, factor: float) -> Limits:
        return replace(self, wall_s=self.wall_s * factor, cpu_s=self.cpu_s * factor)


@dataclass(frozen=True)
class Job:
    """One unit of work for :func:`run_many`."""

    code: str
    tests: str | TestPlan
    entry_point: str | None = None
    key: str = ""


@dataclass
class RunResult:
    verdict: Verdict
    message: str = ""
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    returncode: int | None = None
    tier: str = ""
    uid: int | None = None
    workdir: str = ""
    limits: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    cleanup_error: str | None = None  # the work dir could not be removed (logged, never a verdict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data


@dataclass(frozen=True)
class Isolation:
    """What the sandbox gives on this machine: the tier and what it guarantees."""

    tier: str  # "bwrap" | "unshare" | "userns" | "plain"
    uid_drop: bool
    network_isolated: bool
    pid_namespace: bool
    private_tmp: bool
    notes: tuple[str, ...] = ()
    cgroup: str | None = None  # "v1" | "v2": memory and pids counted by the kernel
    seccomp: bool = False
    minimal_view: bool = False  # only /usr, the interpreter and tmpfs are visible

    @property
    def strong(self) -> bool:
        """A namespace tier with a uid drop: what the coding gate requires without opt-in."""
        return self.tier in ("bwrap", "unshare") and self.uid_drop

    def describe(self) -> str:
        parts = [f"tier={self.tier}"]
        parts.append("uid drop" if self.uid_drop else "no uid drop")
        parts.append("no network" if self.network_isolated else "network NOT isolated")
        parts.append("pid namespace" if self.pid_namespace else "no pid namespace")
        parts.append("private /tmp" if self.private_tmp else "shared /tmp")
        if self.minimal_view:
            parts.append("minimal read-only view (/usr + interpreter, no site-packages)" if self.tier == "bwrap" else "minimal read-only view (/usr + interpreter, no site-packages, pivot_root)")
        else:
            parts.append("the whole host visible")
        parts.append(f"memory+pids by cgroup {self.cgroup}" if self.cgroup else "memory by RLIMIT_AS only (shared memory: memfd, tmpfs, NOT bounded)")
        parts.append("seccomp + no_new_privs" if self.seccomp else "no seccomp")
        return ", ".join(parts)


# --------------------------------------------------------------------------- speed factor

#: Seconds the calibration loop takes on the machine the default limits were tuned on.
_REFERENCE_CALIBRATION_S = 0.008
_speed_lock = threading.Lock()
_speed_cache: float | None = None


def _calibration_loop() -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        acc = 0
        for i in range(100_000):
            acc = (acc + i * i) % 1_000_003
        best = min(best, time.perf_counter() - t0)
    return best


def speed_factor() -> float:
    """How much slower this machine is than the reference one (>= 1.0, <= 20.0).

    Timed once per process and cached: a slow or loaded machine gets proportionally longer
    time limits, so a correct but slow-ish solution does not flip to ``timeout``.  It never
    shrinks limits below the base.  ``DDTREE_SANDBOX_SPEED_FACTOR`` overrides it.
    """
    global _speed_cache
    with _speed_lock:
        if _speed_cache is None:
            env = os.environ.get("DDTREE_SANDBOX_SPEED_FACTOR")
            if env:
                _speed_cache = max(0.05, float(env))
            else:
                _speed_cache = min(20.0, max(1.0, _calibration_loop() / _REFERENCE_CALIBRATION_S))
        return _speed_cache


# --------------------------------------------------------------------------- processes


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, real uid, cwd) from /proc; empty where /proc does not exist."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        ppid = uid = -1
        for line in text.splitlines():
            if line.startswith("PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith("Uid:"):
                uid = int(line.split()[1])
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        table[pid] = (ppid, uid, cwd)
    return table


def find_leftovers(*, uid: int | None = None, workdir: str | None = None, root_pid: int | None = None) -> list[int]:
    """Pids still alive that belong to a run: owned by its uid, with its work dir as cwd,
    or descended from its first process.  Zombies count as gone."""
    table = _proc_table()
    found: set[int] = set()
    for pid, (_ppid, puid, cwd) in table.items():
        if pid == os.getpid():
            continue
        if uid is not None and puid == uid:
            found.add(pid)
        elif workdir and (cwd == workdir or cwd.startswith(workdir + os.sep)):
            found.add(pid)
    if root_pid is not None:
        children: dict[int, list[int]] = {}
        for pid, (ppid, _uid, _cwd) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [root_pid]
        while stack:
            pid = stack.pop()
            for child in children.get(pid, []):
                if child not in found:
                    found.add(child)
                    stack.append(child)
    alive: list[int] = []
    for pid in sorted(found):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def _kill_everything(proc: subprocess.Popen[bytes], uid: int | None, workdir: str, deadline_s: float = 5.0) -> None:
    """SIGKILL the run's process group, then anything of its uid / tree, until none is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    end = time.monotonic() + deadline_s
    while True:
        left = find_leftovers(uid=uid, workdir=workdir, root_pid=proc.pid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > end:
            return
        time.sleep(0.02)


class _Reader(threading.Thread):
    """Reads one pipe to EOF, keeping the first ``keep`` bytes and counting the rest."""

    def __init__(self, fd: int, keep: int, on_total: Callable[[int], None]) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.keep = keep
        self.data = bytearray()
        self.on_total = on_total

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            room = self.keep - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            self.on_total(len(chunk))

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        return text


# --------------------------------------------------------------------------- launching


def _interpreter() -> tuple[str, list[str]]:
    """The interpreter to run in the sandbox and the directories it needs to be reachable."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.dirname(os.path.dirname(exe))
    expose = []
    for path in (os.path.realpath(sys.base_prefix), prefix):
        if path not in expose and path != "/":
            expose.append(path)
    return exe, expose


#: Where packages and their data live under a prefix the view shows (``/usr``, a pyenv or
#: ``/usr/local``-like prefix, a ``venv --copies``): covered by an empty read-only tmpfs.
_PACKAGE_GLOBS = (
    "lib*/python*/site-packages", "lib*/python*/dist-packages",
    "local/lib*/python*/site-packages", "local/lib*/python*/dist-packages",
    "python*/site-packages", "python*/dist-packages",
)


def _editable_sources() -> list[str]:
    """Source directories of editable installs (PEP 610 ``direct_url.json``), which live
    outside site-packages and are not always on ``sys.path`` (import-hook editables)."""
    found: list[str] = []
    try:
        from importlib import metadata

        for dist in metadata.distributions():
            try:
                raw = dist.read_text("direct_url.json")
                info = json.loads(raw) if raw else None
            except (OSError, ValueError):
                continue
            if isinstance(info, dict) and isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable"):
                url = str(info.get("url", ""))
                if url.startswith("file://"):
                    found.append(url[len("file://"):])
    except Exception:  # noqa: BLE001 - a broken distribution must not stop the sandbox
        pass
    return found


@functools.lru_cache(maxsize=1)
def hidden_paths() -> tuple[str, ...]:
    """Directories inside the run's view that hold installed packages or this project's
    data, each covered in the run by an empty read-only tmpfs.

    The view must hold the interpreter and its standard library, not what is installed next
    to them: a reference solution, test, corpus or dataset shipped as package data (ours in
    ``pytest_ddtree/refserver/corpus``, HumanEval's ``HumanEval.jsonl.gz``) is readable
    wherever the install puts it under a prefix the view shows (a non-editable install into
    ``/usr/local``, a pyenv version, a ``venv --copies``).  Found by layout (site- and
    dist-packages under every visible prefix) and by this process (its site dirs, ``sys.path``,
    editable sources, this package and its checkout); kept when inside the view and not
    holding the interpreter or the standard library.
    """
    import glob
    import site
    import sysconfig

    exe, expose = _interpreter()
    roots = [os.path.realpath(p) for p in (*bwrap.SYSTEM_DIRS, *expose) if os.path.isdir(p)]
    paths = sysconfig.get_paths()
    essential = {exe, *(os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths)}
    candidates: list[str] = []
    for root in dict.fromkeys(roots):
        for pattern in _PACKAGE_GLOBS:
            candidates += glob.glob(os.path.join(glob.escape(root), pattern))
        if root not in ("/usr", "/bin", "/sbin") and not root.startswith("/lib"):
            candidates.append(os.path.join(root, "share"))  # data_files of a prefix's packages
    candidates.append("/usr/local/share")
    try:
        candidates += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - an old virtualenv's site module
        pass
    candidates += [paths[k] for k in ("purelib", "platlib") if k in paths]
    stdlib_dirs = [os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths]
    for entry in sys.path:
        real = os.path.realpath(entry or ".")
        in_stdlib = any(real == d or real.startswith(d + os.sep) for d in stdlib_dirs)  # lib-dynload
        if os.path.isdir(real) and (not in_stdlib or real.endswith("-packages")):
            candidates.append(real)
    candidates += _editable_sources()
    candidates += [str(_PKG_DIR.parent), str(_PKG_DIR.parent.parent), os.environ.get("DDTREE_CODING_DIR", "")]

    def inside(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip(os.sep) + os.sep)

    kept: list[str] = []
    for raw in candidates:
        if not raw:
            continue
        path = os.path.realpath(raw)
        if not os.path.isdir(path) or path in roots:
            continue
        if not any(inside(path, root) for root in roots):
            continue  # not in the view anyway
        if any(inside(e, path) for e in essential):
            continue  # the interpreter or its standard library lives there
        kept.append(path)
    result: list[str] = []
    for path in sorted(set(kept)):
        if not any(inside(path, other) for other in result):
            result.append(path)
    return tuple(result)


_uid_lock = threading.Lock()
_uid_counter = 0


def _next_uid() -> int:
    """A per-run uid: distinct across the threads of this process and (by pid) across
    xdist workers, so processes limits and the leftover sweep never mix two runs."""
    global _uid_counter
    with _uid_lock:
        _uid_counter = (_uid_counter + 1) % 64
        slot = _uid_counter
    return UID_BASE + (os.getpid() % 100_000) * 64 + slot


def _scrubbed_env(workdir: str) -> dict[str, str]:
    """Nothing of the harness's environment (tokens, proxies, PYTHON*) reaches the code."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def _user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for _pid, (_pp, puid, _cwd) in _proc_table().items() if puid == uid)


@functools.lru_cache(maxsize=1)
def _runner_source() -> str:
    """values.py then runner.py, as one ``-c`` program: the run needs no project file."""
    parts = []
    for name in ("values.py", "runner.py"):
        text = (_PKG_DIR / name).read_text(encoding="utf-8")
        parts.append("\n".join(ln for ln in text.splitlines() if not ln.startswith("from __future__")))
    return "\n".join(parts) + "\n"


def _build_command(tier: str, workdir: str, uid: int | None, limits: Limits, fds: tuple[int, ...], cgroup_procs: list[str]) -> tuple[list[str], int | None]:
    """argv and the uid for ``Popen(user=...)`` (plain tier) for one run."""
    exe, expose = _interpreter()
    runner = [exe, "-I", "-c", _runner_source(), str(fds[0]), str(fds[1])]
    if tier == "plain":
        return plain.command(uid=uid, run=runner)
    cfg: dict[str, Any] = {
        "mode": "bwrap" if tier == "bwrap" else "unshare",
        "workdir": workdir,
        "uid": uid,
        "gid": uid,
        "expose": expose,
        "hide": list(hidden_paths()),
        "tmp_size": limits.tmp_size,
        "cgroup_procs": cgroup_procs,
    }
    if tier == "bwrap":
        seccomp_fd = fds[2] if len(fds) > 2 else None
        cfg["exec"] = bwrap.command(bwrap.find() or "bwrap", workdir=workdir, expose=expose, hide=list(hidden_paths()), tmp_bytes=_size_bytes(limits.tmp_size), seccomp_fd=seccomp_fd, run=runner)
        return [exe, "-I", str(_STAGE), json.dumps(cfg)], None
    program = seccomp.program()
    cfg.update(seccomp=program.hex() if program else "", exec=runner)
    return unshare.command(user_namespace=tier == "userns", stage=[exe, "-I", str(_STAGE), json.dumps(cfg)]), None


def _size_bytes(size: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].lower() in units else int(size)


def _job_limits(limits: Limits, tier: str, uid: int | None) -> dict[str, int]:
    processes = limits.processes
    if tier == "userns" or (uid is None and os.getuid() != 0):
        processes += _user_process_count()
    return {
        "cpu_s": max(1, int(limits.cpu_s + 0.999)),
        "memory_bytes": limits.memory_bytes,
        "file_size_bytes": limits.file_size_bytes,
        "open_files": limits.open_files,
        "processes": processes,
        "core": 0,
    }


def _prepare_workdir(uid: int | None) -> str:
    """An empty private directory: the run's cwd (the namespace tiers mount a tmpfs on it)."""
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="ddtree-sbx-"))
    os.chmod(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, uid)
    return workdir


def _remove_tree(path: str, deadline_s: float = 60.0) -> str | None:
    """Remove a run's work dir without a recursive Python walk (a 10,000-deep tree must not
    raise RecursionError into the gate): ``rm -rf --one-file-system`` under a deadline.
    Returns what went wrong, for the log; never raises."""
    try:
        os.rmdir(path)  # the usual case: the run wrote into a tmpfs that died with it
        return None
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        done = subprocess.run(["rm", "-rf", "--one-file-system", "--", path], capture_output=True, timeout=deadline_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not remove {path}: {type(exc).__name__}: {exc}"
    if done.returncode != 0 or os.path.lexists(path):
        return f"could not remove {path}: rm exited {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
    return None


class _Sink(threading.Thread):
    """Reads the result pipe to EOF, keeping at most ``cap`` bytes (then it stops keeping)."""

    def __init__(self, fd: int, cap: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.cap = fd, cap
        self.data = bytearray()
        self.overflow = False

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            if len(self.data) + len(chunk) > self.cap:
                self.overflow = True
            else:
                self.data += chunk


def _feed(fd: int, data: bytes) -> None:
    """Write the job into its pipe (in a thread: it can exceed the pipe buffer)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass
    finally:
        os.close(fd)


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def _execute(tier: str, code: str, plan: TestPlan, limits: Limits, want_uid: bool) -> RunResult:
    uid = _next_uid() if want_uid else None
    workdir = _prepare_workdir(uid)
    job_r, job_w = os.pipe()
    out_r, out_w = os.pipe()
    child_fds: tuple[int, ...] = (job_r, out_w)
    program = seccomp.program() if tier == "bwrap" else None
    if program is not None:
        filter_r, filter_w = os.pipe()
        os.write(filter_w, program)
        os.close(filter_w)
        child_fds += (filter_r,)
    group = None
    if (tier in ("bwrap", "unshare") and uid is not None) or tier == "userns":  # userns: where a delegated cgroup is writable
        group = cgroup.create(f"ddtree-sbx-{uid}-{secrets.token_hex(3)}", limits.memory_bytes + _size_bytes(limits.tmp_size), limits.processes + 4)
    argv, popen_user = _build_command(tier, workdir, uid, limits, child_fds, group.procs_files() if group else [])
    job = {**plan.to_job(), "code": code, "limits": _job_limits(limits, tier, uid)}
    total = [0]
    flood = threading.Event()
    lock = threading.Lock()

    def on_total(n: int) -> None:
        with lock:
            total[0] += n
            if total[0] > limits.output_kill_bytes:
                flood.set()

    start = time.monotonic()
    timed_out = False
    proc: subprocess.Popen[bytes] | None = None
    sink = _Sink(out_r, limits.result_bytes)
    readers: list[_Reader] = []
    cleanup_error: str | None = None
    try:
        kwargs: dict[str, Any] = {}
        if popen_user is not None:
            kwargs.update(user=popen_user, group=popen_user, extra_groups=[])
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=_scrubbed_env(workdir),
                start_new_session=True,
                close_fds=True,
                pass_fds=child_fds,
                **kwargs,
            )
        finally:
            for fd in child_fds:
                os.close(fd)
        threading.Thread(target=_feed, args=(job_w, json.dumps(job).encode()), daemon=True).start()
        sink.start()
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            _Reader(proc.stdout.fileno(), limits.output_bytes, on_total),
            _Reader(proc.stderr.fileno(), limits.output_bytes, on_total),
        ]
        for r in readers:
            r.start()
        deadline = start + limits.wall_s
        while proc.poll() is None:
            if flood.is_set() or sink.overflow:
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            flood.wait(0.01)
        _kill_everything(proc, uid, workdir)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed above
            pass
        for r in readers:
            r.join(timeout=2)
        sink.join(timeout=2)
        proc.stdout.close()
        proc.stderr.close()
        duration = time.monotonic() - start
    finally:
        if proc is not None and proc.poll() is None:  # an exception above: never leak
            _kill_everything(proc, uid, workdir)
        try:
            os.close(out_r)
        except OSError:
            pass
        cleanup_error = _remove_tree(workdir)
        if group is not None:
            oom = group.oom_killed()
            why = group.destroy()
            cleanup_error = "; ".join(e for e in (cleanup_error, why) if e) or None

    stdout, stderr = readers[0].text(), readers[1].text()
    rc = proc.returncode
    common: dict[str, Any] = dict(
        stdout=stdout, stderr=stderr, duration_s=round(duration, 4), returncode=rc, tier=tier, uid=uid,
        workdir=workdir, limits=asdict(limits), cleanup_error=cleanup_error,
    )
    if flood.is_set():
        return RunResult(Verdict.ERROR, f"output flood: more than {limits.output_kill_bytes} bytes written; the run was killed", **common)
    if sink.overflow:
        return RunResult(Verdict.ERROR, f"result flood: more than {limits.result_bytes} bytes of results; the run was killed", **common)
    if timed_out:
        return RunResult(Verdict.TIMEOUT, f"wall-clock limit of {limits.wall_s:.1f} s exceeded; all its processes were killed", **common)
    document: Any = None
    if sink.data:
        # Each JSON array or object costs the parser ~60 bytes for 1 byte of text: 16 MiB of
        # "[]," would be ~400 MB in the harness.  An honest document needs at most two per node.
        containers = sink.data.count(b"[") + sink.data.count(b"{")
        if containers > MAX_RESULT_CONTAINERS:
            return RunResult(Verdict.ERROR, f"result flood: the run's results hold {containers:,} JSON arrays and objects, more than {MAX_RESULT_CONTAINERS:,}; not parsed", **common)
        try:
            document = json.loads(bytes(sink.data).decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):  # forged or cut short: no results
            document = None
    if isinstance(document, dict) and document.get("cpu_limit") is True:
        return RunResult(Verdict.TIMEOUT, f"CPU time limit of {limits.cpu_s:.1f} s exceeded", **common)
    if isinstance(document, dict):
        try:
            judged = judge_outcome(plan, document, check_s=limits.wall_s)
        except (RecursionError, MemoryError, ValueError, TypeError) as exc:  # results built to break the comparison
            return RunResult(Verdict.ERROR, f"the run's results could not be compared: {type(exc).__name__}: {str(exc)[:200]}", **common)
        return RunResult(Verdict(judged.verdict), judged.message, **common)
    if rc is not None and rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return RunResult(Verdict.TIMEOUT, f"CPU time limit of {limits.cpu_s:.1f} s exceeded", **common)
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and 128 < rc < 160 and tier != "plain" else 0)
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        hint = " (memory or process limit?)" if sig == signal.SIGKILL else ""
        if group is not None and oom:
            hint = f" (the cgroup memory limit of {group.memory_bytes} bytes was reached)"
        msg = f"the process was killed by signal {name}{hint} before reporting its results"
    else:
        msg = f"the process exited with code {rc} before reporting its results" if not sink.data else "the run's results are not valid JSON"
    tail = _tail(stderr)
    return RunResult(Verdict.ERROR, msg + (f"\nstderr:\n{tail}" if tail else ""), **common)


# --------------------------------------------------------------------------- tier detection

_iso_lock = threading.Lock()
_iso_cache: Isolation | None = None
_PROBE_CODE = "def f(x):\n    return x + 1\n"
_PROBE_TESTS = "f(1) == 2\n"


def _probe(tier: str, want_uid: bool) -> str | None:
    """Run a trivial job in a tier; None when it works, else why not."""
    try:
        res = _execute(tier, _PROBE_CODE, parse_tests(_PROBE_TESTS, "f"), Limits(wall_s=20.0, cpu_s=10.0), want_uid)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if res.verdict is Verdict.PASSED:
        return None
    return f"{res.verdict.value}: {res.message[:300]}"


TIERS = ("bwrap", "unshare", "userns", "plain")


def isolation() -> Isolation:
    """Detect (once per process, cached) the strongest tier that passes a probe run here.

    ``DDTREE_SANDBOX_TIER`` (one of :data:`TIERS`) starts the search at that tier, e.g.
    ``plain`` for tests of the weakest one.
    """
    global _iso_cache
    with _iso_lock:
        if _iso_cache is not None:
            return _iso_cache
        notes: list[str] = []
        forced = os.environ.get("DDTREE_SANDBOX_TIER", "")
        start = TIERS.index(forced) if forced in TIERS else 0
        is_root = hasattr(os, "getuid") and os.getuid() == 0
        linux = sys.platform.startswith("linux")
        group = cgroup.available()  # not root: only a delegated (writable) v2 subtree
        has_seccomp = seccomp.program() is not None
        candidates = []
        if linux and is_root:
            if bwrap.find():
                candidates.append("bwrap")
            else:
                notes.append("bubblewrap (bwrap) not installed: apt-get install bubblewrap")
            if unshare.find():
                candidates.append("unshare")
            else:
                notes.append("util-linux unshare not found")
        elif linux and unshare.find():
            candidates.append("userns")
        for tier in candidates:
            if TIERS.index(tier) < start:
                continue
            why = _probe(tier, want_uid=is_root)
            if why is None:
                _iso_cache = Isolation(tier, is_root, True, True, True, tuple(notes), cgroup=group, seccomp=has_seccomp, minimal_view=True)
                return _iso_cache
            notes.append(f"{tier} tier unavailable ({why})")
            if _under_tmp() and not any("under /tmp" in n for n in notes):
                notes.append(f"the interpreter {_under_tmp()} lies under /tmp, hidden in the run by its private /tmp")
        if is_root:
            why = _probe("plain", want_uid=True)
            if why is None:
                _iso_cache = Isolation("plain", True, False, False, False, tuple(notes))
                return _iso_cache
            notes.append(f"uid drop unavailable ({why})")
        _iso_cache = Isolation("plain", False, False, False, False, tuple(notes))
        return _iso_cache


def _under_tmp() -> str | None:
    """The interpreter's path when it (or a directory it needs) lies under /tmp: every
    namespace tier puts a private tmpfs on /tmp, which hides it from the run."""
    exe, expose = _interpreter()
    for path in (exe, *expose):
        if path == "/tmp" or path.startswith("/tmp/"):
            return exe
    return None


def _fix(iso: Isolation) -> str:
    """What to do about a weak tier, from what actually failed (not always "install")."""
    exe = _under_tmp()
    if exe is not None:
        return (f"the interpreter {exe} lies under /tmp, which the sandbox covers with a private tmpfs, so no run can "
                "start it: use an interpreter (or create the venv) outside /tmp, or set the tier explicitly")
    if os.environ.get("DDTREE_SANDBOX_TIER", "") in TIERS[1:]:
        return f"DDTREE_SANDBOX_TIER={os.environ['DDTREE_SANDBOX_TIER']} skipped the stronger tiers: unset it"
    if not (hasattr(os, "getuid") and os.getuid() == 0):
        return "run as root (the namespace tiers drop to a per-run uid), with bubblewrap (apt-get install bubblewrap) or util-linux unshare"
    if not bwrap.find() and not unshare.find():
        return "install bubblewrap (apt-get install bubblewrap) or util-linux"
    return "the probe runs of the namespace tiers failed as noted; fix that cause (CAP_SYS_ADMIN and CAP_SETUID are needed)"


def refusal(iso: Isolation, allow_plain: bool) -> str | None:
    """Why the coding gate must not run generated code here (None: it may).

    Fail closed: without a namespace tier with a uid drop the gate runs only when the user
    opted in (``--ddtree-sandbox=plain``), and never as root without a uid drop.  The fix
    named is the one for what failed (:func:`_fix`).
    """
    is_root = hasattr(os, "getuid") and os.getuid() == 0
    if is_root and not iso.uid_drop:
        return (
            f"the sandbox would run generated code as root ({iso.describe()}; {'; '.join(iso.notes) or 'no uid drop'}). "
            f"Fix: {_fix(iso)}"
        )
    if iso.strong or allow_plain:
        return None
    why = "; ".join(iso.notes) or ("not root: no uid drop, no cgroup" if iso.tier == "userns" else "no namespaces")
    return (
        f"the strongest sandbox tier is unavailable: {iso.describe()} ({why}). "
        f"Fix: {_fix(iso)}; or accept the weaker isolation explicitly with --ddtree-sandbox=plain (ini: ddtree_sandbox = plain)"
    )


# --------------------------------------------------------------------------- public API


def run_code(code: str, tests: str | TestPlan, entry_point: str | None = None, limits: Limits | None = None, *, scale: bool = True, key: str = "") -> RunResult:
    """Run ``code`` in a fresh sandbox, make the calls of ``tests`` and judge their results here.

    ``tests`` is a :class:`~pytest_ddtree.sandbox.calls.TestPlan` or step lines for
    :func:`~pytest_ddtree.sandbox.calls.parse_tests`.  ``entry_point``, when given, must be
    something callable the code defines.  Empty code gives ``no_code`` without starting
    anything.  Never raises for anything the code does; raises ``OSError`` only when no
    process can be started at all, and ``StepError`` for malformed step lines.
    """
    base = limits or Limits()
    plan = parse_tests(tests, entry_point) if isinstance(tests, str) else tests
    if entry_point and plan.entry_point is None:
        plan = TestPlan(plan.calls, plan.inputs, entry_point)
    if not code.strip():
        return RunResult(Verdict.NO_CODE, "no code was extracted from the answer", limits=asdict(base), key=key)
    lim = base.scaled(speed_factor()) if scale else base
    iso = isolation()
    if hasattr(os, "getuid") and os.getuid() == 0 and not iso.uid_drop:
        return RunResult(Verdict.ERROR, "refused: " + (refusal(iso, True) or "no uid drop"), limits=asdict(base), key=key, tier=iso.tier)
    res = _execute(iso.tier, code, plan, lim, iso.uid_drop)
    res.key = key
    return res


def default_workers() -> int:
    """Bounded parallelism: min(4, cpus).  Each run is a whole interpreter with rlimits."""
    return max(1, min(4, os.cpu_count() or 1))


def run_many(jobs: Sequence[Job], limits: Limits | None = None, *, max_workers: int | None = None, scale: bool = True) -> list[RunResult]:
    """Run jobs in parallel (bounded by ``max_workers``, default :func:`default_workers`),
    results in the order of ``jobs``."""
    if not jobs:
        return []
    isolation()  # probe once before the threads start
    with ThreadPoolExecutor(max_workers=max_workers or default_workers()) as pool:
        futures = [pool.submit(run_code, j.code, j.tests, j.entry_point, limits, scale=scale, key=j.key) for j in jobs]
        return [f.result() for f in futures]
