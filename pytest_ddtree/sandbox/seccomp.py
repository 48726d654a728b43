"""A seccomp filter for the sandbox, hand-assembled classic BPF (no library needed).

Why: namespaces and a uid drop leave kernel interfaces open that generated code has no use
for and that are the usual first step of an escape: new user namespaces (a private root
with mount rights, tmpfs memory outside ``RLIMIT_AS``), the kernel keyring, ``io_uring``,
``ptrace``, mounts, ``bpf``, and ``socket(AF_VSOCK)`` (vsock is not network-namespaced, so a
new network namespace does not cut it off).  The filter makes them fail with ``EPERM`` and kills a process
that uses another syscall ABI (i386 or x32) to get round the table.  bubblewrap loads it with
``--seccomp FD``; the ``unshare`` stage loads it itself with ``prctl`` after
``PR_SET_NO_NEW_PRIVS``.  Only x86_64 has a table here: elsewhere :func:`program` returns
None and the tier reports "no seccomp".
"""

from __future__ import annotations

import platform
import struct

__all__ = ["DENIED", "program"]

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET

#: syscall -> number on x86_64 (denied outright with EPERM).
DENIED = {
    "ptrace": 101,
    "pivot_root": 155,
    "mount": 165,
    "umount2": 166,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
_CLONE = 56
_SOCKET = 41
_AF_VSOCK = 40  # vsock is not network-namespaced: it reaches the host and VMs past --unshare-net
_CLONE3 = 435  # its flags live in memory BPF cannot read: ENOSYS makes libc fall back to clone

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_EPERM = 1
_ENOSYS = 38


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The filter as ``struct sock_filter[]`` bytes, or None on a machine without a table."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    deny = sorted(DENIED.values())
    ins: list[bytes] = [
        _ins(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _ins(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        _ins(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _ins(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _ins(_JGE_K, 0, 1, _X32_BIT),
        _ins(_RET_K, 0, 0, _RET_KILL_PROCESS),
    ]
    # n denied numbers, each "jeq nr -> ret EPERM"; the EPERM return sits after them.
    tail_after = len(deny)  # instructions between a jeq and the EPERM return (exclusive)
    for i, nr in enumerate(deny):
        ins.append(_ins(_JEQ_K, tail_after - i + 4, 0, nr))
    ins += [
        _ins(_JEQ_K, 0, 1, _CLONE3),  # t0
        _ins(_RET_K, 0, 0, _RET_ERRNO | _ENOSYS),  # t1
        _ins(_JEQ_K, 0, 2, _SOCKET),  # t2: socket -> t3, else t5
        _ins(_LD_W_ABS, 0, 0, 16),  # t3: seccomp_data.args[0], low 32 bits: the address family
        _ins(_JEQ_K, 0, 3, _AF_VSOCK),  # t4: AF_VSOCK -> EPERM (fixed up below), else allow (t8)
        _ins(_JEQ_K, 0, 3, _CLONE),  # t5: clone -> t6, else allow (t9)
        _ins(_LD_W_ABS, 0, 0, 16),  # t6: seccomp_data.args[0], low 32 bits: the clone flags
        _ins(_JSET_K, 1, 0, _NAMESPACE_FLAGS),  # t7: namespace flags -> EPERM (fixed up below)
        _ins(_RET_K, 0, 0, _RET_ALLOW),  # t8
        _ins(_RET_K, 0, 0, _RET_ALLOW),  # t9
    ]
    # fix-up: the jeq targets above must land on the EPERM return appended here
    eperm_index = len(ins)
    ins.append(_ins(_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    base = 6
    for i, nr in enumerate(deny):
        pos = base + i
        ins[pos] = _ins(_JEQ_K, eperm_index - pos - 1, 0, nr)
    vsock_pos = base + len(deny) + 4
    ins[vsock_pos] = _ins(_JEQ_K, eperm_index - vsock_pos - 1, 3, _AF_VSOCK)
    jset_pos = base + len(deny) + 7
    ins[jset_pos] = _ins(_JSET_K, eperm_index - jset_pos - 1, 0, _NAMESPACE_FLAGS)
    return b"".join(ins)
