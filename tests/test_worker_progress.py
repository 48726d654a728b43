"""Progress lines of xdist workers on the main process's terminal (report/relay.py): a real ``-n 2``
run on the reference engine shows both workers' waits live, and the channel's bounds hold."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pytest_ddtree.report import relay
from tests.polling import wait_until
from tests.suite_helpers import REPO, reference_profile

MATRIX_OF_TWO_CONFIGS = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4, bs8_b4_k4]
cell_defaults: {output_tokens: 64, prompts: coding}
cells:
  - {name: c1_steady, concurrency: 1, context_tokens: 128, requests: 8, warmup_requests: 1}
"""


@pytest.mark.slow  # two engines, one after the other, and their cells on a 2-core box: about 45 s
def test_minus_n_2_shows_both_workers_progress_before_the_summary(pytester: pytest.Pytester) -> None:
    """``-n 2``: each worker's service start and its cell's repeats reach the main process's terminal,
    prefixed with the worker's id, before pytest's summary (xdist itself shows only dots). With a
    pool of one instance the worker that waits for it says so while it waits."""
    profile = reference_profile(pytester.path, clock_scale=1, control="none", pool=1, instance_lock=True)
    (pytester.path / "configs.yaml").write_text(MATRIX_OF_TWO_CONFIGS)
    run = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_throughput.py"), "--ddtree-config=bs8_b8_k4,bs8_b4_k4", f"--ddtree-service={profile}",
        f"--ddtree-matrix={pytester.path / 'configs.yaml'}", f"--ddtree-results={pytester.path / 'results'}",
        f"--ddtree-baselines={pytester.path / 'baselines'}", "-n", "2", "-p", "no:cacheprovider", timeout=300)
    lines = run.stdout.lines
    assert run.ret == 0, run.stdout.str()[-4000:]
    summary = max(index for index, line in enumerate(lines) if line.startswith("=") and " in " in line)
    for worker in ("gw0", "gw1"):
        shown = [index for index, line in enumerate(lines) if line.startswith(f"[ddtree {worker}] ")]
        assert shown and max(shown) < summary, run.stdout.str()[-4000:]
        said = [lines[index] for index in shown]
        assert any("starting" in line for line in said), said
        # the wait's status at its start and, the cell lasting longer than STATUS_EVERY_S, a repeat's
        assert any(line.startswith(f"[ddtree {worker}] waiting for service bs8_b") for line in said), said
        assert any(": repeat " in line and "/9 requests" in line for line in said), said
    assert any("waiting for the shared service instance lock" in line and line.startswith("[ddtree gw") for line in lines)
    # a worker's line is a line of its own, never appended to the result letters
    assert not any("[ddtree gw" in line and not line.startswith("[ddtree gw") for line in lines), lines


def test_a_worker_shows_one_status_line_per_interval_and_every_event(tmp_path: Path) -> None:
    """A cell's requests each update the status, and each repeat is a wait of its own; the channel
    gets one status line per STATUS_EVERY_S of them, while the session's own lines (a start, a
    ready service) each get one."""
    sink = relay.WorkerSink(tmp_path / "gw0.lines")
    for repeat in (1, 2, 3):
        for done in range(50):
            sink.status(f"bs8_b8_k4 c1: repeat {repeat}/3: {done}/50 requests")
        sink.clear()
    sink.line("starting bs8_b8_k4")
    sink.line("bs8_b8_k4 ready")
    assert (tmp_path / "gw0.lines").read_text().splitlines() == [
        "bs8_b8_k4 c1: repeat 1/3: 0/50 requests", "starting bs8_b8_k4", "bs8_b8_k4 ready"]
    sink.last_status -= relay.STATUS_EVERY_S  # as if the interval had passed
    sink.status("bs8_b8_k4 c1: repeat 3/3: 49/50 requests")
    assert (tmp_path / "gw0.lines").read_text().splitlines()[-1] == "bs8_b8_k4 c1: repeat 3/3: 49/50 requests"


def test_what_a_channel_holds_is_bounded_on_both_sides(tmp_path: Path) -> None:
    """A line is cut and stripped of control characters; a poll shows the newest few lines of a
    flood and says how many it skipped; a line without its end waits for it; a channel past its
    size is not written."""
    shown: list[str] = []
    relay_ = relay.Relay(shown.append)
    try:
        path = Path(relay_.channel("gw1"))
        with path.open("ab") as channel:
            channel.write(b"\x1b[31mred\rline\n" + b"x" * 5000 + b"\n")
            channel.write(b"".join(b"line %d\n" % n for n in range(20)) + b"half a li")
        relay_.drain()
        assert len(shown) == relay.LINES_PER_POLL
        assert shown[0] == f"[ddtree gw1] line 15 ({22 - relay.LINES_PER_POLL} earlier line(s) skipped)"
        assert shown[-1] == "[ddtree gw1] line 19"
        shown.clear()
        with path.open("ab") as channel:
            channel.write(b"ne\n")
        relay_.drain()
        assert shown == ["[ddtree gw1] half a line"]
        assert relay.printable("\x1b[31mred\rline") == "[31mred line"
        assert len(relay.printable("x" * 5000)) == relay.MAX_LINE
    finally:
        relay_.close()
    assert not relay_.folder.exists()
    sink = relay.WorkerSink(tmp_path / "full.lines")
    sink.written = relay.MAX_CHANNEL_BYTES - 4
    sink.line("one more line")
    assert not (tmp_path / "full.lines").exists()


def test_a_terminal_that_blocks_does_not_hold_the_session_end(tmp_path: Path) -> None:
    """The relay's thread stuck in a write (a terminal nobody reads): a replaced worker still gets
    its channel (xdist's loop goes on), and close() gives up on the thread after its deadline."""
    entered, release = threading.Event(), threading.Event()

    def stuck(line: str) -> None:
        entered.set()
        release.wait(120)

    relay_ = relay.Relay(stuck)
    Path(relay_.channel("gw0")).write_text("a line\n")
    wait_until(entered.is_set, 30, "the relay's thread writing the line")
    adder = threading.Thread(target=relay_.channel, args=("gw2",), daemon=True)
    adder.start()
    adder.join(30)
    assert not adder.is_alive(), "a new worker's channel waited on the stuck terminal"
    closer = threading.Thread(target=relay_.close, daemon=True)
    closer.start()
    closer.join(relay.JOIN_TIMEOUT_S + 30)
    try:
        assert not closer.is_alive(), "close() waited on the stuck terminal"
    finally:
        release.set()
