"""A new controller is one module plus its profile keys (service/base.py's protocol, service/kinds.py).

The controller below lives in this test only: it launches the reference engine detached (``setsid
... &``, its pid in a file named by its own profile key ``pid_file``), so the harness is not its
parent, and follows it by that pid. Registered, it runs end to end through the unchanged
manager: profile validation, launch, readiness, the applied-config proof, a relaunch on a config
switch, stop. Nothing outside this file knows its name.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest
import yaml

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service import kinds
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
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.manager import Clients, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ProfileError, ServiceProfile, parse_profile

REFERENCE = Path(__file__).resolve().parent.parent / "suites" / "services" / "reference.yaml"
NAME = "pidfile"


def _alive(pid: int) -> bool:
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
        if self.pid is None or _alive(self.pid):
            return None
        return ExitInfo(None, f"pid {self.pid} from {self.pid_file} is gone", self.log_tail())

    def stop(self) -> None:
        pid, self.pid = self.pid, None
        if pid is None or not _alive(pid):
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


@pytest.fixture
def registered() -> Iterator[ControllerKind]:
    kinds.register(KIND)
    try:
        yield KIND
    finally:
        kinds.unregister(NAME)


def _raw(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(REFERENCE.read_text())
    raw.update({"controller": NAME, "pid_file": str(tmp_path / "engine.pid"), **overrides})
    return raw


def test_a_registered_controller_runs_the_reference_engine_end_to_end(tmp_path: Path, registered: ControllerKind) -> None:
    profile: ServiceProfile = parse_profile(_raw(tmp_path))
    assert profile.capabilities is registered.capabilities and profile.controller_keys == tmp_path / "engine.pid"
    manager = ServiceManager(profile, Placement(0, tmp_path / "logs", tmp_path / "locks"), pacing=Pacing(poll_interval=0.1),
                             clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    pids: list[int] = []
    try:
        first = manager.ensure(parse_config_name("bs8_b8_k4"))
        assert first.proof is not None and not first.proof.failures, first.proof
        assert first.server_info["speculative_num_draft_tokens"] == 8
        out = first.client.generate(text="the controller protocol", sampling_params={"max_new_tokens": 8, "temperature": 0.0})
        assert out["meta_info"]["completion_tokens"] == 8, out
        pids.append(int((tmp_path / "engine.pid").read_text()))
        second = manager.ensure(parse_config_name("bs8_b12_k6"))  # a config switch: stop, relaunch
        pids.append(int((tmp_path / "engine.pid").read_text()))
        assert second.server_info["speculative_num_draft_tokens"] == 12
        assert pids[0] != pids[1] and not _alive(pids[0])
        assert [launch["controller"] for launch in manager.launches] == [NAME, NAME]
        assert manager.config_launches == 2 and all(launch["outcome"] == "ready" for launch in manager.launches)
        assert first.log_path is not None and first.log_path.parent == tmp_path / "logs"
    finally:
        problems = manager.close()
    assert problems == [] and not _alive(pids[-1])


def test_a_registered_controller_owns_its_profile_keys(tmp_path: Path, registered: ControllerKind) -> None:
    with pytest.raises(ProfileError, match="pid_file: the pidfile controller needs the file"):
        parse_profile(_raw(tmp_path, pid_file=""))
    process = {**_raw(tmp_path), "controller": "process"}
    with pytest.raises(ProfileError, match=r"pid_file: pid files belong to controller: pidfile \(this profile's controller is process\)"):
        parse_profile(process)
    with pytest.raises(ValueError, match="registered already"):
        kinds.register(dataclasses.replace(KIND))


def test_an_unregistered_controller_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"controller: must be one of process, systemd, external, command, slurm, got 'pidfile'"):
        parse_profile({key: value for key, value in _raw(tmp_path).items() if key != "pid_file"})
