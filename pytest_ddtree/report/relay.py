"""Progress lines of pytest-xdist workers, shown live on the main process's terminal.

Why: xdist forwards a worker's test reports and nothing else, and a worker's output is captured
while its test runs, so under ``-n 2`` a sweep would show only dots for minutes while each worker
starts a service and measures its cells. The lines a serial run shows (the service's start,
readiness, each cell's repeats and tok/s so far, a wait for a shared instance) reach the
main process, prefixed with the worker's id: ``[ddtree gw1] bs8_b8_k4 c32_4k: repeat 3/3: 2 s, 65/96 requests, ...``.

The channel is one file per worker in a folder the main process makes; its path reaches the worker
in ``workerinput`` (``pytest_configure_node``). The worker appends whole lines (:class:`WorkerSink`:
a local file write, so a worker never waits on the main process); the main process's thread
(:class:`Relay`) reads what is new every ``POLL_S`` and shows each line through the terminal
display, which writes whole lines under its lock. Everything read is bounded: a line's length,
the lines shown per worker and poll (the newest; the rest counted as skipped), the bytes read
per poll and per file. The relay stops at the session end (a last read, so no line is lost before
the summary) and never holds it up: its thread is a daemon, joined with a deadline.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pytest_ddtree import progress
from pytest_ddtree.session import WORKER_PROGRESS_KEY

#: Characters of one line, on either side (a service's log line can be anything).
MAX_LINE = 300
#: Seconds between two status lines of a worker's current wait (a cell's repeats, a start): a long
#: cell shows a line every few seconds, not one per request.
STATUS_EVERY_S = 5.0
#: Bytes a worker writes into its channel in all; past it the worker is silent (a runaway loop
#: fills no disk).
MAX_CHANNEL_BYTES = 4 * 2**20
#: Seconds between two reads of the channels.
POLL_S = 0.5
#: Bytes read from one channel per poll.
READ_BYTES = 64 * 2**10
#: Lines shown per worker and poll; more are skipped (the newest shown).
LINES_PER_POLL = 5
#: Seconds the session end waits for the relay's thread (a blocked terminal) before going on.
JOIN_TIMEOUT_S = 5.0


def printable(text: str) -> str:
    """One terminal line: control characters (a carriage return, an escape sequence's start) are
    spaces, and the line is cut to ``MAX_LINE``."""
    cleaned = "".join(c if c.isprintable() else " " for c in text).strip()
    return cleaned if len(cleaned) <= MAX_LINE else cleaned[: MAX_LINE - 3] + "..."


class WorkerSink:
    """A worker's progress into its channel: the session's lines (:meth:`line`, each one) and
    progress.Display's status of the current wait, at most one each ``STATUS_EVERY_S`` whatever
    the waits (a cell's interleaved repeats are a wait each, a second or two long at the engine's
    clock: showing each one's start made two workers print a line a second)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.written = 0
        self.last_status = -STATUS_EVERY_S
        self.broken = False

    def line(self, text: str) -> None:
        with self.lock:
            self._append(text)

    def status(self, text: str) -> None:
        now = time.monotonic()
        with self.lock:
            if now - self.last_status < STATUS_EVERY_S:
                return
            self.last_status = now
            self._append(text)

    def clear(self) -> None:
        """Nothing is live on a channel to take away."""

    def _append(self, text: str) -> None:
        data = (printable(text) + "\n").encode("utf-8", "replace")
        if self.broken or self.written + len(data) > MAX_CHANNEL_BYTES:
            return
        try:  # O_APPEND: one write of a whole line, never a line split by another's
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError:
            self.broken = True  # the main process's folder is gone (its session ended): stay silent
            return
        self.written += len(data)


class _Tail:
    """What is new in one worker's channel since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        if self.offset >= MAX_CHANNEL_BYTES:
            return []
        try:
            with self.path.open("rb") as stream:
                stream.seek(self.offset)
                data = stream.read(min(READ_BYTES, MAX_CHANNEL_BYTES - self.offset))
        except OSError:
            return []  # not written yet
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        if len(self.partial) > 4 * MAX_LINE:
            self.partial = b""  # no line is this long: drop it rather than hold it
        return [printable(line.decode("utf-8", "replace")) for line in lines if line.strip()]


class Relay:
    """The main process's side: a channel per worker, and a thread that shows their new lines with
    ``show`` (the terminal display's whole-line write)."""

    def __init__(self, show: Callable[[str], None]) -> None:
        self.show = show
        self.folder = Path(tempfile.mkdtemp(prefix="ddtree-progress-"))
        self._tails: dict[str, _Tail] = {}
        self._lock = threading.Lock()  # the channels (a replaced worker adds one while the thread reads)
        self._reading = threading.Lock()  # one reader at a time: the thread, or close() once it ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def channel(self, worker_id: str) -> str:
        """The path a worker writes its lines to; the relay's thread starts with the first."""
        safe = "".join(c for c in worker_id if c.isalnum()) or "worker"
        path = self.folder / f"{safe}.lines"
        with self._lock:
            self._tails[worker_id] = _Tail(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddtree-progress-relay", daemon=True)
                self._thread.start()
        return str(path)

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.drain()

    def drain(self) -> None:
        """Show what each worker wrote since the last read. ``show`` is called holding no lock
        a new worker's channel needs: a stuck terminal stops the relay, never xdist's loop."""
        with self._reading:
            with self._lock:
                tails = list(self._tails.items())
            for worker_id, tail in tails:
                lines = tail.new_lines()
                skipped = max(0, len(lines) - LINES_PER_POLL)
                for index, line in enumerate(lines[skipped:]):
                    note = f" ({skipped} earlier line(s) skipped)" if skipped and index == 0 else ""
                    self.show(f"[ddtree {worker_id}] {line}{note}")

    def close(self) -> None:
        """Stop the thread, show the last lines (unless the thread is stuck on the terminal), and
        remove the channels."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S)
        if thread is None or not thread.is_alive():
            self.drain()
        shutil.rmtree(self.folder, ignore_errors=True)


class LineDisplay(Protocol):
    """The main process's terminal display (report/terminal.py ``TerminalProgress``) as lines reach it."""

    def line(self, text: str) -> None: ...


def session_lines(worker: Mapping[str, Any] | None, display: Callable[[], LineDisplay | None],
                  quiet: Callable[[], bool]) -> Callable[[str], None]:
    """The session's lines (a start, a ready service, a dead host): the terminal's on the main process
    (``worker`` None; through its ``display``, which clears a live status line first; none when
    ``quiet``, pytest's ``-q -q``); on a worker (xdist's workerinput), the main process's channel
    (the worker's progress display too), else stderr."""
    given = worker or {}
    worker_id = given.get("workerid")
    if WORKER_PROGRESS_KEY in given:
        sink = WorkerSink(Path(given[WORKER_PROGRESS_KEY]))
        progress.install(sink)
        return sink.line

    def line(message: str) -> None:
        text = f"[ddtree{' ' + worker_id if worker_id else ''}] {message}"
        shown = display()
        if worker_id is None and shown is not None:
            shown.line(text)
        elif worker_id is not None or not quiet():
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    return line


def start_relay(show: Callable[[str], None]) -> Relay | None:
    """The main process's relay of its workers' lines into ``show``, or None where it cannot be made
    (no temporary folder: the workers' lines stay theirs, the run goes on; ``show`` says so)."""
    try:
        return Relay(show)
    except OSError as exc:
        show(f"[ddtree] the workers' progress lines are not shown: {exc}")
        return None


def end_session_lines(worker: Mapping[str, Any] | None) -> None:
    """At a worker's end (pytest's unconfigure): its channel no longer takes progress.py's waits."""
    if WORKER_PROGRESS_KEY in (worker or {}):
        progress.install(None)
