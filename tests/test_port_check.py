"""Our server, or none: a launch never measures a stranger already on its port.

The stranger is a real SGLang stand-in (``tests/fakes/standin_server.py``) started by the test on
a fixed loopback port, as a server left over from another run would be: it answers the health path
with 200 and /server_info with a config, so without the check the health wait took it for the
launched service ("ready after 0.0 s") and a test passed against it before the harness's own
launch died with "Address already in use".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ddtree.service.base import Launch, ServiceStartError
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.pool import free_port
from pytest_ddtree.service.process import ProcessController, live_process_groups
from pytest_ddtree.service.readiness import wait_ready
from tests.service_helpers import BS8_B8_K4, STANDIN, failed_start, make_manager, make_profile
from tests.suite_helpers import wait_healthy


@pytest.fixture
def stranger() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A server of somebody else's on a fixed port (not in any of our controllers' process groups)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", what="the stranger")
        yield port, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_fixed_port_that_already_answers_is_refused_naming_who_answers(
        stranger: tuple[int, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    port, proc = stranger
    m = make_manager(make_profile(port=port), tmp_path)
    msg = failed_start(m, BS8_B8_K4)
    assert f"port {port} already answers before the launch of bs8_b8_k4" in msg, msg
    assert f"pid {proc.pid} (" in msg and "standin_server.py" in msg  # who answers
    assert "set port: auto" in msg
    assert len(m.launches) == 1 and m.launches[0]["outcome"].startswith("failed")
    assert not list((tmp_path / "logs").rglob("*.log"))  # nothing of ours was launched
    assert proc.poll() is None and live_process_groups() == []


def test_the_health_wait_accepts_only_the_process_it_started(tmp_path: Path) -> None:
    port = free_port()
    ctl = ProcessController(tmp_path, stop_timeout_s=2)
    # our launch, still loading (it never binds); the stranger takes the port after the pre-launch check
    launch = Launch(name="ours", command=f"{sys.executable} -c 'import time; time.sleep(60)'", port=port,
                    url=f"http://127.0.0.1:{port}")
    ctl.start(launch)
    proc = subprocess.Popen([sys.executable, str(STANDIN), "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_healthy(launch.url, what="the stranger")
        with SGLangClient(launch.url, timeout=5) as client, pytest.raises(ServiceStartError) as info:
            wait_ready(client, ctl, "/health_generate", 15, poll_interval=0.1, gpu_memory=None)
    finally:
        ctl.stop()
        proc.kill()
        proc.wait()
    msg = str(info.value)
    assert "health path answered, but not from the process it started" in msg, msg
    assert f"port {port} is listened on by pid {proc.pid}" in msg and "standin_server.py" in msg


def test_the_health_wait_accepts_the_launched_server(tmp_path: Path) -> None:
    port = free_port()
    ctl = ProcessController(tmp_path, stop_timeout_s=2)
    ctl.start(Launch(name="ours", command=f"{sys.executable} {STANDIN} --port {port}", port=port,
                     url=f"http://127.0.0.1:{port}"))
    try:
        with SGLangClient(f"http://127.0.0.1:{port}", timeout=5) as client:
            assert wait_ready(client, ctl, "/health_generate", 30, poll_interval=0.1, gpu_memory=None) >= 0
        assert ctl.answered_by_another() is None
    finally:
        ctl.stop()
