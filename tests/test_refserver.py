"""The reference engine over HTTP: endpoint shapes, errors, streaming, accounting, CLI.

Real ``python -m pytest_ddtree.refserver`` processes on 127.0.0.1; one shared server per
module (a high clock scale keeps it fast).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.refserver_helpers import REPO, RefServer
from tests.polling import wait_until

PAIR = ("Write a Python function that reverses a string.", "```python\ndef reverse_string(s):\n    return s[::-1]\n```")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    s = RefServer(
        ["--speculative-algorithm", "dflash", "--clock-scale", "50", "--speculative-draft-window-size", "2048",
         "--model-path", "test/tiny", "--decode-log-interval", "5", "--enable-metrics"],
        tmp_path_factory.mktemp("refserver"),
    ).wait_ready()
    yield s
    s.stop()


def sse(resp: requests.Response) -> list[Any]:
    """Parse ``data:`` lines; the last must be ``[DONE]``."""
    events = [line[len("data: "):] for line in resp.iter_lines(decode_unicode=True) if line]
    assert events and events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_health_and_info_shapes(srv: RefServer) -> None:
    for path in ("/health", "/health_generate"):
        assert srv.get(path).status_code == 200
    info = srv.info()
    for old in ("/get_server_info",):
        assert set(srv.get(old).json()) == set(info)
    for key, want in {
        "speculative_algorithm": "DFLASH",
        "speculative_num_draft_tokens": 8,
        "speculative_eagle_topk": 4,
        "speculative_dflash_block_size": 8,
        "speculative_draft_window_size": 2048,
        "max_running_requests": 48,
        "host": "127.0.0.1",
        "port": srv.port,
        "model_path": "test/tiny",
        "compact_cache": True,
    }.items():
        assert info[key] == want, key
    assert str(info["version"]).startswith("refserver-")
    state = info["internal_states"][0]  # type: ignore[index]
    for key in ("exact_accept_length_since_flush", "total_output_tokens", "total_verify_steps",
                "simulated_busy_seconds", "requests_completed", "memory_usage", "clock_overruns",
                "clock_overrun_seconds", "work_wall_seconds", "engine_cpu_seconds"):
        assert key in state
    mi = srv.get("/model_info").json()
    assert mi == srv.get("/get_model_info").json()
    assert mi["model_path"] == "test/tiny" and mi["is_generation"] is True
    assert "vocab_size" not in mi and mi["architectures"]
    assert "compact cache" in srv.log() and "The server is fired up and ready to roll!" in srv.log()


def test_generate_and_accounting_are_exact(srv: RefServer) -> None:
    before = srv.info()["internal_states"][0]  # type: ignore[index]
    metas = []
    for text in ("def is_prime(n):", "The history of computing", "zzq unknown ☃ prompt"):
        r = srv.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}})
        assert r.status_code == 200
        body = r.json()
        meta = body["meta_info"]
        assert meta["completion_tokens"] == len(body["output_ids"]) == 40
        assert meta["finish_reason"] == {"type": "length", "length": 40}
        assert meta["spec_accept_length"] == pytest.approx(40 / meta["spec_verify_ct"], rel=1e-5)
        assert meta["e2e_latency"] > 0 and meta["prompt_tokens"] > 0 and meta["id"]
        metas.append(meta)
    after = srv.info()["internal_states"][0]  # type: ignore[index]
    assert after["total_output_tokens"] - before["total_output_tokens"] == sum(m["completion_tokens"] for m in metas)
    assert after["total_verify_steps"] - before["total_verify_steps"] == sum(m["spec_verify_ct"] for m in metas)
    assert after["total_prompt_tokens"] - before["total_prompt_tokens"] == sum(m["prompt_tokens"] for m in metas)
    assert after["requests_completed"] - before["requests_completed"] == 3
    assert after["simulated_busy_seconds"] > before["simulated_busy_seconds"]


def test_input_ids_and_stop_strings(srv: RefServer) -> None:
    r = srv.post("/generate", json={"input_ids": [299, 300, 301], "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == 3
    r = srv.post("/generate", json={"text": "def is_prime(n):", "sampling_params": {"max_new_tokens": 100, "temperature": 0, "stop": ["True"]}})
    body = r.json()
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": "True"}
    assert "True" not in body["text"] and body["text"].endswith("Return ")


def test_chat_reproduces_corpus_pair_whatever_the_system_prompt(srv: RefServer) -> None:
    for system in (None, "You are a helpful assistant.", "Answer in Python."):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": PAIR[0]}]
        r = srv.post("/v1/chat/completions", json={"model": "m", "messages": msgs, "temperature": 0, "return_meta_info": True})
        body = r.json()
        choice = body["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": PAIR[1], "reasoning_content": None}
        assert choice["finish_reason"] == "stop"
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert choice["meta_info"]["completion_tokens"] == usage["completion_tokens"]
        assert choice["meta_info"]["finish_reason"]["type"] == "stop"


def test_openai_sdk_style_request(srv: RefServer) -> None:
    """Exactly what openai-python sends for client.chat.completions.create(...)."""
    headers = {"Content-Type": "application/json", "Authorization": "Bearer EMPTY", "User-Agent": "OpenAI/Python 1.54.0",
               "X-Stainless-Lang": "python", "X-Stainless-Retry-Count": "0", "Accept": "application/json"}
    body = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
            "model": "default", "frequency_penalty": 0, "logprobs": False, "max_tokens": 64, "n": 1, "presence_penalty": 0,
            "seed": 1, "stop": None, "stream": False, "temperature": 0.0, "top_p": 1.0, "user": "pytest", "max_completion_tokens": None}
    r = requests.post(srv.url + "/v1/chat/completions", data=json.dumps(body), headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["message"]["content"] == "Hello! How can I help you today?"
    assert set(out) >= {"id", "object", "created", "model", "choices", "usage"}


def test_completions_endpoint(srv: RefServer) -> None:
    r = srv.post("/v1/completions", json={"model": "m", "prompt": "The history of computing", "max_tokens": 12, "temperature": 0})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"].startswith(" is a history")
    assert body["usage"]["completion_tokens"] == 12 and body["choices"][0]["finish_reason"] == "length"
    chunks = sse(srv.post("/v1/completions", stream=True, json={"model": "m", "prompt": "The history of computing", "max_tokens": 12,
                                                                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}))
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == body["choices"][0]["text"]
    assert chunks[-1]["usage"] == body["usage"] and chunks[-1]["choices"] == []


def test_generate_stream_one_chunk_per_step(srv: RefServer) -> None:
    r = srv.post("/generate", stream=True, json={"text": "def merge_sort(items):", "stream": True,
                                                 "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}})
    chunks = sse(r)
    final = chunks[-1]
    meta = final["meta_info"]
    assert meta["completion_tokens"] == 60 and meta["finish_reason"]["type"] == "length"
    assert len(chunks) == 1 + meta["spec_verify_ct"]  # the prefill token, then one chunk per verify step
    sizes = [len(c["output_ids"]) for c in chunks]
    assert sizes == sorted(sizes) and max(b - a for a, b in zip(sizes, sizes[1:])) > 1
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]  # cumulative
    plain = srv.post("/generate", json={"text": "def merge_sort(items):", "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}}).json()
    assert plain["text"] == final["text"] and plain["output_ids"] == final["output_ids"]


def test_chat_stream_with_usage(srv: RefServer) -> None:
    chunks = sse(srv.post("/v1/chat/completions", stream=True, json={"model": "m", "messages": [{"role": "user", "content": PAIR[0]}],
                                                                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == PAIR[1]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] > 0 and all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_temperature_sampling_is_seeded(srv: RefServer) -> None:
    body = {"text": "The", "sampling_params": {"max_new_tokens": 30, "temperature": 1.5, "ignore_eos": True, "sampling_seed": 3}}
    a = srv.post("/generate", json=body).json()["output_ids"]
    assert srv.post("/generate", json=body).json()["output_ids"] == a
    body["sampling_params"]["sampling_seed"] = 4  # type: ignore[index]
    greedy = srv.post("/generate", json={"text": "The", "sampling_params": {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}}).json()
    assert srv.post("/generate", json=body).json()["output_ids"] != a or greedy["output_ids"] != a


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/generate", b"{not json"),
        ("/generate", b"[1, 2]"),
        ("/generate", b""),
        ("/generate", {"text": 5}),
        ("/generate", {"text": ["a", "b"]}),
        ("/generate", {"input_ids": [1, -1]}),
        ("/generate", {"input_ids": [10**9]}),
        ("/generate", {"input_ids": ["x"]}),
        ("/generate", {"text": "x", "input_ids": [1]}),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}),
        ("/generate", {"text": "x", "sampling_params": {"temperature": "hot"}}),
        ("/generate", {"text": "x", "sampling_params": {"stop": 3}}),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10**7}}),
        ("/generate", {"text": "x", "sampling_params": 7}),
        ("/generate", {"text": "x", "stream": "yes"}),
        ("/v1/chat/completions", {"model": "m"}),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}),
        ("/v1/chat/completions", {"messages": "hi"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        ("/v1/completions", {"prompt": None}),
        ("/v1/completions", {"prompt": "x", "max_tokens": "many"}),
    ],
)
def test_bad_requests_get_400_and_server_lives(srv: RefServer, path: str, payload: Any) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    r = requests.post(srv.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    assert error_message(r.json()), r.text
    assert srv.get("/health").status_code == 200


def error_message(body: Any) -> str:
    """The message of any of SGLang 0.5.23's 400 bodies (see refserver/request_params.py): the
    contract's ``{"error": str}``, a ValueError's ``{"error": {"message"}}``, FastAPI's and the
    OpenAI endpoints' ``ErrorResponse`` (``{"object": "error", "message", ...}``)."""
    if isinstance(body.get("error"), str):
        return str(body["error"])
    if isinstance(body.get("error"), dict):
        return str(body["error"]["message"])
    assert body.get("object") == "error" and body.get("code") == 400, body
    return str(body["message"])


def test_unknown_path_is_404_json(srv: RefServer) -> None:
    for r in (srv.get("/nope"), srv.post("/v1/embeddings", json={"input": "x"})):  # Starlette's own body
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
    assert srv.get("/generate").status_code == 405


def test_metrics_prometheus_text(srv: RefServer) -> None:
    srv.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 5}})
    text = srv.get("/metrics").text
    for name in ("sglang:spec_accept_length", "sglang:spec_verify_calls_total", "sglang:num_running_reqs",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:time_to_first_token_seconds_count",
                 "sglang:generation_tokens_total"):
        assert name in text
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in text
    # the worker's block size, once a decode-log interval (5 batches here) has been folded
    srv.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
    assert 'sglang:spec_num_draft_tokens{model_name="test/tiny"} 8' in srv.get("/metrics").text


def test_acceptance_histogram_on_the_finished_response(srv: RefServer) -> None:
    """tokenizer_manager.py:3193-3201 (0.5.23): one name, on the finished chunk only (streamed or not); index =
    drafts accepted in one verify, the counts sum to spec_verify_ct, no index above block_size - 1."""
    body = {"text": "def merge_sort(items):", "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}}
    meta = srv.post("/generate", json=body).json()["meta_info"]
    hist = meta["spec_correct_drafts_histogram"]
    assert "spec_accept_histogram" not in meta and sum(hist) == meta["spec_verify_ct"]  # the old alias: gone
    assert 2 <= len(hist) <= 8 and hist[-1] > 0
    # 47 decode tokens: each verify gives its accepted drafts plus the bonus (the last one may be cut short)
    assert 47 <= sum(k * n for k, n in enumerate(hist)) + meta["spec_verify_ct"] <= 48
    lines = [line for line in srv.post("/generate", json={**body, "stream": True}).text.splitlines() if line.startswith("data: {")]
    metas = [json.loads(line[6:])["meta_info"] for line in lines]
    assert all("spec_correct_drafts_histogram" not in m for m in metas[:-1])
    assert metas[-1]["spec_correct_drafts_histogram"] == hist


def test_startup_lines_print_the_effective_values(srv: RefServer) -> None:
    log = srv.log()
    assert ("Initialized DFLASH draft runner. attention_backend=triton, model=DFlashDraftModel, block_size=8, "
            "draft_window_size=2048, compact_cache=True") in log
    assert "Initialized DDTree worker. block_size=8, tree_budget=8, topk=4" in log


def test_flush_cache_resets_average_and_refuses_while_busy(srv: RefServer) -> None:
    srv.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
    assert srv.info()["internal_states"][0]["exact_accept_length_since_flush"] > 1  # type: ignore[index]
    assert srv.post("/flush_cache").status_code == 200
    state = srv.info()["internal_states"][0]  # type: ignore[index]
    assert state["exact_accept_length_since_flush"] == 0 and not state.get("avg_spec_accept_length")
    done = threading.Event()

    def long_request() -> None:
        srv.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}})
        done.set()

    t = threading.Thread(target=long_request)
    t.start()
    codes = set()

    def refused_or_done() -> bool:
        codes.add(srv.get("/flush_cache").status_code)
        return 400 in codes or done.is_set()

    wait_until(refused_or_done, 60, lambda: f"a flush refused while the request runs (answers: {codes})")
    t.join(60)
    assert 400 in codes, codes  # refused while busy (not only answered once the request was done)
    assert srv.get("/flush_cache").status_code == 200


def test_client_disconnect_mid_stream_is_harmless(srv: RefServer) -> None:
    r = srv.post("/generate", stream=True, json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}})
    next(r.iter_lines())
    r.close()
    wait_until(lambda: srv.info()["internal_states"][0]["requests_aborted"] >= 1, 10, "the engine to abort the request")  # type: ignore[index]
    assert srv.get("/health").status_code == 200


# -- command line --------------------------------------------------------------------


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_ddtree.refserver", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_help_documents_every_flag_and_fault() -> None:
    out = run_cli("--help").stdout
    for flag in ("--speculative-algorithm", "--speculative-dflash-block-size", "--speculative-num-draft-tokens",
                 "--speculative-eagle-topk", "--speculative-draft-window-size", "--trained-block-size", "--load-seconds",
                 "--clock-scale", "--seed", "--max-running-requests", "--fault", "--host", "--port", "--model-path"):
        assert flag in out
    for fault in ("crash-on-start", "exit-after=N", "http500-rate=P", "hang-after=N", "slow-start=S",
                  "ignore-config=topk", "lossy-verify=P", "slowdown=F", "slow-launch=F:PATH", "clock-jitter=P", "stall=K:S"):
        assert fault in out


@pytest.mark.parametrize(
    "args",
    [["--speculative-eagle-topk", "0"], ["--speculative-algorithm", "EAGLE"], ["--clock-scale", "-1"], ["--fault", "bogus"],
     ["--fault", "exit-after=x"], ["--fault", "stall=0:1"], ["--fault", "slow-launch=8"], ["--fault", "slow-launch=0:/tmp/m"], ["--fault", "stall=2"], ["--speculative-dflash-block-size", "1"], ["--port", "70000"], ["--load-seconds", "nan"]],
)
def test_bad_flag_values_exit_2(args: list[str]) -> None:
    r = run_cli("--port", "1", *args) if "--port" not in args else run_cli(*args)
    assert r.returncode == 2 and "error:" in r.stderr


def test_kept_alive_connection_has_no_delayed_ack_stall(srv: RefServer) -> None:
    """Responses go out with TCP_NODELAY: on a kept-alive connection, a body written behind
    its headers must not wait for the client's delayed ACK (~40 ms on Linux) each time.

    Two figures of the same requests, side by side: the gap between the headers' arrival and
    the body's, and the time to the headers (the engine's work). Without TCP_NODELAY the gap is
    the delayed ACK, ~40 ms against a few ms of work; with it the body follows at once (~0.1 ms).
    A busy machine slows the work too, so no absolute limit is needed.
    """
    payload = json.dumps({"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}).encode()
    request = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    gaps: list[float] = []
    to_headers: list[float] = []
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        for i in range(13):
            t0 = time.monotonic()
            sock.sendall(request)
            received = b""
            while b"\r\n\r\n" not in received:
                received += sock.recv(65536)
            t_headers = time.monotonic()
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
            while len(body) < length:
                body += sock.recv(65536)
            if i >= 2:  # from the third request on: the connection is past Linux's quick-ACK start
                gaps.append(time.monotonic() - t_headers)
                to_headers.append(t_headers - t0)
    gaps.sort()
    to_headers.sort()
    assert gaps[5] < to_headers[5], {"headers -> body": gaps, "request -> headers": to_headers}  # medians
