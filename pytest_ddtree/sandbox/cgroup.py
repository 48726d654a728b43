"""A per-run memory and pids cgroup: limits the kernel counts, also for shared memory.

Why: ``RLIMIT_AS`` counts address space per process; ``memfd_create`` pages and files on a
tmpfs are not in it (+2 GiB was measured past a 512 MiB limit), and four runs at once share
the harness's memory.  A memory cgroup charges every page the run's processes touch,
including shmem and tmpfs, and its ``pids`` limit bounds the run's processes whatever uid
they have.  cgroup v1 (``memory.limit_in_bytes`` + ``pids.max``, as the project's machines
mount it at ``/sys/fs/cgroup/memory`` and ``/sys/fs/cgroup/pids``) and v2 (``memory.max`` +
``pids.max`` in a directory we may write) are both used, under the cgroup this process is
in.  The run's first stage (root) joins the cgroup before it drops to the run's uid; the
parent kills what is left in it and removes it after the run.  Standard library only.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

__all__ = ["RunCgroup", "available", "create"]

_ROOT = "/sys/fs/cgroup"


def _own_paths() -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup ("" for v2)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            for line in fh:
                parts = line.rstrip("\n").split(":", 2)
                if len(parts) != 3:
                    continue
                for ctrl in parts[1].split(",") if parts[1] else [""]:
                    out[ctrl] = parts[2]
    except OSError:
        pass
    return out


def _bases() -> tuple[str, dict[str, str]] | None:
    """("v1"|"v2", {"memory": dir, "pids": dir}) under which run cgroups are made, or None."""
    own = _own_paths()
    v1: dict[str, str] = {c: os.path.join(_ROOT, c, own[c].lstrip("/")) for c in ("memory", "pids") if c in own}
    if len(v1) == 2 and all(os.access(d, os.W_OK) for d in v1.values()):
        return "v1", v1
    if "" in own and os.path.exists(os.path.join(_ROOT, "cgroup.controllers")):
        base = os.path.join(_ROOT, own[""].lstrip("/"))
        try:
            with open(os.path.join(base, "cgroup.subtree_control"), encoding="utf-8") as fh:
                enabled = fh.read().split()
        except OSError:
            return None
        if {"memory", "pids"} <= set(enabled) and os.access(base, os.W_OK):
            return "v2", {"memory": base, "pids": base}
    return None


@dataclass
class RunCgroup:
    """One run's cgroup directories (one per controller on v1, one on v2)."""

    version: str
    dirs: tuple[str, ...]
    memory_bytes: int

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def oom_killed(self) -> bool:
        """Did the memory limit kill something (v1 oom_control / v2 memory.events)?"""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        try:
            with open(os.path.join(self.dirs[0], name), encoding="utf-8") as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value or 0) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return False

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files():
            try:
                with open(path, encoding="utf-8") as fh:
                    found.update(int(x) for x in fh.read().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def destroy(self, deadline_s: float = 5.0) -> str | None:
        """Kill everything left in the cgroup and remove it; what went wrong, or None."""
        end = time.monotonic() + deadline_s
        while True:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            removed = True
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    removed = False
            if removed:
                return None
            if time.monotonic() > end:
                return f"cgroup {', '.join(self.dirs)} not removed (processes left: {left})"
            time.sleep(0.02)


def available() -> str | None:
    """"v1" or "v2" when per-run cgroups can be made here, else None."""
    found = _bases()
    return found[0] if found else None


def create(name: str, memory_bytes: int, pids: int) -> RunCgroup | None:
    """Make the run's cgroup with its limits; None where this machine offers none."""
    found = _bases()
    if found is None:
        return None
    version, bases = found
    made: list[str] = []
    try:
        if version == "v1":
            for ctrl in ("memory", "pids"):
                path = os.path.join(bases[ctrl], name)
                os.makedirs(path, exist_ok=True)
                made.append(path)
            _write(os.path.join(made[0], "memory.limit_in_bytes"), str(memory_bytes))
            swap = os.path.join(made[0], "memory.memsw.limit_in_bytes")
            if os.path.exists(swap):
                _write(swap, str(memory_bytes))
            _write(os.path.join(made[1], "pids.max"), str(pids))
        else:
            path = os.path.join(bases["memory"], name)
            os.makedirs(path, exist_ok=True)
            made.append(path)
            _write(os.path.join(path, "memory.max"), str(memory_bytes))
            _write(os.path.join(path, "memory.swap.max"), "0", optional=True)
            _write(os.path.join(path, "pids.max"), str(pids))
    except OSError:
        for path in made:
            try:
                os.rmdir(path)
            except OSError:
                pass
        return None
    return RunCgroup(version, tuple(made), memory_bytes)


def _write(path: str, value: str, optional: bool = False) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(value)
    except OSError:
        if not optional:
            raise
