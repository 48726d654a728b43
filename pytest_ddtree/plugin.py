"""pytest hooks and fixtures of pytest-ddtree, each handing its work to the module whose job it is
(docs/architecture.md); the main process's own hooks are objects it registers (scheduling.Distribution,
report/terminal.SessionTerminal, finish.SessionEnd). Imports are deferred: pytest loads this plugin into
every run of every project in the environment, which must not load yaml, requests, tabulate or pynvml
unless it gates (``tests/test_codebase.py`` checks it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest

from pytest_ddtree import options

if TYPE_CHECKING:  # the fixtures' types, for annotations only (see the module docstring)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.measure.matrix import Matrix
    from pytest_ddtree.gates.lossless import Reference
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import RunningService
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.report.terminal import SessionTerminal
    from pytest_ddtree.session import DDTreeSession

SESSION_KEY: pytest.StashKey[DDTreeSession] = pytest.StashKey()
SCHEDULE_BY_CONFIG_KEY = pytest.StashKey[bool]()
TERMINAL_KEY: pytest.StashKey[SessionTerminal] = pytest.StashKey()


def _session(config: pytest.Config) -> DDTreeSession:
    return config.stash[SESSION_KEY]


def session_of(config: pytest.Config) -> DDTreeSession | None:
    """The ddtree session of a pytest run, for a suite's hooks (hooks get no fixtures): e.g. a
    ``pytest_generate_tests`` that parametrizes over the matrix. None before configure."""
    return config.stash.get(SESSION_KEY, None)


def _in_use(config: pytest.Config) -> bool:
    return options.in_use(config, _session(config).settings)


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
    """``-n`` without ``--dist`` schedules by config (scheduling.py), beyond the cores warns; a gate run hides pytest-benchmark's table unless asked."""
    args, workers = options.args_and_addopts(config), getattr(config.option, "numprocesses", None)
    if hasattr(config.option, "benchmark_quiet") and options.hides_benchmark_table(args) and options.gate_run(config):
        config.option.benchmark_quiet = True
    if workers:
        from pytest_ddtree.scheduling import schedules_by_config, workers_beyond_cores

        if not hasattr(config, "workerinput") and options.gate_run(config) and (warning := workers_beyond_cores(workers)):
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
        plugins, lambda: config.get_verbosity() <= -2, lambda: _in_use(config), options.args_and_addopts(config))
    lines = session_lines(worker, lambda: terminal.display if terminal is not None else None, lambda: config.get_verbosity() <= -2)
    session = config.stash[SESSION_KEY] = DDTreeSession.of_process(settings, worker, lines)
    session.hooks = ProjectHooks(config)
    plugins.register(FailureCollector(session), "ddtree-failure-collector")
    if terminal is not None:  # the main process: a usage error (exit 4) before anything starts
        from pytest_ddtree.report.changepoints import history_problem
        from pytest_ddtree.scheduling import Distribution, adaptive_problem

        _usage_error(adaptive_problem(settings.max_restarts, settings.priors, getattr(config.option, "numprocesses", None)))
        _usage_error(history_problem(settings.history, settings.history_check) if settings.history is not None else None)
        _usage_error(session.usage_problem(_in_use(config)))
        config.stash[TERMINAL_KEY] = terminal
        plugins.register(terminal, "ddtree-terminal")
        plugins.register(Distribution(session, lambda: _in_use(config), config.stash.get(SCHEDULE_BY_CONFIG_KEY, False),
                                      terminal.channel, lambda ids: terminal.start_live_page(session, ids)),
                         "ddtree-distribution")


def pytest_report_header(config: pytest.Config) -> list[str]:
    from pytest_ddtree.report.terminal import header_lines

    return header_lines(_session(config), _in_use(config), getattr(config.option, "numprocesses", None), config.args)


# -- parametrization and ordering --------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    from pytest_ddtree.configs import CONFIG_FIXTURE

    if CONFIG_FIXTURE not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    _usage_error(session.setup_problem)
    configs = session.selected_configs
    # scope="session": pytest then groups tests by config, so each config is started once.
    metafunc.parametrize(CONFIG_FIXTURE, configs, ids=[c.name for c in configs], scope="session")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A process that collected a test of the plugin's fixtures starts its ddtree session; other runs write nothing."""
    ddtree, terminal = session.config.stash.get(SESSION_KEY, None), session.config.stash.get(TERMINAL_KEY, None)
    if ddtree is not None and terminal is not None:  # the main process
        terminal.start_live_page(ddtree, [item.nodeid for item in session.items])
    if ddtree is not None and any(name.startswith("ddtree_") for item in session.items for name in getattr(item, "fixturenames", ())):
        ddtree.start()
        if terminal is not None:
            terminal.show()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order by config (selection.py); the ``xdist_group`` marker serves users who choose ``--dist
    loadgroup`` themselves. tryfirst: xdist's worker reads the markers in its own modifyitems hook."""
    from pytest_ddtree.configs import item_config

    configs = [item_config(item) for item in items]
    if not any(configs):
        return
    from pytest_ddtree.selection import in_selection_order  # after the return: it loads yaml

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
    """The service running ``ddtree_config``: restarted if needed, healthy, config verified; else every test
    of that config fails (or skips) with the reason (service/manager.py ``Refusal``), and the next starts fresh."""
    from pytest_ddtree.scheduling import HOST_UNREACHABLE_PROPERTY
    from pytest_ddtree.service.manager import Refusal

    _plain_launches_first(request)
    started = ddtree_session.manager.ensure_for_tests(ddtree_config)
    if not isinstance(started, Refusal):
        return started
    if started.unreachable_host is not None:
        request.node.user_properties.append((HOST_UNREACHABLE_PROPERTY, started.unreachable_host))
    if started.skipped:
        pytest.skip(started.message)
    pytest.fail(started.message, pytrace=False)


def _plain_launches_first(request: pytest.FixtureRequest) -> None:
    """The plain server's fixtures before the process's first config: else it is relaunched after each (two restarts)."""
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
    """The lossless gate's non-speculative reference, once per process (gates/lossless.py ``session_reference``)."""
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
    """The lossless gate's launched reference where this session launches one, else None (golden transcripts read)."""
    from pytest_ddtree.gates.lossless import launches_reference

    launched = launches_reference(ddtree_session.profile, ddtree_session.settings)
    return cast("Reference", request.getfixturevalue("ddtree_lossless_reference")) if launched else None


@pytest.fixture(scope="session")
def ddtree_control(request: pytest.FixtureRequest, ddtree_session: DDTreeSession) -> Iterator[str]:
    """The throughput gate's control (gates/throughput/launches.py), measured in each process before its first
    config; yields ``measured``, ``unavailable`` or ``off``. At the process's end, unless the run was stopped:
    the flagged configs relaunched and the control's end launches (``launches.end_of_process``)."""
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


@pytest.hookimpl(tryfirst=True)  # before junitxml's sessionfinish writes the XML: it gets the session's failures too
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A worker hands its records over; the main process, where a session started, ends it (finish.SessionEnd)."""
    ddtree = session.config.stash.get(SESSION_KEY, None)
    if ddtree is not None:
        try:
            ddtree.close()
        finally:
            if hasattr(session.config, "workerinput"):
                ddtree.hand_over(session.config.workeroutput)  # type: ignore[attr-defined]
            elif ddtree.results_dir.exists():
                from pytest_ddtree.finish import SessionEnd

                SessionEnd(ddtree, pytest.TestReport, pytest.ExitCode.TESTS_FAILED).end(session, int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    from pytest_ddtree.report.relay import end_session_lines

    end_session_lines(getattr(config, "workerinput", None))
    ddtree = config.stash.get(SESSION_KEY, None)
    if ddtree is not None:
        ddtree.close()
