"""Fleet tests against real OpenSSH: three sshd "hosts" on 127.0.0.1, each with its own fake
systemd (tests/fakes) really running the reference engine (see tests/fleet_helpers.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.base import ServiceError
from pytest_ddtree.service.manager import Clients, Hooks, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ProfileError, parse_profile
from pytest_ddtree.service.ssh import HostLock, SSHError, SSHHost, SSHTarget
from tests.fleet_helpers import UNIT, FakeHost, SshFleet, sshd_binary
from tests.polling import wait_until
from tests.suite_helpers import default_sigint, wait_healthy

REPO = Path(__file__).resolve().parent.parent
SWEEP = "bs8_b*_k4"
SWEEP_CONFIGS = [f"bs8_b{b}_k4" for b in (4, 8, 12, 16)]  # the glob does not match the _wnone configs


@pytest.fixture(scope="module")
def ssh_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshFleet]:
    """One set of three sshd hosts for this module's tests; stopped (sshd and every host's
    service) when the module is done, not when the worker's whole session ends."""
    if sshd_binary() is None:
        pytest.skip("sshd is not installed: apt-get install -y openssh-server openssh-client (.ci/run does this)")
    fleet = SshFleet(tmp_path_factory.mktemp("fleet"), n=3, load_seconds=0.5)
    try:
        yield fleet.start()
    finally:
        fleet.close()


def _host(fleet: SshFleet, index: int, **kw: Any) -> SSHHost:
    return SSHHost(fleet.hosts[index].target, fleet.ssh_options(), **kw)


def _config_of(command: str, profile: Any) -> str:
    """The config name a launch command ran (matched against every sweep config's rendering)."""
    for name in SWEEP_CONFIGS:
        if profile.render_command(parse_config_name(name), profile.port) == command:
            return name
    return "default"


def _assert_default_restored(host: FakeHost) -> None:
    assert not host.dropin.exists(), f"{host.target}: drop-in left behind"
    calls = (host.state / "systemctl.log").read_text().splitlines()
    assert calls[-2:] == ["daemon-reload", "restart --no-block ddtree-ref.service"], calls[-4:]
    info = wait_healthy(f"http://127.0.0.1:{host.service_port}", timeout=30, what="the default config").server_info()
    assert (info["speculative_num_draft_tokens"], info["speculative_eagle_topk"]) == (8, 4)


def test_sweep_table_names_the_host_of_each_row() -> None:
    from pytest_ddtree.report import text as report
    from tests.report_helpers import RECORDS

    fleet = [{**r, "host": f"ops@gpu-{i % 2}"} for i, r in enumerate(RECORDS)]
    lines = report.render_sweep_table(fleet).splitlines()
    assert lines[0].split()[:3] == ["config", "host", "cell"]
    by_row = {(r["config"], r["cell"]): r["host"] for r in fleet if r["kind"] == "throughput"}
    assert all(by_row[(row.split()[0], row.split()[2])] == row.split()[1] for row in lines[2:])
    assert {c["host"] for c in report.results_json(fleet)["throughput"]} == {"ops@gpu-0", "ops@gpu-1"}
    assert "host" not in report.render_sweep_table(RECORDS).splitlines()[0].split()


# -- the transport ------------------------------------------------------------------------------
def test_target_parsing_and_profile_errors() -> None:
    assert SSHTarget.parse("ops@gpu-3:2222") == SSHTarget("gpu-3", "ops", 2222)
    assert str(SSHTarget.parse("[fd00::1]:22")) == "[fd00::1]:22" and SSHTarget.parse("gpu-3").user is None
    base = {"name": "f", "controller": "systemd", "unit": "u.service", "command": "x {config_args} {port}",
            "url": "http://{host}:{port}", "config_args": {}}
    with pytest.raises(ProfileError, match="port: a remote service listens on a fixed port"):
        parse_profile({**base, "host": "ops@gpu-1"})
    with pytest.raises(ProfileError, match=r"pool\[1\]\.unitt: unknown key"):
        parse_profile({**base, "port": 30000, "pool": ["ops@gpu-1", {"host": "ops@gpu-2", "unitt": "x"}]})
    with pytest.raises(ProfileError, match="host: remote hosts need controller systemd or command"):
        parse_profile({**base, "controller": "process", "host": "ops@gpu-1", "port": 30000})
    profile = parse_profile({**base, "port": 30000, "ssh_options": "-i ~/.ssh/fleet",
                             "pool": ["ops@gpu-1", {"host": "ops@gpu-2:2222", "port": 31000, "unit": "b.service"}]})
    assert profile.pool_size == 2 and profile.host is None
    second = profile.for_instance(1)
    assert isinstance(second.port, int)
    assert (second.host, second.port, second.unit, second.render_url(second.port)) == ("ops@gpu-2:2222", 31000, "b.service", "http://gpu-2:31000")
    assert profile.for_instance(0).fleet.ssh_options == ("-i", "~/.ssh/fleet")
    # {python} on a remote host is the profile's python: (else python3 there), never our own path.
    remote = parse_profile({**base, "command": "{python} -m x {config_args} {port}", "port": 30000, "host": "ops@gpu-1"})
    assert remote.render_command(None, 30000) == "python3 -m x  30000"
    assert parse_profile({**base, "command": "{python} -m x {config_args}", "port": 30000, "host": "ops@gpu-1",
                          "python": "/opt/sglang/bin/python"}).render_command(None, 1).startswith("/opt/sglang/bin/python -m")


def test_ssh_runs_writes_through_one_master_and_times_out(ssh_fleet: SshFleet) -> None:
    host = _host(ssh_fleet, 0, connect_timeout_s=5)
    try:
        result = host.run(["sh", "-c", 'echo "$DDTREE_FAKE_SYSTEMD"; echo oops >&2; exit 3'])
        assert (result.returncode, result.stdout.strip(), result.stderr.strip()) == (3, str(ssh_fleet.hosts[0].state), "oops")
        target = ssh_fleet.hosts[0].root / "dir" / "file.conf"
        host.write_file(str(target), "a 'quoted' $line\n")
        assert target.read_text() == "a 'quoted' $line\n"
        host.remove_file(str(target))
        assert not target.parent.exists()
        # Every call went through one ControlMaster: one socket, one sshd session process tree.
        sockets = os.listdir(Path(host._control_path()).parent)
        assert len(sockets) == 1, sockets
        # The call's deadline ended it (its 1 s + the 5 s connect allowance), not ssh's own timeouts
        # (those exit 255) and not the host's default command deadline.
        with pytest.raises(SSHError, match=r"no answer within 6 s \(ssh killed\)"):
            host.run(["sleep", "60"], timeout_s=1)
    finally:
        host.close()


def test_host_gpus_over_ssh_feed_the_hardware_profile(ssh_fleet: SshFleet) -> None:
    from pytest_ddtree.service.fingerprint import fingerprint
    from pytest_ddtree.service.gpu import HostGpus, parse_smi_memory

    assert parse_smi_memory("memory.used [MiB], memory.total [MiB]\n1 MiB, 81559 MiB\n70000 MiB, 81559 MiB\n") == [
        (2**20, 81559 * 2**20), (70000 * 2**20, 81559 * 2**20)]
    host = _host(ssh_fleet, 1)
    try:
        inventory = HostGpus(host).inventory()
        assert [(g.name, g.memory_total_bytes) for g in inventory.gpus] == [("NVIDIA H200", 81559 * 2**20)]
        assert inventory.driver_version == "550.00"
        profile = fingerprint({"version": "0.5.3", "model_path": "/models/k26"}, None, inventory)
        # the folder is keyed by the setup; the engine version and the host's driver are the build
        assert profile.name == f"1xH200-k26-{profile.digest}"
        assert profile.build == {"engine_version": "0.5.3", "driver": "550.00"}
        # The unit runs its default config: the host's GPU holds its weights.
        assert HostGpus(host).memory_used_bytes() == 60000 * 2**20
    finally:
        host.close()


def test_sudo_wraps_only_unit_management(ssh_fleet: SshFleet) -> None:
    from pytest_ddtree.service.gpu import HostGpus
    from pytest_ddtree.service.systemd import SystemdController

    fake = ssh_fleet.hosts[1]
    host = SSHHost(fake.target, ssh_fleet.ssh_options(), sudo=True)
    log = fake.root / "sudo.log"
    log.unlink(missing_ok=True)
    try:
        controller = SystemdController("ddtree-ref.service", dropin_dir=fake.state / "system", host=host)
        assert controller.show()["ActiveState"] == "active"
        assert "server is fired up" in controller.log_tail(5)  # the journal of the unit, read over ssh
        assert HostGpus(host).memory_used_bytes() == 60000 * 2**20
        host.write_file(str(fake.root / "probe" / "x.conf"), "x\n")
        host.remove_file(str(fake.root / "probe" / "x.conf"))
    finally:
        host.close()
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["systemctl", "journalctl", "sh", "sh"], calls
    assert not any("nvidia-smi" in c for c in calls)


def test_unreachable_host_is_an_ssh_error_not_a_hang(ssh_fleet: SshFleet) -> None:
    from pytest_ddtree.service.pool import free_port

    host = SSHHost(f"nobody@127.0.0.1:{free_port()}", ssh_fleet.ssh_options(), connect_timeout_s=3)
    with pytest.raises(SSHError, match="Connection refused") as info:
        host.run(["systemctl", "show", "x"])
    assert "ssh to nobody@127.0.0.1" in str(info.value) and "while running: systemctl show x" in str(info.value)


def test_host_lock_keeps_a_second_session_out(ssh_fleet: SshFleet) -> None:
    first, second = _host(ssh_fleet, 2), _host(ssh_fleet, 2)
    path = str(ssh_fleet.root / "lock-test.lock")
    lock_a, lock_b = HostLock(first, path), HostLock(second, path)
    lines: list[str] = []
    try:
        lock_a.acquire("session A")
        with pytest.raises(ServiceError, match="stayed locked"):
            lock_b.acquire("session B", lines.append, timeout_s=1, poll_s=0.2)
        assert any("locked by session A" in line for line in lines), lines
        lock_a.release()
        lock_b.acquire("session B", timeout_s=30, poll_s=0.2)
        assert lock_b.held
    finally:
        lock_a.release()
        lock_b.release()
        first.close()
        second.close()


# -- the systemd controller on a remote host ------------------------------------------------------
@pytest.mark.slow
def test_remote_systemd_round_trip_restores_default(ssh_fleet: SshFleet, tmp_path: Path) -> None:
    fake = ssh_fleet.hosts[0]
    raw = ssh_fleet.pool_profile(hosts=[0])
    entry = raw.pop("pool")[0]
    raw.update(host=entry["host"], port=entry["port"], dropin_dir=entry["dropin_dir"], lock_path=entry["lock_path"])
    raw["env"] = {"SGLANG_DFLASH_TREE_VERIFY": "1"}
    profile = parse_profile(raw)
    lines: list[str] = []
    manager = ServiceManager(profile, Placement(0, tmp_path / "logs", tmp_path / "locks"), pacing=Pacing(poll_interval=0.2),
                             hooks=Hooks(lines.append), clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    starts_before = len(fake.starts())
    try:
        service = manager.ensure(parse_config_name("bs8_b12_k6"))
        assert service.url == f"http://127.0.0.1:{fake.service_port}"
        assert service.server_info["speculative_num_draft_tokens"] == 12
        text = fake.dropin.read_text()
        assert "ExecStart=\nExecStart=" + profile.render_command(parse_config_name("bs8_b12_k6"), fake.service_port) in text
        assert 'Environment="SGLANG_DFLASH_TREE_VERIFY=1"' in text
        assert manager.launches[0]["host"] == fake.target and manager.launches[0]["dropin"] == text
        # The GPU memory of the host (fake nvidia-smi over ssh) shows the loaded weights.
        assert manager._gpu_memory is not None and manager._gpu_memory() == 60000 * 2**20
    finally:
        assert manager.close() == []
    config_command = profile.render_command(parse_config_name("bs8_b12_k6"), fake.service_port)
    assert fake.starts()[starts_before:] == [config_command, ssh_fleet.default_command(fake)]
    _assert_default_restored(fake)
    assert (Path(fake.lock_path)).exists()


def test_crash_on_remote_host_reports_its_journal(ssh_fleet: SshFleet, tmp_path: Path) -> None:
    raw = ssh_fleet.pool_profile(hosts=[1])
    raw["command"] = raw["command"].replace("{config_args}", "{config_args} --fault crash-on-start")
    manager = ServiceManager(parse_profile(raw), Placement(0, tmp_path / "logs"), pacing=Pacing(poll_interval=0.2),
                             clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    try:
        with pytest.raises(ServiceError) as info:
            manager.ensure(parse_config_name("bs8_b8_k4"))
        message = str(info.value)
        assert "ddtree-ref.service on" in message or "failed/failed" in message, message
        assert "crash" in message.lower(), message
    finally:
        manager.close()
    _assert_default_restored(ssh_fleet.hosts[1])


def test_command_controller_runs_its_templates_on_the_host(ssh_fleet: SshFleet, tmp_path: Path) -> None:
    from pytest_ddtree.service.pool import free_port
    from tests.service_helpers import command_profile

    fake, work = ssh_fleet.hosts[2], tmp_path / "svc"
    profile = command_profile(work, prefix=f'echo "$DDTREE_FAKE_SYSTEMD" > {work}/where; ', host=fake.target,
                              port=free_port(), url="http://{host}:{port}", ssh_options=ssh_fleet.ssh_options())
    manager = ServiceManager(profile, Placement(0, tmp_path / "logs"), pacing=Pacing(poll_interval=0.2),
                             clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    try:
        service = manager.ensure(parse_config_name("bs8_b12_k6"))
        assert service.server_info["speculative_num_draft_tokens"] == 12
        assert (work / "where").read_text().strip() == str(fake.state)  # the start ran in the host's session
        assert manager.launches[0]["host"] == fake.target
    finally:
        assert manager.close() == []
    assert (work / "restores").exists()


# -- a sweep over the pool (pytest -n 3, one worker per host) ---------------------------------------
def _run_sweep(fleet: SshFleet, tmp_path: Path, on_start: Any = None, *extra: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    profile_path = tmp_path / "fleet.yaml"
    profile_path.write_text(yaml.safe_dump(fleet.pool_profile()))
    argv = [sys.executable, "-m", "pytest", "suites/test_health.py", f"--ddtree-config={SWEEP}", "-n", "3",
            f"--ddtree-service={profile_path}", f"--ddtree-results={tmp_path / 'results'}", "-p", "no:cacheprovider", "-q", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["COLUMNS"] = "400"  # the short summary's failure reasons whole, not cut at 80 columns
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watcher = threading.Thread(target=on_start, daemon=True) if on_start else None
    if watcher:
        watcher.start()
    out, _ = proc.communicate(timeout=400)
    if watcher:
        watcher.join(timeout=60)
    return subprocess.CompletedProcess(argv, proc.returncode, out, ""), parse_profile(yaml.safe_load(profile_path.read_text()))


@pytest.mark.slow  # about 20 s on a 2-core box, 30 s beside other load
def test_sweep_runs_each_config_once_across_three_hosts(ssh_fleet: SshFleet, tmp_path: Path) -> None:
    before = [len(h.starts()) for h in ssh_fleet.hosts]
    result, profile = _run_sweep(ssh_fleet, tmp_path, None, f"--ddtree-package={tmp_path / 'pkg'}", "--ddtree-package-name=fleet")
    assert result.returncode == 0, result.stdout[-4000:]
    ran: dict[str, list[str]] = {}
    for host, skip in zip(ssh_fleet.hosts, before):
        launches = host.starts()[skip:]
        assert launches[-1] == ssh_fleet.default_command(host), "the last start of each host is its default"
        for command in launches[:-1]:
            ran.setdefault(_config_of(command, profile.for_instance(host.index)), []).append(host.target)
    assert sorted(ran) == sorted(SWEEP_CONFIGS), ran
    assert all(len(targets) == 1 for targets in ran.values()), f"a config ran twice: {ran}"
    assert len({t[0] for t in ran.values()}) == 3, f"not every host was used: {ran}"
    for host in ssh_fleet.hosts:
        _assert_default_restored(host)
    # The results say which host measured what.
    records = [yaml.safe_load(line) for f in (tmp_path / "results").glob("records-*.jsonl") for line in f.read_text().splitlines()]
    health = {r["config"]: r.get("host") for r in records if r.get("kind") == "health"}
    assert set(health) == set(SWEEP_CONFIGS) and {h: [t] for h, t in health.items()} == ran
    # The package describes the hosts that ran the service, each snapshot taken there over ssh.
    package = tmp_path / "pkg" / "fleet"
    for host in ssh_fleet.hosts:
        folder = package / "env" / "hosts" / host.target.replace(":", "_")
        snapshot = yaml.safe_load((folder / "environment.json").read_text())
        assert snapshot["host"] == host.target and snapshot["env_vars"]["DDTREE_FAKE_SYSTEMD"] == str(host.state)
        assert (folder / "pip-freeze.txt").read_text().strip()
        # The unit as found on that host (`systemctl cat` over ssh), before the sweep's drop-in.
        unit = (folder / "systemctl-cat.txt").read_text()
        assert unit.startswith(f"# {host.state / 'system' / 'ddtree-ref.service'}\n"), unit
        assert ssh_fleet.default_command(host) in unit and "ddtree.conf" not in unit
    first = min(ssh_fleet.hosts, key=lambda h: h.target)
    main_env = yaml.safe_load((package / "env" / "environment.json").read_text())
    assert main_env["host"] == first.target
    assert (package / "services" / "systemd" / "ddtree-ref.service").read_text() == (
        package / "env" / "hosts" / first.target.replace(":", "_") / "systemctl-cat.txt").read_text()


@pytest.mark.slow  # about 20 s on a 2-core box, 30 s beside other load
def test_host_down_mid_sweep_fails_only_its_configs(ssh_fleet: SshFleet, tmp_path: Path) -> None:
    """The victim's sshd dies once its first sweep config is up and checked. The live hosts start
    slowly at first, so the victim passes its first test first and xdist queues the fourth config
    on it too: that config must come back to a live host, not fail with the victim."""
    victim, live = ssh_fleet.hosts[1], [ssh_fleet.hosts[0], ssh_fleet.hosts[2]]
    before = [len(h.starts()) for h in ssh_fleet.hosts]
    journal = victim.state / f"{UNIT}.journal"
    offset = journal.stat().st_size

    def up_and_checked() -> bool:
        """The harness read /server_info of the victim's new engine: its start is over, the
        first test needs no ssh, the second one's liveness check does."""
        since = journal.read_bytes()[offset:].decode(errors="replace").split(f"fake-systemd: Starting {UNIT}", 1)
        return len(since) == 2 and "server_info HTTP" in since[1]

    def kill_once_its_service_is_up() -> None:
        try:
            wait_until(up_and_checked, 120, "the victim's sweep config to be up and checked", interval=0.05)
        finally:
            ssh_fleet.stop_sshd(1)
            for host in live:
                host.delay_starts(None)

    for host in live:
        host.delay_starts(4)
    try:
        result, profile = _run_sweep(ssh_fleet, tmp_path, kill_once_its_service_is_up)
        victim_starts = victim.starts()[before[1]:]
    finally:
        for host in live:
            host.delay_starts(None)
        if victim.sshd is None:
            ssh_fleet.start_sshd(1)
        # The dead host's service kept running (its sshd is what died) on its sweep config: put
        # the default back by hand, as an operator would, for the tests after this one.
        victim.dropin.unlink(missing_ok=True)
        victim.systemctl("daemon-reload")
        victim.systemctl("restart", "ddtree-ref.service")
    assert result.returncode != 0, result.stdout[-4000:]
    out = result.stdout
    # pytest's short test summary lines (`FAILED suites/...::test[config] - reason`), not the
    # session's verdict line (`FAILED: 5 test(s) failed (...)`) that heads the summary
    failures = [line for line in out.splitlines() if re.match(r"(FAILED|ERROR) \S+::\S+\[", line)]
    failed = {line.split("[", 1)[1].split("]", 1)[0] for line in failures}
    assert all(f"ssh to {victim.target} failed" in line for line in failures), "\n".join(failures)
    assert f"host {victim.target} does not answer: worker gw1 takes no more configs" in out, out[-4000:]
    # The dead host failed the config(s) it had launched before its sshd died, and was handed no
    # config after that (before the fix it went on taking and failing configs). A config queued on
    # it is asked back; it comes back to a live host unless xdist had already handed the worker its
    # first test (a worker gets its next test before the current one ends), then it fails there.
    held = {_config_of(command, profile.for_instance(1)) for command in victim_starts}
    stayed = set(re.findall(r"(bs\S+) had already begun on worker gw1", out))
    assert held and held <= failed <= held | stayed, (failed, held, stayed, out[-4000:])
    assert not (stayed - failed), "a config said to stay with the dead host did not fail there"
    came_back = set(re.findall(r"(bs\S+) came back from worker gw1", out))
    assert not (came_back & stayed), (came_back, stayed)
    held |= stayed
    # Every config it did not launch was measured once, by a live host (counted from the journals).
    ran_live: list[str] = []
    for host in (ssh_fleet.hosts[0], ssh_fleet.hosts[2]):
        for command in host.starts()[before[host.index]:-1]:  # the last start is the restored default
            ran_live.append(_config_of(command, profile.for_instance(host.index)))
        _assert_default_restored(host)
    assert sorted(ran_live) == sorted(set(SWEEP_CONFIGS) - held), (ran_live, held, failed)


@pytest.mark.slow
def test_ctrl_c_mid_sweep_restores_every_host(ssh_fleet: SshFleet, tmp_path: Path) -> None:
    """SIGINT to the sweep's process group (what a terminal's Ctrl-C sends) while every host runs a
    config: each worker restores its own host before pytest exits."""
    profile_path = tmp_path / "fleet.yaml"
    profile_path.write_text(yaml.safe_dump(ssh_fleet.pool_profile()))
    argv = [sys.executable, "-m", "pytest", "suites/test_health.py", "--ddtree-config=bs8_b*_k4*", "-n", "3",
            f"--ddtree-service={profile_path}", f"--ddtree-results={tmp_path / 'results'}", "-p", "no:cacheprovider", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    try:
        wait_until(lambda: all(h.dropin.exists() for h in ssh_fleet.hosts), 180, "every host to run a sweep config")
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, out[-3000:]  # pytest's "interrupted"
    for host in ssh_fleet.hosts:
        _assert_default_restored(host)
