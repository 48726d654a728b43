"""The ``command`` controller: drive any scheduler (kubectl, Slurm, a vendor CLI) by shell templates.

The harness does not need to know how a cluster starts a pod or a job, only four verbs: ``start``
(launch the config and return; readiness is the manager's), ``stop``, ``status`` (exit 0 while the
service runs or starts, non-zero once it failed; its output says why) and optionally ``logs``
(the log tail shown with a failure) and ``restore`` (put the default config back at session end;
without it, restore is ``stop``). Templates are ``str.format`` strings with ``{config_args}``,
``{config_env}``, ``{host}``, ``{port}``, ``{url}``, ``{name}``, ``{unit}``, ``{python}`` and the config's
fields (``{block_size}`` ``{budget}`` ``{topk}`` ``{window}``); a literal brace is ``{{``. They run
with ``sh -c``, on the profile's ``host`` over ssh when it has one, each with
``command_timeout_s``: a scheduler CLI that hangs fails the config instead of the sweep.

A start template must return once the launch is handed over. A template that backgrounds a
server locally is fine (output goes to files, not pipes, so its children cannot hold us); over ssh
the background process must redirect its output, or ssh waits for it.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import TYPE_CHECKING, Mapping

from pytest_ddtree.records.launch_shapes import ControllerEntry
from pytest_ddtree.service.base import (
    Capabilities,
    ExitInfo,
    GpuWait,
    Launch,
    LaunchFrom,
    ServiceError,
    ServiceStartError,
    without_health_polls,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind
from pytest_ddtree.service.ssh import Host, output_tail

if TYPE_CHECKING:
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.service.validated_profile import ServiceProfile

LOG_LINES = 40


def render_env(env: Mapping[str, str]) -> str:
    """``{config_env}``: shell-quoted ``KEY=value`` words, for ``env {config_env} cmd`` or ``kubectl set env``."""
    return " ".join(shlex.quote(f"{key}={value}") for key, value in sorted(env.items()))


class CommandController(Controller):
    """Runs the profile's start/stop/status/logs/restore templates (see the module docstring)."""

    kind = "command"

    def __init__(self, templates: Mapping[str, str], host: Host, *, command_timeout_s: float = 60.0) -> None:
        self.templates = dict(templates)
        self.host = host
        self.command_timeout_s = command_timeout_s
        self._launch: Launch | None = None
        self._values: dict[str, object] = {}
        self._running = False
        self._touched = False

    def render(self, verb: str, values: Mapping[str, object] | None = None) -> str:
        """The shell command of ``verb`` with the current launch's values."""
        data = {key: "" if value is None else value for key, value in (values if values is not None else self._values).items()}
        return self.templates[verb].format(**data).strip()

    @staticmethod
    def values_for(launch: Launch) -> dict[str, object]:
        values: dict[str, object] = {"config_args": "", "config_env": render_env(launch.env), "block_size": "",
                                     "budget": "", "topk": "", "window": "", "unit": "", "python": "", "host": ""}
        values.update(launch.fields)
        values.update({"port": "" if launch.port is None else launch.port, "url": launch.url, "name": launch.name})
        return values

    def plan(self, launch: Launch, profile: ServiceProfile, config: DDTreeConfig | None, extra_args: str | None) -> Launch:
        """The launch's template values and its rendered ``start`` (the launch record's command)."""
        planned = dataclasses.replace(launch, fields=template_fields(profile, config, extra_args))
        return dataclasses.replace(planned, command=self.render("start", self.values_for(planned)))

    def _run(self, verb: str) -> tuple[int, str, str]:
        command = self.render(verb)
        result = self.host.run_shell(command, timeout_s=self.command_timeout_s)
        return result.returncode, result.stdout, command

    def start(self, launch: Launch) -> None:
        self._launch = launch
        self._values = self.values_for(launch)
        self._touched = True
        code, output, command = self._run("start")
        if code != 0:
            raise ServiceStartError(
                f"the start command exited {code}",
                exit_code=code,
                log_tail=f"$ {command}\n{output.rstrip()}\n{self.log_tail()}",
                config_name=launch.name,
                hint="run the profile's start command by hand; it must launch the service and return",
            )
        self._running = True

    def failure(self) -> ExitInfo | None:
        if not self._running:
            return None
        code, output, command = self._run("status")
        if code == 0:
            return None
        return ExitInfo(code, f"status command `{command}` exited {code}: {output_tail(output, 3)}", self.log_tail())

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        code, output, command = self._run("stop")
        if code != 0:
            raise ServiceError(f"the stop command `{command}` exited {code}: {output_tail(output)}")

    def restore_default(self) -> None:
        """Run ``restore`` (the profile's default config back); without one, ``stop`` did it."""
        if not self._touched or "restore" not in self.templates:
            return
        self._touched = False
        values = dict(self._values)
        values.update({key: "" for key in ("config_args", "block_size", "budget", "topk", "window")})
        command = self.render("restore", values)
        result = self.host.run_shell(command, timeout_s=self.command_timeout_s)
        if result.returncode != 0:
            raise ServiceError(f"the restore command `{command}` exited {result.returncode}: {output_tail(result.stdout)}")

    def log_tail(self, n: int = LOG_LINES) -> str:
        if "logs" not in self.templates:
            return "<the profile has no logs command>"
        if not self._values:
            return "<not started>"
        try:
            code, output, command = self._run("logs")
        except ServiceError as exc:  # ssh down: the tail must not hide the real error
            return f"<no logs: {exc}>"
        lines = without_health_polls(output.rstrip().splitlines(), n)
        return lines if code == 0 else f"<logs command exited {code}>\n" + lines

    def describe(self) -> str:
        where = "" if self.host.name == "local" else f" on {self.host.name}"
        return f"command controller{where} ({self._launch.name if self._launch else 'not started'})"

    def launch_record(self) -> ControllerEntry:
        record: ControllerEntry = {"templates": dict(self.templates)}
        if self._values:
            record["commands"] = {verb: self.render(verb) for verb in self.templates if verb != "restore"}
        if self.host.name != "local":
            record["host"] = self.host.name
        return record


def template_fields(profile: ServiceProfile, config: DDTreeConfig | None, extra_args: str | None = None) -> dict[str, object]:
    """The templates' values for ``config`` (None with ``extra_args``: the non-speculative reference)."""
    fields: dict[str, object] = dict(config.field_values(profile.default_window)) if config is not None else {}
    args = profile.render_config_args(config) if config is not None else []
    config_args = " ".join(part for part in (shlex.join(args), extra_args or "") if part)
    fields.update(config_args=config_args, config_env=render_env(profile.render_env(config)),
                  host=profile.node, unit=profile.unit or "", python=shlex.quote(profile.launch_python))
    return fields


def _make(context: ControllerContext) -> Controller:
    fleet = context.profile.fleet
    return CommandController(fleet.commands, context.host, command_timeout_s=fleet.command_timeout_s)


KIND = ControllerKind(
    name="command",
    capabilities=Capabilities(launch=LaunchFrom.OWN_TEMPLATES, gpu_wait=GpuWait.SINCE_FIRST_LAUNCH, remote_hosts=True),
    make=_make,
)
"""``controller: command``: the profile's start/stop/status templates (fleet.py checks them)."""
