"""The bubblewrap backend: the run sees only the system's /usr, the interpreter and tmpfs.

Why bubblewrap: it is the well-kept tool for exactly this (Flatpak's sandbox).  Run as the
run's unprivileged uid inside a user namespace it builds a new root holding, read-only,
``/usr`` (with the ``/bin`` and ``/lib*`` links), the interpreter's prefix (with every
site- and dist-packages directory and the project's data covered by an empty tmpfs), a fresh
``/proc`` and a minimal ``/dev``; the work dir and ``/tmp`` are size-capped tmpfs mounts
that die with the namespace.  There is no ``/run``, ``/var``, ``/etc``, home or project
tree, no network (a new network namespace), new PID/IPC/UTS/cgroup namespaces,
``no_new_privs`` (bubblewrap always sets it), no further user namespaces
(``--disable-userns``) and the seccomp filter of :mod:`pytest_ddtree.sandbox.seccomp`.
``--die-with-parent`` ties the run to the harness.

bubblewrap cannot reach an interpreter under a 0700 directory (pyenv under ``/root``) as an
unprivileged uid, so the root stage (:mod:`pytest_ddtree.sandbox.stage`, mode ``bwrap``)
first makes it reachable in a mount namespace of its own, joins the run's cgroup, drops to
the run's uid and then executes the command built here.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["SYSTEM_DIRS", "command", "find"]

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def find() -> str | None:
    return shutil.which("bwrap")


def command(bwrap: str, *, workdir: str, expose: list[str], hide: list[str], tmp_bytes: int, seccomp_fd: int | None, run: list[str]) -> list[str]:
    """The bwrap argv for one run (the environment is the caller's, already scrubbed).
    Each directory of ``hide`` (installed packages, the project's data) is covered by an
    empty read-only tmpfs."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in expose:
        if not any(path == d or path.startswith(d + os.sep) for d in SYSTEM_DIRS):
            argv += ["--ro-bind", path, path]
    for path in hide:
        argv += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(tmp_bytes), "--tmpfs", "/tmp", "--size", str(tmp_bytes), "--tmpfs", "/dev/shm"]
    argv += ["--size", str(tmp_bytes), "--perms", "0700", "--tmpfs", workdir, "--chdir", workdir]
    argv += ["--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--", *run]
