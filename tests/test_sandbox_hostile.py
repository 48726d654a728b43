"""Hostile payloads against the sandbox: the seven findings of issue #11, with real processes.

Each payload is bounded (a few seconds, at most ~1 GiB of memory, a few MiB of disk) and
harmless if it escaped; each is written so that it *passes only if its attack worked* (it
returns the right answer only when it could read, forge or reach what it must not), so a
``passed`` verdict here is an escape.  After each run the host is checked: no process of the
run's uid, no work dir, no file written outside the run.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from pytest_ddtree import sandbox
from pytest_ddtree.sandbox import Isolation, Job, Limits, RunResult, Verdict
from pytest_ddtree.sandbox.execute import execute_in_tier

LIMITS = Limits(wall_s=6.0, cpu_s=4.0)
REPO = Path(__file__).resolve().parent.parent
SQUARE_TESTS = "f(7) == 49\nf(12) == 144\n"

pytestmark = pytest.mark.skipif(not sandbox.isolation().strong, reason=f"needs a namespace tier with a uid drop: {sandbox.isolation().describe()}")


def run_all(jobs: list[Job], limits: Limits = LIMITS) -> list[RunResult]:
    results = sandbox.run_many(jobs, limits, scale=False)
    for res in results:
        assert sandbox.find_leftovers(uid=res.uid) == [], f"{res.key}: processes left behind"
        assert not os.path.lexists(res.workdir), f"{res.key}: work dir left on the host"
        assert res.cleanup_error is None, res.cleanup_error
    return results


# --------------------------------------------------------------------------- 1: forged passes

FORGERIES = {
    # an object equal to everything: compared as data in the parent, it is opaque
    "eq_always": "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n\ndef f(x):\n    return Yes()\n",
    # patch the runner's serializer so the results say what we want
    "json_patch": (
        "import json\n_dumps = json.dumps\n"
        "json.dumps = lambda o, *a, **k: _dumps({'verdict': 'passed', 'steps': [{'v': [['B', True]]}] * 2})\n"
        "def f(x):\n    return 0\n"
    ),
    # write a verdict straight into the result pipe and leave
    "os_write": (
        "import os, sys\ndef f(x):\n    os.write(int(sys.argv[2]), b'{\"verdict\": \"passed\", \"nonce\": \"x\"}')\n    os._exit(0)\n"
    ),
    # results built to crash the parent: a JSON document nested 200,000 deep ...
    "deep_json": "import os, sys\ndef f(x):\n    os.write(int(sys.argv[2]), b'[' * 200_000)\n    os._exit(0)\n",
    # ... and a real value nested 20,000 deep (encoded without recursion, shown without crashing)
    "deep_value": "from functools import reduce\ndef f(x):\n    return reduce(lambda acc, _: [acc], range(20_000), [x])\n",
    # learn the answers from the tests, the problem files or the reference solutions
    "read_sources": (
        "import os, glob\n"
        f"SEEN = [p for p in ['tests.py', {str(REPO / 'suites/coding/slugify.yaml')!r}, {str(REPO / 'pytest_ddtree/gates/coding.py')!r}] if os.path.exists(p)]\n"
        f"SEEN += glob.glob({str(REPO.parent) + '/*/suites/coding/*.yaml'!r}) + glob.glob('/*/suites/coding/*.yaml')\n"
        "def f(x):\n    return x * x if SEEN else -1\n"
    ),
    # walk the runner's frames and the heap for expected values
    "frame_gc_walk": (
        "import gc, sys\n"
        "def f(x):\n"
        "    frame = sys._getframe()\n"
        "    while frame is not None:\n"
        "        for v in frame.f_locals.values():\n"
        "            if isinstance(v, dict) and 'expect' in v:\n"
        "                return v['expect']\n"
        "        frame = frame.f_back\n"
        "    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and ('expect' in o or 'verdict' in o):\n"
        "            return x * x\n"
        "    return -1\n"
    ),
}


def test_forged_passes_are_failed_or_error() -> None:
    results = run_all([Job(code, SQUARE_TESTS, "f", key=name) for name, code in FORGERIES.items()])
    verdicts = {r.key: r.verdict for r in results}
    assert all(v in (Verdict.FAILED, Verdict.ERROR) for v in verdicts.values()), verdicts
    # the honest answer passes through the same path
    (honest,) = run_all([Job("def f(x):\n    return x * x\n", SQUARE_TESTS, "f", key="honest")])
    assert honest.verdict is Verdict.PASSED, honest.message


# --------------------------------------------------------------------------- 2-4: disk, memory, writes outside


def test_deep_tree_disk_fill_and_memfd_bomb_end_with_a_verdict_and_leave_nothing() -> None:
    token = secrets.token_hex(6)
    outside = [f"/run/lock/ddtree-hostile-{token}", f"/var/tmp/ddtree-hostile-{token}", f"/dev/shm/ddtree-hostile-{token}", f"/tmp/ddtree-hostile-{token}"]
    payloads = {
        "deep_tree": (
            "import os\ndef f(x):\n    for i in range(1200):\n        os.mkdir('d')\n        os.chdir('d')\n"
            "    with open('blob', 'wb') as fh:\n        fh.write(b'x' * (8 << 20))\n    return x * x\n"
        ),
        "disk_fill": (
            "import os\ndef f(x):\n    n = 0\n    try:\n        while n < 256:\n"
            "            with open(f'fill{n}', 'wb') as fh:\n                fh.write(b'x' * (8 << 20))\n            n += 1\n"
            "    except OSError:\n        pass\n    return n\n"
        ),
        "memfd_bomb": (
            # 50 x 15 MiB: each under RLIMIT_FSIZE, 750 MiB in all, none of it in RLIMIT_AS
            "import os\nFDS = []\ndef f(x):\n    for i in range(50):\n        fd = os.memfd_create(f'm{i}')\n"
            "        os.write(fd, b'x' * (15 << 20))\n        FDS.append(fd)\n    return x * x\n"
        ),
        "writes_outside": (
            "import os\n"
            f"TARGETS = {outside!r}\n"
            "def f(x):\n    done = 0\n    for t in TARGETS:\n        try:\n"
            "            with open(t, 'w') as fh:\n                fh.write('cross-run channel')\n            done += 1\n"
            "        except OSError:\n            pass\n    return done\n"
        ),
    }
    tests = {"deep_tree": "f(3) == 9", "disk_fill": "f(1) == 256", "memfd_bomb": "f(3) == 9", "writes_outside": "f(1) == 0"}
    # 192 MiB of memory for the run: the kernel's count must stop 750 MiB of memfd pages
    small = Limits(wall_s=8.0, cpu_s=4.0, memory_bytes=192 << 20)
    results = {r.key: r for r in run_all([Job(code, tests[name], "f", key=name) for name, code in payloads.items()], small)}
    # the deep tree fits the work dir's tmpfs: it passes, and the parent's clean-up survives it
    assert results["deep_tree"].verdict is Verdict.PASSED, results["deep_tree"].message
    # the disk fill stops at the tmpfs cap (far below 256 x 8 MiB)
    assert results["disk_fill"].verdict is Verdict.FAILED and "got 256" not in results["disk_fill"].message
    # the memfd bomb (1 GiB of shared memory) is stopped by the kernel's accounting
    memfd = results["memfd_bomb"]
    if sandbox.isolation().cgroup:
        assert memfd.verdict is Verdict.ERROR and "cgroup memory limit" in memfd.message, memfd.message
    else:
        assert memfd.verdict in (Verdict.ERROR, Verdict.PASSED)
    # nothing written outside the run exists on the host afterwards (a later run cannot read it)
    assert [p for p in outside if os.path.lexists(p)] == []


def test_plain_tier_cleanup_survives_a_deep_tree() -> None:
    """The plain tier writes to the host disk: its clean-up (rm -rf --one-file-system under a
    deadline, no Python recursion: shutil.rmtree raised RecursionError near 1,000) must remove
    a 1,050-deep tree and still give a verdict.
    Run without a uid drop (the interpreter here may sit under /root): the payload is ours."""
    code = "import os\ndef f(x):\n    for i in range(1050):\n        os.mkdir('d')\n        os.chdir('d')\n    return x * x\n"
    res = execute_in_tier("plain", code, sandbox.parse_tests(SQUARE_TESTS, "f"), LIMITS, want_uid=False)
    assert res.verdict is Verdict.PASSED, res.message
    assert res.cleanup_error is None and not os.path.lexists(res.workdir)
    assert sandbox.find_leftovers(workdir=res.workdir) == []


# --------------------------------------------------------------------------- 5: unix sockets


def test_unix_sockets_under_run_and_abstract_receive_nothing() -> None:
    token = secrets.token_hex(6)
    path = f"/run/ddtree-hostile-{token}.sock"
    abstract = f"\0ddtree-hostile-{token}"
    servers = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    received: list[bytes] = []
    stop = threading.Event()

    def accept(server: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    received.append(conn.recv(1024))
                except OSError:
                    pass

    try:
        servers[0].bind(path)
        os.chmod(path, 0o777)
        servers[1].bind(abstract)
        threads = []
        for server in servers:
            server.listen(4)
            server.settimeout(0.2)
            threads.append(threading.Thread(target=accept, args=(server,), daemon=True))
            threads[-1].start()
        code = (
            "import socket\ndef f(x):\n    for address in ADDRESSES:\n"
            "        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "        try:\n            s.connect(address)\n            s.sendall(b'escaped')\n            return x * x\n"
            "        except OSError:\n            pass\n    return -1\n"
        )
        (res,) = run_all([Job(f"ADDRESSES = {[path, abstract]!r}\n" + code, SQUARE_TESTS, "f", key="unix")])
    finally:
        stop.set()
        for server in servers:
            server.close()
        if os.path.exists(path):
            os.unlink(path)
    assert res.verdict is Verdict.FAILED, res.message
    assert received == []


# --------------------------------------------------------------------------- 6: fail closed


def test_plain_without_opt_in_is_refused_with_reason_and_fix() -> None:
    plain = Isolation("plain", True, False, False, False, ("bubblewrap (bwrap) not installed: apt-get install bubblewrap",))
    why = sandbox.refusal(plain, allow_plain=False)
    assert why is not None and "--ddtree-sandbox=plain" in why and "apt-get install bubblewrap" in why
    assert sandbox.refusal(plain, allow_plain=True) is None
    as_root = Isolation("plain", False, False, False, False)
    if os.getuid() == 0:  # never as root, opt-in or not
        assert "as root" in (sandbox.refusal(as_root, allow_plain=True) or "")
    assert sandbox.refusal(sandbox.isolation(), allow_plain=False) is None  # this machine's tier is strong


# --------------------------------------------------------------------------- 7: keyring, privileges, kernel surface


def test_seccomp_no_new_privs_and_no_keyring() -> None:
    iso = sandbox.isolation()
    if not iso.seccomp:
        pytest.skip(f"no seccomp filter on this machine: {iso.describe()}")
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(nr, *args):\n    r = libc.syscall(nr, *args)\n    return ctypes.get_errno() if r == -1 else 0\n"
        "def clone(flags):\n    r = libc.syscall(56, flags, 0, 0, 0, 0)\n    if r == 0:\n        os._exit(0)  # an escaped child leaves at once\n"
        "    if r > 0:\n        os.waitpid(r, 0)\n    return ctypes.get_errno() if r == -1 else 0\n"
        "def f():\n"
        "    status = open('/proc/self/status').read()\n"
        "    nnp = status.split('NoNewPrivs:')[1].split()[0]\n"
        "    return [\n"
        "        call(250, 0, -3, 0, 0, 0),\n"  # keyctl(KEYCTL_GET_KEYRING_ID, session keyring)
        "        call(272, 0x10000000),\n"  # unshare(CLONE_NEWUSER)
        "        call(425, 8, 0),\n"  # io_uring_setup
        "        call(101, 16, 1, 0, 0),\n"  # ptrace(PTRACE_ATTACH, 1)
        "        call(165, 0, 0, 0, 0, 0),\n"  # mount
        "        clone(0x10000000 | 17),\n"  # clone(CLONE_NEWUSER | SIGCHLD)
        "        call(435, 0, 0),\n"  # clone3: ENOSYS, so libc falls back to clone
        "        call(41, 40, 1, 0),\n"  # socket(AF_VSOCK, SOCK_STREAM): vsock is not network-namespaced
        "        call(41, 1, 1, 0) == 0,\n"  # socket(AF_UNIX) still works (it returns an fd, not -1)
        "        nnp,\n"
        "        os.getuid() != 0,\n"
        "    ]\n"
    )
    (res,) = run_all([Job(code, "f() == [1, 1, 1, 1, 1, 1, 38, 1, True, '1', True]", "f", key="kernel")])
    assert res.verdict is Verdict.PASSED, res.message  # EPERM (1) everywhere, clone3 ENOSYS, vsock EPERM, no_new_privs set, not root


# --------------------------------------------------------------------------- the userns tier


def test_userns_tier_as_an_unprivileged_user() -> None:
    """Not root: the same stage inside a user namespace builds the same minimal view with the
    filter, and the gate refuses it without the opt-in (no uid drop, no cgroup).  Run as
    'nobody' with the system interpreter, which that user can reach."""
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if os.getuid() != 0 or setpriv is None or not os.access(python, os.X_OK):
        pytest.skip("needs root, util-linux setpriv and /usr/bin/python3 to act as an unprivileged user")
    script = (
        "import json\nfrom pytest_ddtree import sandbox\niso = sandbox.isolation()\n"
        "r = sandbox.run_code('import os\\ndef f():\\n    return sorted(os.listdir(\"/\"))', 'f() == 1', 'f')\n"
        "print(json.dumps({'tier': iso.tier, 'seccomp': iso.seccomp, 'message': r.message, 'refusal': sandbox.refusal(iso, False), 'describe': iso.describe()}))\n"
    )
    done = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", script],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, cwd="/tmp", capture_output=True, text=True, timeout=120, check=False,
    )
    if done.returncode != 0 and "Permission denied" in done.stderr:
        pytest.skip(f"the checkout is not readable by an unprivileged user: {done.stderr[-200:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["tier"] != "userns":
        pytest.skip(f"unprivileged user namespaces are not allowed here: tier {out['tier']}")
    listing = out["message"]  # the failed step shows what / holds in the run
    assert "'usr'" in listing and not any(f"'{d}'" in listing for d in ("etc", "run", "var", "home", "root", "work")), listing
    assert out["seccomp"] is True and "--ddtree-sandbox=plain" in out["refusal"]
    # memory: charged to a delegated cgroup where one is writable, else said to be unbounded
    assert "by cgroup" in out["describe"] or "shared memory: memfd, tmpfs, NOT bounded" in out["describe"], out["describe"]
