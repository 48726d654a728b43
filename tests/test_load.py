"""Load generator: token accounting, ITL spreading, closed loop, invalid cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ddtree.measure import generate_stream, load
from pytest_ddtree.service.client import SGLangClient
from tests.load_standin import StandInConfig, standin_server


def test_itl_spreads_a_chunk_over_its_tokens() -> None:
    r = load.RequestResult(index=0, expected_prompt_tokens=4, expected_output_tokens=7, start=0.0)
    last = load.apply_chunk(r, 0.10, 1, None)  # first token: TTFT
    last = load.apply_chunk(r, 0.16, 4, last)  # 3 tokens in 60 ms -> 3 x 20 ms
    last = load.apply_chunk(r, 0.16, 4, last)  # no new tokens: nothing
    last = load.apply_chunk(r, 0.26, 7, last)  # 3 tokens in 100 ms
    r.end = 0.27
    assert r.ttft_s == pytest.approx(0.10)
    assert r.itl_s == pytest.approx([0.02] * 3 + [0.1 / 3] * 3)
    assert r.completion_tokens == 7
    # TPOT and ITL agree up to the tail after the last token
    assert r.tpot_s == pytest.approx((0.27 - 0.10) / 6)


def test_cell_counts_tokens_from_meta_info_not_chunks() -> None:
    cell = load.Cell("c4_short", concurrency=4, context_tokens=64, output_tokens=16, requests=12)
    with standin_server(StandInConfig(tokens_per_chunk=3)) as (url, cfg):
        res = load.run_cell(url, cell)
    assert res.valid, res.problems()
    m = res.metrics()

    def number(key: str) -> float:
        value = m[key]
        assert value is not None, key  # a valid cell has every figure
        return float(value)

    assert m["completed"] == 12 and m["ddtree_failed"] == 0
    assert m["total_output_tokens"] == 12 * 16
    assert m["total_input_tokens"] == 12 * 64
    assert all(r.chunks == 1 + 5 for r in res.requests)  # 1 + ceil(15 / 3) chunks, 16 tokens
    assert all(len(r.itl_s) == 15 for r in res.requests)
    assert m["ddtree_tokens_per_verify"] == pytest.approx(16 / 6)  # the gated figure: the requests' own ratio ...
    assert m["accept_length"] == pytest.approx(3.0)  # ... bench_serving's accept_length: the server's figure
    assert isinstance(m["completed"], int) and isinstance(m["total_output_tokens"], int)
    assert m["total_output_tokens_retokenized"] == m["total_output_tokens"] and m["total_input_vision_tokens"] == 0
    # bench_serving's peaks count per one-second bucket: a request is in every second it touches
    assert 4 <= number("max_concurrent_requests") <= 12 and 0 < float(m["max_output_tokens_per_s"] or 0) <= number("total_output_tokens")
    assert m["output_throughput"] == pytest.approx(number("total_output_tokens") / number("duration"))
    assert m["max_concurrency"] == 4 and 2.5 < float(m["concurrency"] or 0) <= 4.01
    for dist in ("ttft", "tpot", "itl", "e2e_latency"):  # bench_serving's names, p95 included
        for stat in ("mean", "median", "std", "p90", "p95", "p99"):
            value = m[f"{stat}_{dist}_ms"]
            assert isinstance(value, float) and value >= 0, (stat, dist)
    assert m["total_throughput"] == pytest.approx((number("total_input_tokens") + number("total_output_tokens")) / number("duration"))
    assert m["ddtree_server_input_tokens"] == m["total_input_tokens"]  # sent == counted by the server
    ours = {k for k in m if k.startswith("ddtree_")}
    assert ours >= {"ddtree_failed", "ddtree_spec_verify_ct", "ddtree_tokens_per_verify"}
    # warm-up ran at the measured concurrency and was excluded; then one flush
    assert cfg.generate_calls == 12 + 4
    assert cfg.flushes == 1
    assert cfg.max_active <= 4


def test_a_speculative_cell_without_spec_verify_ct_is_invalid() -> None:
    cell = load.Cell("c2", concurrency=2, context_tokens=8, output_tokens=6, requests=4, warmup_requests=0)
    with standin_server(StandInConfig(no_spec=True)) as (url, _):
        plain = load.run_cell(url, cell)  # a non-speculative measurement: fine, no accept length
        spec = load.run_cell(url, cell, speculative=True)
    assert plain.valid and plain.metrics()["ddtree_tokens_per_verify"] is None
    assert not spec.valid
    assert any("4 of 4 responses carry no spec_verify_ct" in p and "the server does not speculate" in p for p in spec.problems())


def test_http_errors_make_the_cell_invalid() -> None:
    cell = load.Cell("c2", concurrency=2, context_tokens=8, output_tokens=4, requests=6, warmup_requests=0)
    with standin_server(StandInConfig(fail_every=3)) as (url, _):
        res = load.run_cell(url, cell)
    assert not res.valid
    assert res.failed == 2
    assert res.metrics()["ddtree_failed"] == 2 and res.metrics()["completed"] == 4
    assert any("HTTP 500" in p for p in res.problems())


def test_prompt_token_mismatch_is_invalid() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=4, requests=2, warmup_requests=0)
    with standin_server(StandInConfig(prompt_offset=1)) as (url, _):
        res = load.run_cell(url, cell)
    assert any("server counted 9 prompt tokens, sent 8" in p for p in res.problems())


def test_short_output_is_invalid() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=10, requests=2, warmup_requests=0)
    with standin_server(StandInConfig(output_cap=6)) as (url, _):
        res = load.run_cell(url, cell)
    assert any("6 output tokens, expected 10" in p for p in res.problems())


def test_stream_without_token_counts_is_an_error_not_a_chunk_count() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=4, requests=1, warmup_requests=0)
    with standin_server(StandInConfig(no_meta=True)) as (url, _):
        res = load.run_cell(url, cell)
    assert res.failed == 1
    assert "completion_tokens" in (res.requests[0].error or "")


def test_unreachable_server_fails_requests_not_the_harness() -> None:
    cell = load.Cell("c1", concurrency=2, context_tokens=8, output_tokens=4, requests=2, warmup_requests=0, prompts="random")
    with standin_server() as (url, _):
        pass  # closed now
    with SGLangClient(url, timeout=2) as client:
        maker = load.prompt_maker(client, vocab_size=100)
        res = load.run_cell(client, cell, prompts=maker, flush=False)
        assert res.failed == 2 and not res.valid
        with pytest.raises(load.LoadError, match="cannot make the prompts.*connection refused"):
            load.run_cell(client, load.Cell("c1", 1, 8, 4, 1, 0))


def test_failed_flush_is_noted() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=4, requests=1, warmup_requests=0)
    with standin_server(StandInConfig(flush_status=400)) as (url, _):
        with SGLangClient(url) as client:
            assert load.flush_cache(client, deadline_s=0.1) is False
        res = load.run_cell(url, cell, flush_deadline_s=0.2)
    assert any("flush_cache" in n for n in res.notes)
    assert res.valid  # a stale acceptance counter is a note, not an invalid measurement


def test_fast_token_count_is_not_fooled_by_the_text() -> None:
    import json

    evil = json.dumps({"text": 'he said "completion_tokens": 99', "meta_info": {"completion_tokens": 7}}).encode()
    assert generate_stream._fast_completion_tokens(evil) == 7
    first = json.dumps({"meta_info": {"completion_tokens": 12}, "text": '"completion_tokens": 5'}).encode()
    assert generate_stream._fast_completion_tokens(first) == 12
    assert generate_stream._fast_completion_tokens(b'{"error": {"message": "x"}}') is None
    with pytest.raises(ValueError, match="server error"):
        generate_stream._chunk_meta(b'{"error": {"message": "x"}}')


def test_a_malformed_acceptance_histogram_is_an_invalid_response() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=4, requests=2, warmup_requests=0)
    with standin_server(StandInConfig(histogram=[1, "lots"])) as (url, _):
        res = load.run_cell(url, cell, speculative=True)
    assert not res.valid and res.failed == 2
    assert all("invalid response" in p and "not a count" in p for p in res.problems() if p.startswith("request"))
    assert "2 of 2 requests failed (invalid 2)" in res.problems()


def test_a_histogram_above_the_config_bound_makes_the_cell_invalid_with_the_evidence() -> None:
    cell = load.Cell("c1", concurrency=1, context_tokens=8, output_tokens=7, requests=2, warmup_requests=0)
    # the stand-in counts 3 verifies for 7 tokens (chunks of 1, 3, 3): they accepted 0, 2 and 5 drafts
    with standin_server(StandInConfig(histogram=[1, 0, 1, 0, 0, 1])) as (url, _):
        fine = load.run_cell(url, cell, speculative=True, accept_bound=7)
        wrong = load.run_cell(url, cell, speculative=True, accept_bound=3)
    assert fine.valid and fine.accept_histogram() == [2, 0, 2, 0, 0, 2]
    assert not wrong.valid
    assert any("did not apply" in p and "more than 3 drafts" in p and "[1, 0, 1, 0, 0, 1]" in p for p in wrong.problems())


def test_cpu_stall_seconds_reads_the_kernels_cpu_pressure_and_nothing_else(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=9.13 avg60=15.95 avg300=14.71 total=11072082598\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert load.cpu_stall_seconds(str(psi)) == pytest.approx(11072.082598)
    for hostile in ("", "some total=-5\n", "some total=1e9\n", "some total=" + "9" * 40 + "\n", "full total=5\n",
                    "\x00\xff" * 3000):
        psi.write_text(hostile)
        assert load.cpu_stall_seconds(str(psi)) is None, hostile[:40]
    assert load.cpu_stall_seconds(str(tmp_path / "missing")) is None
    here = load.cpu_stall_seconds()
    if here is not None:  # a Linux kernel with PSI: a counter that only grows
        later = load.cpu_stall_seconds()
        assert later is not None and later >= here >= 0


def test_a_cells_host_cpu_pressure_is_its_stall_time_over_its_duration() -> None:
    workload = load.workload_dict(load.Cell(name="c1", concurrency=1, context_tokens=8, output_tokens=4, requests=1), "coding")
    cell = load.CellResult(cell="c1", workload=workload, requests=[], duration_s=2.0, host_cpu_stall_s=0.5)
    assert cell.metrics()["ddtree_host_cpu_pressure"] == pytest.approx(0.25)
    assert load.CellResult(cell="c1", workload=workload, requests=[], duration_s=2.0).metrics()["ddtree_host_cpu_pressure"] is None
