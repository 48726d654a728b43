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
    from pytest_ddtree.service.manager import RunningService
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.report.terminal import SessionTerminal
    from pytest_ddtree.session import DDTreeSession

SESSION_KEY: pytest.StashKey[DDTreeSession] = pytest.StashKey()
FINISH_KEY: pytest.StashKey[FinishOutcome] = pytest.StashKey()
SCHEDULE_BY_CONFIG_KEY = pytest.StashKey[bool]()
TERMINAL_KEY: pytest.StashKey[SessionTerminal] = pytest.StashKey()
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
    if workers:
        from pytest_ddtree.scheduling import schedules_by_config, workers_beyond_cores

        warning = workers_beyond_cores(workers) if not _is_xdist_worker(config) and options.gate_run(config) else None
        if warning is not None:
            config.issue_config_time_warning(pytest.PytestConfigWarning(warning), stacklevel=2)
        config.stash[SCHEDULE_BY_CONFIG_KEY] = schedules_by_config(workers, getattr(config.option, "dist", "no"), args)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ddtree: test of a DDTree config (parametrized over --ddtree-config)")
    from pytest_ddtree.hookspec import ProjectHooks
    from pytest_ddtree.report.relay import session_lines
    from pytest_ddtree.report.terminal import SessionTerminal
    from pytest_ddtree.session import DDTreeSession, FailureCollector, process_settings

    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    try:
        settings = process_settings(lambda **given: options.resolve_settings(config, **given), worker, lambda note:
                                    config.issue_config_time_warning(pytest.PytestDeprecationWarning(note), stacklevel=2))
    except options.OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    plugins = config.pluginmanager
    terminal = None if worker is not None else SessionTerminal(
        plugins, lambda: config.get_verbosity() <= -2, lambda: _in_use(config), _args_and_addopts(config))
    lines = session_lines(worker, lambda: terminal.display if terminal is not None else None, lambda: config.get_verbosity() <= -2)
    session = config.stash[SESSION_KEY] = DDTreeSession.of_process(settings, worker, lines)
    session.hooks = ProjectHooks(config)
    plugins.register(FailureCollector(session), "ddtree-failure-collector")
    if terminal is not None:  # the main process: a usage error (exit 4) before anything starts
        from pytest_ddtree.scheduling import adaptive_problem

        _usage_error(adaptive_problem(settings.max_restarts, settings.priors, getattr(config.option, "numprocesses", None)))
        if settings.history is not None:
            from pytest_ddtree.report.changepoints import history_problem

            _usage_error(history_problem(settings.history, settings.history_check))
        _usage_error(session.usage_problem(_in_use(config)))
        from pytest_ddtree.scheduling import Distribution

        config.stash[TERMINAL_KEY] = terminal
        plugins.register(terminal, "ddtree-terminal")
        plugins.register(Distribution(session, lambda: _in_use(config), config.stash.get(SCHEDULE_BY_CONFIG_KEY, False),
                                      terminal.channel, lambda ids: _start_live_page(config, session, ids), _item_config),
                         "ddtree-distribution")


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
    if ddtree is not None and ddtree.is_main_process:
        _start_live_page(session.config, ddtree, [item.nodeid for item in session.items])
    if ddtree is not None and any(name.startswith("ddtree_") for item in session.items for name in getattr(item, "fixturenames", ())):
        ddtree.start()
        if TERMINAL_KEY in session.config.stash:
            session.config.stash[TERMINAL_KEY].show()


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
        golden = ddtree_session.settings.update_baselines and ddtree_session.profile.lossless == "golden"
        return lossless.session_reference(ddtree_session.manager, ddtree_session.recorder, ddtree_session.settings.session_id,
                                          ddtree_session.baselines if golden else None)
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
    from pytest_ddtree.gates.throughput import launches
    from pytest_ddtree.gates.throughput.cells import CellSetup

    session = ddtree_session
    launcher = launches.Launcher(session.manager, session.recorder, CellSetup.of(session.profile, session.settings, session.slo),
                                 session.baselines, session.worker_count)
    done, cells = launches.start(launcher, request.session.items)
    yield done
    if not (request.session.shouldstop or request.session.shouldfail):
        launches.end_of_process(launcher, request.session.items, done, cells)


@pytest.fixture
def ddtree_baselines(ddtree_service: RunningService, ddtree_session: DDTreeSession) -> BaselineStore:
    """The baseline store of this hardware profile (baselines/<hardware-profile>/<config>.yaml)."""
    return ddtree_session.baselines(ddtree_service.server_info)


# -- reporting and session end -----------------------------------------------------------------
def _start_live_page(config: pytest.Config, ddtree: DDTreeSession, nodeids: Sequence[str]) -> None:
    """Main process: report.html at the start, rewritten after each config's last test (report/html/live.py)."""
    if ddtree.live_report is None and ddtree.setup_problem is None:
        from pytest_ddtree.report.html.live import start_live_report

        live = ddtree.live_report = start_live_report(nodeids, [c.name for c in ddtree.selected_configs], ddtree.settings,
                                                      ddtree.profile, ddtree.failed_tests)
        if live is not None:
            config.pluginmanager.register(live, "ddtree-live-report")


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
    from pytest_ddtree.report.relay import end_session_lines

    if TERMINAL_KEY in config.stash:
        config.stash[TERMINAL_KEY].close()
    end_session_lines(getattr(config, "workerinput", None))
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
