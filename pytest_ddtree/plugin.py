"""pytest hooks and fixtures of pytest-ddtree: thin glue over the pytest-free modules.

What lives here is only what needs pytest: the hooks, the fixtures, and the few objects registered
as plugins whose hooks need pytest's markers. Each hands its work to the module whose job it is
(docs/architecture.md): options.py, session.py, selection.py, scheduling.py, finish.py and report/.

Imports of those modules are deferred into the hooks and fixtures that need them: pytest loads
this plugin into every run of every project in the environment, and a run that passes no
``--ddtree-*`` option and has no suites/ folder must not load yaml, requests, tabulate or
pynvml (``tests/test_codebase.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
DISPLAY_KEY: pytest.StashKey[TerminalProgress] = pytest.StashKey()
RELAY_KEY: pytest.StashKey[Relay | None] = pytest.StashKey()  # None: it could not be made
CONFIG_FIXTURE = "ddtree_config"


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _session(config: pytest.Config) -> DDTreeSession:
    return config.stash[SESSION_KEY]


def session_of(config: pytest.Config) -> DDTreeSession | None:
    """The ddtree session of a pytest run, for a suite's hooks (hooks get no fixtures): e.g. a
    ``pytest_generate_tests`` that parametrizes over the matrix. None before configure."""
    return config.stash.get(SESSION_KEY, None)


def _in_use(config: pytest.Config) -> bool:
    return options.in_use(config, _session(config).settings)


def _args_and_addopts(config: pytest.Config) -> list[str]:
    return [str(arg) for arg in (*config.invocation_params.args, *config.getini("addopts"))]


def _usage_error(problem: str | None) -> None:
    if problem is not None:
        raise pytest.UsageError(problem)


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
    run shows pytest-benchmark's table only when asked for (options.py); ``-n`` beyond the cores warns."""
    args = _args_and_addopts(config)
    if (config.pluginmanager.hasplugin("benchmark") and hasattr(config.option, "benchmark_quiet")
            and options.hides_benchmark_table(args) and options.gate_run(config)):
        config.option.benchmark_quiet = True
    workers = getattr(config.option, "numprocesses", None)
    if workers and not _is_xdist_worker(config) and options.gate_run(config):
        from pytest_ddtree.scheduling import workers_beyond_cores

        if (warning := workers_beyond_cores(workers)) is not None:
            config.issue_config_time_warning(pytest.PytestConfigWarning(warning), stacklevel=2)
    if not workers or getattr(config.option, "dist", "no") not in ("no", "load"):
        return
    # xdist turns "no" into "load" in its own (also tryfirst) hook; only an explicit --dist wins.
    if not any(arg.startswith("--dist") or arg == "-d" for arg in args):
        config.stash[SCHEDULE_BY_CONFIG_KEY] = True


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: SchedulerLog) -> ConfigScheduling | None:
    if not config.stash.get(SCHEDULE_BY_CONFIG_KEY, False):
        return None
    from pytest_ddtree.scheduling import ConfigScheduling, DeadHostWatcher, ssh_instances

    session = _session(config)
    scheduler = ConfigScheduling(config, log, progress=session.progress, instances=ssh_instances(session, _in_use(config)))
    config.pluginmanager.register(DeadHostWatcher(scheduler), "ddtree-dead-host-watcher")
    return scheduler


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ddtree: test of a DDTree config (parametrized over --ddtree-config)")
    from pytest_ddtree.hookspec import ProjectHooks
    from pytest_ddtree.report.relay import session_lines
    from pytest_ddtree.session import DDTreeSession, FailureCollector, process_settings

    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    try:
        settings = process_settings(lambda **given: options.resolve_settings(config, **given), worker, lambda note:
                                    config.issue_config_time_warning(pytest.PytestDeprecationWarning(note), stacklevel=2))
    except options.OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    lines = session_lines(worker, lambda: config.stash.get(DISPLAY_KEY, None), lambda: config.get_verbosity() <= -2)
    session = config.stash[SESSION_KEY] = DDTreeSession.of_process(settings, worker, lines)
    session.hooks = ProjectHooks(config)
    config.pluginmanager.register(FailureCollector(session), "ddtree-failure-collector")
    if worker is None:  # the controller: a usage error (exit 4) before anything starts
        from pytest_ddtree.scheduling import adaptive_problem

        _usage_error(adaptive_problem(settings.max_restarts, settings.priors, getattr(config.option, "numprocesses", None)))
        if settings.history is not None:
            from pytest_ddtree.report.changepoints import history_problem

            _usage_error(history_problem(settings.history, settings.history_check))
        _usage_error(session.usage_problem(_in_use(config)))
        config.pluginmanager.register(_LiveReportHooks(session), "ddtree-live-report")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: Any) -> None:
    """A worker restoring its service after Ctrl-C gets the time a restore may take (scheduling.py)."""
    session = config.stash.get(SESSION_KEY, None)
    nodes = getattr(config.pluginmanager.get_plugin("dsession"), "nodemanager", None)
    if session is None or nodes is None or not _in_use(config) or session.setup_problem is not None:
        return
    if session.profile.capabilities.relaunch:
        from pytest_ddtree.scheduling import allow_restores

        allow_restores(nodes, session.profile.stop_timeout_s)


def pytest_sessionstart(session: pytest.Session) -> None:
    ddtree = session.config.stash.get(SESSION_KEY, None)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if ddtree is not None and ddtree.is_main_process and _in_use(session.config) and reporter is not None:
        from pytest_ddtree.report.terminal import with_skip_reasons

        reporter.reportchars = with_skip_reasons(reporter.reportchars, _args_and_addopts(session.config))


def _show_progress(config: pytest.Config) -> None:
    """The progress display on the terminal of a process that runs ddtree tests (report/terminal.py)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or _is_xdist_worker(config) or config.get_verbosity() <= -2 or DISPLAY_KEY in config.stash:
        return
    from pytest_ddtree.report.terminal import show_progress

    config.stash[DISPLAY_KEY] = show_progress(reporter, config.pluginmanager.get_plugin("capturemanager"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerNode) -> None:
    """xdist main process -> worker: one results folder, session id and timestamp (session.py), and
    the channel of its progress lines (report/relay.py)."""
    from pytest_ddtree.report.relay import WORKER_PROGRESS_KEY
    from pytest_ddtree.session import worker_input

    session = _session(node.config)
    node.workerinput.update(worker_input(session.settings))
    relay = _relay(node.config, session)
    if relay is not None:
        node.workerinput[WORKER_PROGRESS_KEY] = relay.channel(node.workerinput["workerid"])


def _relay(config: pytest.Config, session: DDTreeSession) -> Relay | None:
    """The main process's relay of its workers' progress lines (report/relay.py), made with the
    first worker; none where no progress is shown (``-q -q``) or nothing of ddtree runs."""
    if RELAY_KEY in config.stash:
        return config.stash[RELAY_KEY]
    if not _in_use(config) or session.setup_problem is not None:
        return None
    _show_progress(config)
    display = config.stash.get(DISPLAY_KEY, None)
    if display is None:
        return None
    from pytest_ddtree.report.relay import start_relay

    relay = config.stash[RELAY_KEY] = start_relay(display.line)
    if relay is not None:
        config.pluginmanager.register(_RelayCloser(config), "ddtree-relay-closer")
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
    from pytest_ddtree.report.terminal import header_lines

    return header_lines(_session(config), _in_use(config), getattr(config.option, "numprocesses", None), config.args)


# -- parametrization and ordering --------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if CONFIG_FIXTURE not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    _usage_error(session.setup_problem)
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
    """Order by config (selection.py) and mark each test with its config's group.

    The default ``-n`` scheduling groups by config (scheduling.py); the ``xdist_group`` marker
    serves users who choose ``--dist loadgroup`` themselves. tryfirst: xdist's worker reads the
    markers in its own modifyitems hook.
    """
    configs = [_item_config(item) for item in items]
    if not any(configs):
        return
    from pytest_ddtree.selection import in_selection_order

    for item, cfg in zip(items, configs):
        if cfg is not None:
            item.add_marker(pytest.mark.ddtree)
            item.add_marker(pytest.mark.xdist_group(name=cfg.name))
    items[:] = [items[index] for index in in_selection_order(configs, _session(config).selected_configs)]


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
    """The config matrix and cells of suites/configs.yaml (or --ddtree-matrix)."""
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
            from pytest_ddtree.scheduling import HOST_UNREACHABLE_PROPERTY

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
    from pytest_ddtree.gates.throughput.cells import CellSetup

    session = ddtree_session
    launcher = launches.Launcher(session.manager, session.recorder, CellSetup.of(session.profile, session.settings, session.slo),
                                 session.baselines, session.worker_count)
    done, cells = launches.start(launcher, request.session.items)
    yield done
    if request.session.shouldstop or request.session.shouldfail:
        return
    launches.relaunch_flagged(launcher, request.session.items)
    if done == "measured" and launches.wants_end_launch(session.recorder.records):
        launches.measure_launches(launcher, cells, control.END)
    if done == "measured":
        launches.further_launches(launcher, cells)


@pytest.fixture
def ddtree_baselines(ddtree_service: RunningService, ddtree_session: DDTreeSession) -> BaselineStore:
    """The baseline store of this hardware profile (baselines/<hardware-profile>/<config>.yaml)."""
    return ddtree_session.baselines(ddtree_service.server_info)


# -- reporting and session end -----------------------------------------------------------------
class _LiveReportHooks:
    """Main process only: report.html at the start and after each config's last test (report/html/live.py)."""

    def __init__(self, session: DDTreeSession) -> None:
        self.session = session

    def _start(self, nodeids: Sequence[str]) -> None:
        if self.session.live_report is None and self.session.setup_problem is None:
            from pytest_ddtree.report.html.live import start_live_report

            start_live_report(self.session, nodeids)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._start([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: WorkerNode, ids: Sequence[str]) -> None:
        self._start(list(ids))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        live = self.session.live_report
        if live is not None and report.when == "teardown" and live.test_done(report.nodeid):
            live.write_running(self.session.failed_tests)


def _session_failure_reports(outcome: FinishOutcome) -> list[pytest.TestReport]:
    """Each session-level failure as a failed test report of its own (finish.py ``SessionFailure``)."""
    return [pytest.TestReport(**failure.report()) for failure in outcome.failures]


@pytest.hookimpl(tryfirst=True)  # before junitxml's sessionfinish writes the XML: it gets the session's failures too
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    ddtree = session.config.stash.get(SESSION_KEY, None)
    if ddtree is None:
        return
    try:
        ddtree.close()
    finally:
        if _is_xdist_worker(session.config):
            ddtree.hand_over(session.config.workeroutput)  # type: ignore[attr-defined]
        if ddtree.is_main_process and ddtree.results_dir.exists():
            _end_session(session, ddtree, int(exitstatus))


def _end_session(session: pytest.Session, ddtree: DDTreeSession, exitstatus: int) -> None:
    """The main process's session end (finish.py), folded into pytest's exit status and reports."""
    from pytest_ddtree.finish import end_session

    outcome = session.config.stash[FINISH_KEY] = end_session(ddtree, exitstatus)
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
    from pytest_ddtree.report.relay import WORKER_PROGRESS_KEY

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
