"""Progress of the harness's long waits: a restart, each cell's repeats, confirmations, relaunches.

Why a module of its own: a throughput cell on a GPU box runs for minutes and a restart of a large
model for ten, and pytest prints nothing until a test ends (bench_serving and ``vllm bench`` show a
bar). The code that waits (the service manager, readiness, the load generator, the gate) says
what it is doing here, in a few calls that cost nothing when nobody listens; the plugin installs
a :class:`Display` that shows it in pytest's terminal (a live status line on a TTY, a line about
every 10 s otherwise, nothing under ``-q -q``). No pytest import: the benchmarks drive the same
code with no display, and then nothing is shown.

Two kinds of calls:

* :func:`activity` (a context manager) names one wait with a plan (``bs8_b8_k4 c8_4k: repeat 2/3``,
  16 requests); :func:`request_done` counts its requests and output tokens as they finish (from
  the load generator's threads), so the line says how far it is and the tok/s so far.
* :func:`status` states where a wait without requests stands (a restart: elapsed, readiness, the
  service log's last line); the display shows the newest.

Under pytest-xdist a worker has no terminal the user sees (xdist forwards only test reports): the
plugin installs a worker display that writes into a channel the main process reads, and the
main process shows those lines prefixed with the worker's id (report/relay.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol


#: Characters of an activity's progress bar.
BAR_WIDTH = 20


class Display(Protocol):
    """Where progress goes (the plugin's terminal display)."""

    def status(self, text: str) -> None:
        """The newest state of the current wait; called often (a display shows what it can)."""

    def clear(self) -> None:
        """The wait is over: a live line goes away."""


@dataclass
class Activity:
    """One wait with a plan: its label, how many requests it sends, what has finished so far."""

    label: str
    requests: int | None = None
    started: float = field(default_factory=time.monotonic)
    requests_done: int = 0
    output_tokens: int = 0

    def text(self, now: float | None = None) -> str:
        elapsed = (now if now is not None else time.monotonic()) - self.started
        parts = [f"{self.label}: {elapsed:.0f} s"]
        if self.requests is not None:
            parts.append(f"{self.requests_done}/{self.requests} requests")
        if self.output_tokens and elapsed > 0:
            parts.append(f"{self.output_tokens / elapsed:.0f} tok/s so far")
        line = ", ".join(parts)
        if self.requests is not None:  # a bar, as bench_serving's tqdm shows one, where the terminal has room for it
            import shutil

            filled = min(BAR_WIDTH, BAR_WIDTH * self.requests_done // max(1, self.requests))
            bar = f" [{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"
            if len(line) + len(bar) + len("[ddtree] ") < shutil.get_terminal_size((80, 24)).columns:
                line += bar
        return line


_lock = threading.Lock()
_display: Display | None = None
_current: Activity | None = None


def install(display: Display | None) -> Display | None:
    """Show progress on ``display`` from now on (None: show nothing); returns the one it replaces."""
    global _display
    with _lock:
        replaced, _display = _display, display
    return replaced


def showing() -> bool:
    """Whether a display is installed (a wait that also reports through a callback of its own
    leaves its periodic lines to the display then)."""
    return _display is not None


def _show(text: str) -> None:
    display = _display
    if display is not None:
        display.status(text)


@contextmanager
def activity(label: str, requests: int | None = None) -> Iterator[Activity]:
    """A wait named ``label`` (sending ``requests`` requests) for the length of the block; a wait
    inside another (a repeat inside a confirmation) stands for it until it ends."""
    global _current
    current = Activity(label, requests)
    with _lock:
        outer, _current = _current, current
    _show(current.text())
    try:
        yield current
    finally:
        with _lock:
            _current = outer
        display = _display
        if display is not None:
            if outer is not None:
                display.status(outer.text())
            else:
                display.clear()


def request_done(output_tokens: int) -> None:
    """One request of the current activity finished with ``output_tokens`` tokens (any thread)."""
    with _lock:
        current = _current
        if current is None:
            return
        current.requests_done += 1
        current.output_tokens += max(0, int(output_tokens))
        text = current.text()
    _show(text)


def status(text: str) -> None:
    """Where a wait without requests stands (a restart); shown as the newest state."""
    _show(text)


def done() -> None:
    """A wait stated with :func:`status` is over."""
    display = _display
    if display is not None and _current is None:
        display.clear()
