"""The util-linux ``unshare`` backend: new namespaces, then the root stage builds the view.

Why: where bubblewrap is not installed, util-linux ``unshare`` (present on every Debian
system) still gives new PID, network, IPC, UTS and mount namespaces; the root stage
(:mod:`pytest_ddtree.sandbox.stage`, mode ``unshare``) then builds the same minimal,
read-only root as bubblewrap and ``pivot_root``s into it, drops to the run's uid, sets
``no_new_privs`` and loads the seccomp filter.  As PID 1 of the namespace it reaps orphans;
``--kill-child`` ties the namespace to the process the parent kills on a timeout.  Not root
(tier ``userns``), the same runs inside a new user namespace, without a uid drop.
"""

from __future__ import annotations

import shutil

__all__ = ["command", "find"]


def find() -> str | None:
    return shutil.which("unshare")


def command(*, user_namespace: bool, stage: list[str]) -> list[str]:
    """The unshare argv that starts ``stage`` (the interpreter, stage.py and its config)."""
    argv = [find() or "unshare"]
    if user_namespace:
        argv += ["--user", "--map-root-user"]
    argv += ["--net", "--pid", "--ipc", "--uts", "--mount", "--fork", "--kill-child", "--mount-proc", "--"]
    return argv + stage
