"""Shared fixtures of the plugin's own tests: pytester, repository paths, reference engines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from pytest_ddtree import progress
from tests import machine_share, xdist_turns
from tests.machine_share import register_run
from tests.sglang_lane import SpecModels, build_spec_models, sglang_python

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def no_session_progress_display() -> Iterator[None]:
    """The tests run with no progress display installed: the plugin of this very run installs one
    (its worker's channel under -n, the terminal's status line on a TTY), and a test or a class's
    fixture that drives the harness's waits in process and reads their progress lines would see them
    go to it instead (a wait leaves its periodic lines to a display that is showing). Session-scoped,
    so it is in place before any module's or class's fixture starts a service; put back at the end."""
    replaced = progress.install(None)
    yield
    progress.install(replaced)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def sglang_spec_models(tmp_path_factory: pytest.TempPathFactory) -> SpecModels:
    """The speculative lane's models with known acceptance (tests/sglang_lane.py), built once a
    session (a worker's, under xdist); skips, saying why, where the real-SGLang venv is absent."""
    python, why = sglang_python()
    if python is None:
        pytest.skip(why)
    return build_spec_models(tmp_path_factory.mktemp("spec-models"), python)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # xdist's main process (or a run without xdist)
        register_run()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that measure alone (``measurement_alone``) first, then the modules with the most
    slow tests, each kept whole and otherwise in file order.

    CI runs ``-n 2 --dist loadfile``: xdist hands out whole modules in this order
    (tests/xdist_turns.py keeps it), so a module of several minutes collected near the end
    (test_throughput_suite.py) would keep one worker busy long after the other had finished.
    Longest first is the classic remedy (LPT scheduling); the ``slow`` marks stand for the
    lengths. A module that measures alone goes first, while the other worker has plenty of other
    work to take beside it. The order is the same on every worker, as xdist requires.
    """
    slow_per_module: dict[str, int] = {}
    for item in items:
        slow_per_module.setdefault(item.nodeid.split("::")[0], 0)
        if item.get_closest_marker("slow"):
            slow_per_module[item.nodeid.split("::")[0]] += 1
    first_seen = {module: i for i, module in enumerate(slow_per_module)}
    alone = {module: xdist_turns.module_measures_alone(str(REPO / module)) for module in slow_per_module}
    items.sort(key=lambda item: (not alone[m := item.nodeid.split("::")[0]], -slow_per_module[m], first_seen[m]))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` in the order above; a module that measures alone has no timing-sensitive neighbour."""
    if config.getvalue("dist") != "loadfile":
        return None
    return xdist_turns.MeasurementTurnScheduling(config, log)


@pytest.fixture(scope="module")
def measurement_turn() -> Iterator[None]:
    """For timing-sensitive modules: raised CPU priority, and turns with other test runs on this
    machine while there are any (tests/machine_share.py says why)."""
    with machine_share.measurement_turn():
        yield


@pytest.fixture(scope="module")
def measurement_alone(measurement_turn: None) -> None:
    """For a timing-sensitive module judged against the committed baselines (the main job): what
    ``measurement_turn`` does, and within this run no other timing-sensitive module beside it
    (tests/xdist_turns.py reads this fixture's name from the module)."""
