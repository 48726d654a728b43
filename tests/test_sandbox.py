"""Containment tests for pytest_ddtree.sandbox: real sandboxed subprocesses, no mocks.

Each hostile program must end within its limit with a clear verdict and leave no process
behind (checked through /proc: nothing owned by the run's uid, nothing with its work dir as
cwd) and no work dir behind.
"""

from __future__ import annotations

import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path

import pytest

from pytest_ddtree import sandbox
from pytest_ddtree.sandbox import Job, Limits, RunResult, Verdict

FAST = Limits(wall_s=4.0, cpu_s=3.0)
ENTRY_TESTS = "assert f() == 1\n"


#: How long past its wall limit a run may go before the test gives up on it: only a sandbox that
#: never ends a run reaches it (its verdict message names the limit that did end it).
STUCK_FACTOR = 10.0
STUCK_GRACE_S = 60.0


def run(code: str, tests: str = ENTRY_TESTS, entry: str | None = "f", limits: Limits = FAST) -> RunResult:
    pool = ThreadPoolExecutor(1)
    try:
        future = pool.submit(sandbox.run_code, code, tests, entry, limits, scale=False)
        try:
            res = future.result(timeout=STUCK_FACTOR * limits.wall_s + STUCK_GRACE_S)
        except FuturesTimeout:
            pytest.fail(f"the sandbox did not end the run: still running long after its {limits.wall_s:g} s wall limit")
    finally:
        pool.shutdown(wait=False)
    assert_clean(res)
    return res


def assert_clean(res: RunResult) -> None:
    left = sandbox.find_leftovers(uid=res.uid, workdir=res.workdir or None)
    assert left == [], f"processes left behind: {left}"
    if res.workdir:
        assert not os.path.exists(res.workdir), "work dir not removed"


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc checks")


def test_isolation_is_reported() -> None:
    iso = sandbox.isolation()
    assert iso.tier in sandbox.TIERS
    assert iso.describe().startswith("tier=")
    if sys.platform.startswith("linux") and os.getuid() == 0 and not iso.strong:
        pytest.fail(f"root on Linux should get the bwrap or unshare tier: {iso}")


def test_pass_fail_error_verdicts() -> None:
    ok = run("def f():\n    return 1\n")
    assert ok.verdict is Verdict.PASSED, ok.message
    bad = run("def f():\n    return 2\n")
    assert bad.verdict is Verdict.FAILED
    assert "assert f() == 1" in bad.message and "got:      2" in bad.message
    msg = run("def f():\n    return 2\n", tests="assert f() == 1, 'want one'\n")
    assert msg.verdict is Verdict.FAILED and "want one" in msg.message
    err = run("def f():\n    raise KeyError('boom')\n")
    assert err.verdict is Verdict.ERROR and "KeyError" in err.message and "boom" in err.message
    syn = run("def f(:\n")
    assert syn.verdict is Verdict.ERROR and "SyntaxError" in syn.message
    missing = run("def g():\n    return 1\n")
    assert missing.verdict is Verdict.ERROR and "'f'" in missing.message
    assert sandbox.run_code("  \n", ENTRY_TESTS, "f").verdict is Verdict.NO_CODE


def test_exit_calls_do_not_pass() -> None:
    assert run("import sys\nsys.exit(0)\n").verdict is Verdict.ERROR
    hard = run("import os\nos._exit(0)\n")
    assert hard.verdict is Verdict.ERROR and "before reporting its results" in hard.message


def test_main_block_does_not_run() -> None:
    res = run("def f():\n    return 1\nif __name__ == '__main__':\n    input()\n")
    assert res.verdict is Verdict.PASSED


@linux_only
def test_infinite_loop_times_out() -> None:
    res = run("def f():\n    while True:\n        pass\n", limits=Limits(wall_s=1.5, cpu_s=10.0))
    assert res.verdict is Verdict.TIMEOUT and "wall-clock" in res.message


@linux_only
def test_cpu_limit() -> None:
    res = run("def f():\n    while True:\n        pass\n", limits=Limits(wall_s=30.0, cpu_s=1.0))
    # the CPU limit ended it, not the wall clock (which a loaded machine could also reach)
    assert res.verdict is Verdict.TIMEOUT and "CPU time limit" in res.message, res.message


@linux_only
def test_fork_bomb_is_contained() -> None:
    code = (
        "import os\n"
        "def f():\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            pass\n"
    )
    iso = sandbox.isolation()
    if os.getuid() == 0 and not iso.uid_drop:
        pytest.skip(f"root without a uid drop cannot bound processes (RLIMIT_NPROC): {iso.describe()}")
    res = run(code, limits=Limits(wall_s=2.0, cpu_s=5.0))
    assert res.verdict in (Verdict.TIMEOUT, Verdict.ERROR)


@linux_only
def test_memory_bomb() -> None:
    code = "def f():\n    blocks = []\n    while True:\n        blocks.append(bytearray(50_000_000))\n"
    res = run(code, limits=Limits(wall_s=5.0, memory_bytes=256 * 1024 * 1024))
    assert res.verdict is Verdict.ERROR and "MemoryError" in res.message


def test_output_flood_is_cut() -> None:
    code = "import sys\ndef f():\n    while True:\n        sys.stdout.write('x' * 65536)\n"
    res = run(code, limits=Limits(wall_s=10.0, output_kill_bytes=2 * 1024 * 1024, output_bytes=1000))
    assert res.verdict is Verdict.ERROR and "output flood" in res.message
    assert len(res.stdout) <= 1000  # (the 10 s wall limit would have said TIMEOUT: the flood ended it)


def test_stdin_is_empty() -> None:
    res = run("import sys\ndata = sys.stdin.read()\ndef f():\n    return 1 if data == '' else 0\n")
    assert res.verdict is Verdict.PASSED, res.message
    eof = run("x = input()\ndef f():\n    return 1\n")
    assert eof.verdict is Verdict.ERROR and "EOFError" in eof.message


@linux_only
def test_setsid_child_is_killed() -> None:
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(600)\n"
        "    os._exit(0)\n"
        "def f():\n"
        "    return 1\n"
    )
    res = run(code)
    assert res.verdict is Verdict.PASSED
    # a run that times out while its setsid grandchild sleeps
    res2 = run(code.replace("    return 1\n", "    time.sleep(600)\n"), limits=Limits(wall_s=1.5))
    assert res2.verdict is Verdict.TIMEOUT


@linux_only
def test_write_outside_is_refused(tmp_path: Path) -> None:
    canary_dir = Path(os.environ.get("DDTREE_CANARY_DIR", str(Path(__file__).resolve().parent)))
    canary = tmp_path / "canary.txt"
    canary.write_text("intact\n")
    canary.chmod(0o644)
    tmp_path.chmod(0o755)
    targets = [str(canary), str(tmp_path / "new.txt"), str(canary_dir / "ddtree-sandbox-escape.txt")]
    code = (
        "import os\n"
        f"TARGETS = {targets!r}\n"
        "def f():\n"
        "    wrote = []\n"
        "    for t in TARGETS:\n"
        "        try:\n"
        "            with open(t, 'w') as fh:\n"
        "                fh.write('pwned')\n"
        "            wrote.append(t)\n"
        "        except OSError:\n"
        "            pass\n"
        "    try:\n"
        "        open('/tmp/ddtree-sandbox-leak.txt', 'w').write('x')\n"
        "    except OSError:\n"
        "        pass\n"
        "    open('inside.txt', 'w').write('fine')\n"
        "    return wrote\n"
    )
    iso = sandbox.isolation()
    if not iso.uid_drop:
        pytest.skip(f"files of the invoking user are writable in this tier: {iso.describe()}")
    res = run(code, tests="assert f() == []\n")
    assert canary.read_text() == "intact\n"
    assert not (canary_dir / "ddtree-sandbox-escape.txt").exists()
    if iso.uid_drop:
        assert res.verdict is Verdict.PASSED, res.message
        assert not (tmp_path / "new.txt").exists()
    if iso.private_tmp:
        assert not Path("/tmp/ddtree-sandbox-leak.txt").exists()


@linux_only
def test_no_network() -> None:
    iso = sandbox.isolation()
    if not iso.network_isolated:
        pytest.skip(f"no network isolation on this machine: {iso.describe()}")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        code = (
            "import socket\n"
            "def f():\n"
            "    try:\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "        return 'connected'\n"
            "    except OSError:\n"
            "        return 1\n"
        )
        res = run(code)
        assert res.verdict is Verdict.PASSED, res.message
    finally:
        srv.close()


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_SECRET_TOKEN", "hunter2")
    res = run("import os\ndef f():\n    return 1 if 'DDTREE_SECRET_TOKEN' not in os.environ and os.environ['HOME'] == os.getcwd() else 0\n")
    assert res.verdict is Verdict.PASSED, res.message


def test_run_many_parallel_keeps_order() -> None:
    jobs = [Job(code=f"def f():\n    return {i % 2}\n", tests=ENTRY_TESTS, entry_point="f", key=str(i)) for i in range(6)]
    results = sandbox.run_many(jobs, FAST, scale=False)
    assert [r.key for r in results] == [str(i) for i in range(6)]
    assert [r.verdict for r in results] == [Verdict.FAILED, Verdict.PASSED] * 3
    for r in results:
        assert_clean(r)


def test_speed_factor_cached_and_bounded() -> None:
    a = sandbox.speed_factor()
    assert a == sandbox.speed_factor()
    assert 0 < a <= 20
    scaled = Limits(wall_s=2.0, cpu_s=1.0).scaled(3.0)
    assert scaled.wall_s == 6.0 and scaled.cpu_s == 3.0
    # the CPU limit scales by the loop's CPU seconds, never more than its clock seconds (one thread)
    cpu = sandbox.limits.cpu_speed_factor()
    assert 1 <= cpu <= a * 1.01 or "DDTREE_SANDBOX_SPEED_FACTOR" in os.environ
    assert Limits(wall_s=2.0, cpu_s=1.0).scaled(3.0, 1.5).cpu_s == 1.5
