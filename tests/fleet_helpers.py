"""Throwaway OpenSSH "hosts" on 127.0.0.1 for the fleet tests and the fleet benchmark.

Each host is one real ``sshd`` on its own loopback port, with a throwaway host key, a throwaway
user key and ``SetEnv`` giving its sessions their own fake systemd state: the fake
``systemctl``/``journalctl``/``nvidia-smi`` of tests/fakes come first on PATH and keep their
state in the host's folder, so three hosts on one machine have three independent units, each
really running the reference engine. Nothing touches the machine's own ssh configuration: the
client runs with ``-F /dev/null`` and our own known_hosts, the servers with our own config.
Stopping a host's sshd kills the listener and every session it forked, as a host that goes down
would; services started through it live on (they belong to the fake systemd, as on a real host).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ddtree.service.pool import free_port
from pytest_ddtree.service.process import _parent_death_signal
from tests.polling import wait_until

FAKES = Path(__file__).resolve().parent / "fakes"
UNIT = "ddtree-ref.service"
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")
REFERENCE_FLAGS = {
    "block_size": "--speculative-dflash-block-size {value}",
    "budget": "--speculative-num-draft-tokens {value}",
    "topk": "--speculative-eagle-topk {value}",
    "window": "--speculative-draft-window-size {value}",
}
REFERENCE_APPLIED = {
    "speculative_dflash_block_size": "block_size",
    "speculative_num_draft_tokens": "budget",
    "speculative_eagle_topk": "topk",
    "speculative_draft_window_size": "window",
}


def sshd_binary() -> str | None:
    found = shutil.which("sshd")
    return found or next((path for path in SSHD_CANDIDATES if os.access(path, os.X_OK)), None)


def refserver_command(load_seconds: float = 0.0) -> str:
    """The fleet profile's launch command: the reference engine on the host's port."""
    return (
        f"{sys.executable} -m pytest_ddtree.refserver --host {{host}} --port {{port}} --clock-scale 10 "
        f"--load-seconds {load_seconds:g} {{config_args}}"
    )


@dataclass
class FakeHost:
    index: int
    root: Path
    ssh_port: int
    service_port: int
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def state(self) -> Path:
        return self.root / "systemd"

    @property
    def target(self) -> str:
        return f"{getpass.getuser()}@127.0.0.1:{self.ssh_port}"

    @property
    def dropin(self) -> Path:
        return self.state / "system" / f"{UNIT}.d" / "ddtree.conf"

    @property
    def lock_path(self) -> str:
        return str(self.root / "host.lock")

    def local_env(self) -> dict[str, str]:
        """Environment to run this host's fake systemctl from the test process itself."""
        return {**os.environ, "DDTREE_FAKE_SYSTEMD": str(self.state)}

    def systemctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(FAKES / "systemctl"), *args], env=self.local_env(), capture_output=True, text=True, timeout=60)

    def starts(self) -> list[str]:
        """Every ExecStart the fake systemd ran on this host, in order (from its journal)."""
        journal = self.state / f"{UNIT}.journal"
        if not journal.exists():
            return []
        marker = f"fake-systemd: Starting {UNIT}: "
        return [line.split(marker, 1)[1] for line in journal.read_text().splitlines() if marker in line]

    def delay_starts(self, seconds: float | None) -> None:
        """Make this host's next unit starts slow (the fake systemd sleeps before ExecStart), or not."""
        path = self.state / "start-delay"
        if seconds is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{seconds:g}")

    def unit_status(self) -> dict[str, Any]:
        path = self.state / f"{UNIT}.status.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_listening(port: int, timeout_s: float = 10.0) -> None:
    wait_until(lambda: _listening(port), timeout_s, f"sshd to listen on 127.0.0.1:{port}", interval=0.05)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class SshFleet:
    """``n`` fake hosts under ``root``; ``start()`` brings them up with their default config running."""

    root: Path
    n: int = 3
    load_seconds: float = 0.0
    session_env: dict[str, str] = field(default_factory=dict)
    """More variables for every ssh session (e.g. SLURM_CONF: a login node of a test cluster)."""
    hosts: list[FakeHost] = field(default_factory=list)

    @property
    def key(self) -> Path:
        return self.root / "id_ed25519"

    def ssh_options(self) -> list[str]:
        return [
            "-F", "/dev/null", "-i", str(self.key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={self.root / 'known_hosts'}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR",
        ]

    def default_command(self, host: FakeHost) -> str:
        return refserver_command(self.load_seconds).format(
            host="127.0.0.1", port=host.service_port,
            config_args="--speculative-dflash-block-size 8 --speculative-num-draft-tokens 8 --speculative-eagle-topk 4 "
            "--speculative-draft-window-size 2048",
        )

    def start(self) -> SshFleet:
        sshd = sshd_binary()
        if sshd is None:
            raise RuntimeError("sshd not installed: apt-get install -y openssh-server (.ci/run does)")
        if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
            Path("/run/sshd").mkdir(mode=0o755, parents=True)  # sshd's privilege separation dir when root
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("host_ed25519", "id_ed25519"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddtree-test", "-f", str(self.root / name)], check=True)
        shutil.copy(self.root / "id_ed25519.pub", self.root / "authorized_keys")
        host_key = (self.root / "host_ed25519.pub").read_text().split()[:2]
        known = []
        for index in range(self.n):
            host = FakeHost(index, self.root / f"host{index}", free_port(), free_port())
            (host.state / "system").mkdir(parents=True)
            known.append(f"[127.0.0.1]:{host.ssh_port} {' '.join(host_key)}")
            self.hosts.append(host)
        (self.root / "known_hosts").write_text("\n".join(known) + "\n")
        for host in self.hosts:
            self._write_sshd_config(host)
            self.start_sshd(host.index)
            (host.state / "system" / UNIT).write_text(f"[Service]\nExecStart={self.default_command(host)}\n")
            host.systemctl("daemon-reload")
            host.systemctl("start", UNIT)
        return self

    def _write_sshd_config(self, host: FakeHost) -> None:
        # Wrappers naming our interpreter: a login shell's rc files may put a slow python3 shim
        # (pyenv) ahead of everything on PATH.
        bin_dir = host.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool in ("systemctl", "journalctl", "nvidia-smi"):
            wrapper = bin_dir / tool
            wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKES / tool} "$@"\n')
            wrapper.chmod(0o755)
        # A sudo that logs what it was asked to run (sudo: true must only wrap unit management).
        sudo = bin_dir / "sudo"
        sudo.write_text(f'#!/bin/sh\n[ "$1" = "-n" ] && shift\necho "$*" >> {host.root / "sudo.log"}\nexec "$@"\n')
        sudo.chmod(0o755)
        path = ":".join([str(bin_dir), str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
        (host.root / "sshd_config").write_text(
            f"Port {host.ssh_port}\nListenAddress 127.0.0.1\nHostKey {self.root / 'host_ed25519'}\n"
            f"PidFile {host.root / 'sshd.pid'}\nAuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nMaxSessions 50\nMaxStartups 50\nLogLevel ERROR\n"
            # SHLVL=1: bash then skips ~/.bashrc for the command (it only reads it at level 1).
            f"SetEnv PATH={path} DDTREE_FAKE_SYSTEMD={host.state} SHLVL=1"
            + "".join(f" {name}={value}" for name, value in sorted(self.session_env.items())) + "\n"
        )

    def start_sshd(self, index: int) -> None:
        host = self.hosts[index]
        sshd = sshd_binary()
        assert sshd is not None
        log = open(host.root / "sshd.log", "ab")
        # Dies with the test process even when that is SIGKILLed (a timed-out CI job).
        host.sshd = subprocess.Popen([sshd, "-D", "-e", "-f", str(host.root / "sshd_config")], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL, preexec_fn=_parent_death_signal())
        log.close()
        _wait_listening(host.ssh_port)

    def stop_sshd(self, index: int) -> None:
        """The host goes down: its sshd and every session it forked are killed."""
        host = self.hosts[index]
        proc, host.sshd = host.sshd, None
        if proc is None:
            return
        victims = [proc.pid, *_descendants(proc.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)

    def close(self) -> None:
        for host in self.hosts:
            self.stop_sshd(host.index)
            host.systemctl("stop", UNIT)

    def pool_profile(self, *, name: str = "fleet", hosts: list[int] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A systemd host-pool profile over ``hosts`` (default: all) as a YAML-ready dict."""
        chosen = [self.hosts[i] for i in (hosts if hosts is not None else range(self.n))]
        raw: dict[str, Any] = {
            "name": name,
            "controller": "systemd",
            "unit": UNIT,
            "command": refserver_command(self.load_seconds),
            "url": "http://{host}:{port}",
            "port": chosen[0].service_port,
            "default_window": 2048,
            "config_args": dict(REFERENCE_FLAGS),
            "applied": dict(REFERENCE_APPLIED),
            "ssh_options": self.ssh_options(),
            "ready_timeout_s": 60,
            "stop_timeout_s": 10,
            "gpu_release_timeout_s": 20,
            "connect_timeout_s": 5,
            "command_timeout_s": 30,
            "lossless": "golden",
            "max_context": 16384,
            "pool": [
                {"host": h.target, "port": h.service_port, "dropin_dir": str(h.state / "system"), "lock_path": h.lock_path}
                for h in chosen
            ],
        }
        raw.update(extra or {})
        return raw
