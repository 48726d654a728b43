"""Privileged first stage of the Linux sandbox (runs as root; standard library only).

Mode ``unshare``: started as ``unshare --net --pid --ipc --uts --mount --fork --kill-child
--mount-proc -- python -I stage.py CONFIG_JSON``, it is PID 1 of new PID, network, IPC, UTS
and mount namespaces, still root.  It joins the run's cgroup, builds the run's whole view
on a fresh tmpfs (read-only ``/usr`` and the interpreter's prefix, with installed packages
and the project's data covered by empty read-only tmpfs mounts, a new ``/proc``, a few
device nodes, size-capped tmpfs ``/tmp``, ``/dev/shm`` and work dir) and ``pivot_root``s
into it, so nothing else of the host exists for the run.  A child then drops to the per-run
uid, sets ``no_new_privs``, loads the seccomp filter and ``exec``s the runner; the stage
reaps orphans until the runner ends.

Mode ``bwrap``: in a mount namespace of its own, it makes an interpreter under a 0700
directory (pyenv under ``/root``) reachable by covering the blocked directory with a tmpfs
and binding only the interpreter back, read-only; joins the run's cgroup; drops to the
per-run uid and ``exec``s bubblewrap, which builds the run's view (:mod:`.bwrap`).

Why a stage at all: dropping to an unprivileged uid is what makes ``RLIMIT_NPROC`` (fork
bombs) and file permissions real, joining a cgroup needs root, and the interpreter often
lives where the unprivileged uid cannot go.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        ctypes.c_ulong(flags),
        data.encode() if data is not None else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _blocked_ancestor(path: str) -> str | None:
    """The topmost directory on the way to ``path`` that 'others' may not traverse."""
    parts = os.path.abspath(path).split(os.sep)[1:]
    current = ""
    for part in parts[:-1] if len(parts) > 1 else []:
        current = current + os.sep + part
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return None
        if not mode & 0o001:
            return current
    return None


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CLONE_NEWNS = 0x00020000
MS_PRIVATE = 1 << 18


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _prctl(option: int, arg: int | ctypes.c_void_p | None) -> None:
    if _libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


def _join_cgroups(procs_files: list[str]) -> None:
    for path in procs_files:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))


def _drop(uid: int | None, gid: int | None) -> None:
    if uid is not None:
        os.setgroups([])
        os.setgid(gid if gid is not None else uid)
        os.setuid(uid)


def _expose(expose: list[str], fds: dict[str, int]) -> None:
    """Cover each directory the run's uid cannot traverse on the way to the interpreter with a
    tmpfs, and bind the interpreter back, read-only, at its own path."""
    covered: set[str] = set()
    for p in expose:
        blocked = _blocked_ancestor(p)
        if blocked is not None and blocked not in covered and blocked != "/":
            _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
            covered.add(blocked)
    for p in expose:
        if not os.path.isdir(p):
            os.makedirs(p, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fds[p]}", p, None, MS_BIND | MS_REC, None)
            _mount(None, p, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
MS_NOEXEC = 8
MNT_DETACH = 2
_PIVOT_ROOT_NR = {"x86_64": 155, "aarch64": 41}


def _ro_bind(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC, None)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def _minimal_root(workdir: str, expose: list[str], hide: list[str], tmp_size: str, uid: int | None, gid: int | None) -> None:
    """Build the run's whole view on a fresh tmpfs and ``pivot_root`` into it, as bubblewrap
    does: read-only ``/usr`` (and the ``/bin``, ``/lib*`` links), the interpreter's prefix,
    a new ``/proc``, a few device nodes, and size-capped tmpfs ``/tmp`` and work dir.
    Nothing else of the host (``/run``, ``/etc``, homes, the project) exists for the run."""
    new_root = workdir  # an empty host dir, private to this run; a tmpfs goes on top
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")

    def inside(path: str) -> str:
        return os.path.join(new_root, path.lstrip("/"))

    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), inside(path))
        elif os.path.isdir(path):
            os.makedirs(inside(path), exist_ok=True)
            _ro_bind(path, inside(path))
    for path in expose:
        if any(path == d or path.startswith(d + os.sep) for d in SYSTEM_DIRS):
            continue
        os.makedirs(inside(path), exist_ok=True)
        _ro_bind(path, inside(path))
    for path in hide:  # installed packages and the project's data: an empty read-only tmpfs
        if os.path.isdir(inside(path)):
            _mount("tmpfs", inside(path), "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=0755,size=4k")
    os.makedirs(inside("/proc"))
    _mount("proc", inside("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    os.makedirs(inside("/dev"))
    _mount("tmpfs", inside("/dev"), "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        open(inside(f"/dev/{name}"), "w").close()
        _mount(f"/dev/{name}", inside(f"/dev/{name}"), None, MS_BIND, None)
    for name, target in (("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"), ("fd", "/proc/self/fd")):
        os.symlink(target, inside(f"/dev/{name}"))
    os.makedirs(inside("/dev/shm"))
    os.makedirs(inside("/tmp"))
    _mount("tmpfs", inside("/tmp"), "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_size}")
    _mount("tmpfs", inside("/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_size}")
    # The work dir is a size-capped tmpfs of its own: what the run writes there never
    # reaches the host disk and vanishes with the namespace (no clean-up walk afterwards).
    os.makedirs(inside(workdir), exist_ok=True)
    owner = f",uid={uid},gid={gid if gid is not None else uid}" if uid is not None else ""
    _mount("tmpfs", inside(workdir), "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0700,size={tmp_size}{owner}")

    old = inside("/.oldroot")
    os.makedirs(old)
    nr = _PIVOT_ROOT_NR.get(os.uname().machine)
    if nr is None or _libc.syscall(nr, new_root.encode(), old.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root: {os.strerror(err)}")
    os.chdir("/")
    if _libc.umount2(b"/.oldroot", MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount /.oldroot: {os.strerror(err)}")
    os.rmdir("/.oldroot")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=1m")


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    mode: str = cfg.get("mode", "unshare")
    workdir: str = cfg["workdir"]
    uid: int | None = cfg["uid"]
    gid: int | None = cfg["gid"]
    expose: list[str] = cfg["expose"]
    tmp_size: str = cfg["tmp_size"]

    if mode == "bwrap":
        # Our own mount namespace, only to make the interpreter reachable for the run's uid;
        # bubblewrap (run as that uid) builds the run's view from it.
        if _libc.unshare(CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
        _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
        fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in expose}
        _expose(expose, fds)
        for fd in fds.values():
            os.close(fd)
        _join_cgroups(cfg.get("cgroup_procs", []))
        _drop(uid, gid)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(cfg["exec"][0], cfg["exec"])

    _join_cgroups(cfg.get("cgroup_procs", []))  # before the host's /sys goes out of view
    _minimal_root(workdir, expose, cfg.get("hide", []), tmp_size, uid, gid)

    argv_next: list[str] = cfg["exec"]
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        try:
            _drop(uid, gid)
            os.chdir(workdir)
            _load_filter(cfg.get("seccomp", ""))
            os.execv(argv_next[0], argv_next)
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"ddtree-sandbox-stage: {type(exc).__name__}: {exc}\n".encode())
        os._exit(126)
    # PID 1 of the namespace: reap orphans until the runner ends, then report its status
    # as an exit code (128 + signal, the shell convention): util-linux unshare 2.38 cannot
    # re-raise a child's fatal signal and would say only "exit 1".  When this process
    # exits, the kernel kills everything left in the namespace.
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 125
        if pid == child:
            if os.WIFSIGNALED(status):
                return 128 + os.WTERMSIG(status)
            return os.WEXITSTATUS(status)


def _load_filter(program_hex: str) -> None:
    """no_new_privs, then the seccomp filter (hex of struct sock_filter[]), if any."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if not program_hex:
        return
    raw = bytes.fromhex(program_hex)
    buf = ctypes.create_string_buffer(raw, len(raw))
    prog = _SockFprog(len(raw) // 8, ctypes.cast(buf, ctypes.c_void_p).value)
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which falls back
        print(f"ddtree-sandbox-stage: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(125)
