"""A controller kind of the tests' own (``pidfile``), outside the package: the proof that a new
controller is one module plus its profile keys (tests/test_controller_protocol.py registers it,
in its own process and, through a conftest, in a pytest session's).

It launches the profile's command detached (``setsid ... &``, the pid written to the file its own
profile key ``pid_file`` names), so the harness is not its parent, and follows it by that pid.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any, Mapping

from pytest_ddtree.service.base import (
    Capabilities,
    ExitInfo,
    FailFn,
    GpuWait,
    Launch,
    LaunchFrom,
    ServiceStartError,
    tail_file,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind

NAME = "pidfile"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: an exited process waiting to be reaped by its parent (init, which in
    a container may never do it) is a zombie, not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class PidFileController(Controller):
    """Starts the profile's command detached, remembers its pid from a file, kills its session."""

    kind = NAME

    def __init__(self, pid_file: Path, stop_timeout_s: float) -> None:
        self.pid_file = pid_file
        self.stop_timeout_s = stop_timeout_s
        self.pid: int | None = None
        self._launch: Launch | None = None

    def start(self, launch: Launch) -> None:
        assert launch.log_path is not None, "log_file capability: the manager names the log"
        self._launch = launch
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        script = 'setsid sh -c "exec $1" > "$2" 2>&1 < /dev/null & echo $! > "$3"'
        env = {**os.environ, **launch.env}
        done = subprocess.run(["sh", "-c", script, "sh", launch.command, str(launch.log_path), str(self.pid_file)],
                              env=env, timeout=30, check=False)
        if done.returncode != 0:
            raise ServiceStartError(f"the launcher exited {done.returncode}", exit_code=done.returncode, config_name=launch.name)
        self.pid = int(self.pid_file.read_text())

    def failure(self) -> ExitInfo | None:
        if self.pid is None or alive(self.pid):
            return None
        return ExitInfo(None, f"pid {self.pid} from {self.pid_file} is gone", self.log_tail())

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is None or not alive(pid):
            return
        fd = os.pidfd_open(pid)  # waits for the exit of a process that is not our child, without polling
        try:
            os.killpg(pid, signal.SIGTERM)
            if not select.select([fd], [], [], self.stop_timeout_s)[0]:
                os.killpg(pid, signal.SIGKILL)
                select.select([fd], [], [], self.stop_timeout_s)
        finally:
            os.close(fd)

    def log_tail(self, n: int = 40) -> str:
        return tail_file(self._launch.log_path if self._launch is not None else None, n)

    def describe(self) -> str:
        return f"{NAME} controller pid {self.pid}"


def _check_profile(raw: Mapping[str, Any], fail: FailFn) -> object:
    if not raw.get("pid_file"):
        raise fail("pid_file", "the pidfile controller needs the file its launcher writes the pid to")
    return Path(str(raw["pid_file"]))


def _make(context: ControllerContext) -> Controller:
    pid_file = context.profile.controller_keys
    assert isinstance(pid_file, Path)
    return PidFileController(pid_file, context.profile.stop_timeout_s)


KIND = ControllerKind(
    name=NAME,
    capabilities=Capabilities(launch=LaunchFrom.PROFILE_COMMAND, gpu_wait=GpuWait.NONE, log_file=True),
    make=_make,
    profile_keys={"pid_file": (str, False)},
    check_profile=_check_profile,
    keys_meaning="pid files",
)
