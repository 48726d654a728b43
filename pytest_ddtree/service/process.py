"""The ``process`` controller: the service runs as our child, in its own process group.

Why a process group: a launcher like ``python -m sglang.launch_server`` forks tokenizer,
detokenizer and one scheduler per GPU; killing only the leader leaves GPU memory held by
orphans and the next config fails to load. Why a registry with atexit and signal handlers:
a Ctrl-C, a SIGTERM from CI or an internal error in pytest must never leave a 600 GB model
loaded on the GPUs with nobody owning it.
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Callable, Mapping
from urllib.parse import urlsplit

from pytest_ddtree.records.launch_shapes import ControllerEntry
from pytest_ddtree.service import ports
from pytest_ddtree.service.base import (
    Capabilities,
    ExitInfo,
    GpuWait,
    Launch,
    LaunchFrom,
    ServiceStartError,
    describe_exit_code,
    head_file,
    tail_file,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind

# -- global registry: every live process group we started, for emergency cleanup -----------------
_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_LIVE_LOCK = threading.Lock()
_ATEXIT_INSTALLED = False
_PREVIOUS_HANDLERS: dict[int, object] = {}


def _register(proc: subprocess.Popen[bytes]) -> None:
    global _ATEXIT_INSTALLED
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
        if not _ATEXIT_INSTALLED:
            atexit.register(kill_all_groups)
            _ATEXIT_INSTALLED = True


def _unregister(proc: subprocess.Popen[bytes]) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(proc.pid, None)


def live_process_groups() -> list[int]:
    """Process-group ids of services started here and not yet stopped (for tests and reports)."""
    with _LIVE_LOCK:
        return sorted(_LIVE)


def kill_all_groups() -> None:
    """SIGKILL every process group still registered, and reap the leaders.

    Runs at interpreter exit and from the signal handlers. It uses SIGKILL directly: when we are
    here the orderly ``stop()`` did not run, and the process that called us is about to die.
    """
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
        _LIVE.clear()
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            pass


class TerminatedBySignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived (a cancelled CI job, a closed terminal).

    A KeyboardInterrupt on purpose: pytest then takes its Ctrl-C path, runs the session-finish
    hooks, and the plugin's ``ServiceManager.close()`` stops our services and puts systemd units
    back as they were found (drop-in, running or stopped). Results already measured are kept.
    """


_SIGNALLED: list[int] = []


def _kill_groups_from_signal_handler() -> None:
    """SIGKILL our process groups without taking a lock or waiting.

    The interrupted main thread may hold ``_LIVE_LOCK`` or a Popen's wait lock; acquiring either
    here would deadlock, so this only reads a snapshot (one C-level copy under the GIL) and signals.
    """
    for pid in list(_LIVE):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _on_fatal_signal(signum: int, frame: FrameType | None) -> None:
    """First signal: raise :class:`TerminatedBySignal` in the main thread (orderly cleanup).
    A second one while that cleanup runs: kill the process groups and die by the signal.

    Signal-safe: no lock, no blocking call, no I/O on the first path; the orderly work happens
    after the handler has returned, in ordinary code that may take locks and wait.
    """
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if _SIGNALLED:
        _kill_groups_from_signal_handler()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _SIGNALLED.append(signum)
    if callable(previous):
        previous(signum, frame)
    raise TerminatedBySignal(
        f"{signal.Signals(signum).name} received: stopping the services this session started and "
        "restoring systemd units before exiting (send it again to kill them at once)"
    )


def install_signal_handlers(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """Turn SIGTERM and SIGHUP into an orderly interrupt (see :class:`TerminatedBySignal`).

    SIGINT is left alone: pytest already turns it into KeyboardInterrupt. Without this, SIGTERM
    kills pytest without running atexit or the session-finish hooks, leaving a model loaded on the
    GPUs or a systemd unit running a test config. Only callable from the main thread; a no-op
    elsewhere.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in signals:
        if signum in _PREVIOUS_HANDLERS:
            continue
        previous = signal.getsignal(signum)
        _PREVIOUS_HANDLERS[signum] = previous
        if previous == signal.SIG_IGN:  # e.g. SIGHUP under nohup: the user asked to keep running
            continue
        signal.signal(signum, _on_fatal_signal)


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec function that makes Linux SIGKILL the child if pytest is SIGKILLed.

    The last line of defence (atexit cannot run after SIGKILL). It covers the group leader only;
    its own children are reached by the leader's shutdown or by ``stop()``. Only armed from the
    main thread: Linux sends the signal when the *thread* that forked exits, and a worker thread
    that ends would otherwise kill a healthy service.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        pr_set_pdeathsig = 1
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # parent died between fork and prctl
            os._exit(1)

    return preexec


def _group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) pids in process group ``pgid`` from /proc; None where there is no /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command (which may contain spaces and parentheses): state ppid pgrp ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class ProcessController(Controller):
    """Runs the rendered command as a child process group with one log file per start."""

    kind = "process"

    def __init__(self, log_dir: Path, *, env: Mapping[str, str] | None = None, stop_timeout_s: float = 30.0) -> None:
        self.log_dir = Path(log_dir)
        self.extra_env = dict(env or {})
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._launch: Launch | None = None
        self._log_path: Path | None = None
        self._starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def _next_log_path(self, name: str) -> Path:
        """``<log_dir>/<name>-<n>.log``, never overwriting an earlier start's log."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        while True:
            self._starts += 1
            path = self.log_dir / f"{name}-{self._starts}.log"
            if not path.exists():
                return path

    def start(self, launch: Launch) -> None:
        self.stop()
        argv = shlex.split(launch.command)
        if not argv:
            raise ServiceStartError(f"empty launch command for {launch.name}", hint="set 'command' in the service profile")
        self._refuse_taken_port(launch)
        log_path = launch.log_path or self._next_log_path(launch.name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.extra_env)
        env.update(launch.env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # so the log tail shows the last words of a crash
        with open(log_path, "ab") as log:
            log.write(f"# pytest-ddtree launch {launch.name}: {launch.command}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=_parent_death_signal(),
                )
            except OSError as exc:
                raise ServiceStartError(
                    f"cannot run {argv[0]!r}: {exc.strerror or exc}",
                    log_tail=tail_file(log_path),
                    elapsed=0.0,
                    config_name=launch.name,
                    hint="check the profile's 'command' (the executable must exist and be on PATH)",
                ) from None
        _register(proc)
        self._proc, self._launch, self._log_path = proc, launch, log_path

    @staticmethod
    def _refuse_taken_port(launch: Launch) -> None:
        """A port that answers before the launch is somebody else's server: measuring it would
        measure the wrong server, and our launch would die with "Address already in use"."""
        host = urlsplit(launch.url).hostname or "127.0.0.1"
        if launch.port is not None and ports.answers(host, launch.port):
            raise ports.PortTaken(
                f"port {launch.port} already answers before the launch of {launch.name}: {ports.who_listens(launch.port)}",
                elapsed=0.0, config_name=launch.name,
                hint="stop that server, or set port: auto in the profile (a free port per launch)")

    def answered_by_another(self) -> str | None:
        """The port's listener must be of the process group this controller started."""
        proc, launch = self._proc, self._launch
        if proc is None or launch is None or launch.port is None:
            return None
        return ports.stranger_on(launch.port, proc.pid)

    def failure(self) -> ExitInfo | None:
        proc = self._proc
        if proc is None:
            return None
        code = proc.poll()
        if code is None:
            return None
        return ExitInfo(code, f"process {proc.pid} exited with code {describe_exit_code(code)}", self.log_tail())

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL it after the grace period, reap the leader."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        self._signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # The leader may be gone while workers it forked are still shutting down.
        while time.monotonic() < deadline and self._group_alive(pgid):
            time.sleep(0.05)
        if self._group_alive(pgid) or proc.poll() is None:
            self._signal_group(pgid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
                pass
            end = time.monotonic() + 5
            while time.monotonic() < end and self._group_alive(pgid):
                time.sleep(0.05)
        _unregister(proc)
        # Keep _launch/_log_path so a failure report after stop still has the log.
        self._proc = None

    @staticmethod
    def _signal_group(pgid: int, signum: int) -> None:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        """Whether any non-zombie process is still in the group.

        Zombies count as gone: an orphaned worker that already died stays a zombie until PID 1
        reaps it, and some container inits never do; waiting for it would always cost the
        whole grace period and a pointless SIGKILL.
        """
        members = _group_members(pgid)
        if members is not None:
            return bool(members)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def log_tail(self, n: int = 40) -> str:
        return tail_file(self._log_path, n)

    def startup_log(self) -> str | None:
        """The log from its start: the worker's start-up lines come early, before megabytes of
        warm-up and request lines."""
        return head_file(self._log_path)

    def describe(self) -> str:
        if self._proc is None:
            return "process (not running)"
        return f"process group {self._proc.pid} (log {self._log_path})"

    def launch_record(self) -> ControllerEntry:
        return {"pid": self.pid, "log": str(self._log_path) if self._log_path else None}


def _make(context: ControllerContext) -> Controller:
    return ProcessController(context.log_dir, stop_timeout_s=context.profile.stop_timeout_s)


KIND = ControllerKind(
    name="process",
    capabilities=Capabilities(launch=LaunchFrom.PROFILE_COMMAND, gpu_wait=GpuWait.SINCE_FIRST_LAUNCH, log_file=True,
                              service_python_here=True),
    make=_make,
)
"""``controller: process``: the profile's command as a child of this session, on this machine."""
