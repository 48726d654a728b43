"""Nothing hangs: each request, and each phase of requests, ends by its deadline as a whole.

The service is the real reference engine with its ``trickle`` fault: past N answers of one kind
(health, /server_info, a non-streamed /generate, a streamed one, chat) it answers with a 200 that
never ends, a byte a second, and a stream with its first chunk and then an SSE comment a second.
A timeout per socket read never trips on that (a byte arrives within every read's timeout); the
deadlines here must, within their (small) settings, with a failure that names the deadline, what
had arrived and the profile key to raise, and with no engine process left behind.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.measure import load
from pytest_ddtree.gates.throughput import measurement
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.http import DeadlineExceeded
from pytest_ddtree.measure.prompts import Prompt
from pytest_ddtree.service.base import ServiceStartError
from pytest_ddtree.service.manager import Pacing, Placement, ServiceManager
from pytest_ddtree.service.process import live_process_groups
from tests.polling import wait_until
from tests.suite_helpers import reference_profile, run_suite
from tests.refserver_helpers import BS8_B8_K4, RefServer, managers, ref_profile  # noqa: F401 (a fixture)

DEADLINE_S = 2.0
READY_S = 6.0  # readiness includes the engine's own start, a few seconds on a loaded box
SLACK_S = 8.0  # a loaded 2-core box: the call must be over by its deadline plus this


def finishes(call: Callable[[], Any], within: float) -> BaseException | Any:
    """Run ``call`` on a thread and poll until it is over (its exception, or its value); fails
    the test when it is still running ``within`` seconds later (a hang, not a slow answer)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: not thread.is_alive(), within, "the call to end by its deadline")
    return out[0]


@pytest.fixture(scope="module")
def trickling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    """One engine whose chat, streams and /server_info trickle for ever."""
    server = RefServer(["--speculative-algorithm", "DFLASH", "--fault", "trickle=chat:0,trickle=stream:0,trickle=server_info:0"],
                       tmp_path_factory.mktemp("trickling"))
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.mark.parametrize(("call", "key"), [
    ("server_info", "info_timeout_s"),
    ("chat", "request_timeout_s"),
])
def test_a_trickling_answer_ends_at_the_request_deadline(trickling: RefServer, call: str, key: str) -> None:
    with SGLangClient(trickling.url, timeout=DEADLINE_S, info_timeout=DEADLINE_S) as client:
        if call == "server_info":
            err = finishes(client.server_info, DEADLINE_S + SLACK_S)
        else:
            err = finishes(lambda: client.chat([{"role": "user", "content": "hi"}], max_tokens=8), DEADLINE_S + SLACK_S)
    assert isinstance(err, DeadlineExceeded), err
    text = str(err)
    assert f"the request deadline of {DEADLINE_S:g} s ({key} in the profile) passed" in text
    assert "bytes of the body had arrived (HTTP 200, reading the body)" in text  # what came: a trickle, not silence
    assert f"raise {key} in the profile" in text


def test_sse_comments_after_the_first_chunk_do_not_extend_a_stream(trickling: RefServer) -> None:
    with SGLangClient(trickling.url, timeout=DEADLINE_S) as client:
        result = finishes(lambda: load.stream_request(client.http, 0, Prompt(target_tokens=3, input_ids=(1, 2, 3)), 8),
                          DEADLINE_S + SLACK_S)
    assert isinstance(result, load.RequestResult) and not result.ok
    error = result.error or ""
    assert f"the request deadline of {DEADLINE_S:g} s (request_timeout_s in the profile) passed" in error, error
    assert "(1 chunks, 1 tokens)," in error and "of them after the last chunk and no data (SSE comments or keep-alives)" in error, error
    assert result.bytes_after_last_chunk >= len(b": keep-alive\n\n")  # the comments arrived, and did not extend it


def test_a_chat_cells_stream_ends_at_the_request_deadline(trickling: RefServer) -> None:
    from pytest_ddtree.measure.chat_stream import stream_chat

    with SGLangClient(trickling.url, timeout=DEADLINE_S) as client:
        result = finishes(lambda: stream_chat(client.http, 0, Prompt(target_tokens=3, text="hi"), 8, thinking=True),
                          DEADLINE_S + SLACK_S)
    assert isinstance(result, load.RequestResult) and not result.ok
    assert f"the request deadline of {DEADLINE_S:g} s (request_timeout_s in the profile) passed" in (result.error or ""), result.error


def test_a_cell_ends_at_its_deadline_and_says_what_finished(trickling: RefServer) -> None:
    cell = load.Cell("c1_tiny", concurrency=1, context_tokens=16, output_tokens=8, requests=20)
    with SGLangClient(trickling.url, timeout=1.0) as client:
        # each request ends after 1 s, so the 20 requests alone would take 20 s: the cell's 2.5 s ends them
        err = finishes(lambda: measurement.run_repeat(client, cell, 2.5, flush=False), 2.5 + SLACK_S)
    assert isinstance(err, measurement.CellDeadlineExceeded), err
    text = str(err)
    assert "c1_tiny: the cell c1_tiny deadline of 2.5 s (cell_timeout_s in the profile) passed with 0 of 20" in text, text
    assert "raise cell_timeout_s in the profile" in text


@pytest.mark.parametrize(("fault", "key", "overrides"), [
    ("trickle=health:0", "ready_timeout_s", {}),
    ("trickle=server_info:0", "info_timeout_s", {"info_timeout_s": DEADLINE_S}),
    ("trickle=generate:0", "probe_timeout_s", {"probe_timeout_s": DEADLINE_S}),
])
def test_a_start_phase_that_trickles_fails_the_config_and_stops_the_service(
        tmp_path: Path, managers: list[ServiceManager], fault: str, key: str, overrides: dict[str, float]) -> None:
    """Readiness (/health_generate), the applied check (/server_info) and the copy probe (a
    non-streamed /generate): the start fails naming the deadline, and the engine is stopped."""
    # the manager's own client factory: the clients' deadlines are the profile's
    m = ServiceManager(ref_profile(f"--fault {fault}", **overrides), Placement(0, tmp_path / "logs", tmp_path / "locks"),
                       pacing=Pacing(READY_S if key == "ready_timeout_s" else 30, poll_interval=0.1))
    managers.append(m)
    err = finishes(lambda: m.ensure(BS8_B8_K4), READY_S + SLACK_S + 10)  # + the engine's own start
    assert isinstance(err, ServiceStartError), err
    if key == "ready_timeout_s":  # each poll is cut by its own 5 s deadline or by readiness's, bytes arriving or not
        assert f"not ready after {READY_S:g} s" in str(err) and "deadline of" in str(err) and "passed; " in str(err), str(err)
        assert "raise ready_timeout_s in the profile" in str(err)
    else:
        assert f"({key} in the profile) passed" in str(err), str(err)
    assert "Traceback" not in str(err).split("log tail")[0]
    assert live_process_groups() == []  # the failed start stopped its engine
    with pytest.raises(ServiceStartError):  # and the config stays failed: no second ten-minute start
        m.ensure(BS8_B8_K4)


def _marked_processes(mark: str) -> list[int]:
    """Processes whose environment carries ``mark`` (the engines a pytester session started)."""
    found = []
    needle = f"DDTREE_DEADLINE_TEST={mark}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_sweep_whose_streams_trickle_fails_each_config_at_its_cell_deadline_and_goes_on(pytester: pytest.Pytester) -> None:
    """End to end: the throughput suite, two configs, every streamed /generate trickling after its
    first chunk. Each config fails at its cell's deadline with the message, its service is
    stopped, the next config is measured, and nothing is left running."""
    mark = pytester.path.name
    profile = reference_profile(pytester.path, "--fault trickle=stream:0", control="none", request_timeout_s=1,
                                cell_timeout_s=2.5, env={"DDTREE_DEADLINE_TEST": mark})
    result = run_suite(pytester, profile, "--ddtree-cell=c1_short", suite="test_throughput.py",
                       config="bs8_b8_k4,bs8_b12_k6", timeout=120)
    out = result.stdout.str()
    assert result.ret == 1, out
    for config in ("bs8_b8_k4", "bs8_b12_k6"):
        assert f"{config}: c1_short: the cell c1_short deadline of 2.5 s (cell_timeout_s in the profile) passed" in out, out
    assert "Traceback" not in out and "INTERNALERROR" not in out and "During handling of the above exception" not in out
    assert _marked_processes(mark) == []


@pytest.mark.slow
def test_a_readiness_that_trickles_ends_at_ready_timeout_for_each_config(pytester: pytest.Pytester) -> None:
    mark = pytester.path.name
    profile = reference_profile(pytester.path, "--fault trickle=health:0", control="none", ready_timeout_s=READY_S,
                                env={"DDTREE_DEADLINE_TEST": mark})
    result = run_suite(pytester, profile, suite="test_health.py", config="bs8_b8_k4,bs8_b12_k6", timeout=120)
    out = result.stdout.str()
    assert result.ret == 1, out
    for config in ("bs8_b8_k4", "bs8_b12_k6"):  # the sweep went on to the second config
        assert f"service for config {config}: service not ready after {READY_S:g} s (last answer from /health_generate: " in out, out
    assert out.count("raise ready_timeout_s in the profile") >= 2, out
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert _marked_processes(mark) == []
