"""What a session shows on pytest's terminal: the live progress display and the end-of-session sections.

No pytest import: the plugin hands in its terminal reporter and capture manager, typed here by the
Protocols of what is called on them, so the display is driven the same way by a test with a stand-in
for the terminal (and the plugin stays hooks and fixtures).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import pluggy

from pytest_ddtree import progress

if TYPE_CHECKING:
    from pytest_ddtree.measure.matrix import Cell
    from pytest_ddtree.options import Settings
    from pytest_ddtree.report.relay import Relay
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.session import DDTreeSession

hookimpl = pluggy.HookimplMarker("pytest")  # pytest's own marker (pytest.hookimpl), so no pytest import


class Reporter(Protocol):
    """The part of pytest's ``TerminalReporter`` (_pytest/terminal.py) the session writes with."""

    #: The file whose results the current line shows; None makes the next result start a line of its own.
    currentfspath: Path | str | int | None

    @property
    def isatty(self) -> object: ...

    def ensure_newline(self) -> None: ...

    def rewrite(self, line: str, *, erase: bool = False) -> None: ...

    def write(self, content: str) -> None: ...

    def write_line(self, line: str) -> None: ...

    def write_sep(self, sep: str, title: str | None = None) -> None: ...


class TestReport(Protocol):
    """What the display reads of pytest's ``TestReport``."""

    @property
    def when(self) -> str | None: ...

    @property
    def passed(self) -> bool: ...


class Capture(Protocol):
    """pytest's ``CaptureManager`` (_pytest/capture.py): a test's output is captured while it runs."""

    def global_and_fixture_disabled(self) -> AbstractContextManager[None]: ...


class TerminalProgress:
    """progress.Display on pytest's terminal reporter (the main process's; see progress.py).

    On a TTY the newest state is a live status line under the last test line (rewritten in place,
    at most a few times a second, cut to the terminal's width); otherwise a line about every
    ``INTERVAL_S`` seconds (a CI log gets a heartbeat, not a flood). After either, the next test
    result starts its file's line again, so pytest's own lines stay whole."""

    INTERVAL_S = 10.0
    LIVE_EVERY_S = 0.25

    def __init__(self, reporter: Reporter, capture: Capture | None) -> None:
        self.reporter = reporter
        # a test's output is captured while it runs: like pytest's live logging, write around it
        self.capture = capture
        self.tty = bool(reporter.isatty)
        self.lock = threading.Lock()
        self.live = False
        self.last_shown = 0.0
        self.last_line = time.monotonic()
        # xdist's main process writes its results' letters with no file name before them, so the
        # reporter does not know a line of them is open: pytest_runtest_logreport marks it
        self.mid_line = False

    def _fits(self, text: str) -> str:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        return text if len(text) <= width else text[: max(0, width - 3)] + "..."

    def _uncaptured(self) -> AbstractContextManager[None]:
        return self.capture.global_and_fixture_disabled() if self.capture is not None else contextlib.nullcontext()

    def status(self, text: str) -> None:
        now = time.monotonic()
        with self.lock, self._uncaptured():
            if self.tty:
                if now - self.last_shown < self.LIVE_EVERY_S:
                    return
                if not self.live:
                    self.reporter.ensure_newline()
                    self.live = True
                self.reporter.rewrite(self._fits(f"[ddtree] {text}"), erase=True)
            else:
                if now - self.last_line < self.INTERVAL_S:
                    return
                self._write(f"[ddtree] {text}")
            self.last_shown = now

    def clear(self) -> None:
        with self.lock, self._uncaptured():
            self._clear()

    def _clear(self) -> None:
        if self.live:
            self.reporter.rewrite("", erase=True)
            self.reporter.write("\r")
            self.live = False
            self.reporter.currentfspath = None  # the next result writes its file's name again

    def line(self, text: str) -> None:
        with self.lock, self._uncaptured():
            self._clear()
            self._write(text)

    def pytest_runtest_logreport(self, report: TestReport) -> None:
        """Registered as a plugin on xdist's main process: a result letter may now be on the line."""
        if report.when == "call" or not report.passed:
            self.mid_line = True

    def _write(self, text: str) -> None:
        if self.mid_line and not self.reporter.currentfspath:
            self.reporter.write("\n")  # a line of its own, after the letters so far
        self.mid_line = False
        self.reporter.write_line(text)
        self.last_line = time.monotonic()


def write_sections(reporter: Reporter, sections: Sequence[tuple[str, str]]) -> None:
    """The session's sections (verdict, sweep table, bill...) in pytest's terminal summary, each under
    its ``=`` rule, as pytest writes its own."""
    for title, text in sections:
        reporter.write_sep("=", title)
        for line in text.rstrip("\n").splitlines():
            reporter.write_line(line)


class Plugins(Protocol):
    """pytest's plugin manager, as the terminal side reads it (the terminal reporter, the capture
    manager) and registers the display with it."""

    def get_plugin(self, name: str) -> Any: ...

    def register(self, plugin: object, name: str | None = None) -> str | None: ...  # noqa: V107 (pytest's signature)


class SessionTerminal:
    """The main process's terminal side of a session, registered as a plugin: the short test
    summary's skip reasons where ddtree runs (``in_use``), the progress display, made once the
    process runs ddtree tests (none under ``-q -q``; none on an xdist worker, which has no terminal
    the user sees), and the relay of its workers' lines into it (report/relay.py), made with the
    first worker. pytest's terminal reporter and capture manager are looked up when needed: they
    are registered after this plugin's configure may run."""

    def __init__(self, plugins: Plugins, quiet: Callable[[], bool], in_use: Callable[[], bool], args: Sequence[str]) -> None:
        self._plugins = plugins
        self._quiet = quiet
        self._in_use = in_use
        self._args = args
        self.display: TerminalProgress | None = None
        self.relay: Relay | None = None
        self._relay_made = False

    def pytest_sessionstart(self) -> None:
        reporter = self._plugins.get_plugin("terminalreporter")
        if reporter is not None and self._in_use():
            reporter.reportchars = with_skip_reasons(reporter.reportchars, self._args)

    def show(self) -> TerminalProgress | None:
        if self.display is None and not self._quiet():
            reporter = self._plugins.get_plugin("terminalreporter")
            if reporter is not None:
                self.display = TerminalProgress(reporter, self._plugins.get_plugin("capturemanager"))
                progress.install(self.display)
        return self.display

    def channel(self, worker_id: str) -> str | None:
        """The worker's channel into the relay, for its workerinput; None where no progress is shown
        or the relay could not be made."""
        if not self._relay_made:
            display = self.show()
            if display is None:
                return None
            from pytest_ddtree.report.relay import start_relay

            self._relay_made = True
            self.relay = start_relay(display.line)
            if self.relay is not None:
                self._plugins.register(display, "ddtree-terminal-progress")  # it sees the result letters
        return self.relay.channel(worker_id) if self.relay is not None else None

    @hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        """The workers' last lines shown, before the session's summary: after xdist's own
        sessionfinish has torn the workers down (trylast), and before the terminal reporter's summary
        (its wrapper runs after). A Ctrl-C ends xdist's loop while the workers still stop their
        services, and what they say then ('slurm job 18 stopped: ...') comes after the loop."""
        self._stop_relay()

    def _stop_relay(self) -> None:
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.close()

    def start_live_page(self, session: DDTreeSession, nodeids: Sequence[str]) -> None:
        """report.html from the collected tests, rewritten after each config's last test (report/html/live.py)."""
        if session.live_report is None and session.setup_problem is None:
            from pytest_ddtree.report.html.live import start_live_report

            live = session.live_report = start_live_report(nodeids, [c.name for c in session.selected_configs], session.settings,
                                                           session.profile, session.failed_tests)
            if live is not None:
                self._plugins.register(live, "ddtree-live-report")

    def pytest_unconfigure(self) -> None:
        self.close()

    def close(self) -> None:
        """At pytest's unconfigure: the relay's thread ended, the display uninstalled."""
        self._stop_relay()
        if self.display is not None:
            progress.install(None)
            self.display = None


def with_skip_reasons(reportchars: str, args: Sequence[str]) -> str:
    """pytest's ``-r`` characters of a gate run. An inconclusive cell is a skip whose reason says what
    to do ("only 6 clean repeats of the 12 needed: rerun on a quieter machine or raise
    --ddtree-repeats"), so the short test summary shows skip reasons, unless the user chose the
    summary's contents (``-r`` in ``args``, the command line and addopts)."""
    chose = any(arg.startswith(("-r", "--report-chars")) for arg in args)
    return reportchars if chose or "s" in reportchars or "N" in reportchars else reportchars + "s"


def header_lines(session: DDTreeSession, in_use: bool, workers: object, args: Sequence[str]) -> list[str]:
    """pytest's header of a run that gates configs (``in_use``): the profile and how each config field
    reaches the service, the selected configs and those the build cannot run, the results folder,
    the session's predicted cost for ``workers`` (``-n``) and the pool's note."""
    if not in_use or session.setup_problem is not None:
        return []
    settings, profile = session.settings, session.profile
    names = ", ".join(c.name for c in session.selected_configs)
    left_out = session.selection.summary_lines()
    return [
        f"ddtree: service profile {profile.name} ({settings.url or settings.service}), controller {profile.controller}",
        *(f"ddtree:   {field}: {how}" for field, how in profile.how_fields_reach_the_service().items()),
        f"ddtree: configs {names}",
        *([f"ddtree: left out of the selection ({len(left_out)}), this build cannot run them as named:"]
          + [f"ddtree:   {line}" for line in left_out] if left_out else []),
        f"ddtree: results {settings.results}",
        *predicted_lines(profile, settings, session.cells, len(session.selected_configs), workers, args), *session.pool_lines(workers),
    ]


def predicted_lines(profile: ServiceProfile, settings: Settings, cells: Sequence[Cell], configs: int, processes: object,
                    paths: Sequence[str] = ()) -> list[str]:
    """The header's prediction for a session of the suites (``pytest suites``) of ``configs`` selected
    configs and the selected ``cells``, with ``profile``, ``settings`` and ``-n`` (``processes``;
    ``auto``: one process): how many launches it will take, by purpose (``records/bill.py predict``).
    The lossless gate's reference is counted where the run's ``paths`` name a folder (the suites) or its
    module (``test_lossless.py``): the header comes before the collection."""
    from pytest_ddtree.records.bill import END_LAUNCH_MIN_CONFIGS, predict

    relaunch = profile.capabilities.relaunch and not isinstance(profile.pool, tuple)
    control = relaunch and profile.control != "none" and (bool(profile.control) or profile.lossless_args is not None)
    bless = settings.update_baselines
    closed = [w for w in cells if w.open_loop is None and (profile.max_context is None or w.context_tokens <= profile.max_context)]
    launches = profile.bless_control_launches if bless else profile.control_launches
    plan = predict(configs=configs, processes=processes if isinstance(processes, int) else 1, control_launches=launches,
                   control_max_launches=launches if bless else profile.control_max_launches, control=control and bool(closed),
                   # the lossless gate launches its reference (gates/lossless.py launches_reference) in instance mode or a bless
                   lossless_reference=relaunch and (profile.lossless == "instance" or bless) and _runs_lossless(paths),
                   shared=not profile.control,
                   cells=len(closed), repeats=settings.repeats, end_launch_min_configs=END_LAUNCH_MIN_CONFIGS,
                   control_min_configs=profile.control_min_configs, control_cells=profile.control_cells,
                   judged=not settings.measure_only)
    return [f"ddtree: {plan.text()}"]


def _runs_lossless(paths: Sequence[str]) -> bool:
    """Whether a run of ``paths`` (pytest's arguments; none: the rootdir's tests) holds the lossless gate's tests."""
    import os

    names = [p.split("::")[0] for p in paths if not p.startswith("-")]
    return not names or any(os.path.isdir(p) or os.path.basename(p) == "test_lossless.py" for p in names)
