"""The processes of a run: the per-run uid, the /proc table, and killing whatever a run left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

#: First uid of the per-run uid range used when running as root.  Far above any real
#: account so the sandbox owns no file on the host and shares no process count.
UID_BASE = int(os.environ.get("DDTREE_SANDBOX_UID_BASE", "1500000000"))


def proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, real uid, cwd) from /proc; empty where /proc does not exist."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        ppid = uid = -1
        for line in text.splitlines():
            if line.startswith("PPid:"):
                ppid = int(line.split()[1])
            elif line.startswith("Uid:"):
                uid = int(line.split()[1])
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        table[pid] = (ppid, uid, cwd)
    return table


def find_leftovers(*, uid: int | None = None, workdir: str | None = None, root_pid: int | None = None) -> list[int]:
    """Pids still alive that belong to a run: owned by its uid, with its work dir as cwd,
    or descended from its first process.  Zombies count as gone."""
    table = proc_table()
    found: set[int] = set()
    for pid, (_ppid, puid, cwd) in table.items():
        if pid == os.getpid():
            continue
        if uid is not None and puid == uid:
            found.add(pid)
        elif workdir and (cwd == workdir or cwd.startswith(workdir + os.sep)):
            found.add(pid)
    if root_pid is not None:
        children: dict[int, list[int]] = {}
        for pid, (ppid, _uid, _cwd) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [root_pid]
        while stack:
            pid = stack.pop()
            for child in children.get(pid, []):
                if child not in found:
                    found.add(child)
                    stack.append(child)
    alive: list[int] = []
    for pid in sorted(found):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def kill_everything(proc: subprocess.Popen[bytes], uid: int | None, workdir: str, deadline_s: float = 5.0) -> None:
    """SIGKILL the run's process group, then anything of its uid / tree, until none is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    end = time.monotonic() + deadline_s
    while True:
        left = find_leftovers(uid=uid, workdir=workdir, root_pid=proc.pid)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > end:
            return
        time.sleep(0.02)


_uid_lock = threading.Lock()
_uid_counter = 0


def next_uid() -> int:
    """A per-run uid: distinct across the threads of this process and (by pid) across
    xdist workers, so processes limits and the leftover sweep never mix two runs."""
    global _uid_counter
    with _uid_lock:
        _uid_counter = (_uid_counter + 1) % 64
        slot = _uid_counter
    return UID_BASE + (os.getpid() % 100_000) * 64 + slot


def user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for _pid, (_pp, puid, _cwd) in proc_table().items() if puid == uid)
