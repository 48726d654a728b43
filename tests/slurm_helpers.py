"""A throwaway Slurm cluster on this machine for the slurm controller's tests.

Real daemons from Debian's ``slurm-wlm`` and ``munge``: one ``munged`` with its own key and
socket, one ``slurmctld`` and one ``slurmd`` per node (``slurmd -N nodeN``, each node with its own
port, ``NodeHostname=localhost``, ``NodeAddr=127.0.0.1``), all configured in a temporary folder
(state, spool, logs, pid files) through ``SLURM_CONF``: the machine's own ``/etc/slurm`` and
``/etc/munge`` are never read or changed. No cgroups (``proctrack/linuxproc``, ``task/none``), no
accounting daemon (``sacct`` then says accounting is disabled, and the controller reads the final
state from ``scontrol show job``), scheduler intervals lowered so a test waits seconds, not
minutes. :meth:`SlurmCluster.close` cancels every job and stops every daemon it started.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pytest_ddtree.service.pool import free_port
from pytest_ddtree.service.process import _parent_death_signal
from tests.polling import wait_until

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
DAEMON_DIRS = ("/usr/sbin", "/usr/bin", "/sbin")


def missing_slurm() -> str | None:
    """Why a local cluster cannot start here (None: it can)."""
    missing = [name for name in SLURM_BINARIES if _which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed: apt-get install -y slurm-wlm munge (.ci/run does this)"
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs (the tests' throwaway cluster runs it as root)"
    return None


def _which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in DAEMON_DIRS if os.access(f"{d}/{name}", os.X_OK)), None)


@dataclass
class SlurmCluster:
    """``nodes`` slurmd nodes (node1, node2...), one CPU each, in partition ``debug``."""

    root: Path
    nodes: int = 2
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"node{i + 1}" for i in range(self.nodes)]

    def start(self) -> SlurmCluster:
        problem = missing_slurm()
        if problem:
            raise RuntimeError(problem)
        for name in ("munge", "state", "log"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o755)  # munged wants its socket's folder reachable by everyone
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        socket_path = self.root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._spawn("munged", [_req("munged"), "-F", "-f", f"--socket={socket_path}", f"--key-file={key}",
                               f"--log-file={self.root / 'log' / 'munged.log'}", f"--pid-file={self.root / 'munge' / 'pid'}",
                               f"--seed-file={self.root / 'munge' / 'seed'}"])
        wait_until(socket_path.exists, 20, "munged to create its socket", interval=0.05)
        self._write_conf(socket_path)
        self._spawn("slurmctld", [_req("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        wait_until(lambda: self.run("sinfo", "-h").returncode == 0, 30, "slurmctld to answer sinfo", interval=0.2)
        for node in self.node_names:
            self._spawn(f"slurmd-{node}", [_req("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        wait_until(self.all_idle, 60, f"{self.nodes} slurmd node(s) to register idle", interval=0.2)
        return self

    def _write_conf(self, socket_path: Path) -> None:
        user = getpass.getuser()
        root = self.root
        node_lines = "".join(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs=1 RealMemory=1000 State=UNKNOWN\n"
            for node in self.node_names
        )
        self.conf.write_text(
            "ClusterName=ddtree-test\n"
            # slurmd (NoInAddrAny) and slurmctld (NoCtldInAddrAny) on loopback only: without them they listen on every interface
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny\n"
            f"SlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={free_port()}\nSlurmdPort={free_port()}\n"
            f"SlurmUser={user}\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={socket_path}\n"
            f"StateSaveLocation={root / 'state'}\nSlurmdSpoolDir={root / 'spool-%n'}\n"
            f"SlurmctldPidFile={root / 'slurmctld.pid'}\nSlurmdPidFile={root / 'slurmd-%n.pid'}\n"
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}\nSlurmdLogFile={root / 'log' / 'slurmd-%n.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "SchedulerType=sched/backfill\nSchedulerParameters=bf_interval=1,sched_min_interval=100000\n"
            # Quick turn-around: a cancelled job is SIGKILLed 2 s after SIGTERM, a lost daemon noticed soon.
            "MessageTimeout=5\nKillWait=2\nInactiveLimit=0\nSlurmdTimeout=30\nReturnToService=2\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            + node_lines
            # A higher tier whose jobs cancel the default partition's (what preemption looks like).
            + "PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n"
            + f"PartitionName=debug Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP PriorityTier=1\n"
            + f"PartitionName=urgent Nodes={','.join(self.node_names)} MaxTime=INFINITE State=UP PriorityTier=2\n"
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        # Dies with the test process even when that is SIGKILLed (a timed-out CI job).
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=self.env,
                                preexec_fn=_parent_death_signal(), start_new_session=True)
        log.close()
        self.procs.append(proc)

    def run(self, *argv: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), env=self.env, input=input_text, capture_output=True, text=True, timeout=30)

    def all_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return sorted(states) == self.node_names and all(s == "idle" for s in states.values())

    def queue(self) -> list[str]:
        """``squeue``'s jobs (pending, running, completing) as ``ID STATE NAME``."""
        return [line for line in self.run("squeue", "-h", "-o", "%i %T %j").stdout.splitlines() if line.strip()]

    def wait_queue_empty(self, timeout_s: float = 30) -> None:
        wait_until(lambda: not self.queue(), timeout_s, "squeue to be empty", interval=0.2)

    def job(self, job_id: str) -> dict[str, str]:
        from pytest_ddtree.service.slurm import parse_scontrol_job

        return parse_scontrol_job(self.run("scontrol", "show", "job", "-o", job_id).stdout)

    def submit_blocker(self, node: str, partition: str = "debug") -> str:
        """A job that holds ``node``'s only CPU until cancelled (what makes ours wait in the queue;
        in partition ``urgent``, what preempts ours)."""
        result = self.run("sbatch", "--parsable", f"--nodelist={node}", f"--partition={partition}", "--job-name=blocker",
                          "--output=/dev/null", "--wrap=sleep 600")
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip()
        wait_until(lambda: self.job(job_id).get("JobState") == "RUNNING", 30, f"blocker job {job_id} to run", interval=0.2)
        return job_id

    def close(self) -> None:
        if self.procs:
            self.run("scancel", "--user", getpass.getuser())
            try:  # the jobs' slurmstepd are not the daemons' children: let Slurm end them first
                self.wait_queue_empty(30)
            except AssertionError:
                pass
        for proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()


def _req(name: str) -> str:
    path = _which(name)
    assert path is not None, name
    return path
