"""Hooks a project implements, in its ``conftest.py`` or a plugin, to extend pytest-ddtree.

The plugin registers them with ``pluginmanager.add_hookspecs`` (``pytest_addhooks``), so pytest
checks an implementation's name and arguments as it does its own hooks'. The hooks'
specifications live here, and the relay (:class:`ProjectHooks`) through which the modules that do not
import pytest (the gates) call them where the thing happens: the plugin gives the session one over
its pytest config. The marker is pluggy's (pytest's own hook specs use it too), so this module does
not import pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    """The session's GPU bill, once, on the main process at the session end (after every worker's
    records arrived): results.json's ``bill``, i.e. ``launches``, ``restart_s`` (seconds from start
    to ready), ``measured_s``, ``gpu_s`` and ``by_purpose`` (configs, control, lossless reference,
    confirmations, relaunches, rate probes: each one's launches, restart seconds, repeats and
    measured seconds). A site forwards it to its own accounting (a GPU-hours dashboard, a CI
    annotation) without parsing results.json.
    """


@hookspec
def pytest_ddtree_cell_measured(config: pytest.Config, ddtree_config: str, cell: str, figures: dict[str, Any],
                                samples: dict[str, list[float]]) -> None:
    """A throughput cell's repeats are done (its confirmation run too, where it had one), before it
    is judged: ``ddtree_config`` names the config (``bs8_b8_k4``), ``cell`` the cell
    (``c1_ctx512``); ``figures`` are its bench_serving figures over the counted repeats (its
    throughput record's ``metrics``, as records-*.jsonl has them: ``output_throughput``,
    ``mean_ttft_ms``, ``accept_length``, ...), and
    ``samples`` each gated metric's counted repeat samples. Called in the process that measured the
    cell (an xdist worker under ``-n``), for each cell of a config the suite measures. A site streams
    the numbers to its own dashboard as they exist, without waiting for results.json.
    """


@hookspec
def pytest_ddtree_verdict(config: pytest.Config, ddtree_config: str | None, cell: str | None,
                          verdict: dict[str, Any]) -> None:
    """A verdict was made: a throughput cell's (``ddtree_config`` and ``cell`` name it; in the
    process that measured it) or the session's (both None; once, on the main process, at the session
    end). ``verdict["decision"]`` is what the gate does, ``pass``, ``fail``, ``skip`` or ``warn``
    (the session's: ``pass`` or ``fail``, as its exit status), and ``verdict["message"]`` says why
    (empty for a plain pass; the session's: its verdict line). A cell's also holds its verdict record (results.json's
    ``verdict``: ``status``, ``reasons``, each gated metric's change and tolerance); the session's
    ``failed_checks``, the session checks that failed (``control``, ``uniform-shift``, ...). A site
    pages someone, or annotates a pull request, on the verdict itself.
    """


class ProjectHooks:
    """The project's hooks as the session, its gates and its end call them: over a pytest config (the
    plugin's, given to the session), or over none (a script's session), when each call does nothing."""

    def __init__(self, config: pytest.Config | None = None) -> None:
        self._config = config

    def cell_measured(self, ddtree_config: str, cell: str, figures: Mapping[str, Any],
                      samples: Mapping[str, Sequence[float]]) -> None:
        if self._config is not None:
            self._config.hook.pytest_ddtree_cell_measured(config=self._config, ddtree_config=ddtree_config, cell=cell,
                                                          figures=dict(figures),
                                                          samples={k: list(v) for k, v in samples.items()})

    def hardware_profile(self, fingerprint: HardwareProfile) -> str | None:
        if self._config is None:
            return None
        named: str | None = self._config.hook.pytest_ddtree_hardware_profile(config=self._config, fingerprint=fingerprint)
        return named

    def session_bill(self, bill: dict[str, Any]) -> None:
        if self._config is not None:
            self._config.hook.pytest_ddtree_session_bill(config=self._config, bill=bill)

    def verdict(self, ddtree_config: str | None, cell: str | None, verdict: Mapping[str, Any]) -> None:
        if self._config is not None:
            self._config.hook.pytest_ddtree_verdict(config=self._config, ddtree_config=ddtree_config, cell=cell,
                                                    verdict=dict(verdict))
