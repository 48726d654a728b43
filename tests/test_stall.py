"""A stream that stalls fails fast: no new token for ``stall_timeout_s`` (before the first token,
``first_token_timeout_s``) ends the request, however many SSE keep-alives arrive, and its cell stops
after that first stalled request with the evidence.

The stand-in (``tests/load_standin.py``) streams ``first_tokens`` tokens and then only SSE comments;
the end-to-end test runs the throughput suite against the reference engine with its ``trickle``
fault (the first chunk, then an SSE comment a second, for ever) at the default settings.
"""

from __future__ import annotations

import re

import pytest

from pytest_ddtree.measure import load
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.http import Stall
from tests.load_standin import StandInConfig, standin_server
from tests.suite_helpers import reference_profile, run_suite

QUICK = Stall(first_token_s=1.5, between_s=0.5)


def _run(cfg: StandInConfig, cell: load.Cell) -> load.CellResult:
    with standin_server(cfg) as (url, _), SGLangClient(url, timeout=60) as client:
        client.http.stall = QUICK
        return load.run_cell(client, cell)


def test_keep_alives_after_a_token_stall_the_request_and_the_cell_stops_there() -> None:
    cell = load.Cell("c2", concurrency=2, context_tokens=8, output_tokens=8, requests=8, warmup_requests=0)
    res = _run(StandInConfig(keepalive_s=0.05, first_tokens=1), cell)
    assert res.sent == 2 and len(res.requests) == 2  # each client's first request; nothing sent after the stall
    assert {r.failure for r in res.requests} == {"stall"}
    error = res.requests[0].error or ""
    assert "stalled: no new token for 0.5 s (stall_timeout_s 0.5 s); 1 tokens had arrived" in error, error
    assert "bytes of SSE comments or keep-alives and no token" in error
    assert not res.valid and "2 of 2 requests failed (stall 2)" in res.problems()


def test_no_first_token_stalls_at_the_first_token_deadline() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=8, requests=4, warmup_requests=0)
    res = _run(StandInConfig(keepalive_s=0.05, first_tokens=0), cell)
    assert res.sent == 1 and res.requests[0].failure == "stall"
    assert "no first token for 1.5 s (first_token_timeout_s 1.5 s); 0 tokens had arrived" in (res.requests[0].error or "")


def test_silence_stalls_as_keep_alives_do() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=8, requests=3, warmup_requests=0)
    res = _run(StandInConfig(keepalive_s=600, first_tokens=2), cell)  # one comment, then nothing at all
    assert res.sent == 1 and res.requests[0].failure == "stall", res.requests[0].error
    assert "no new token for" in (res.requests[0].error or "") and "2 tokens had arrived" in (res.requests[0].error or "")


def test_a_stalled_warm_up_stops_the_cell_before_its_measured_phase() -> None:
    cell = load.Cell("c2", concurrency=2, context_tokens=8, output_tokens=8, requests=8, warmup_requests=2)
    with pytest.raises(load.LoadError, match=r"c2: warm-up request \d failed: StreamError: stalled: no new token for 0.5 s"):
        _run(StandInConfig(keepalive_s=0.05, first_tokens=1), cell)


def test_an_open_loop_cell_stops_sending_after_a_stall() -> None:
    from pytest_ddtree.measure import openloop

    cell = load.Cell("r4", concurrency=8, context_tokens=8, output_tokens=8, requests=12, warmup_requests=0,
                     open_loop=openloop.Arrivals(4.0, "constant"))
    res = _run(StandInConfig(keepalive_s=0.05, first_tokens=1), cell)
    stalled = [r for r in res.requests if "stalled: no new token" in (r.error or "")]
    unsent = [r for r in res.requests if "not sent: an earlier request stalled" in (r.error or "")]
    assert stalled and unsent and len(stalled) + len(unsent) == 12, [r.error for r in res.requests]


@pytest.mark.slow
def test_a_server_that_streams_only_keep_alives_ends_a_one_cell_session_in_minutes_naming_the_stall(
        pytester: pytest.Pytester) -> None:
    profile = reference_profile(pytester.path, "--fault trickle=stream:0", control="none")  # default deadlines
    result = run_suite(pytester, profile, "--ddtree-cell=c1_short", suite="test_throughput.py", config="bs8_b8_k4",
                       timeout=300)
    out = result.stdout.str()
    assert result.ret == 1, out
    # minutes, not cell_timeout_s (3600 s): the cell ended at its first request, which stalled (its
    # warm-up), so the session took at most first_token_timeout_s + stall_timeout_s of waiting
    assert re.search(r"c1_short: warm-up request \d+ failed: \w+: stalled: no new token for 30", out), out[-3000:]
    assert "stalled: no new token for 30" in out and "(stall_timeout_s 30 s)" in out, out
    assert "Traceback" not in out and "INTERNALERROR" not in out
