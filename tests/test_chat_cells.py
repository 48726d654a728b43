"""Chat cells (issue #33): the matrix's api/thinking keys, the chat stream reader against hostile
input, the reference engine's thinking and reasoning_content, and chat cells measured on it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.configs import ConfigError
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.measure import chat_stream, load
from pytest_ddtree.measure.generate_stream import RequestResult, StallWatch
from pytest_ddtree.refserver.openai_endpoints import ReasoningSplit
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.http import Stall
from tests.bench_serving_contract import check_result
from tests.refserver_helpers import RefServer, config_args


# -- the matrix's keys --------------------------------------------------------------------------


def _workloads(tmp_path: Path, line: str) -> Any:
    path = tmp_path / "configs.yaml"
    path.write_text(f"cells:\n  - {line}\n")
    return load_matrix(path).cells


def test_api_and_thinking_keys_are_parsed_and_bad_values_say_the_closest(tmp_path: Path) -> None:
    (plain,) = _workloads(tmp_path, "{name: c1, concurrency: 1, context_tokens: 64}")
    assert (plain.api, plain.thinking) == ("generate", None)
    assert "api" not in load.workload_dict(plain)  # a /generate cell's workload (its baseline) is unchanged
    for text, value in (("on", True), ("off", False), ("'on'", True), ("'OFF'", False)):
        (cell,) = _workloads(tmp_path, f"{{name: c1, concurrency: 1, context_tokens: 64, api: chat, thinking: {text}}}")
        assert (cell.api, cell.thinking) == ("chat", value)
        assert load.workload_dict(cell)["thinking"] == ("on" if value else "off")
    (chat,) = _workloads(tmp_path, "{name: c1, concurrency: 1, context_tokens: 64, api: chat}")
    assert load.workload_dict(chat)["api"] == "chat" and load.workload_dict(chat)["thinking"] is None
    from pytest_ddtree.gates.throughput.measurement import rate_cell

    probe = rate_cell(cell, 4.0)  # a rate search's probe of a chat template sends chat, with its thinking
    assert (probe.api, probe.thinking, load.workload_dict(probe)["thinking"]) == ("chat", False, "off")
    for line, message in (
        ("{concurrency: 1, context_tokens: 64, api: chta}", "api must be one of generate, chat, got 'chta'; did you mean 'chat'"),
        ("{concurrency: 1, context_tokens: 64, api: chat, thinking: onn}", "thinking must be on or off, got 'onn'; did you mean 'on'"),
        ("{concurrency: 1, context_tokens: 64, thinking: on}", "thinking: on needs api: chat"),
        ("{concurrency: 1, context_tokens: 64, api: chat, thinkng: on}", "did you mean 'thinking'"),
    ):
        with pytest.raises(ConfigError, match=message):
            _workloads(tmp_path, line)


# -- the stream reader against hostile input ------------------------------------------------------


def _lines(*chunks: Any, done: bool = True) -> bytes:
    out = b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _delta(content: str | None = None, reasoning: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"reasoning_content": reasoning}
    if content is not None:
        delta["content"] = content
    return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def _usage(completion: int, prompt: int = 20) -> dict[str, Any]:
    return {"id": "x", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def _read(data: bytes, asked: int = 4) -> RequestResult:
    result = RequestResult(index=0, expected_prompt_tokens=16, expected_output_tokens=asked, templated=True)
    ticks = iter(range(1, 10**6))
    chat_stream.read_chat_events(io.BytesIO(data), result, asked, lambda: float(next(ticks)),
                                 StallWatch(Stall(1e9, 1e9), None, 0.0))  # a tick per read: no stall here
    return result


def test_the_reader_times_content_and_reasoning_deltas_and_counts_tokens_from_usage() -> None:
    spec = {"id": "x", "choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 1, 1]}}}
    result = _read(_lines(_delta(content=""), _delta(reasoning="ab"), _delta(reasoning="c"), _delta(content="d"),
                          spec, _usage(4)))
    # one tick per line read (each event ends with a blank line): the role chunk's empty content is no
    # token, the first reasoning delta (the third line) is the first token
    assert result.ttft_s == 3.0
    assert result.itl_s == [2.0, 2.0] and result.completion_tokens == 4 and result.prompt_tokens == 20
    assert result.spec_verify_ct == 2 and result.accept_histogram == [0, 1, 1]
    assert result.problems() == ["request 0 failed: None"]  # ok is stream_chat's to set
    result.ok = True
    assert result.problems() == []
    result.prompt_tokens = 10  # a template only adds: fewer than the message's tokens is a cut message
    assert "chat message of 16 tokens" in result.problems()[0]


@pytest.mark.parametrize(("data", "message"), [
    (_lines(_delta(content="a"), done=False), "without 'data: \\[DONE\\]'"),
    (_lines(_delta(content="a")), "no usage chunk"),
    (_lines(_usage(4)), "no content or reasoning_content"),
    (_lines(_delta(content="a"), _usage(5)), "more than the 4 asked"),
    (_lines(_delta(content="a"), {"choices": [], "usage": {"completion_tokens": "4"}}), "not a count"),
    (_lines(b"{not json"), "not JSON"),
    (_lines(b"[1, 2]"), "not a JSON object"),
    (_lines({"error": {"message": "boom"}}), "server error in stream: .*boom"),
    (_lines({"object": "error", "message": "overloaded"}), "server error in stream: overloaded"),
    (_lines(*[_delta(content="a")] * 20, _usage(4)), "more than 12 text deltas"),
    (b"data: " + b"x" * (chat_stream.CHAT_LINE_LIMIT + 10) + b"\n", "stream line over"),
    (b": keep-alive\n" * (chat_stream.CHAT_BODY_BASE // 13 + chat_stream.CHAT_BYTES_PER_TOKEN * 4 // 13 + 2), "stream over"),
    (_lines(_delta(content="a"), {"choices": [], "sglext": {"spec_tokens_details": {
        "spec_verify_ct": 2, "spec_correct_drafts_histogram": [5]}}}, _usage(4)), "invalid response"),
])
def test_the_reader_refuses_a_hostile_or_broken_stream(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _read(data)


def test_reasoning_split_follows_the_qwen3_detector_across_deltas() -> None:
    forced = ReasoningSplit(forced=True)
    assert [forced.feed(t) for t in ("let me", " think</th", "ink>The", " answer")] == [
        ("let me", ""), (" think", ""), (None, "The"), (None, " answer")]
    opened = ReasoningSplit(forced=False)
    assert [opened.feed(t) for t in ("<thi", "nk>hm</think>", "ok")] == [(None, ""), ("hm", ""), (None, "ok")]
    plain = ReasoningSplit(forced=False)
    assert plain.feed("<", final=True) == (None, "<") and plain.feed("x") == (None, "x")


def test_the_exported_chat_template_switches_thinking_as_the_engine_renders_it() -> None:
    jinja2 = pytest.importorskip("jinja2")
    from pytest_ddtree.refserver.openai_endpoints import THINK_OFF_SUFFIX
    from pytest_ddtree.refserver.hf_export import CHAT_TEMPLATE

    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    messages = [{"role": "user", "content": "hi"}]
    on, off, unsent = (template.render(messages=messages, add_generation_prompt=True, **kw)
                       for kw in ({"enable_thinking": True}, {"enable_thinking": False}, {}))
    assert on == unsent and off == on + THINK_OFF_SUFFIX


# -- on the reference engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefServer]:
    s = RefServer([*config_args("bs8_b8_k4"), "--clock-scale", "50", "--reasoning-parser", "qwen3"],
                  tmp_path_factory.mktemp("chat")).wait_ready()
    yield s
    s.stop()


def _stream(engine: RefServer, thinking: bool | None) -> list[dict[str, Any]]:
    body = {"messages": [{"role": "user", "content": "def fib(n):"}], "max_tokens": 12, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_spec_tokens_details": True}
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    lines = [line for line in engine.post("/v1/chat/completions", json=body).text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_the_engine_streams_reasoning_when_thinking_is_on_and_content_when_off(engine: RefServer) -> None:
    def texts(chunks: list[dict[str, Any]], key: str) -> str:
        return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c["choices"])

    on, off, default = _stream(engine, True), _stream(engine, False), _stream(engine, None)
    assert texts(on, "reasoning_content") and not texts(on, "content")
    assert texts(off, "content") and not texts(off, "reasoning_content")
    assert texts(default, "reasoning_content") == texts(on, "reasoning_content")  # the template's default is on
    usage_on, usage_off = on[-1]["usage"], off[-1]["usage"]
    assert usage_on["completion_tokens"] == usage_off["completion_tokens"] == 12
    assert usage_off["prompt_tokens"] > usage_on["prompt_tokens"]  # off: the template's empty think block
    assert (usage_on["reasoning_tokens"], usage_off["reasoning_tokens"]) == (12, 0)  # as real SGLang counts them
    (ext,) = [c["sglext"]["spec_tokens_details"] for c in on if "sglext" in c]
    assert ext["spec_verify_ct"] == sum(ext["spec_correct_drafts_histogram"]) > 0


def test_chat_cells_thinking_on_and_off_are_valid_and_carry_their_api(engine: RefServer) -> None:
    with SGLangClient(engine.url) as client:
        results = {}
        for thinking in (True, False):
            cell = load.Cell(f"chat_{thinking}", concurrency=2, context_tokens=64, output_tokens=16, requests=4,
                             warmup_requests=1, api="chat", thinking=thinking)
            res = load.run_cell(client, cell, speculative=True, accept_bound=7)
            assert res.valid, res.problems()
            assert res.workload["api"] == "chat" and res.workload["thinking"] == ("on" if thinking else "off")
            assert res.prompt_source == "documents via /tokenize, as chat text"
            assert all(r.prompt_tokens is not None and r.prompt_tokens > 64 for r in res.requests)  # the template's too
            assert all(r.completion_tokens == 16 and r.spec_verify_ct for r in res.requests)
            results[thinking] = res.metrics()
        assert results[True]["ddtree_tokens_per_verify"] and results[False]["ddtree_tokens_per_verify"]
        sent_on, sent_off = results[True]["total_input_tokens"], results[False]["total_input_tokens"]
        assert isinstance(sent_on, int) and isinstance(sent_off, int) and sent_off > sent_on


def test_an_open_loop_chat_cell_sends_its_schedule_through_the_chat_endpoint(engine: RefServer) -> None:
    from pytest_ddtree.measure.openloop import Arrivals

    cell = load.Cell("r20_chat", concurrency=6, context_tokens=64, output_tokens=8, requests=6, warmup_requests=0,
                     open_loop=Arrivals(20.0, "constant"), api="chat", thinking=False)
    with SGLangClient(engine.url) as client:
        res = load.run_cell(client, cell, speculative=True)
    assert res.valid, res.problems()
    assert res.send_lag_s is not None and len(res.send_lag_s) == 6
    assert all(r.prompt_tokens is not None and r.prompt_tokens > 64 and r.spec_verify_ct for r in res.requests)
    assert res.metrics()["request_rate"] == 20.0 and res.workload["thinking"] == "off"


# -- a session through suites/test_throughput.py ---------------------------------------------------

CHAT_MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4]
cell_defaults: {output_tokens: 16}
cells:
  - {name: c2_think, concurrency: 2, context_tokens: 48, requests: 4, warmup_requests: 1, api: chat, thinking: on}
  - {name: c2_nothink, concurrency: 2, context_tokens: 48, requests: 4, warmup_requests: 1, api: chat, thinking: off}
"""


@pytest.mark.slow
@pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py
def test_a_session_measures_chat_cells_thinking_on_and_off_through_the_throughput_suite(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    from tests.suite_helpers import reference_profile

    profile = reference_profile(pytester.path, "--reasoning-parser qwen3", clock_scale=5, control="none")
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(CHAT_MATRIX)
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}",
        f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        "--ddtree-config=bs8_b8_k4", "-p", "no:cacheprovider", "-rA", timeout=240)
    result.assert_outcomes(passed=2, warnings=2)  # no baselines yet: a warning each
    results = json.loads((pytester.path / "results" / "results.json").read_text())
    cells = {c["cell"]: c for c in results["throughput"]}
    for name, thinking in (("c2_think", "on"), ("c2_nothink", "off")):
        cell = cells[name]
        assert (cell["backend"], cell["ddtree_api"], cell["ddtree_thinking"]) == ("sglang-oai-chat", "chat", thinking)
        assert cell["measurement_status"] == "valid" and cell["completed"] == 4 and cell["ddtree_tokens_per_verify"] > 1
        assert check_result(cell) == [], check_result(cell)  # bench_serving's keys and types, as a /generate cell's
    # the template's think block is in the prompt: thinking off sends more tokens than on
    assert cells["c2_nothink"]["ddtree_server_input_tokens"] > cells["c2_think"]["ddtree_server_input_tokens"]
    records = [json.loads(line) for path in (pytester.path / "results").glob("records-*.jsonl")
               for line in path.read_text().splitlines()]
    workloads = {r["cell"]: r["workload"] for r in records if r.get("kind") == "throughput"}
    assert workloads["c2_think"]["thinking"] == "on" and workloads["c2_nothink"]["api"] == "chat"


# -- against real SGLang 0.5.23 (the CPU lane) -----------------------------------------------------


#: The lane's tiny template with Qwen3's thinking switch (off: an empty think block after the header).
THINK_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% if enable_thinking is defined and enable_thinking is false %}"
                  "<think>\n\n</think>\n\n{% endif %}{% endif %}")


def _texts(url: str, thinking: bool | None) -> tuple[str, str, int]:
    """(reasoning_content, content, usage.prompt_tokens) of one streamed chat, read raw."""
    import requests

    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_completion_tokens": 6,
                            "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    chunks = [json.loads(line[6:]) for line in requests.post(url + "/v1/chat/completions", json=body, timeout=60).text.splitlines()
              if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return ("".join(d.get("reasoning_content") or "" for d in deltas), "".join(d.get("content") or "" for d in deltas),
            chunks[-1]["usage"]["prompt_tokens"])


@pytest.mark.sglang
@pytest.mark.slow  # real SGLang's start-up, ~20 s alone
def test_the_chat_reader_and_thinking_agree_with_real_sglang(tmp_path: Path) -> None:
    """Real SGLang 0.5.23 with a template that has the thinking switch and --reasoning-parser qwen3,
    beside the engine with the same parser: the harness's own request (chat_template_kwargs, ignore_eos,
    return_spec_tokens_details) reads alike from both (a text delta, usage's counts, [DONE]), and thinking
    on (or not sent: the template's default) streams reasoning_content only, off content only, with
    the template's think block in the prompt (serving_chat.py, reasoning_parser.py Qwen3Detector)."""
    from pytest_ddtree.measure.prompts import Prompt
    from pytest_ddtree.service.pool import free_port
    from tests.sglang_lane import launch_real_sglang, sglang_python

    python, why = sglang_python()
    if python is None:
        pytest.skip(why)
    template = tmp_path / "think.jinja"
    template.write_text(THINK_TEMPLATE)
    engine = RefServer(["--speculative-algorithm", "DFLASH", "--clock-scale", "50", "--reasoning-parser", "qwen3"], tmp_path, "engine")
    try:
        with launch_real_sglang(tmp_path, free_port(), python=python,
                                extra_args=["--chat-template", str(template), "--reasoning-parser", "qwen3"]) as real:
            engine.wait_ready()
            for url in (real, engine.url):
                with SGLangClient(url) as client:
                    for thinking in (True, False, None):
                        result = chat_stream.stream_chat(client.http, 0, Prompt(4, text="Hello there"), 8, thinking=thinking)
                        assert result.ok, (url, result.error)
                        assert result.completion_tokens == 8 and result.ttft_s is not None and result.ttft_s > 0
                        assert isinstance(result.prompt_tokens, int) and result.prompt_tokens >= 4  # the template's too
                        if url == real:  # CPU SGLang does not speculate: no sglext chunk, no verify counts
                            assert result.spec_verify_ct is None and result.accept_histogram is None
                        else:  # the engine speculates (DFLASH by default): its sglext chunk carries them
                            assert result.spec_verify_ct and sum(result.accept_histogram or []) == result.spec_verify_ct
                (on, on_content, on_prompt), (off_reasoning, off, off_prompt) = _texts(url, True), _texts(url, False)
                default_reasoning, default_content, _ = _texts(url, None)
                assert on and not on_content and default_reasoning and not default_content, url
                assert off and not off_reasoning, url
                assert off_prompt > on_prompt, url
    finally:
        engine.stop()
