"""A cancelled CI job (SIGTERM) leaves systemd units as the session found them (#10.6).

The fake systemctl in tests/fakes really starts and stops the unit's ExecStart, so these tests
see the same drop-in files and unit states an operator would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_ddtree.service.pool import free_port
from tests.polling import wait_until
from tests.suite_helpers import MATRIX, wait_healthy
from tests.service_helpers import APPLIED, BS8_B8_K4, CONFIG_ARGS, STANDIN, fake_systemd, make_manager, systemd_profile  # noqa: F401

UNIT = "standin.service"
DEFAULT_ARGS = "--speculative-num-draft-tokens 8 --speculative-eagle-topk 4"
ADMIN_DROPIN = "[Service]\nEnvironment=ADMIN_SETTING=1\n"


def _install_unit(state: Path, port: int, running: bool) -> None:
    (state / "system" / UNIT).write_text(f"[Service]\nExecStart={sys.executable} {STANDIN} --port {port} {DEFAULT_ARGS}\n")
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    if running:
        subprocess.run(["systemctl", "start", UNIT], check=True)
        wait_healthy(f"http://127.0.0.1:{port}", what="the admin's default config")


def _active_state() -> str:
    out = subprocess.run(["systemctl", "show", UNIT, "-p", "ActiveState"], capture_output=True, text=True, check=True).stdout
    return out.strip().partition("=")[2]


def _assert_as_found(state: Path, port: int, was_running: bool, dropin: Path) -> None:
    assert dropin.read_text() == ADMIN_DROPIN  # the admin's own drop-in of that name is back
    if was_running:
        info = wait_healthy(f"http://127.0.0.1:{port}", what="the restored default config").server_info()
        assert (info["speculative_num_draft_tokens"], info["speculative_eagle_topk"]) == (8, 4)
    else:
        assert _active_state() == "inactive"  # stopped before the session: stopped after it
        assert subprocess.run(["systemctl", "is-active", UNIT], capture_output=True).returncode != 0


def test_close_leaves_a_stopped_unit_stopped(tmp_path: Path, fake_systemd: Path) -> None:  # noqa: F811
    """Session end (no signal): the running case is test_service's round trip."""
    was_running = False
    port = free_port()
    _install_unit(fake_systemd, port, was_running)
    dropin = fake_systemd / "system" / f"{UNIT}.d" / "ddtree.conf"
    dropin.parent.mkdir(parents=True)
    dropin.write_text(ADMIN_DROPIN)
    m = make_manager(systemd_profile(fake_systemd, port), tmp_path)
    svc = m.ensure(BS8_B8_K4)
    assert "ExecStart=" in dropin.read_text() and svc.server_info["speculative_num_draft_tokens"] == 8
    assert m.close() == []
    _assert_as_found(fake_systemd, port, was_running, dropin)


HOLDING_TEST = '''
import os, threading
from pathlib import Path

def test_hold(ddtree_service):
    Path(os.environ["DDTREE_TEST_MARKER"]).write_text(str(ddtree_service.server_info["pid"]))
    threading.Event().wait(120)  # the outer test sends SIGTERM while we are here
'''


@pytest.mark.slow
@pytest.mark.parametrize("was_running", [True, False], ids=["unit-running", "unit-stopped"])
def test_sigterm_restores_dropin_and_unit_state(pytester: pytest.Pytester, fake_systemd: Path, monkeypatch: pytest.MonkeyPatch, was_running: bool) -> None:  # noqa: F811
    port = free_port()
    _install_unit(fake_systemd, port, was_running)
    dropin = fake_systemd / "system" / f"{UNIT}.d" / "ddtree.conf"
    dropin.parent.mkdir(parents=True)
    dropin.write_text(ADMIN_DROPIN)
    profile = pytester.path / "systemd.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "standin-systemd", "controller": "systemd", "unit": UNIT, "dropin_dir": str(fake_systemd / "system"),
        "command": f"{sys.executable} {STANDIN} --port {{port}} {{config_args}}", "url": "http://127.0.0.1:{port}",
        "port": port, "config_args": CONFIG_ARGS, "applied": APPLIED, "ready_timeout_s": 15, "stop_timeout_s": 2,
        "default_window": None,
    }))
    pytester.makepyfile(test_hold=HOLDING_TEST)
    marker = pytester.path / "serving.pid"
    monkeypatch.setenv("DDTREE_TEST_MARKER", str(marker))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "test_hold.py", f"--ddtree-service={profile}", f"--ddtree-matrix={MATRIX}",
         "--ddtree-config=bs8_b8_k4", f"--ddtree-results={pytester.path / 'results'}", "-p", "no:cacheprovider", "-q"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, 30, "the held test to write its marker", interval=0.05)
        assert proc.poll() is None, proc.communicate(timeout=5)[0]
        test_config_pid = int(marker.read_text())
        assert "--speculative-num-draft-tokens 8" in dropin.read_text()  # the session's config is in force
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "SIGTERM received" in out
    with pytest.raises(ProcessLookupError):
        os.kill(test_config_pid, 0)  # the test config's server is gone
    _assert_as_found(fake_systemd, port, was_running, dropin)
