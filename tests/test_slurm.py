"""The slurm controller against a real Slurm: munged, slurmctld and two slurmd on this machine
(tests/slurm_helpers.py), each config a batch job running the reference engine. Every fault case
(queue wait, time limit, preemption, Ctrl-C) ends with Slurm's own words and nothing of ours
left in the queue (the ``slurm`` fixture checks the queue after each test)."""

from __future__ import annotations

import contextlib
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
from pytest_ddtree.configs import DDTreeConfig, parse_config_name
from pytest_ddtree.service.base import ServiceDiedError, ServiceStartError
from pytest_ddtree.service.manager import Clients, Hooks, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ProfileError, parse_profile
from pytest_ddtree.service.slurm import (
    exit_code_number,
    parse_sacct,
    parse_slurm_keys,
    parse_squeue_line,
    render_job_script,
)
from tests.polling import wait_until
from tests.slurm_helpers import SlurmCluster, missing_slurm
from tests.suite_helpers import default_sigint

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "suites" / "services" / "slurm-reference.yaml"


def _profile_raw(**slurm: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    raw["slurm"] = {**raw["slurm"], "poll_interval_s": 0.3, **slurm}
    raw.update(ready_timeout_s=60, stop_timeout_s=20)
    return raw


def _manager(tmp_path: Path, lines: list[str] | None = None, **slurm: Any) -> ServiceManager:
    return ServiceManager(parse_profile(_profile_raw(**slurm)), Placement(0, tmp_path / "logs"),
                          pacing=Pacing(poll_interval=0.2, progress_interval=0.5),
                          hooks=Hooks(lines.append if lines is not None else None),
                          clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))


# -- without a cluster ------------------------------------------------------------------------------
def test_profile_keys_are_validated_with_the_key_named() -> None:
    fail = lambda key, problem: ProfileError(f"{key}: {problem}")  # noqa: E731
    with pytest.raises(ProfileError, match=r"slurm.gress: unknown key"):
        parse_slurm_keys({"gress": "gpu:8"}, fail)
    with pytest.raises(ProfileError, match=r"slurm.time_limit: not a Slurm time"):
        parse_slurm_keys({"time_limit": "2h"}, fail)
    with pytest.raises(ProfileError, match=r"slurm.output: only %j"):
        parse_slurm_keys({"output": "/scratch/%u-%j.out"}, fail)
    with pytest.raises(ProfileError, match=r"slurm.sbatch_options: each entry is one sbatch option"):
        parse_slurm_keys({"sbatch_options": ["exclusive"]}, fail)
    raw = _profile_raw()
    with pytest.raises(ProfileError, match=r"url: must contain \{host\}"):
        parse_profile({**raw, "url": "http://127.0.0.1:{port}"})
    with pytest.raises(ProfileError, match="pool: a slurm profile has no pool"):
        parse_profile({**raw, "pool": 2})
    with pytest.raises(ProfileError, match="slurm: job options belong to controller: slurm"):
        parse_profile({**raw, "controller": "process"})
    # Behind a login node over ssh, port auto is fine: the job picks its port on its node.
    assert parse_profile({**raw, "host": "ops@login-1"}).host == "ops@login-1"


def test_job_script_carries_the_profile_and_publishes_the_endpoint() -> None:
    keys = parse_slurm_keys({"partition": "gpu", "account": "llm", "gres": "gpu:8", "time_limit": "02:00:00",
                             "sbatch_options": "--exclusive --qos=high", "setup": "module load cuda/12.4\nsource /opt/venv/bin/activate",
                             "container": "apptainer exec --nv /images/sglang.sif"}, lambda k, p: ProfileError(p))
    script = render_job_script(keys, job_name="ddtree-bs8_b8_k4-abc", output="/scratch/slurm-%j.out",
                               command="python -m sglang.launch_server --port ${DDTREE_PORT}", env={"HF_TOKEN": "x y"}, port=30000)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in ("--partition=gpu", "--account=llm", "--gres=gpu:8", "--time=02:00:00", "--exclusive", "--qos=high",
                   "--no-requeue", "--nodes=1", "--output=/scratch/slurm-%j.out"):
        assert f"#SBATCH {option}" in lines, option
    assert lines.index("module load cuda/12.4") < lines.index("export HF_TOKEN='x y'") < lines.index("DDTREE_PORT=30000")
    assert lines[-1] == "exec apptainer exec --nv /images/sglang.sif python -m sglang.launch_server --port ${DDTREE_PORT}"
    # What squeue and sacct say, as the controller reads it.
    status = parse_squeue_line("RUNNING|None|node2|ddtree-endpoint=10.0.0.7:31234\n")
    assert status is not None and (status.state, status.node, status.endpoint) == ("RUNNING", "node2", ("10.0.0.7", 31234))
    pending = parse_squeue_line("PENDING|Priority|(null)|\n")
    assert pending is not None and pending.waiting and pending.reason == "Priority" and pending.node == ""
    assert parse_sacct("4242|PREEMPTED|0:15|None\n") == ("PREEMPTED", "0:15", "None")
    assert (exit_code_number("0:15"), exit_code_number("3:0")) == (-15, 3)



def test_an_environment_name_that_is_no_shell_identifier_is_refused() -> None:
    """The job script writes ``export NAME=...``: a name such as ``X=1;touch /tmp/p;Y`` would be a
    command. The profile refuses it (tests/test_profiles.py); the script writer never writes it."""
    keys = parse_slurm_keys({"partition": "gpu"}, lambda k, p: ProfileError(p))
    with pytest.raises(ServiceStartError, match="not an environment variable name"):
        render_job_script(keys, job_name="j", output="o", command="c", env={"X=1;touch /tmp/p;Y": "v"}, port=1)


# -- against a local cluster -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and two slurmd in a temporary folder, for this module's tests."""
    problem = missing_slurm()
    if problem:
        pytest.skip(f"no local Slurm: {problem}")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2)
    try:
        cluster.start()
    except Exception as exc:  # noqa: BLE001 - a machine where slurmd cannot run: say why
        logs = "\n".join(f"{p.name}: {p.read_text()[-400:]}" for p in sorted((cluster.root / "log").glob("*")) if p.is_file())
        cluster.close()
        pytest.skip(f"local Slurm did not start here: {exc}\n{logs}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """The cluster, this process's Slurm commands pointed at it, and nothing of ours left queued after."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    yield slurm_cluster
    leftover = slurm_cluster.queue()
    slurm_cluster.run("scancel", "--user", "root")
    slurm_cluster.wait_queue_empty()
    assert not [job for job in leftover if job.split()[2] != "blocker"], leftover


def _listening_tcp(pid: int) -> list[str]:
    """The local addresses (ip:port) on which process ``pid`` listens, from /proc (no ss or psutil)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                ip = ".".join(str(b) for b in raw[::-1]) if width == 8 else raw.hex()
                found.append(f"{ip}:{int(port, 16)}")
    return found


def test_every_slurm_daemon_listens_on_loopback_only(slurm: SlurmCluster) -> None:
    """The test cluster is reachable from this machine only: slurmctld and each slurmd bind 127.0.0.1
    (CommunicationParameters=NoInAddrAny,NoCtldInAddrAny; without them they bind every interface)."""
    daemons = [(Path(str(proc.args[0])).name, _listening_tcp(proc.pid)) for proc in slurm.procs
               if proc.poll() is None and isinstance(proc.args, list) and "slurm" in Path(str(proc.args[0])).name]
    assert sorted(name for name, _ in daemons) == ["slurmctld", "slurmd", "slurmd"], daemons
    assert all(addresses for _, addresses in daemons), daemons
    assert all(a.startswith("127.0.0.1:") for _, addresses in daemons for a in addresses), daemons


def test_each_config_is_a_job_whose_url_follows_its_node(slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ddtree.service.gpu import HostGpus
    from tests.fleet_helpers import FAKES

    tools = tmp_path / "bin"  # a node "with a GPU": the fake nvidia-smi first on the PATH its steps get
    tools.mkdir()
    (tools / "nvidia-smi").write_text(f'#!/bin/sh\nexec {sys.executable} {FAKES / "nvidia-smi"} "$@"\n')
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    manager = _manager(tmp_path)
    try:
        service = manager.ensure(parse_config_name("bs8_b12_k6"))
        assert service.server_info["speculative_num_draft_tokens"] == 12 and service.url.startswith("http://127.0.0.1:")
        # The engine's start-up lines are read from the job log (evidence the config applied).
        assert service.proof is not None and service.proof.startup is not None and service.proof.startup.lines
        record = manager.launches[0]
        job = record["slurm"]
        assert record["url"] == service.url and f":{job['port']}" in service.url and job["node"] in slurm.node_names
        assert job["version"].startswith("slurm") and "#SBATCH --no-requeue" in job["script"]
        assert "--speculative-num-draft-tokens 12" in job["script"]
        assert slurm.job(job["job_id"])["JobState"] == "RUNNING"
        # The package's environment snapshot is taken on the job's node, as a step of the job.
        runner = manager.snapshot_runner()
        assert runner is not None and runner.name == job["node"]
        out = runner.run(["sh", "-c", 'echo "$SLURM_JOB_ID $SLURMD_NODENAME"'], timeout_s=30).stdout.split()
        assert out == [job["job_id"], job["node"]]
        # The GPUs of the hardware profile are the node's, asked there (nvidia-smi in the job's allocation).
        assert [g.name for g in HostGpus(runner).inventory().gpus] == ["NVIDIA H200"]
        # The next config is the next job; the first one is cancelled and gone.
        second = manager.ensure(parse_config_name("bs8_b4_k4"))
        assert second.server_info["speculative_num_draft_tokens"] == 4
        assert [line.split()[0] for line in slurm.queue()] == [manager.launches[1]["slurm"]["job_id"]]
        assert "serves on 127.0.0.1" in manager._controller.log_tail()  # type: ignore[union-attr]
    finally:
        assert manager.close() == []
    slurm.wait_queue_empty()
    assert slurm.job(manager.launches[0]["slurm"]["job_id"])["JobState"] == "CANCELLED"


def test_a_refused_submission_fails_its_config_with_sbatchs_words(slurm: SlurmCluster, tmp_path: Path) -> None:
    manager = _manager(tmp_path, partition="nosuch")
    try:
        with pytest.raises(ServiceStartError, match="sbatch refused the job .exit 1.: .*Invalid partition name specified") as info:
            manager.ensure(parse_config_name("bs8_b8_k4"))
        assert "#SBATCH --partition=nosuch" in str(info.value) and "check the profile's slurm: keys" in str(info.value)
    finally:
        assert manager.close() == []


def test_behind_a_login_node_every_slurm_command_runs_there_over_ssh(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``host:`` a login node: sbatch, squeue, scancel and the job log's tail go through ssh (a
    throwaway sshd whose sessions see the test cluster's SLURM_CONF); the URL is still the node's."""
    from tests.fleet_helpers import SshFleet, sshd_binary

    if sshd_binary() is None:
        pytest.skip("sshd is not installed: apt-get install -y openssh-server openssh-client (.ci/run does this)")
    fleet = SshFleet(tmp_path / "login", n=1, session_env={"SLURM_CONF": str(slurm.conf)}).start()
    raw = _profile_raw(output=str(tmp_path / "jobs" / "%x-%j.out"))
    raw.update(host=fleet.hosts[0].target, ssh_options=fleet.ssh_options())
    manager = ServiceManager(parse_profile(raw), Placement(0, tmp_path / "logs"), pacing=Pacing(poll_interval=0.2),
                             clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    try:
        service = manager.ensure(parse_config_name("bs8_b12_k6"))
        record = manager.launches[0]
        assert service.server_info["speculative_num_draft_tokens"] == 12 and service.url.startswith("http://127.0.0.1:")
        assert record["login_host"] == fleet.hosts[0].target and record["slurm"]["node"] in slurm.node_names
        assert "serves on 127.0.0.1" in manager._controller.log_tail()  # type: ignore[union-attr]
    finally:
        assert manager.close() == []
        fleet.close()
    assert not slurm.queue()


@pytest.mark.slow
def test_a_job_waits_in_the_queue_with_slurms_reason(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Both nodes are busy: the job pends with the reason squeue gives. Its own queue timeout fails
    it with that reason (and cancels it); with a longer one it starts once a node frees up."""
    blockers = [slurm.submit_blocker(node) for node in slurm.node_names]
    lines: list[str] = []
    # 12 s: on a loaded 2-core box slurmctld once had not yet given the job a reason after 6 s ("None")
    manager = _manager(tmp_path, lines, queue_timeout_s=12)
    try:
        with pytest.raises(ServiceStartError) as info:
            manager.ensure(parse_config_name("bs8_b8_k4"))
        message = str(info.value)
        assert "still PENDING after 12 s (queue_timeout_s); Slurm's reason: Resources (cancelled)" in message, message
        assert any("pending, reason: Resources" in line for line in lines), lines
        assert sorted(line.split()[0] for line in slurm.queue()) == sorted(blockers)
    finally:
        manager.close()

    lines.clear()
    manager = _manager(tmp_path / "2", lines, queue_timeout_s=60)

    def free_a_node_once_it_waits() -> None:
        wait_until(lambda: any("pending, reason: Resources" in line for line in lines), 30, "the pending progress line", interval=0.1)
        slurm.run("scancel", blockers[1])

    freer = threading.Thread(target=free_a_node_once_it_waits, daemon=True)
    freer.start()
    try:
        service = manager.ensure(parse_config_name("bs8_b8_k4"))
        freer.join(timeout=30)
        assert manager.launches[0]["slurm"]["node"] == slurm.node_names[1] and service.server_info["speculative_num_draft_tokens"] == 8
        assert manager.launches[0]["slurm"]["queued_s"] > 0
    finally:
        assert manager.close() == []
        slurm.run("scancel", blockers[0])


def _death_of(manager: ServiceManager, config: DDTreeConfig) -> str | None:
    """The manager's words once the config's job has died, else None (for wait_until)."""
    try:
        manager.ensure(config)
    except ServiceDiedError as exc:
        return str(exc)
    return None


@pytest.mark.slow
def test_a_job_killed_at_its_time_limit_fails_its_config_and_the_sweep_goes_on(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The running job's limit is cut to zero (as an admin may; Slurm's limit check then ends it
    within its 30 s period): the config fails with Slurm's state, exit code and log line; the next
    config gets a new job."""
    manager = _manager(tmp_path)
    config = parse_config_name("bs8_b8_k4")
    try:
        manager.ensure(config)
        job_id = manager.launches[0]["slurm"]["job_id"]
        assert slurm.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=0").returncode == 0

        message = wait_until(lambda: _death_of(manager, config), 90, "the job to be killed at its time limit", interval=0.5)
        assert f"slurm job {job_id} on " in message and "is TIMEOUT (reason TimeLimit, exit code 0:" in message, message  # 0:0 when the engine exits cleanly on SIGTERM
        assert "DUE TO TIME LIMIT" in message, message  # slurmstepd's line in the job log
        with pytest.raises(ServiceDiedError):  # the config's other tests fail at once, with the same words
            manager.ensure(config)
        assert manager.launches[0]["outcome"].startswith("died: slurm job")
        assert manager.ensure(parse_config_name("bs8_b4_k4")).server_info["speculative_num_draft_tokens"] == 4
    finally:
        assert manager.close() == []


def test_a_preempted_job_fails_its_config_with_slurms_words(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A job of a higher-tier partition takes the node (PreemptMode=CANCEL): the running config
    fails with PREEMPTED and slurmstepd's line; the next config's job runs on the other node."""
    manager = _manager(tmp_path)
    config = parse_config_name("bs8_b8_k4")
    try:
        manager.ensure(config)
        job = manager.launches[0]["slurm"]
        urgent = slurm.submit_blocker(job["node"], partition="urgent")

        message = wait_until(lambda: _death_of(manager, config), 60, "the job to be preempted", interval=0.3)
        assert f"slurm job {job['job_id']} on {job['node']} is PREEMPTED (exit code 0:" in message, message
        assert "DUE TO PREEMPTION" in message, message
        assert manager.ensure(parse_config_name("bs8_b4_k4")).server_info["speculative_num_draft_tokens"] == 4
        assert manager.launches[1]["slurm"]["node"] != job["node"]
    finally:
        assert manager.close() == []
        slurm.run("scancel", urgent)


def _sweep(tmp_path: Path, *extra: str, suites: tuple[str, ...] = ("suites/test_health.py",), configs: str = "bs8_b*_k4") -> list[str]:
    return [sys.executable, "-m", "pytest", *suites, f"--ddtree-config={configs}", "-n", "2",
            f"--ddtree-service={SHIPPED}", f"--ddtree-results={tmp_path / 'results'}", "-p", "no:cacheprovider", "-q", *extra]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["COLUMNS"] = "400"
    return env


@pytest.mark.slow
def test_sweep_with_two_workers_runs_two_jobs_at_once(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A two-config sweep of the shipped profile with ``-n 2`` (health, and lossless against each
    worker's non-speculative reference, itself a job): each launch its own job, both nodes busy at
    once, nothing left in the queue, and a package that records each job's script, the Slurm
    version and each node's environment. (The whole ``suites`` run is the README's; the coding and
    throughput gates add nothing Slurm-specific, and timing an engine on a shared CI box is
    tests/machine_share.py's business.)"""
    suites = ("suites/test_health.py", "suites/test_lossless.py")
    result = subprocess.run(_sweep(tmp_path, f"--ddtree-package={tmp_path / 'pkg'}", "--ddtree-package-name=slurm", suites=suites,
                                   configs="bs8_b4_k4,bs8_b8_k4"),
                            cwd=REPO, env=_env(), capture_output=True, text=True, timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert not slurm.queue(), slurm.queue()
    records = [yaml.safe_load(line) for f in (tmp_path / "results").glob("records-*.jsonl") for line in f.read_text().splitlines()]
    launches = [r["launch"] for r in records if r.get("kind") == "launch"]
    jobs = {launch["config"]: launch["slurm"] for launch in launches if launch["config"] != "lossless-reference"}
    assert sorted(jobs) == ["bs8_b4_k4", "bs8_b8_k4"], sorted(jobs)
    references = [launch["slurm"] for launch in launches if launch["config"] == "lossless-reference"]
    assert references and all("--speculative" not in job["script"] for job in references)  # the command without config_args
    assert len({job["job_id"] for job in [*jobs.values(), *references]}) == len(jobs) + len(references)
    # Two workers, two jobs at once: some of their jobs ran at the same time, on different nodes.
    spans = [(slurm.job(job["job_id"]), job["node"]) for job in [*jobs.values(), *references]]
    together = [(a_node, b_node) for i, (a, a_node) in enumerate(spans) for (b, b_node) in spans[i + 1:]
                if a["StartTime"] < b["EndTime"] and b["StartTime"] < a["EndTime"]]
    assert together and all(a_node != b_node for a_node, b_node in together), (together, spans)
    health = {r["config"]: r.get("host") for r in records if r.get("kind") == "health"}
    assert health == {config: job["node"] for config, job in jobs.items()}, health  # each result names its node
    # Every job of the sweep ended cancelled by the harness, none by a failure of its own.
    assert {slurm.job(job["job_id"]).get("JobState") for job in jobs.values()} == {"CANCELLED"}
    package = tmp_path / "pkg" / "slurm"
    assert (package / "services" / "slurm" / "slurm-version.txt").read_text().startswith("slurm")
    for config, job in jobs.items():
        assert (package / "services" / "slurm" / f"{config}.sbatch").read_text() == job["script"]
    hosts = sorted(p.name for p in (package / "env" / "hosts").iterdir())
    assert hosts and set(hosts) <= set(slurm.node_names), hosts  # each worker's last job's node, snapshot taken there
    for host in hosts:
        snapshot = yaml.safe_load((package / "env" / "hosts" / host / "environment.json").read_text())
        assert snapshot["env_vars"].get("SLURMD_NODENAME") == host, snapshot["env_vars"]


@pytest.mark.slow
def test_ctrl_c_cancels_running_and_queued_jobs(slurm: SlurmCluster, tmp_path: Path) -> None:
    """One node is taken by another user's job: one worker's job runs, the other's waits in the
    queue. SIGINT to the sweep's process group (a terminal's Ctrl-C) cancels both."""
    blocker = slurm.submit_blocker(slurm.node_names[1])
    proc = subprocess.Popen(_sweep(tmp_path), cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=default_sigint)
    try:
        def ours(state: str) -> list[str]:
            return [line for line in slurm.queue() if line.split()[1] == state and "blocker" not in line]

        wait_until(lambda: ours("RUNNING") and ours("PENDING"), 120, "one job of the sweep running and one pending", interval=0.2)
        queued = [line.split()[0] for line in ours("RUNNING") + ours("PENDING")]
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 2, out[-3000:]  # pytest's "interrupted"
    assert [line.split()[0] for line in slurm.queue()] == [blocker], (slurm.queue(), out[-3000:])
    assert {slurm.job(job_id).get("JobState") for job_id in queued} == {"CANCELLED"}
    for job_id in queued:  # each worker said what Slurm reports of its job once it was cancelled
        assert re.search(rf"slurm job {job_id}( on node\d)? stopped: squeue says CANCELLED", out), out[-3000:]
    slurm.run("scancel", blocker)
