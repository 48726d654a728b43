"""The controller protocol: what every way of running a service implements and declares.

Very different ways of running a service (a child process, a systemd unit, a Slurm job, shell
templates, somebody else's server) sit behind this protocol, in the style of pytest-xdist's
scheduler protocol, so that the manager's logic - stop, wait for the GPU, start, wait until
ready, verify the applied config, cache failures - is written and tested once. Each way is one
module exporting a :class:`ControllerKind`: its name (the profile's ``controller:``), what it can
do as typed :class:`~pytest_ddtree.service.base.Capabilities`, the profile keys it owns and how it
makes its :class:`Controller`. The manager, the session and the package ask the capabilities or
call a hook, never the name (tests/test_codebase.py checks): adding a way of running a service
is one module plus its profile keys, registered in ``service/kinds.py``.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pytest_ddtree.records.launch_shapes import ControllerEntry
from pytest_ddtree.service.base import (
    STARTUP_LOG_LINES,
    Capabilities,
    ExitInfo,
    FailFn,
    KeyTypes,
    Launch,
    ProgressFn,
    Runner,
)

if TYPE_CHECKING:
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.service.ssh import LocalHost, SSHHost
    from pytest_ddtree.service.validated_profile import ServiceProfile


class Controller(abc.ABC):
    """Launches and stops one service instance; knows when it has died.

    ``start`` returns as soon as the launch was handed over (a process spawned, a restart queued),
    never after the model is loaded: readiness is the manager's job so that it can show progress,
    apply one deadline and notice a crash through ``failure()`` within a poll interval.

    The hooks with a default body are the protocol's optional parts: a controller overrides the
    ones its way of running needs (a scheduler's placement, a unit's take-over), the manager calls
    every one of them at its step and never asks which controller it holds.
    """

    kind: str = "abstract"
    """The profile's ``controller:`` name, for messages and the launch record."""
    unit_text: str | None = None
    """The service's unit file as found (``systemctl cat``) for the package; None: no unit."""

    def plan(self, launch: Launch, profile: ServiceProfile, config: DDTreeConfig | None, extra_args: str | None) -> Launch:
        """``launch`` (name, port, url, env and log path known) with what this controller runs:
        by default the profile's ``command`` rendered for ``config`` (None: the non-speculative
        reference with ``extra_args``)."""
        return dataclasses.replace(launch, command=profile.render_command(config, launch.port, extra_args=extra_args))

    def placed_on(self) -> str | None:
        """The node the ready launch runs on where the controller chose it (a scheduler's job), so
        results say which node measured; None: the profile's host says it (the default)."""
        return None

    def prepare(self) -> None:
        """Before the GPU-release wait of a launch: take the service over (systemd stops its unit,
        even its default config, so that its memory is released); nothing by default."""

    @abc.abstractmethod
    def start(self, launch: Launch) -> None:
        """Launch the service described by ``launch``; return once launched, not once ready."""

    def await_placement(self, launch: Launch, progress: ProgressFn | None, *, ready_timeout_s: float,
                        progress_interval: float = 10.0) -> Launch:
        """Wait until the launch has a place to run and return it with its final URL and port.

        Nothing to wait for where the place is known beforehand (the default); a batch job is
        placed by its scheduler (slurm.py), and its URL follows the node it got.
        """
        return launch

    @abc.abstractmethod
    def failure(self) -> ExitInfo | None:
        """Non-None once the launched service has exited or its unit has failed."""

    def answered_by_another(self) -> str | None:
        """Once the health path answers: why the answer is not the launched service's (a stranger on
        its port, who), or None: it is, or this controller cannot tell (the default)."""
        return None

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop what this controller started; safe to call twice or before start."""

    @abc.abstractmethod
    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the current launch's log."""

    def startup_log(self) -> str | None:
        """The current launch's log from its start, as far as the controller can read it (bounded),
        for the start-up lines that print the effective speculative values; None: no log here."""
        text = self.log_tail(STARTUP_LOG_LINES)
        return None if text.startswith("<") else text

    def restore_default(self) -> None:
        """Put the service back on the profile's default config (systemd); nothing for others."""

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human description (``process pid 123``, ``systemd unit x.service``)."""

    def launch_record(self) -> ControllerEntry:
        """Controller-specific details of the last launch for the repro package."""
        return {}

    def snapshot_runner(self, host: LocalHost | SSHHost) -> Runner | None:
        """Where the package's environment snapshot is taken: the ssh host the service ran on
        (the default), or None: this machine's own snapshot covers it."""
        return host if host.remote else None

    def close(self) -> None:
        """Release what the controller holds beyond the service (a client's connections) at
        session end, after ``stop`` and ``restore_default``; nothing by default."""


@dataclass(frozen=True)
class ControllerContext:
    """What a controller is made from: the profile (its instance's), where its commands run,
    where its logs go, and the tools and clients the manager was given."""

    profile: ServiceProfile
    host: LocalHost | SSHHost
    instance: int
    log_dir: Path
    progress: ProgressFn | None
    health_client: Callable[[str, float], Any]
    """A client for ``(url, timeout)`` with ``health(path)``: an adopted service's readiness."""
    systemctl: tuple[str, ...] = ("systemctl",)
    journalctl: tuple[str, ...] = ("journalctl",)


def _no_profile_check(raw: Mapping[str, Any], fail: FailFn) -> object:
    return None


@dataclass(frozen=True)
class ControllerKind:
    """One way of running a service, as its module exports it (``KIND``) and kinds.py registers it.

    ``profile_keys`` are the profile keys this controller owns (a key of another controller is
    refused); ``check_profile`` validates them (and what else this controller needs of a profile)
    and returns the parsed keys, kept as ``ServiceProfile.controller_keys``; ``make`` builds the
    controller of one manager.
    """

    name: str
    capabilities: Capabilities
    make: Callable[[ControllerContext], Controller]
    profile_keys: KeyTypes = field(default_factory=dict)
    check_profile: Callable[[Mapping[str, Any], FailFn], object] = _no_profile_check
    keys_meaning: str = "keys"
    """What the owned keys are, for the error when another controller's profile gives them."""
