"""The ``systemd`` controller: reconfigure a unit through a drop-in and restart it.

Production deployments run SGLang as a unit (so it survives logouts and restarts on boot). The
harness must not edit the admin's unit file, so it writes one drop-in,
``<dropin_dir>/<unit>.d/ddtree.conf``, that replaces ``ExecStart`` with the config's command, and
removes it again at session end (``restore_default``), restarting the unit on its own default if
it was running when the session found it (a stopped unit stays stopped). The same restore runs on
SIGTERM (a cancelled CI job), see ``process.install_signal_handlers``.
State comes from ``systemctl show`` (ActiveState, SubState, ExecMainStatus, ExecMainPID) and the
log tail from ``journalctl -u``, the same places an operator would look. With a profile ``host``
all of it (systemctl, journalctl, the drop-in file) happens on that host over ssh (ssh.py).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_ddtree.records.launch_shapes import ControllerEntry
from pytest_ddtree.service.base import (
    POLL_LINES_FACTOR,
    STARTUP_LOG_LINES,
    Capabilities,
    ExitInfo,
    FailFn,
    GpuWait,
    Launch,
    LaunchFrom,
    ServiceError,
    describe_exit_code,
    without_health_polls,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind
from pytest_ddtree.service.ssh import COMMAND_NOT_FOUND_EXIT, Host, LocalHost, RemoteCommandError

DEFAULT_DROPIN_DIR = Path("/etc/systemd/system")
DROPIN_NAME = "ddtree.conf"
SHOW_PROPERTIES = ("ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainPID", "InvocationID")


class SystemctlError(ServiceError):
    """A systemctl/journalctl call failed (not installed, no permission, unknown unit)."""


def _quote_env(key: str, value: str) -> str:
    """One ``Environment=`` assignment, quoted the way systemd parses it."""
    assignment = f"{key}={value}"
    escaped = assignment.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def render_dropin(command: str, env: Mapping[str, str], note: str = "") -> str:
    """The drop-in text: an empty ``ExecStart=`` clears the unit's own, then ours.

    Percent signs are doubled because systemd expands ``%`` specifiers in ExecStart.
    """
    lines = ["# Written by pytest-ddtree; removed at the end of the test session."]
    if note:
        lines.append(f"# {note}")
    lines += ["[Service]", "ExecStart=", "ExecStart=" + command.replace("%", "%%")]
    for key, value in sorted(env.items()):
        lines.append("Environment=" + _quote_env(key, value).replace("%", "%%"))
    return "\n".join(lines) + "\n"


def parse_show(text: str) -> dict[str, str]:
    """``systemctl show`` output (``Key=Value`` lines) as a dict."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


class SystemdController(Controller):
    """Drives one unit with ``systemctl``; the commands are configurable for tests and sudo."""

    kind = "systemd"

    def __init__(
        self,
        unit: str,
        *,
        dropin_dir: Path | str | None = None,
        systemctl: Sequence[str] = ("systemctl",),
        journalctl: Sequence[str] = ("journalctl",),
        stop_timeout_s: float = 30.0,
        not_started_grace_s: float = 5.0,
        command_timeout_s: float = 60.0,
        host: Host | None = None,
    ) -> None:
        self.host: Host = host if host is not None else LocalHost(command_timeout_s)
        self.unit = unit
        self.dropin_dir = Path(dropin_dir) if dropin_dir else DEFAULT_DROPIN_DIR
        self.systemctl = list(systemctl)
        self.journalctl = list(journalctl)
        self.stop_timeout_s = stop_timeout_s
        self.not_started_grace_s = not_started_grace_s
        self.command_timeout_s = command_timeout_s
        self._launch: Launch | None = None
        self._dropin_text: str | None = None
        self._started_at: float | None = None
        self._seen_running = False
        self._touched = False  # whether we changed anything that restore_default must undo
        # What the admin had before we touched the unit: restore_default puts it back as found.
        self._was_active: bool | None = None
        self._previous_dropin: str | None = None
        self.unit_text: str | None = None
        """``systemctl cat`` of the unit as found (before our drop-in), for the repro package."""

    @property
    def dropin_path(self) -> Path:
        return self.dropin_dir / f"{self.unit}.d" / DROPIN_NAME

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            result = self.host.run(argv, timeout_s=self.command_timeout_s, privileged=True)
        except RemoteCommandError as exc:
            raise SystemctlError(str(exc)) from None
        if result.returncode == COMMAND_NOT_FOUND_EXIT:
            raise SystemctlError(
                f"cannot run {argv[0]!r} on {self.host.name}: not found on PATH; the systemd controller needs "
                "systemctl (use controller: process to run the command directly)"
            )
        if check and result.returncode != 0:
            raise SystemctlError(
                f"{shlex.join(argv)} on {self.host.name} failed with exit code {result.returncode}: "
                f"{(result.stderr or result.stdout).strip() or '<no output>'}\n"
                "what to do: check that the unit exists and that this user may manage it "
                "(e.g. a sudoers rule for systemctl, or run as root)"
            )
        return result

    def show(self) -> dict[str, str]:
        """The unit's current state properties."""
        result = self._run(self.systemctl + ["show", self.unit, "-p", ",".join(SHOW_PROPERTIES)])
        return parse_show(result.stdout)

    def _write_dropin(self, text: str) -> None:
        try:
            self.host.write_file(str(self.dropin_path), text)
        except RemoteCommandError as exc:
            raise SystemctlError(f"cannot write the drop-in: {exc}") from None

    def _remember_previous_state(self) -> None:
        """Before the first change: was the unit running, and was a drop-in of our name there?

        A unit that was stopped must stay stopped after the session (someone stopped it on
        purpose, e.g. to free the GPUs), and a drop-in we did not write must come back as it was.
        """
        if self._touched:
            return
        props = self.show()
        self._was_active = props.get("ActiveState", "") in ("active", "activating", "reloading")
        try:
            self._previous_dropin = self.host.read_file(str(self.dropin_path))
        except RemoteCommandError as exc:
            raise SystemctlError(f"cannot read the existing drop-in: {exc}") from None
        # Read where the unit runs (over ssh for a fleet host): the package must describe that
        # host's unit, and this machine may have none or another one of the same name.
        unit = self._run(self.systemctl + ["cat", "--no-pager", self.unit], check=False)
        self.unit_text = unit.stdout if unit.returncode == 0 and unit.stdout.strip() else None
        self._touched = True

    def start(self, launch: Launch) -> None:
        text = render_dropin(launch.command, launch.env, note=f"config {launch.name}")
        self._remember_previous_state()
        self._write_dropin(text)
        self._dropin_text = text
        self._launch = launch
        self._run(self.systemctl + ["daemon-reload"])
        # --no-block: readiness (with progress and one deadline) is the manager's job.
        self._run(self.systemctl + ["restart", "--no-block", self.unit])
        self._started_at = time.monotonic()
        self._seen_running = False

    def failure(self) -> ExitInfo | None:
        if self._started_at is None:
            return None
        props = self.show()
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        status = props.get("ExecMainStatus", "")
        code = int(status) if status.lstrip("-").isdigit() else None
        if active in ("active", "activating", "reloading") and sub != "auto-restart":
            self._seen_running = True
            return None
        failed = (
            active == "failed"
            or sub == "auto-restart"
            or (active == "inactive" and self._seen_running)
            or (active == "inactive" and time.monotonic() - self._started_at > self.not_started_grace_s)
        )
        if not failed:
            return None
        code_text = f", exit status {describe_exit_code(code)}" if code is not None else ""
        return ExitInfo(
            code,
            f"unit {self.unit} is {active}/{sub} (result {props.get('Result', '?')}{code_text})",
            self.log_tail(),
        )

    def prepare(self) -> None:
        """Take the unit over before the GPU-release wait (``take_over``)."""
        self.take_over()

    def take_over(self) -> None:
        """Stop the unit before our first start, so its GPU memory can be freed first.

        From here on ``restore_default`` owes the admin the unit as it was found.
        """
        self._remember_previous_state()
        self._run(self.systemctl + ["stop", self.unit], check=False)
        self._started_at = None

    def stop(self) -> None:
        if self._started_at is None and not self._touched:
            return
        self._run(self.systemctl + ["stop", self.unit], check=False)
        self._started_at = None

    def restore_default(self) -> None:
        """Put the unit back as it was found: the drop-in (ours removed, a previous one written
        back), reloaded, and running on the admin's own ExecStart only if it was running before;
        a unit that was stopped is left stopped."""
        if not self._touched:
            return
        if self._previous_dropin is not None:
            self._write_dropin(self._previous_dropin)
        else:
            try:
                self.host.remove_file(str(self.dropin_path))  # and its folder when no other drop-in is left
            except RemoteCommandError as exc:
                raise SystemctlError(f"cannot remove the drop-in: {exc}") from None
        self._run(self.systemctl + ["daemon-reload"])
        if self._was_active is False:
            self._run(self.systemctl + ["stop", self.unit], check=False)
        else:
            self._run(self.systemctl + ["restart", "--no-block", self.unit])
        self._touched = False
        self._dropin_text = None
        self._started_at = None

    def log_tail(self, n: int = 40) -> str:
        try:
            result = self._run(self.journalctl + ["-u", self.unit, "-n", str(n * POLL_LINES_FACTOR), "--no-pager"], check=False)
        except ServiceError as exc:  # also ssh failures: a log tail must never raise
            return f"<no journal: {exc}>"
        return without_health_polls((result.stdout or result.stderr).rstrip().splitlines(), n)

    def startup_log(self) -> str | None:
        """This run of the unit's journal only (``_SYSTEMD_INVOCATION_ID``, the run's
        ``InvocationID``, systemd >= 232): the unit's journal also holds earlier runs, whose
        start-up lines print another config's values, and with the current run's lines missing
        (a build that prints none, a rate-limited journal) the last of those would be taken as
        this launch's evidence. Without an invocation id there are no start-up lines to trust."""
        try:
            invocation = self.show().get("InvocationID", "")
        except ServiceError:
            return None
        if not re.fullmatch(r"[0-9a-f]{32}", invocation):
            return None
        try:
            result = self._run(self.journalctl + ["-u", self.unit, f"_SYSTEMD_INVOCATION_ID={invocation}",
                                                  "-n", str(STARTUP_LOG_LINES), "--no-pager"], check=False)
        except ServiceError:
            return None
        text = result.stdout if result.returncode == 0 else ""
        return text if text.strip() and not text.startswith("-- No entries --") else None

    def describe(self) -> str:
        where = "" if self.host.name == "local" else f" on {self.host.name}"
        return f"systemd unit {self.unit}{where} (drop-in {self.dropin_path})"

    def launch_record(self) -> ControllerEntry:
        record: ControllerEntry = {"unit": self.unit, "dropin_path": str(self.dropin_path), "dropin": self._dropin_text}
        if self.host.name != "local":
            record["host"] = self.host.name
        return record


def _check_profile(raw: Mapping[str, Any], fail: FailFn) -> object:
    if not raw.get("unit"):
        raise fail("unit", "the systemd controller needs the unit name, e.g. sglang-k26.service")
    return None


def _make(context: ControllerContext) -> Controller:
    p = context.profile
    assert p.unit is not None, "the systemd profile check guarantees a unit"
    return SystemdController(
        p.unit,
        dropin_dir=p.dropin_dir,
        systemctl=context.systemctl,
        journalctl=context.journalctl,
        stop_timeout_s=p.stop_timeout_s,
        command_timeout_s=p.fleet.command_timeout_s,
        host=context.host,
    )


KIND = ControllerKind(
    name="systemd",
    capabilities=Capabilities(launch=LaunchFrom.PROFILE_COMMAND, gpu_wait=GpuWait.DRIVER_ONLY, remote_hosts=True, unit=True),
    make=_make,
    check_profile=_check_profile,
)
"""``controller: systemd``: the profile's command as a drop-in of an existing unit (here or on a host)."""
