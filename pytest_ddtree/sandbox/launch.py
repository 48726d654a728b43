"""How one run is started: its command line per tier, its environment, its resource limits and its work dir."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pytest_ddtree.sandbox import bwrap, plain, seccomp, unshare
from pytest_ddtree.sandbox.limits import Limits
from pytest_ddtree.sandbox.processes import user_process_count
from pytest_ddtree.sandbox.view import hidden_paths, interpreter

_PKG_DIR = Path(__file__).resolve().parent
_STAGE = _PKG_DIR / "stage.py"


def scrubbed_env(workdir: str) -> dict[str, str]:
    """Nothing of the harness's environment (tokens, proxies, PYTHON*) reaches the code."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


@functools.lru_cache(maxsize=1)
def _runner_source() -> str:
    """values.py then runner.py, as one ``-c`` program: the run needs no project file."""
    parts = []
    for name in ("values.py", "runner.py"):
        text = (_PKG_DIR / name).read_text(encoding="utf-8")
        parts.append("\n".join(ln for ln in text.splitlines() if not ln.startswith("from __future__")))
    return "\n".join(parts) + "\n"


def build_command(tier: str, workdir: str, uid: int | None, limits: Limits, fds: tuple[int, ...], cgroup_procs: list[str]) -> tuple[list[str], int | None]:
    """argv and the uid for ``Popen(user=...)`` (plain tier) for one run."""
    exe, expose = interpreter()
    runner = [exe, "-I", "-c", _runner_source(), str(fds[0]), str(fds[1])]
    if tier == "plain":
        return plain.command(uid=uid, run=runner)
    cfg: dict[str, Any] = {
        "mode": "bwrap" if tier == "bwrap" else "unshare",
        "workdir": workdir,
        "uid": uid,
        "gid": uid,
        "expose": expose,
        "hide": list(hidden_paths()),
        "tmp_size": limits.tmp_size,
        "cgroup_procs": cgroup_procs,
    }
    if tier == "bwrap":
        seccomp_fd = fds[2] if len(fds) > 2 else None
        cfg["exec"] = bwrap.command(bwrap.find() or "bwrap", workdir=workdir, expose=expose, hide=list(hidden_paths()), tmp_bytes=size_bytes(limits.tmp_size), seccomp_fd=seccomp_fd, run=runner)
        return [exe, "-I", str(_STAGE), json.dumps(cfg)], None
    program = seccomp.program()
    cfg.update(seccomp=program.hex() if program else "", exec=runner)
    return unshare.command(user_namespace=tier == "userns", stage=[exe, "-I", str(_STAGE), json.dumps(cfg)]), None


def size_bytes(size: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].lower() in units else int(size)


def job_limits(limits: Limits, tier: str, uid: int | None) -> dict[str, int]:
    processes = limits.processes
    if tier == "userns" or (uid is None and os.getuid() != 0):
        processes += user_process_count()
    return {
        "cpu_s": max(1, int(limits.cpu_s + 0.999)),
        "memory_bytes": limits.memory_bytes,
        "file_size_bytes": limits.file_size_bytes,
        "open_files": limits.open_files,
        "processes": processes,
        "core": 0,
    }


def prepare_workdir(uid: int | None) -> str:
    """An empty private directory: the run's cwd (the namespace tiers mount a tmpfs on it)."""
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="ddtree-sbx-"))
    os.chmod(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, uid)
    return workdir


def remove_tree(path: str, deadline_s: float = 60.0) -> str | None:
    """Remove a run's work dir without a recursive Python walk (a 10,000-deep tree must not
    raise RecursionError into the gate): ``rm -rf --one-file-system`` under a deadline.
    Returns what went wrong, for the log; never raises."""
    try:
        os.rmdir(path)  # the usual case: the run wrote into a tmpfs that died with it
        return None
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        done = subprocess.run(["rm", "-rf", "--one-file-system", "--", path], capture_output=True, timeout=deadline_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not remove {path}: {type(exc).__name__}: {exc}"
    if done.returncode != 0 or os.path.lexists(path):
        return f"could not remove {path}: rm exited {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
    return None
