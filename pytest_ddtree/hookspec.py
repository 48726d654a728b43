"""Hooks a project implements, in its ``conftest.py`` or a plugin, to extend pytest-ddtree.

The plugin registers them with ``pluginmanager.add_hookspecs`` (``pytest_addhooks``), so pytest
checks an implementation's name and arguments as it does its own hooks'. Only the hook's
specification lives here; the plugin calls it where the decision is made. The marker is
pluggy's (pytest's own hook specs use it too), so this module does not import pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import pytest

    from pytest_ddtree.service.fingerprint import HardwareProfile

hookspec = pluggy.HookspecMarker("pytest")


@hookspec(firstresult=True)
def pytest_ddtree_hardware_profile(config: pytest.Config, fingerprint: HardwareProfile) -> str | None:
    """The name of the baseline folder for the hardware this session measures on.

    Called once per process, at the first service start, with the fingerprint the harness
    took (``fingerprint.name`` is the folder it would use, already the profile's
    ``hardware_profile:`` where that key is set; ``fingerprint.details`` holds the setup it stands
    for: GPUs, model, tensor parallelism and the launch's setup flags; ``fingerprint.build`` the
    build found at that start: engine version, algorithm, drafter, driver). Return another name to file
    the baselines under it (made safe as a folder name), or None to keep the harness's; the
    first implementation that returns a name wins. Like pytest-benchmark's
    ``pytest_benchmark_generate_machine_info``: a site names its machines its own way (a rack,
    a cloud instance type), and identical hosts can share one folder.
    """


@hookspec
def pytest_ddtree_session_bill(config: pytest.Config, bill: dict[str, Any]) -> None:
    """The session's GPU bill, once, on the controller at the session end (after every worker's
    records arrived): results.json's ``bill``, i.e. ``launches``, ``restart_s`` (seconds from start
    to ready), ``measured_s``, ``gpu_s`` and ``by_purpose`` (configs, control, lossless reference,
    confirmations, relaunches, rate probes: each one's launches, restart seconds, repeats and
    measured seconds). A site forwards it to its own accounting (a GPU-hours dashboard, a CI
    annotation) without parsing results.json.
    """
