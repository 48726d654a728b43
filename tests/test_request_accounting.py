"""Every request a cell sends is accounted for, and a number no config can produce is refused.

A stand-in SGLang server on loopback (``tests/load_standin.py``) turns hostile on demand: one
streamed chunk nested 200,000 arrays deep (which raised ``RecursionError`` through the load
generator's thread, so the request vanished and the cell read "46 of 48 completed, 0 failed"),
a chunk that is not JSON, a finished chunk whose ``spec_verify_ct`` gives 16 tokens per verify at
block size 8, or a negative one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.measure import accounting, chat_stream, load, loops, openloop, stats
from pytest_ddtree.measure.prompts import Prompt, PromptSet
from pytest_ddtree.records.words import Status
from pytest_ddtree.service import proof
from pytest_ddtree.service.http import ServiceHTTP
from tests.load_standin import StandInConfig, standin_server
from tests.refserver_helpers import REPO, RefServer, config_args
from tests.suite_helpers import reference_profile, run_suite


def test_a_chunk_nested_too_deeply_fails_its_request_and_the_cell_never_loses_it() -> None:
    cell = load.Cell("c4", concurrency=4, context_tokens=16, output_tokens=8, requests=12, warmup_requests=0)
    with standin_server(StandInConfig(hostile_every=4)) as (url, cfg):
        res = load.run_cell(url, cell, speculative=True, accept_bound=7)
    assert cfg.generate_calls == 12
    assert res.sent == 12 and len(res.requests) == 12  # completed + failed == sent
    failed = [r for r in res.requests if not r.ok]
    assert len(failed) == 3 and {r.failure for r in failed} == {"too deep"}
    assert all("nested too deeply" in (r.error or "") for r in failed)
    m = res.metrics()
    assert m["completed"] == 9 and m["ddtree_failed"] == 3
    assert not res.valid
    assert "3 of 12 requests failed (too deep 3)" in res.problems()
    # the gate's status and the bless: an invalid repeat is never blessed
    status, reasons = verdicts.measurement_status(stats.RepeatPolicy(), [100.0] * 3, not res.valid,
                                                     [m] * 3, res.problems())
    assert status == Status.INVALID
    assert not verdicts.judge_bless(status, reasons, [100.0] * 3).blessed


def test_an_open_loop_cell_names_the_real_cause_not_its_deadline() -> None:
    cell = load.Cell("r40", concurrency=4, context_tokens=16, output_tokens=8, requests=8, warmup_requests=0,
                     open_loop=openloop.Arrivals(40.0, "constant"))
    with standin_server(StandInConfig(hostile_every=2)) as (url, _):
        res = load.run_cell(url, cell)
    failed = [r for r in res.requests if not r.ok]
    assert len(failed) == 4 and {r.failure for r in failed} == {"too deep"}
    assert not any("deadline" in (r.error or "") for r in failed)
    assert res.sent == 8 and "4 of 8 requests failed (too deep 4)" in res.problems()


@pytest.mark.parametrize(("chunk", "kind"), [
    (b'{"meta_info": {"completion_tokens": 1', "unparseable"),
    (b'{"text": "\xff\xfe", "meta_info": {"completion_tokens": 1}}', "unparseable"),
    (b'{"error": "overloaded"}', "server error"),
    (b'{"meta_info": {"completion_tokens": ' + b"9" * 30 + b"}}", "impossible"),
    (b"[1, 2]", "invalid"),
])
def test_each_failure_says_why(chunk: bytes, kind: str) -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=4, requests=2, warmup_requests=0)
    with standin_server(StandInConfig(hostile_every=1, hostile_chunk=chunk)) as (url, _):
        res = load.run_cell(url, cell)
    assert [r.failure for r in res.requests] == [kind, kind], [r.error for r in res.requests]
    assert f"2 of 2 requests failed ({kind} 2)" in res.problems()


def test_a_chat_stream_nested_too_deeply_fails_its_request() -> None:
    with standin_server(StandInConfig(hostile_every=1)) as (url, _), ServiceHTTP(url, timeout=30) as service:
        result = chat_stream.stream_chat(service, 0, Prompt(8, text="hello"), 4)
    assert not result.ok and result.failure == "too deep" and "nested too deeply" in (result.error or "")


def test_a_sender_that_raises_is_a_failed_request_not_a_lost_one() -> None:
    def broken(*_: object) -> load.RequestResult:
        raise RecursionError("maximum recursion depth exceeded")

    cell = load.Cell("c2", concurrency=2, context_tokens=8, output_tokens=4, requests=4, warmup_requests=0)
    with standin_server() as (url, _), ServiceHTTP(url, timeout=30) as service:
        prompts = PromptSet([Prompt(8, input_ids=(1,) * 8) for _ in range(cell.requests)], "random", "ids")
        results, _, sent = loops.run_closed_loop(service, 2, prompts, 4, None, 30.0, broken)
    assert sent == 4 and len(results) == 4 and {r.failure for r in results} == {"too deep"}


@pytest.mark.parametrize(("verify_ct", "words"), [
    (1, "16.00 tokens per verify, above the config's maximum of 8"),  # 16 tokens in one verify on bs8
    (-7, "meta_info.spec_verify_ct is -7: not a count of at least 0"),
    (20, "spec_verify_ct 20 for 16 completion tokens is 0.80 tokens per verify, below 1"),
])
def test_an_impossible_verify_count_makes_the_cell_invalid_with_value_and_bound(verify_ct: int, words: str) -> None:
    cell = load.Cell("c2", concurrency=2, context_tokens=8, output_tokens=16, requests=4, warmup_requests=0)
    with standin_server(StandInConfig(verify_ct=verify_ct)) as (url, _):
        res = load.run_cell(url, cell, speculative=True, accept_bound=7)  # bs8: at most 7 drafts + the bonus
    assert not res.valid
    assert any(words in p for p in res.problems()), res.problems()


def test_counts_and_latencies_that_cannot_be_true_are_refused_where_they_enter() -> None:
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(accounting.StreamError, match="not a count") as info:
            accounting.count(bad, "meta_info.prompt_tokens")
        assert info.value.kind == "impossible"
    for bad_latency in (-0.1, float("nan"), float("inf"), "1"):
        with pytest.raises(accounting.StreamError, match="not a finite latency"):
            accounting.latency(bad_latency, "meta_info.e2e_latency")
    assert accounting.count(None, "x") is None and accounting.latency(0.5, "x") == 0.5


def test_a_copy_probe_reporting_an_impossible_verify_count_fails_the_proof() -> None:
    def answer(verify_ct: int) -> Callable[[str, Mapping[str, Any]], Any]:
        return lambda text, sampling: {"text": "x", "meta_info": {"completion_tokens": 48, "spec_verify_ct": verify_ct}}

    too_many = proof.run_copy_probe(answer(3), bound=7)  # 48 tokens in 3 verifies: 16 a verify on bs8
    assert too_many.errors and "16.00 tokens per verify, above the config's maximum of 8" in too_many.errors[0]
    negative = proof.run_copy_probe(answer(-21), bound=7)
    assert negative.errors and "spec_verify_ct is -21" in negative.errors[0]
    judged = proof.judge({"block_size": 8, "budget": 8}, settable={"block_size"}, reported=set(), probe=too_many,
                         startup=None, metrics_text=None)
    assert any("tokens per verify" in f for f in judged.failures)


def _baseline_cells(pytester: pytest.Pytester) -> list[str]:
    """The cells any bless wrote under the session's baselines folder."""
    out: list[str] = []
    for path in (pytester.path / "baselines").rglob("*.yaml"):
        out += list(((yaml.safe_load(path.read_text()) or {}).get("metrics") or {}))
    return out


@pytest.mark.slow
def test_end_to_end_a_bless_never_stores_a_cell_that_lost_a_request(pytester: pytest.Pytester) -> None:
    profile = reference_profile(pytester.path, "--fault deep-chunk=5", control="none")
    result = run_suite(pytester, profile, "--ddtree-cell=c1_short", "--ddtree-update-baselines",
                       suite="test_throughput.py", timeout=300)
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    assert "too deep" in out and "nested too deeply" in out, out[-3000:]
    assert "c1_short" not in _baseline_cells(pytester)
    assert "Traceback" not in out and "INTERNALERROR" not in out


@pytest.mark.slow
def test_end_to_end_an_impossible_verify_count_fails_the_proof_and_through_a_url_the_cell(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    # 16 tokens a verify on bs8: the launched service fails its copy probe's proof
    profile = reference_profile(pytester.path, "--fault verify-ct=0.0625", control="none")
    launched = run_suite(pytester, profile, "--ddtree-cell=c1_short", "--ddtree-update-baselines",
                         suite="test_throughput.py", timeout=300)
    out = launched.stdout.str()
    assert launched.ret == 1 and "tokens per verify, above the config's maximum of 8" in out, out[-3000:]
    assert _baseline_cells(pytester) == []
    # the same server named by --ddtree-url (not probed: somebody else's): its cells are invalid, nothing blessed
    server = RefServer([*config_args("bs8_b8_k4"), "--fault", "verify-ct=0.0625"], tmp_path).wait_ready()
    try:
        external = pytester.runpytest_subprocess(
            str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}", f"--ddtree-url={server.url}",
            f"--ddtree-results={pytester.path / 'results-url'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
            "--ddtree-cell=c1_short", "--ddtree-update-baselines", "-p", "no:cacheprovider", "-rA", timeout=300)
    finally:
        server.stop()
    out = external.stdout.str()
    assert external.ret == 1 and "above the config's maximum of 8" in out, out[-3000:]
    assert _baseline_cells(pytester) == []
