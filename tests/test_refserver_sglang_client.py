"""What SGLang's own clients (bench_serving, SDKs) need from the reference engine, checked against
SGLang's source (sgl-project/sglang at v0.5.23, python/sglang/...; file:line):

* the tokenizer ``/model_info`` names opens in a Hugging Face loader and tokenizes exactly as the
  engine (benchmark/serving.py:2180 ``run_benchmark`` reads ``tokenizer_path``;
  benchmark/utils.py:44 ``get_tokenizer`` opens it with ``AutoTokenizer.from_pretrained``;
  benchmark/datasets/random.py:57 ``sample_random_requests`` draws ids below its vocab_size);
* ``/flush_cache?timeout=`` (srt/entrypoints/http_server.py:1027 ``flush_cache``;
  srt/managers/scheduler_components/flush_wrapper.py:22 ``handle``, :39 ``check_pending``);
* the prefix cache behind ``meta_info.cached_tokens`` (srt/mem_cache/radix_cache.py:343 ``reset``,
  :364 ``match_prefix``, :428 ``insert``, :552 ``evict``; the match cap of
  srt/managers/schedule_batch.py:1766 ``Req._compute_max_prefix_len``);
* ``/start_profile`` / ``/stop_profile`` (srt/entrypoints/http_server.py:1223, :1234;
  srt/managers/tokenizer_control_mixin.py:424 ``_execute_profile`` raises on a refusal;
  srt/managers/scheduler_components/profiler_manager.py:121-125, :325-329 the refusals);
* ``return_logprob`` / ``top_logprobs_num`` (srt/managers/tokenizer_manager.py:2840
  ``add_logprob_to_meta_info``, :3098 ``detokenize_logprob_tokens``;
  srt/managers/scheduler_components/logprob_result_processor.py:38 the None first input entry;
  srt/managers/scheduler.py:3260-3272 the default start).
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import tokenizers

from pytest_ddtree.refserver.clock import ClockModel
from tests.refserver_helpers import RefServer
from tests.polling import wait_until

TEXTS = [
    "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n",
    "Zebra quokka xylophone — naïve café ≤ 3 µs 😀 日本語\t\r\n  end",
    "<|user|>\nHello there<|end|><|assistant|>\n",
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    s = RefServer(["--speculative-algorithm", "DFLASH", "--clock-scale", "50", "--model-path", "test/tiny"], tmp_path_factory.mktemp("sglang-client")).wait_ready()
    yield s
    s.stop()


def hf(srv: RefServer) -> tokenizers.Tokenizer:
    path = Path(srv.get("/model_info").json()["tokenizer_path"])
    assert (path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()
    return tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))


def state(srv: RefServer) -> dict[str, Any]:
    internal: dict[str, Any] = srv.info()["internal_states"][0]  # type: ignore[index]
    return internal


# -- the tokenizer ---------------------------------------------------------------------------------


def test_model_info_tokenizer_path_opens_in_hugging_face_and_tokenizes_as_the_engine(srv: RefServer) -> None:
    tok = hf(srv)
    assert tok.get_vocab_size(with_added_tokens=False) == 163840  # Kimi K2's vocabulary size
    for text in TEXTS:
        served = srv.post("/tokenize", json={"prompt": text, "add_special_tokens": True}).json()["tokens"]
        assert tok.encode(text).ids == served, text
        assert tok.decode(served, skip_special_tokens=False) == text
        assert srv.post("/detokenize", json={"tokens": served}).json()["text"] == tok.decode(served)


def test_ids_a_real_tokenizer_sends_are_valid_and_random_ids_survive_a_text_round_trip(srv: RefServer) -> None:
    """bench_serving's random-ids data set sends consecutive ids from a random offset below the
    tokenizer's vocab_size (benchmark/datasets/random.py ``sample_random_requests``), as ids with
    --tokenize-prompt, else as their decoded text."""
    tok = hf(srv)
    ids = list(range(150000, 150040))  # a Llama-3- / Qwen-sized id is a valid (reserved) token
    r = srv.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == len(ids)
    text = tok.decode(ids)
    assert srv.post("/tokenize", json={"prompt": text}).json()["tokens"] == ids
    # tokenizer_manager.py _validate_input_ids_in_vocab: past the vocabulary, SGLang's own message
    r = srv.post("/generate", json={"input_ids": [5, 163840], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400
    assert "contains values greater than the vocab size (163840)" in r.json()["error"]["message"]


# -- /flush_cache?timeout= ---------------------------------------------------------------------------


def long_request(srv: RefServer, tokens: int) -> tuple[threading.Thread, threading.Event]:
    """A request that keeps the engine busy (``tokens`` greedy tokens) in a thread; returns when it runs."""
    done = threading.Event()
    before = state(srv)["num_running_reqs"] + state(srv)["requests_completed"]

    def run() -> None:
        srv.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}})
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: state(srv)["num_running_reqs"] + state(srv)["requests_completed"] > before, 30, "the request to run")
    return t, done


@contextmanager
def busy(srv: RefServer) -> Iterator[None]:
    """A streamed request of 20000 tokens runs meanwhile; closing the stream aborts it."""
    r = srv.post("/generate", stream=True, json={"text": "x", "stream": True, "sampling_params": {
        "max_new_tokens": 20000, "ignore_eos": True, "temperature": 0}})
    try:
        lines = r.iter_lines()  # kept: a dropped line iterator closes the connection (an abort)
        next(lines)  # the first chunk: it runs
        yield
    finally:
        r.close()
        wait_until(lambda: state(srv)["num_running_reqs"] == 0, 30, "the aborted request to leave")


def test_flush_cache_without_timeout_is_refused_while_busy_with_sglangs_text(srv: RefServer) -> None:
    with busy(srv):
        r = srv.get("/flush_cache")
        assert (r.status_code, r.text) == (400, "Flush cache failed.\n")
    r = srv.post("/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.\n")


def test_flush_cache_timeout_waits_for_idle_then_flushes(srv: RefServer) -> None:
    """flush_wrapper.py: a busy scheduler keeps the flush pending and flushes at the first idle moment."""
    t, done = long_request(srv, 300)
    r = srv.post("/flush_cache", params={"timeout": 60})
    assert r.status_code == 200, r.text
    assert state(srv)["num_running_reqs"] == 0 and state(srv)["prefix_cache_tokens"] == 0
    t.join(60)
    assert done.is_set()


def test_flush_cache_timeout_expires_while_busy_and_a_second_flush_is_refused(srv: RefServer) -> None:
    with busy(srv):
        answers: list[requests.Response] = []
        first = threading.Thread(target=lambda: answers.append(srv.post("/flush_cache", params={"timeout": 1.0})))
        first.start()
        second = wait_until(lambda: "Another" in (text := srv.post("/flush_cache").text) and text,
                            30, "the pending flush to refuse a second one")
        assert second == "Another flush_cache is already in progress."
        first.join(60)
        # its timeout ended it (the text), and it waited meanwhile (the second flush saw it pending)
        assert (answers[0].status_code, answers[0].text) == (400, "Timed out waiting for idle state.")


@pytest.mark.parametrize("bad", ["-1", "soon", "nan"])
def test_flush_cache_bad_timeout_is_a_400(srv: RefServer, bad: str) -> None:
    """http_server.py: ``timeout: float = Query(0.0, ge=0.0)``; validation errors answer 400."""
    assert srv.post("/flush_cache", params={"timeout": bad}).status_code == 400


# -- the prefix cache ------------------------------------------------------------------------------


def generate(srv: RefServer, ids: list[int], max_new_tokens: int = 1) -> dict[str, Any]:
    r = srv.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens,
                                                                          "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_cached_tokens_and_prefill_time_follow_the_radix_cache(srv: RefServer) -> None:
    assert srv.post("/flush_cache", params={"timeout": 30}).status_code == 200
    clock = ClockModel()
    prompt = list(range(20000, 22000))
    busy0 = state(srv)["simulated_busy_seconds"]
    first = generate(srv, prompt)
    busy1 = state(srv)["simulated_busy_seconds"]
    assert first["meta_info"]["cached_tokens"] == 0
    assert busy1 - busy0 == pytest.approx(clock.prefill_fixed + clock.prefill_per_token * len(prompt))
    again = generate(srv, prompt)
    busy2 = state(srv)["simulated_busy_seconds"]
    # schedule_batch.py _compute_max_prefix_len: at most len(prompt) - 1 tokens come from the cache
    assert again["meta_info"]["cached_tokens"] == len(prompt) - 1
    assert busy2 - busy1 == pytest.approx(clock.prefill_fixed + clock.prefill_per_token * 1)
    # a finished request leaves prompt + output (minus its last token) in the tree
    out = generate(srv, prompt[:1000] + [30000], max_new_tokens=6)["output_ids"]
    follow = generate(srv, prompt[:1000] + [30000] + out[:3] + [30001])
    assert follow["meta_info"]["cached_tokens"] == 1000 + 1 + 3
    assert srv.post("/flush_cache").status_code == 200
    assert generate(srv, prompt)["meta_info"]["cached_tokens"] == 0


# -- /start_profile, /stop_profile -------------------------------------------------------------------


def test_profile_endpoints_answer_as_sglang_and_write_a_chrome_trace(srv: RefServer, tmp_path: Path) -> None:
    """http_server.py start_profile_async / stop_profile_async; profiler_manager.py refusals are a
    RuntimeError in tokenizer_control_mixin.py _execute_profile, i.e. a plain 500."""
    r = srv.get("/stop_profile")
    assert (r.status_code, r.text) == (500, "Internal Server Error")
    r = srv.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "p1", "activities": ["CPU", "GPU"]})
    assert (r.status_code, r.text) == (200, "Start profiling.\n")
    assert srv.post("/start_profile").status_code == 500  # already in progress
    generate(srv, [7, 8, 9], max_new_tokens=12)
    r = srv.post("/stop_profile")
    assert (r.status_code, r.text) == (200, "Stop profiling. This will take some time.\n")
    trace = json.loads(gzip.decompress((tmp_path / "p1-TP-0.trace.json.gz").read_bytes()))
    names = [e["name"] for e in trace["traceEvents"]]
    assert names[0] == "prefill" and "decode" in names and all(e["ph"] == "X" and e["dur"] >= 0 for e in trace["traceEvents"])
    # num_steps (bench_serving sends it as a string): stops by itself after that many forward passes
    r = srv.post("/start_profile", json={"output_dir": str(tmp_path), "profile_id": "p2", "num_steps": "2"})
    assert r.status_code == 200
    generate(srv, [7, 8, 9], max_new_tokens=40)
    trace_file = tmp_path / "p2-TP-0.trace.json.gz"
    trace = json.loads(gzip.decompress(wait_until(lambda: trace_file.read_bytes() if trace_file.is_file() else None, 30,
                                                  "the trace")))
    assert len(trace["traceEvents"]) == 2 + 1  # target forward count = now + num_steps + 1
    assert srv.post("/stop_profile").status_code == 500  # it stopped by itself
    assert srv.post("/start_profile", json={"num_steps": "many"}).status_code == 400


# -- return_logprob, top_logprobs_num ----------------------------------------------------------------


def test_logprobs_have_sglangs_meta_info_shapes(srv: RefServer) -> None:
    """tokenizer_manager.py add_logprob_to_meta_info / detokenize_logprob_tokens: [logprob, id, text]
    entries; logprob_result_processor.py: the first input entry's logprob is None."""
    body = {"input_ids": [300, 301, 302, 303], "return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 1,
            "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    out = srv.post("/generate", json=body).json()
    meta = out["meta_info"]
    assert [e[1] for e in meta["input_token_logprobs"]] == [301, 302, 303]
    assert meta["input_token_logprobs"][0][0] is None and all(isinstance(e[0], float) and e[0] <= 0 for e in meta["input_token_logprobs"][1:])
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"] and meta["output_token_logprobs_length"] == 6
    assert all(isinstance(e[2], str) for e in meta["output_token_logprobs"])
    assert meta["input_top_logprobs"][0] is None and all(len(row) == 3 for row in meta["input_top_logprobs"][1:])
    for chosen, row in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(row) == 3 and row[0][0] >= row[1][0] >= row[2][0]
        assert chosen[1] == row[0][1] and chosen[0] == pytest.approx(row[0][0])  # greedy = the most probable
    # the default logprob_start_len (-1) reports output tokens only; no top lists without top_logprobs_num
    plain = srv.post("/generate", json={"input_ids": [300, 301], "return_logprob": True,
                                        "sampling_params": {"max_new_tokens": 3, "temperature": 0}}).json()["meta_info"]
    assert plain["input_token_logprobs"] == [] and len(plain["output_token_logprobs"]) == plain["completion_tokens"]
    assert plain["output_token_logprobs"][0][2] is None and "output_top_logprobs" not in plain
    # streamed: every chunk carries the logprobs so far
    events = [line for line in srv.post("/generate", stream=True, json={**body, "stream": True}).iter_lines() if line]
    chunks = [json.loads(e[len(b"data: "):]) for e in events if e != b"data: [DONE]"]
    assert all(len(c["meta_info"]["output_token_logprobs"]) == len(c["output_ids"]) for c in chunks)
    assert chunks[-1]["meta_info"]["output_token_logprobs"] == meta["output_token_logprobs"]
    assert srv.post("/generate", json={**body, "logprob_start_len": 9}).status_code == 400
    assert srv.post("/generate", json={**body, "token_ids_logprob": [163840]}).status_code == 400


def test_cache_report_puts_cached_tokens_in_openai_usage(tmp_path: Path) -> None:
    """srt/entrypoints/openai/usage_processor.py: prompt_tokens_details.cached_tokens only with
    --enable-cache-report (bench_serving --cache-report reads it)."""
    s = RefServer(["--speculative-algorithm", "DFLASH", "--clock-scale", "50", "--enable-cache-report"], tmp_path).wait_ready()
    try:
        body = {"model": "m", "prompt": list(range(20000, 20300)), "max_tokens": 2, "temperature": 0}
        first = s.post("/v1/completions", json=body).json()["usage"]
        again = s.post("/v1/completions", json=body).json()["usage"]
        assert first["prompt_tokens_details"] == {"cached_tokens": 0}
        assert again["prompt_tokens_details"] == {"cached_tokens": 299}
    finally:
        s.stop()
