"""The command controller passes the process controller's lifecycle tests, driven by shell templates.

The templates launch the same stand-in server as test_service.py, in their own session (setsid),
the way a user's wrapper around a scheduler CLI would: ``start`` backgrounds it and returns,
``status`` reports its exit code once it is gone, ``stop`` signals its process group, ``logs``
tails its log, ``restore`` records that it ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.service.base import AppliedConfigMismatch, AppliedDiff, ServiceError, ServiceStartError
from pytest_ddtree.service.manager import ServiceManager
from pytest_ddtree.service.profile import ProfileError, parse_profile
from tests.service_helpers import APPLIED, BS8_B8_K4, BS8_B12_K6, CONFIG_ARGS, command_profile, failed_start, make_manager, pid_alive


def _group_alive(work: Path) -> bool:
    return pid_alive(int((work / "pid").read_text()))


@pytest.fixture
def closing() -> Any:
    made: list[ServiceManager] = []
    yield made
    for manager in made:
        manager.close()


def test_start_readiness_applied_reuse_and_switch(tmp_path: Path, closing: list[ServiceManager]) -> None:
    work = tmp_path / "svc"
    lines: list[str] = []
    manager = make_manager(command_profile(work, "--listen-delay 0.5 --load-seconds 0.5"), tmp_path, lines)
    closing.append(manager)
    service = manager.ensure(BS8_B8_K4)
    assert service.server_info["speculative_eagle_topk"] == 4
    assert "connection refused" in "\n".join(lines) or "HTTP 503" in "\n".join(lines)
    assert manager.ensure(BS8_B8_K4) is service  # same config: no restart
    first_pid = service.server_info["pid"]
    assert isinstance(first_pid, int)
    record = manager.launches[0]
    assert record["controller"] == "command" and "--speculative-eagle-topk 4" in (record["command"] or "")
    assert record["commands"]["stop"].startswith("g=$(cat ")
    switched = manager.ensure(BS8_B12_K6)
    assert switched.server_info["speculative_num_draft_tokens"] == 12
    assert not pid_alive(first_pid)
    # The config's fields and {config_env} reached the template.
    assert (work / "starts").read_text().splitlines() == ["bs8_b8_k4 8 8 4 2048 SGLANG_X=1", "bs8_b12_k6 8 12 6 2048 SGLANG_X=1"]


def test_a_service_that_never_gets_ready_shows_its_logs_without_the_harness_polls(tmp_path: Path) -> None:
    """The logs template's output of a service still loading is mostly the harness's own /health_generate
    polls (the service's 503 answers): they are left out, with how many."""
    msg = failed_start(make_manager(command_profile(tmp_path / "svc", "--load-seconds 600"), tmp_path, ready_timeout_s=3),
                       BS8_B8_K4)
    assert "not ready after 3 s" in msg and "HTTP 503" in msg, msg
    assert "access lines of the harness's own health polls left out" in msg and '"GET /health' not in msg, msg
    assert "standin: listening" in msg, msg


def test_crash_on_start_reported_fast_with_exit_code_and_log(tmp_path: Path, closing: list[ServiceManager]) -> None:
    manager = make_manager(command_profile(tmp_path / "svc", "--fault crash-on-start"), tmp_path)
    closing.append(manager)
    with pytest.raises(ServiceStartError) as info:
        manager.ensure(BS8_B8_K4)
    message = str(info.value)
    # the status template's exit ended the wait, not the readiness deadline ("not ready after")
    assert "exited while starting" in message and "not ready after" not in message, message
    assert info.value.exit_code == 3 and "service exited with code 3" in message
    assert "simulated crash while loading weights" in message  # the logs template's tail
    with pytest.raises(ServiceStartError) as again:
        manager.ensure(BS8_B8_K4)
    assert again.value is info.value and len(manager.launches) == 1


def test_ignored_config_fails_the_applied_check(tmp_path: Path, closing: list[ServiceManager]) -> None:
    manager = make_manager(command_profile(tmp_path / "svc", "--fault ignore-config=topk"), tmp_path)
    closing.append(manager)
    with pytest.raises(AppliedConfigMismatch) as info:
        manager.ensure(BS8_B8_K4)
    assert info.value.diffs == [AppliedDiff("speculative_eagle_topk", 4, 1)]
    assert not _group_alive(tmp_path / "svc")  # the wrong service was stopped


def test_close_stops_and_restores(tmp_path: Path) -> None:
    work = tmp_path / "svc"
    manager = make_manager(command_profile(work), tmp_path)
    service = manager.ensure(BS8_B8_K4)
    assert _group_alive(work)
    assert manager.close() == []
    pid = service.server_info["pid"]
    assert isinstance(pid, int) and not pid_alive(pid) and not _group_alive(work)
    assert (work / "restores").read_text() == f"restore [] {service.url}\n"  # no config args on restore
    assert manager.close() == []  # twice is fine


def test_start_command_failure_and_timeout(tmp_path: Path, closing: list[ServiceManager]) -> None:
    failing = make_manager(command_profile(tmp_path / "a", start="echo 'kubectl: no such deployment' >&2; exit 7"), tmp_path)
    closing.append(failing)
    with pytest.raises(ServiceStartError) as info:
        failing.ensure(BS8_B8_K4)
    assert info.value.exit_code == 7 and "kubectl: no such deployment" in str(info.value)
    pid_file = tmp_path / "hanging.pid"
    hanging = make_manager(command_profile(tmp_path / "b", start=f"echo $$ > {pid_file}; exec sleep 60", command_timeout_s=1), tmp_path)
    closing.append(hanging)
    with pytest.raises(ServiceError, match=r"did not finish within 1 s \(killed\)"):  # the command's deadline
        hanging.ensure(BS8_B8_K4)
    assert not pid_alive(int(pid_file.read_text()))  # killed at its deadline, not left sleeping


def test_profile_errors_name_the_template() -> None:
    base = {"name": "c", "controller": "command", "url": "http://127.0.0.1:{port}", "port": 30000, "config_args": {}}
    with pytest.raises(ProfileError, match="status: the command controller needs start, stop and status"):
        parse_profile({**base, "start": "x", "stop": "y"})
    with pytest.raises(ProfileError, match=r"start: unknown placeholder\(s\) \['budgett'\]"):
        parse_profile({**base, "start": "x {budgett}", "stop": "y", "status": "z"})
    with pytest.raises(ProfileError, match="start: command templates belong to controller: command"):
        parse_profile({**base, "controller": "process", "command": "x {config_args} {port}", "start": "x"})


def test_the_docs_fleet_and_kubectl_examples_are_valid_profiles(repo_root: Path) -> None:
    """The fleet and Kubernetes pages' examples parse as profiles and render the commands they promise."""
    import re

    import yaml

    from pytest_ddtree.service.command import CommandController
    from pytest_ddtree.service.ssh import LocalHost

    text = "".join((repo_root / "docs" / "fleet" / page).read_text() for page in ("ssh.md", "kubernetes.md"))
    blocks = dict(re.findall(r"```yaml\nname: (k26-fleet|k26-k8s)\n(.*?)```", text, re.S))
    assert set(blocks) == {"k26-fleet", "k26-k8s"}
    profiles = {}
    for name, body in blocks.items():
        raw = yaml.safe_load(f"name: {name}\n" + body.replace("{...}", "{}"))
        raw.update(config_args=CONFIG_ARGS, applied=APPLIED)
        profiles[name] = parse_profile(raw)
    fleet = profiles["k26-fleet"]
    third_port = fleet.for_instance(2).port
    assert isinstance(third_port, int)
    assert fleet.pool_size == 3 and fleet.for_instance(2).render_url(third_port) == "http://10.0.0.3:30001"
    assert fleet.for_instance(1).render_url(30000) == "http://gpu-node-2:30000"
    k8s = profiles["k26-k8s"]
    values = {"config_args": "--speculative-eagle-topk 4", "url": k8s.render_url(30000), "port": 30000, "name": "bs8_b8_k4"}
    controller = CommandController(k8s.fleet.commands, LocalHost())
    assert 'DDTREE_ARGS="--speculative-eagle-topk 4"' in controller.render("start", values)
    assert "jsonpath='{.items[*].status.containerStatuses[*].restartCount}'" in controller.render("status", values)
    assert "{ for (i = 1; i <= NF; i++) if ($i > 0) { print" in controller.render("status", values)
