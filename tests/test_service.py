"""Service lifecycle tests with real processes on 127.0.0.1 (stand-in server, fake systemd)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.base import (
    AppliedConfigMismatch,
    AppliedDiff,
    ExternalConfigMismatch,
    Launch,
    ServiceDiedError,
    ServiceStartError,
)
from pytest_ddtree.service.manager import Pacing, Placement, RunningService, ServiceManager
from pytest_ddtree.service.pool import InstanceLock, free_port, instance_for_worker, resolve_instance, worker_index
from pytest_ddtree.service.process import ProcessController, live_process_groups
from pytest_ddtree.service.profile import ServiceProfile, parse_profile
from pytest_ddtree.service.readiness import applied_diff
from pytest_ddtree.service.systemd import parse_show, render_dropin
from tests.polling import wait_until
from tests.suite_helpers import default_sigint, wait_healthy
from tests.service_helpers import APPLIED, BS8_B12_K6, BS8_B8_K4, CONFIG_ARGS, STANDIN, failed_start, fake_systemd, make_manager, make_profile, pid_alive, systemd_profile  # noqa: F401 (fixtures)

@pytest.fixture
def managers() -> Iterator[list[ServiceManager]]:
    made: list[ServiceManager] = []
    yield made
    for m in made:
        m.close()
    assert live_process_groups() == []


# -- process controller + readiness -------------------------------------------------------------
def test_ready_applied_and_reuse(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = make_manager(make_profile(), tmp_path)
    managers.append(m)
    svc = m.ensure(BS8_B8_K4)
    assert svc.server_info["speculative_eagle_topk"] == 4
    assert svc.client.health("/health_generate") == 200
    assert m.ensure(BS8_B8_K4) is svc  # same config: no restart
    assert len(m.launches) == 1
    rec = m.launches[0]
    assert rec["outcome"] == "ready" and "--speculative-eagle-topk 4" in (rec["command"] or "")
    assert Path(rec["log"] or "").name == "bs8_b8_k4-0-1.log"
    same = m.ensure(parse_config_name("bs8_b8_k4_w2048"))  # same launch under the 2048 default
    assert same is svc and same.config.name == "bs8_b8_k4_w2048" and len(m.launches) == 1  # type: ignore[union-attr]
    pid = svc.server_info["pid"]
    assert isinstance(pid, int)
    svc2 = m.ensure(BS8_B12_K6)  # switch: old stopped, new started
    assert svc2.server_info["speculative_num_draft_tokens"] == 12
    assert not pid_alive(pid)


def test_crash_on_start_reported_fast_and_cached(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = make_manager(make_profile("--fault crash-on-start"), tmp_path)
    managers.append(m)
    with pytest.raises(ServiceStartError) as info:
        m.ensure(BS8_B8_K4)
    msg = str(info.value)
    # Fast = the exit ended the wait, not the 15 s readiness deadline (that error says "not ready after").
    assert "exited while starting" in msg and "not ready after" not in msg, msg
    assert info.value.exit_code == 3 and "exit code: 3" in msg
    assert "simulated crash while loading weights" in msg  # the log tail
    assert "bs8_b8_k4" in msg
    with pytest.raises(ServiceStartError) as again:
        m.ensure(BS8_B8_K4)
    # Cached: the same error object, and no second launch.
    assert again.value is info.value
    assert len(m.launches) == 1 and m.launches[0]["outcome"].startswith("failed")


def test_slow_start_past_deadline_fails_with_log_tail(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = make_manager(make_profile("--fault slow-start=60"), tmp_path, ready_timeout_s=1.5)
    managers.append(m)
    with pytest.raises(ServiceStartError) as info:  # (the engine's own 60 s start would end it ready)
        m.ensure(BS8_B8_K4)
    msg = str(info.value)
    assert "not ready after 1.5 s" in msg, msg  # the 1.5 s deadline ended the wait
    assert "HTTP 503" in msg and "standin: listening" in msg
    # the log tail leaves out the harness's own readiness polls (the service's answers to them, 503 each)
    assert "access lines of the harness's own health polls left out" in msg and '"GET /health' not in msg, msg
    assert live_process_groups() == []  # the slow process was stopped


def test_a_systemd_unit_that_never_gets_ready_shows_its_journal_without_the_harness_polls(
        tmp_path: Path, fake_systemd: Path) -> None:
    """The journal's last lines of a unit still loading are the harness's own /health_generate polls: the
    tail reads more of it and leaves them out, so the unit's own lines show (here its listening line)."""
    port = free_port()
    (fake_systemd / "system" / "standin.service").write_text(f"[Service]\nExecStart={sys.executable} {STANDIN} --port {port}\n")
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    msg = failed_start(make_manager(systemd_profile(fake_systemd, port, "--load-seconds 600"), tmp_path, ready_timeout_s=4),
                       BS8_B8_K4)
    assert "not ready after 4 s" in msg and "HTTP 503" in msg, msg
    assert "access lines of the harness's own health polls left out" in msg and '"GET /health' not in msg, msg
    assert "standin: listening" in msg, msg


def test_refused_connections_and_503_tolerated_with_progress(tmp_path: Path, managers: list[ServiceManager]) -> None:
    lines: list[str] = []
    m = make_manager(make_profile("--listen-delay 1.5 --load-seconds 1.5"), tmp_path, lines)
    managers.append(m)
    m.ensure(BS8_B8_K4)
    progress = "\n".join(lines)
    assert "connection refused" in progress and "HTTP 503" in progress
    assert "s elapsed" in progress and "ready on" in progress


def test_ignored_config_fails_applied_check_with_diff(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = make_manager(make_profile("--fault ignore-config=topk"), tmp_path)
    managers.append(m)
    with pytest.raises(AppliedConfigMismatch) as info:
        m.ensure(BS8_B8_K4)
    assert info.value.diffs == [AppliedDiff("speculative_eagle_topk", 4, 1)]
    assert "speculative_eagle_topk" in str(info.value) and "expected" in str(info.value)
    with pytest.raises(AppliedConfigMismatch):
        m.ensure(BS8_B8_K4)
    assert len(m.launches) == 1


def test_exit_mid_run_fails_rest_of_config_next_config_runs(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = make_manager(make_profile("--fault exit-after=2", copy_probe=False), tmp_path)  # it counts requests
    managers.append(m)
    svc = m.ensure(BS8_B8_K4)
    svc.client.generate("hi", sampling_params={"max_new_tokens": 1})
    svc.client.generate("hi", sampling_params={"max_new_tokens": 1})  # the server exits after answering this one
    pid = svc.server_info["pid"]
    assert isinstance(pid, int)
    wait_until(lambda: not pid_alive(pid), 10, "the server to exit after its second request")
    with pytest.raises(ServiceDiedError) as info:
        m.ensure(BS8_B8_K4)
    assert info.value.exit_code == 3 and "exit-after=2" in str(info.value)
    with pytest.raises(ServiceDiedError):
        m.ensure(BS8_B8_K4)
    svc2 = m.ensure(BS8_B12_K6)
    assert svc2.server_info["speculative_eagle_topk"] == 6
    assert [r["outcome"] for r in m.launches] == ["died: " + m.launches[0]["outcome"][6:], "ready"]


@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["sigterm", "sigkill"])
def test_stop_leaves_no_process_in_group(tmp_path: Path, ignore_sigterm: bool) -> None:
    port = free_port()
    extra = " --ignore-sigterm" if ignore_sigterm else ""
    ctl = ProcessController(tmp_path, stop_timeout_s=0.5)
    ctl.start(Launch("stop", f"{sys.executable} {STANDIN} --port {port} --spawn-child{extra}", port, ""))

    def logged_child() -> int | None:
        return next((int(line.split()[-1]) for line in ctl.log_tail().splitlines() if "worker child pid" in line), None)

    child = wait_until(logged_child, 5, "the stand-in to log its worker child's pid")
    assert ctl.pid is not None
    leader = ctl.pid
    proc = ctl._proc
    assert proc is not None
    ctl.stop()
    ctl.stop()  # idempotent
    assert not pid_alive(leader) and not pid_alive(child)
    # SIGTERM ended the leader, or (it ignores SIGTERM) the SIGKILL after the grace period did
    assert proc.returncode == -(signal.SIGKILL if ignore_sigterm else signal.SIGTERM), proc.returncode
    assert live_process_groups() == []


def test_sigint_to_harness_leaves_no_orphan(tmp_path: Path) -> None:
    """A Python process running a manager gets SIGINT: KeyboardInterrupt + atexit kill the group."""
    pidfile = tmp_path / "server.pid"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from tests.service_helpers import make_profile, make_manager, BS8_B8_K4
        from pathlib import Path
        m = make_manager(make_profile("--spawn-child"), Path({str(tmp_path)!r}))
        svc = m.ensure(BS8_B8_K4)
        Path({str(pidfile)!r}).write_text(str(svc.server_info["pid"]))
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], preexec_fn=default_sigint)
    wait_until(pidfile.exists, 15, "the harness to start its server")
    server_pid = int(pidfile.read_text())
    log = next((tmp_path / "logs").glob("*.log")).read_text()
    child = int(next(l for l in log.splitlines() if "worker child pid" in l).split()[-1])
    assert pid_alive(server_pid) and pid_alive(child)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=10)
    # The harness is gone; its group kill reaches the server and its child a moment later.
    wait_until(lambda: not pid_alive(server_pid) and not pid_alive(child), 10, "the server and its child to die")


# -- external -----------------------------------------------------------------------------------
def test_external_other_config_fails_with_the_diff(tmp_path: Path) -> None:
    port = free_port()
    runner = ProcessController(tmp_path, stop_timeout_s=2)
    runner.start(Launch("ext", f"{sys.executable} {STANDIN} --port {port} --speculative-dflash-block-size 8 --speculative-num-draft-tokens 8 --speculative-eagle-topk 4 --speculative-draft-window-size 2048", port, ""))
    try:
        profile = parse_profile({
            "name": "ext", "controller": "external", "url": f"http://127.0.0.1:{port}", "port": port,
            "config_args": CONFIG_ARGS, "applied": APPLIED, "health_path": "/health",
        })
        managers = [make_manager(profile, tmp_path)]

        def started() -> RunningService | None:
            try:
                return managers[-1].ensure(BS8_B8_K4)
            except ServiceStartError:  # not up yet: a fresh manager, as a new session would have
                managers.append(make_manager(profile, tmp_path))
                return None

        svc = wait_until(started, 10, "the external service to answer", interval=0.1)
        m = managers[-1]
        assert svc.launch_command is None and svc.config == BS8_B8_K4
        with pytest.raises(ExternalConfigMismatch) as info:
            m.ensure(BS8_B12_K6)
        assert [(d.key, d.expected, d.actual) for d in info.value.diffs] == [
            ("speculative_num_draft_tokens", 12, 8), ("speculative_eagle_topk", 6, 4)]
        assert "never restarts an external service" in str(info.value)
        with pytest.raises(ExternalConfigMismatch):  # remembered: no second round trip decides otherwise
            m.ensure(BS8_B12_K6)
        assert m.ensure(BS8_B8_K4).url == f"http://127.0.0.1:{port}"
        m.close()
        assert runner.failure() is None  # close never stops an external service
    finally:
        runner.stop()
    m2 = make_manager(profile, tmp_path)
    with pytest.raises(ServiceStartError, match="does not answer"):
        m2.ensure(BS8_B8_K4)


def test_fake_systemd_round_trip_restores_default(tmp_path: Path, fake_systemd: Path) -> None:
    port = free_port()
    default_cmd = f"{sys.executable} {STANDIN} --port {port} --speculative-num-draft-tokens 8 --speculative-eagle-topk 4"
    (fake_systemd / "system" / "standin.service").write_text(f"[Service]\nExecStart={default_cmd}\n")
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "start", "standin.service"], check=True)
    profile = systemd_profile(fake_systemd, port)
    profile = parse_profile({**_raw(profile), "env": {"SGLANG_DFLASH_TREE_VERIFY": "1"}})
    m = make_manager(profile, tmp_path)
    svc = m.ensure(BS8_B12_K6)
    assert svc.server_info["speculative_num_draft_tokens"] == 12
    dropin = fake_systemd / "system" / "standin.service.d" / "ddtree.conf"
    text = dropin.read_text()
    expected_cmd = profile.render_command(BS8_B12_K6, port)
    assert "[Service]\nExecStart=\nExecStart=" + expected_cmd + "\n" in text
    assert 'Environment="SGLANG_DFLASH_TREE_VERIFY=1"' in text
    assert m.launches[0]["dropin"] == text and m.launches[0]["controller"] == "systemd"
    assert "--speculative-draft-window-size 2048" in expected_cmd
    assert m.close() == []
    assert not dropin.exists()
    client = wait_healthy(f"http://127.0.0.1:{port}", timeout=10, what="the default config")
    info = client.server_info()
    assert info["speculative_num_draft_tokens"] == 8 and info["speculative_eagle_topk"] == 4
    calls = (fake_systemd / "systemctl.log").read_text().splitlines()
    assert "stop standin.service" in calls and "restart --no-block standin.service" in calls
    assert calls[-2:] == ["daemon-reload", "restart --no-block standin.service"]


def test_fake_systemd_failed_unit_reports_journal(tmp_path: Path, fake_systemd: Path) -> None:
    port = free_port()
    (fake_systemd / "system" / "standin.service").write_text(f"[Service]\nExecStart={sys.executable} -c pass\n")
    m = make_manager(systemd_profile(fake_systemd, port, "--fault crash-on-start"), tmp_path)
    with pytest.raises(ServiceStartError) as info:
        m.ensure(BS8_B8_K4)
    msg = str(info.value)
    # Noticed from the unit's state, not by running into the ready deadline (no wall-time assert:
    # the box is shared, and each fake systemctl call is a Python start-up).
    assert "exited while starting" in msg and "not ready after" not in msg
    assert "failed/failed" in msg and "simulated crash" in msg and info.value.exit_code == 3
    m.close()
    assert not (fake_systemd / "system" / "standin.service.d" / "ddtree.conf").exists()


def test_fake_systemd_start_up_lines_come_from_this_run_of_the_unit_only(tmp_path: Path, fake_systemd: Path) -> None:
    """The journal holds every run of the unit; the start-up lines read for the applied proof are
    the current run's (its InvocationID), never an earlier launch's of another config."""
    port = free_port()
    (fake_systemd / "system" / "standin.service").write_text(f"[Service]\nExecStart={sys.executable} -c pass\n")
    m = make_manager(systemd_profile(fake_systemd, port), tmp_path)
    try:
        m.ensure(BS8_B12_K6)
        m.ensure(BS8_B8_K4)
        journal = (fake_systemd / "standin.service.journal").read_text()
        assert "--speculative-num-draft-tokens 12" in journal and "--speculative-num-draft-tokens 8" in journal
        text = m._controller_for_profile().startup_log()
        assert text is not None and "--speculative-num-draft-tokens 8" in text, text
        assert "--speculative-num-draft-tokens 12" not in text, text
    finally:
        m.close()


def _raw(profile: ServiceProfile) -> dict[str, Any]:
    keys = ("name", "controller", "command", "url", "port", "config_args", "applied", "unit", "dropin_dir",
            "ready_timeout_s", "stop_timeout_s")
    return {k: (dict(v) if isinstance(v := getattr(profile, k), type(profile.env)) else v) for k in keys}


# -- pool and lock ------------------------------------------------------------------------------
def test_pool_assignment() -> None:
    assert [worker_index(w) for w in (None, "master", "gw0", "gw7")] == [0, 0, 0, 7]
    assert [instance_for_worker(f"gw{i}", 2) for i in range(4)] == [0, 1, 0, 1]
    auto = make_profile(pool=3)
    slots = [resolve_instance(auto, i) for i in range(3)]
    assert len({s.port for s in slots}) == 3
    assert all(s.url == f"http://127.0.0.1:{s.port}" for s in slots)
    fixed = make_profile(pool=2, port=31000)
    assert [resolve_instance(fixed, i).port for i in range(2)] == [31000, 31001]
    urls = parse_profile({"name": "ext", "controller": "external", "url": "http://10.0.0.1:30000",
                          "config_args": CONFIG_ARGS, "applied": APPLIED, "pool": ["http://10.0.0.1:30000", "http://10.0.0.2:30001/"]})
    assert resolve_instance(urls, 1).url == "http://10.0.0.2:30001" and resolve_instance(urls, 2).port == 30000


def test_two_managers_get_distinct_ports(tmp_path: Path, managers: list[ServiceManager]) -> None:
    profile = make_profile(pool=2)
    a = ServiceManager(profile, Placement(0, tmp_path / "a", tmp_path / "locks"), pacing=Pacing(poll_interval=0.1))
    b = ServiceManager(profile, Placement(1, tmp_path / "b", tmp_path / "locks"), pacing=Pacing(poll_interval=0.1))
    managers += [a, b]
    assert a.ensure(BS8_B8_K4).url != b.ensure(BS8_B12_K6).url


def test_file_lock_serializes_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "spans"
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from pathlib import Path
        from pytest_ddtree.service.pool import InstanceLock
        lock = InstanceLock(Path({str(tmp_path)!r}), "standin-0")
        lock.acquire()
        t0 = time.time(); time.sleep(0.6); t1 = time.time()
        lock.release()
        with open({str(out)!r}, "a") as fh:
            fh.write(f"{{t0}} {{t1}}\\n")
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    assert [p.wait(timeout=15) for p in procs] == [0, 0]
    spans = sorted(tuple(map(float, line.split())) for line in out.read_text().splitlines())
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]
    lock = InstanceLock(tmp_path, "standin-0")
    lock.acquire(timeout_s=1)
    assert lock.held
    lock.release()


def test_manager_holds_lock_until_switch_or_close(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = make_manager(make_profile(), tmp_path)
    managers.append(m)
    m.ensure(BS8_B8_K4)
    other = InstanceLock(tmp_path / "locks", "standin-0")
    with pytest.raises(TimeoutError):
        other.acquire(timeout_s=0.3)
    m.release()
    other.acquire(timeout_s=1)
    other.release()


# -- pure helpers -------------------------------------------------------------------------------
def test_applied_diff_and_helpers() -> None:
    expected = {"a": 8, "b": None, "c": 4, "internal_states.0.x": 2}
    info = {"a": "8", "b": None, "c": 1, "internal_states": [{"x": 2}]}
    assert applied_diff(expected, info) == [AppliedDiff("c", 4, 1)]
    assert applied_diff({"missing": 1}, {})[0].actual == "<missing>"
    text = render_dropin("/usr/bin/x --p 50%", {"A": 'q"1'})
    assert "ExecStart=\nExecStart=/usr/bin/x --p 50%%\n" in text and 'Environment="A=q\\"1"' in text
    assert parse_show("ActiveState=failed\nExecMainStatus=3\n") == {"ActiveState": "failed", "ExecMainStatus": "3"}
    err = ServiceStartError("boom", 137, "line1\nline2", 1.25, config_name="bs8_b8_k4", hint="do x")
    assert "exit code: 137 (128+9: SIGKILL)" in str(err) and "    line2" in str(err) and "do x" in str(err)


def test_free_ports_avoid_the_ephemeral_range() -> None:
    """Outgoing connections take source ports from the ephemeral range: a listener there races them."""
    from pytest_ddtree.service.pool import _ephemeral_range

    low, _ = _ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 10  # random, so two concurrent callers rarely agree
    assert all(1024 <= p < low for p in ports), ports


def test_a_start_that_lost_its_port_is_retried_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first port the manager picks is already taken: the engine exits with EADDRINUSE, and
    the manager retries on a fresh port instead of failing the config."""
    import socket

    import pytest_ddtree.service.manager as manager_module
    from pytest_ddtree.service.pool import InstanceSlot

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    picks = iter([taken])

    def resolve(profile: ServiceProfile, index: int) -> InstanceSlot:
        port = next(picks, None) or free_port()
        return InstanceSlot(index, port, profile.render_url(port))

    monkeypatch.setattr(manager_module, "resolve_instance", resolve)
    profile = make_profile(command="{python} -m pytest_ddtree.refserver --port {port} {config_args}")
    m = make_manager(profile, tmp_path)
    try:
        svc = m.ensure(BS8_B12_K6)
        assert svc.url != f"http://127.0.0.1:{taken}"
        assert [launch["outcome"] for launch in m.launches][0].startswith("failed")
        assert m.launches[-1]["outcome"] == "ready" and len(m.launches) == 2
    finally:
        m.close()
        blocker.close()


def test_the_last_exception_line_of_a_dying_service_leads_its_failure() -> None:
    from pytest_ddtree.service.base import last_error_line

    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "ValueError: DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'.\n"
            "[2026-12-02 05:37:05] kill_process_tree called: parent_pid=1\n")
    assert last_error_line(tail) == "ValueError: DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'."
    assert last_error_line("torch.OutOfMemoryError: CUDA out of memory\nINFO: shutting down") == "torch.OutOfMemoryError: CUDA out of memory"
    assert last_error_line("INFO: Uvicorn running\nWARNING: slow") is None


def test_one_applied_check_takes_null_0_and_minus_1_for_no_window() -> None:
    """readiness.verify_applied is the check of start-up and of suites/test_health.py alike: a
    build that writes "no window" as null (SGLang 0.5.23's unset arg), 0 or -1 passes both, and
    a real difference fails both with the diff."""
    from pytest_ddtree.service.base import AppliedConfigMismatch
    from pytest_ddtree.service.readiness import verify_applied

    for reported in (None, 0, -1):
        verify_applied("bs8_b8_k4_wnone", {"speculative_draft_window_size": None},
                       {"speculative_draft_window_size": reported})
    with pytest.raises(AppliedConfigMismatch, match="speculative_draft_window_size"):
        verify_applied("bs8_b8_k4_wnone", {"speculative_draft_window_size": None}, {"speculative_draft_window_size": 2048})
    health = (Path(__file__).resolve().parent.parent / "suites" / "test_health.py").read_text()
    assert "verify_applied(" in health and "==" not in health.split("def test_service_reports_the_asked_config")[1].split("def ")[0]
