"""Shared fixtures of the plugin's own tests: pytester, repository paths, reference engines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests import machine_share
from tests.machine_share import register_run

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        register_run()


@pytest.fixture(scope="module")
def measurement_turn() -> Iterator[None]:
    """For timing-sensitive modules: raised CPU priority, and turns with other test runs on this
    machine while there are any (tests/machine_share.py says why)."""
    with machine_share.measurement_turn():
        yield
