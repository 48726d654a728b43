"""Who answers on a port: so a launch never measures a server somebody else left there.

Why: with a fixed ``port: 30000`` and a stranger already listening there, the health wait was
answered by the stranger at once ("ready after 0.0 s", its block size "proven by behaviour"), a
test passed against it, and only then did the harness's own launch die with "Address already in
use". So the process controller refuses a port that already answers before it launches (naming who
answers: the listening process from ``/proc``, where this user can see it), and once the health path
answers it checks that the port's listener belongs to the process group it started.

Linux only where it names processes (``/proc/net/tcp{,6}`` and ``/proc/<pid>/fd``); elsewhere it
still sees that the port answers, and cannot say who.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pytest_ddtree.service.base import ServiceStartError

#: How long the pre-launch connect may take (loopback answers in microseconds).
CONNECT_TIMEOUT_S = 1.0
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp
_MAX_FDS = 200_000  # fds looked at before giving up on naming the listener (a bounded scan)


class PortTaken(ServiceStartError):
    """The launch's port already answers: a fixed port fails its launch; an auto-chosen one is
    chosen again (the manager's port race)."""


def answers(host: str, port: int) -> bool:
    """Whether something accepts a TCP connection on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def listening_inodes(port: int) -> set[int]:
    """The socket inodes listening on ``port`` (any address, IPv4 or IPv6); empty where /proc has none."""
    out: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                out.add(int(fields[9]))
    return out


def owners(inodes: set[int]) -> dict[int, int]:
    """pid -> process group of each process that holds one of ``inodes`` (those this user can see)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    found: dict[int, int] = {}
    seen = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                seen += 1
                if os.readlink(fd.path) in wanted:
                    found[int(entry.name)] = os.getpgid(int(entry.name))
                    break
        except OSError:
            continue  # gone, or not ours to look at
        if seen > _MAX_FDS:
            break
    return found


def describe(pid: int) -> str:
    """``pid 123 (python -m http.server 30000)``, the command line cut short."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()[:300]
        command = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        command = ""
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def who_listens(port: int) -> str:
    """Who listens on ``port``, as far as this user can tell."""
    inodes = listening_inodes(port)
    if not inodes:
        return "something this machine does not list as a listener (a forwarded port, another network namespace?)"
    pids = owners(inodes)
    if not pids:
        return "a process of another user (its socket is listed, its process is not visible to this user)"
    return ", ".join(describe(pid) for pid in sorted(pids))


def stranger_on(port: int, group: int) -> str | None:
    """Why ``port``'s listener is not of process group ``group`` (who it is), or None: it is ours,
    or this machine cannot tell (no listener listed: the check never refuses what it cannot see)."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    pids = owners(inodes)
    if any(pgid == group for pgid in pids.values()):
        return None
    who = ", ".join(describe(pid) for pid in sorted(pids)) or "a process of another user"
    return f"port {port} is listened on by {who}, not by the process group {group} this session started"
