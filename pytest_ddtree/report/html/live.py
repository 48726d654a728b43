"""The page of a running session: rewritten at start and each time a config's last test ends.

Why count tests per config: a sweep is hours of restarts, so "config k of n, ETA" is what a
person watching it wants, and the only moment the page can say something new about a config
is when all of that config's tests are done. The main process sees every test report (from
itself or, under xdist, from the workers) and knows the plan from collection, so it counts;
the page is built from the records every worker has appended so far, so what it shows is what
is on disk, never a guess.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_ddtree.report.html import HEARTBEAT_S, REPORT_HTML, LiveStatus, payload_from_records, write_report
from pytest_ddtree.report.html.model import config_of_nodeid
from pytest_ddtree.records.recorder import read_records

if TYPE_CHECKING:
    from pytest_ddtree.options import Settings
    from pytest_ddtree.service.profile import ServiceProfile


class Finished(Protocol):
    """What the page reads of pytest's ``TestReport``."""

    @property
    def nodeid(self) -> str: ...

    @property
    def when(self) -> str: ...


class LiveReport:
    """Progress of one session and the page that shows it (main process only)."""

    def __init__(self, results_dir: Path, configs: Sequence[str], environment: Mapping[str, Any] | None = None,
                 started_at: float | None = None) -> None:
        self.path = results_dir / REPORT_HTML
        self.results_dir = results_dir
        self.configs = list(configs)
        self.environment = dict(environment or {})
        self.started_at = started_at if started_at is not None else time.time()
        self._planned: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()
        self._done: list[str] = []
        self._lock = threading.Lock()
        self.errors: list[str] = []
        self._heartbeat: Heartbeat | None = None
        #: --ddtree-measure-only: the records do not say it, and the page must not call the session "pass"
        self.measure_only = False
        #: The session's failed tests so far (the plugin's collector appends to it), for each rewrite.
        self.failed_tests: Sequence[Mapping[str, str]] = ()

    def plan(self, nodeids: Iterable[str]) -> None:
        """The collected tests (once; under xdist every worker collects the same list)."""
        with self._lock:
            if not self._planned:
                self._planned = Counter(c for n in nodeids if (c := config_of_nodeid(n, self.configs)))

    def test_done(self, nodeid: str) -> bool:
        """Count a finished test; True when it was its config's last one (the page is due)."""
        with self._lock:
            config = config_of_nodeid(nodeid, self.configs)
            if config is None:
                return False
            self._reported[config] += 1
            if config not in self._done and self._planned.get(config) and self._reported[config] >= self._planned[config]:
                self._done.append(config)
                return True
            return False

    def status(self, state: str = "running") -> LiveStatus:
        with self._lock:
            planned = [c for c in self.configs if self._planned.get(c)] if self._planned else list(self.configs)
            done = len(self._done)
            total = len(planned)
            now = time.time()
            eta = self.started_at + (now - self.started_at) / done * total if state == "running" and done else None
            current = [c for c in self.configs if self._reported[c] and c not in self._done]
            return LiveStatus(state=state, done=done, total=total, started_at=self.started_at, eta=eta,
                              current=current if state == "running" else [], planned=planned, updated_at=now)

    def pytest_runtest_logreport(self, report: Finished) -> None:
        """Registered as a plugin on the main process once started: it sees every test's report (the
        workers' too), and a config's last one makes the page due."""
        if report.when == "teardown" and self.test_done(report.nodeid):
            self.write_running(self.failed_tests)

    def write_running(self, failed_tests: Sequence[Mapping[str, str]] = ()) -> None:
        """Rewrite the page from the records on disk; a failure is kept for the summary, never raised."""
        try:
            self.results_dir.mkdir(parents=True, exist_ok=True)
            payload = payload_from_records(read_records(self.results_dir), failed_tests, self.environment)
            payload["measure_only"] = self.measure_only
            write_report(self.path, payload, self.status("running"))
        except Exception as exc:  # noqa: BLE001 - the live page must never break the session
            self.errors.append(f"live report.html not written: {type(exc).__name__}: {exc}")

    def write_final(self, payload: Mapping[str, Any]) -> Path:
        self.stop_heartbeat()
        return write_report(self.path, payload, self.status("finished"))

    def start_heartbeat(self, interval_s: float = HEARTBEAT_S) -> None:
        """Touch the running page every ``interval_s`` from now on (see :class:`Heartbeat`)."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self.path, interval_s)
            self._heartbeat.start()

    def stop_heartbeat(self) -> None:
        beat, self._heartbeat = self._heartbeat, None
        if beat is not None:
            beat.stop()


class Heartbeat(threading.Thread):
    """Touches the running page's modification time every ``interval_s`` while this process lives.

    Why: the page is rewritten only when a config's last test ends (an hour apart on a GPU sweep),
    so its content cannot tell a slow session from a dead one; its modification time can, and
    the page's own script reads it (``document.lastModified``) to stop reloading and say that
    the session stopped once no process has touched it for ``STALE_S``. A daemon thread: it dies
    with the process, which is the point.
    """

    def __init__(self, path: Path, interval_s: float) -> None:
        super().__init__(name="ddtree-report-heartbeat", daemon=True)
        self.path = path
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                os.utime(self.path)
            except OSError:
                pass  # not written yet, or its folder went away: the next beat tries again

    def stop(self) -> None:
        self._stop_event.set()


def start_live_report(nodeids: Sequence[str], configs: Sequence[str], settings: Settings, profile: ServiceProfile,
                      failed_tests: Sequence[Mapping[str, str]]) -> LiveReport | None:
    """The main process's page from the collected tests (``nodeids``), where they hold a test of one of
    the selected ``configs`` (the project's other tests get no page, and no folder: None): the
    environment recorded once (the session's ``profile``, its results folder) and the first page
    written ("running: config 0 of n"); ``failed_tests`` is the session's list, which grows as tests fail."""
    from pytest_ddtree.configs import config_in_nodeid
    from pytest_ddtree.report.html import collect_environment

    if not any(config_in_nodeid(nodeid) in configs for nodeid in nodeids):
        return None
    live = LiveReport(settings.results, configs)
    live.plan(nodeids)
    if not live.status().total:
        return None
    live.measure_only = settings.measure_only
    live.failed_tests = failed_tests
    try:
        live.environment = collect_environment(
            f"{profile.name} ({settings.url or settings.service}), controller {profile.controller}", live.configs, live.results_dir)
    except Exception as exc:  # noqa: BLE001 - a fact we could not read must not stop the session
        live.environment = {"environment": f"not recorded ({type(exc).__name__}: {exc})"}
    live.write_running(failed_tests)
    live.start_heartbeat()
    return live
