"""One run end to end: start it in a tier, feed it the job, bound its output and time, kill what is left, judge its results."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pytest_ddtree.sandbox import cgroup, seccomp
from pytest_ddtree.sandbox.calls import TestPlan, judge_outcome
from pytest_ddtree.sandbox.launch import build_command, job_limits, prepare_workdir, remove_tree, scrubbed_env, size_bytes
from pytest_ddtree.sandbox.limits import Limits
from pytest_ddtree.sandbox.outcome import RunResult, Verdict
from pytest_ddtree.sandbox.processes import kill_everything, next_uid
from pytest_ddtree.sandbox.values import MAX_NODES

#: Most JSON arrays and objects a run's result document may hold (see :func:`execute_in_tier`).
MAX_RESULT_CONTAINERS = 2 * MAX_NODES + 100_000


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


def execute_in_tier(tier: str, code: str, plan: TestPlan, limits: Limits, want_uid: bool) -> RunResult:
    """Run ``code`` once in ``tier`` with the calls of ``plan``, leave nothing behind, and
    judge the results here (the package docstring says what each tier guarantees)."""
    uid = next_uid() if want_uid else None
    workdir = prepare_workdir(uid)
    job_r, job_w = os.pipe()
    out_r, out_w = os.pipe()
    child_fds = (job_r, out_w, *_seccomp_fds(tier))
    group = _run_cgroup(tier, uid, limits)
    argv, popen_user = build_command(tier, workdir, uid, limits, child_fds, group.procs_files() if group else [])
    job = {**plan.to_job(), "code": code, "limits": job_limits(limits, tier, uid)}
    watch = _Watch(limits, _Sink(out_r, limits.result_bytes))
    oom = False
    try:
        watch.run(argv, popen_user, workdir, child_fds, job_w, json.dumps(job).encode(), uid)
    finally:
        if watch.proc is not None and watch.proc.poll() is None:  # an exception above: never leak
            kill_everything(watch.proc, uid, workdir)
        try:
            os.close(out_r)
        except OSError:
            pass
        cleanup_error = remove_tree(workdir)
        if group is not None:
            oom = group.oom_killed()
            why = group.destroy()
            cleanup_error = "; ".join(e for e in (cleanup_error, why) if e) or None

    assert watch.proc is not None
    stdout, stderr = watch.readers[0].text(), watch.readers[1].text()
    rc = watch.proc.returncode
    common: dict[str, Any] = dict(
        stdout=stdout, stderr=stderr, duration_s=round(watch.duration, 4), returncode=rc, tier=tier, uid=uid,
        workdir=workdir, limits=asdict(limits), cleanup_error=cleanup_error,
    )
    cut_short = _cut_short(watch, limits, common)
    if cut_short is not None:
        return cut_short
    document = _result_document(watch.sink.data, common)
    if isinstance(document, RunResult):
        return document
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
    msg = _why_no_results(rc, tier, group if oom else None, bool(watch.sink.data))
    tail = _tail(stderr)
    return RunResult(Verdict.ERROR, msg + (f"\nstderr:\n{tail}" if tail else ""), **common)


def _seccomp_fds(tier: str) -> tuple[int, ...]:
    """The read end of a pipe holding the seccomp filter (bwrap reads it by fd), or nothing."""
    program = seccomp.program() if tier == "bwrap" else None
    if program is None:
        return ()
    filter_r, filter_w = os.pipe()
    os.write(filter_w, program)
    os.close(filter_w)
    return (filter_r,)


def _run_cgroup(tier: str, uid: int | None, limits: Limits) -> cgroup.RunCgroup | None:
    """The run's own cgroup where the tier can have one (userns: where a delegated cgroup is writable)."""
    if (tier in ("bwrap", "unshare") and uid is not None) or tier == "userns":
        return cgroup.create(f"ddtree-sbx-{uid}-{secrets.token_hex(3)}", limits.memory_bytes + size_bytes(limits.tmp_size), limits.processes + 4)
    return None


class _Watch:
    """One run's process from start to its end: its output bounded, its time limited."""

    def __init__(self, limits: Limits, sink: _Sink) -> None:
        self.limits = limits
        self.sink = sink
        self.total = 0
        self.flood = threading.Event()
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.readers: list[_Reader] = []
        self.timed_out = False
        self.duration = 0.0

    def on_total(self, n: int) -> None:
        with self.lock:
            self.total += n
            if self.total > self.limits.output_kill_bytes:
                self.flood.set()

    def run(self, argv: list[str], popen_user: int | None, workdir: str, child_fds: tuple[int, ...], job_w: int, job: bytes, uid: int | None) -> None:
        """Start the run, feed it the job, wait for its end, a flood or the wall-clock limit,
        then kill everything of it and collect its output."""
        start = time.monotonic()
        kwargs: dict[str, Any] = {}
        if popen_user is not None:
            kwargs.update(user=popen_user, group=popen_user, extra_groups=[])
        try:
            self.proc = proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=scrubbed_env(workdir),
                start_new_session=True,
                close_fds=True,
                pass_fds=child_fds,
                **kwargs,
            )
        finally:
            for fd in child_fds:
                os.close(fd)
        threading.Thread(target=_feed, args=(job_w, job), daemon=True).start()
        self.sink.start()
        assert proc.stdout is not None and proc.stderr is not None
        self.readers = [
            _Reader(proc.stdout.fileno(), self.limits.output_bytes, self.on_total),
            _Reader(proc.stderr.fileno(), self.limits.output_bytes, self.on_total),
        ]
        for r in self.readers:
            r.start()
        deadline = start + self.limits.wall_s
        while proc.poll() is None:
            if self.flood.is_set() or self.sink.overflow:
                break
            if time.monotonic() >= deadline:
                self.timed_out = True
                break
            self.flood.wait(0.01)
        kill_everything(proc, uid, workdir)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILLed above
            pass
        for r in self.readers:
            r.join(timeout=2)
        self.sink.join(timeout=2)
        proc.stdout.close()
        proc.stderr.close()
        self.duration = time.monotonic() - start


def _cut_short(watch: _Watch, limits: Limits, common: dict[str, Any]) -> RunResult | None:
    """The verdict of a run that was killed for its output or its time, if it was."""
    if watch.flood.is_set():
        return RunResult(Verdict.ERROR, f"output flood: more than {limits.output_kill_bytes} bytes written; the run was killed", **common)
    if watch.sink.overflow:
        return RunResult(Verdict.ERROR, f"result flood: more than {limits.result_bytes} bytes of results; the run was killed", **common)
    if watch.timed_out:
        return RunResult(Verdict.TIMEOUT, f"wall-clock limit of {limits.wall_s:.1f} s exceeded; all its processes were killed", **common)
    return None


def _result_document(data: bytearray, common: dict[str, Any]) -> Any:
    """The run's results as parsed JSON (None: none, forged or cut short), or the error verdict
    of a document too costly to parse."""
    if not data:
        return None
    # Each JSON array or object costs the parser ~60 bytes for 1 byte of text: 16 MiB of
    # "[]," would be ~400 MB in the harness.  An honest document needs at most two per node.
    containers = data.count(b"[") + data.count(b"{")
    if containers > MAX_RESULT_CONTAINERS:
        return RunResult(Verdict.ERROR, f"result flood: the run's results hold {containers:,} JSON arrays and objects, more than {MAX_RESULT_CONTAINERS:,}; not parsed", **common)
    try:
        return json.loads(bytes(data).decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # forged or cut short: no results
        return None


def _why_no_results(rc: int | None, tier: str, oom_group: cgroup.RunCgroup | None, wrote_results: bool) -> str:
    """What ended a run that reported no results: a signal (and which limit it suggests) or its exit code."""
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if rc is not None and 128 < rc < 160 and tier != "plain" else 0)
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        hint = " (memory or process limit?)" if sig == signal.SIGKILL else ""
        if oom_group is not None:
            hint = f" (the cgroup memory limit of {oom_group.memory_bytes} bytes was reached)"
        return f"the process was killed by signal {name}{hint} before reporting its results"
    return f"the process exited with code {rc} before reporting its results" if not wrote_results else "the run's results are not valid JSON"
