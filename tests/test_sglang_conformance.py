"""Conformance: the reference engine answers as real SGLang 0.5.23 does, wherever the harness looks.

Why: the engine is CI's stand-in for SGLang, so a harness feature that works only because the engine
is kinder than SGLang (a key SGLang lacks, a 400 where SGLang streams an error, a gauge SGLang sets
later) passes CI and fails on the GPU box. One story in two parts:

* **against the real server** (skips, with the reason, where the real-SGLang venv is absent): one
  module-scoped real SGLang (tests/sglang_lane.py, CPU, non-speculative) and one reference engine get
  the same requests; per endpoint the status, the content type, every JSON body's keys and value
  types (nested), the SSE framing, the error bodies of bad requests, the metric names, TYPE lines and
  values at idle, ``/flush_cache``'s answers, ``/tokenize`` and ``/detokenize`` are compared. Every
  difference found must be declared on docs/conformance.md (its table is read here: a new
  difference fails, and a declared one that no longer shows fails too, so the page stays true);
* **what CPU SGLang cannot show** (speculation, the forks' flag handling, timing): each behaviour is
  checked against the engine and cites the SGLang source the engine follows (the 0.5.23 wheel where
  it has the code; a fork or PR where only that has it).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from pytest_ddtree.service.pool import free_port
from tests.polling import wait_until
from tests.refserver_helpers import REPO, RefServer
from tests.sglang_lane import launch_real_sglang, sglang_python

PAGE = REPO / "docs" / "conformance.md"
WHEEL = "sglang 0.5.23 "  # the real server's source, as cited here and on the page
HTTP_SERVER = WHEEL + "sglang/srt/entrypoints/http_server.py"
TOKENIZER_MANAGER = WHEEL + "sglang/srt/managers/tokenizer_manager.py"
METRICS_REPORTER = WHEEL + "sglang/srt/managers/scheduler_components/metrics_reporter.py"
SCHEDULER = WHEEL + "sglang/srt/managers/scheduler.py"
SPEC_HOOK = WHEEL + "sglang/srt/arg_groups/speculative_hook.py"
DDTREE_HOOK = "Rancy-Wang/sglang@ddtree-v2 (PR 27509) python/sglang/srt/arg_groups/speculative_hook.py"
SUBSIR_WORKER = "SubSir/sglang@0433712a5d69 python/sglang/srt/speculative/dflash_worker.py"

GREEDY = {"temperature": 0, "ignore_eos": True}
#: The engine's flags for the comparison: speculation on, as the harness runs it in CI (the
#: speculative fields it adds are declared differences: CPU SGLang cannot speculate).
ENGINE_ARGS = ["--clock-scale", "50", "--enable-metrics", "--speculative-algorithm", "DFLASH",
               "--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "8",
               "--speculative-eagle-topk", "4", "--speculative-draft-window-size", "2048"]
#: /server_info keys the harness reads (readiness, the profiles' applied keys, fingerprint.py,
#: the control, proof): each must be in both answers with the same type unless declared.
HARNESS_SERVER_INFO_KEYS = (
    "model_path", "tokenizer_path", "port", "tp_size", "dp_size", "context_length", "max_total_num_tokens",
    "max_running_requests", "enable_metrics", "decode_log_interval", "version", "speculative_algorithm",
    "speculative_num_draft_tokens", "speculative_dflash_block_size", "speculative_eagle_topk",
    "speculative_num_steps", "speculative_draft_window_size", "speculative_draft_model_path", "internal_states",
)
#: Gauges whose value at idle (before any request but the start-up's warm-up) the harness may read.
IDLE_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:spec_accept_length",
               "sglang:spec_num_draft_tokens", "sglang:gen_throughput")


# -- the declared differences: docs/conformance.md's table -------------------------------------------

_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*$")


def declared_differences() -> dict[str, tuple[str, str]]:
    """``pattern -> (SGLang source, why)`` from the page's table of deliberate differences."""
    rows: dict[str, tuple[str, str]] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match and match.group(1) != "difference":
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


# -- shapes ----------------------------------------------------------------------------------------

def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def shape(value: object, path: str = "", out: dict[str, str] | None = None, depth: int = 0) -> dict[str, str]:
    """``path -> type`` of every value of a JSON body (list elements merged under ``[]``)."""
    out = {} if out is None else out
    out[path or "."] = type_name(value) if path not in out or out[path] == type_name(value) else "mixed"
    if depth > 6:
        return out
    if isinstance(value, dict):
        for key, item in value.items():
            shape(item, f"{path}.{key}", out, depth + 1)
    elif isinstance(value, list):
        for item in value[:50]:
            shape(item, f"{path}[]", out, depth + 1)
    return out


def compare_shapes(where: str, engine: dict[str, str], real: dict[str, str], *,
                   keys: Callable[[str], bool] = lambda _: True) -> list[str]:
    diffs = []
    for path in sorted(set(engine) | set(real)):
        if not keys(path):
            continue
        if path not in real:
            diffs.append(f"{where} {path}: only in the engine")
        elif path not in engine:
            diffs.append(f"{where} {path}: only in SGLang")
        elif engine[path] != real[path] and "null" not in (engine[path], real[path]):
            diffs.append(f"{where} {path}: {engine[path]} in the engine, {real[path]} in SGLang")
        elif engine[path] != real[path]:
            diffs.append(f"{where} {path}: {engine[path]} in the engine, {real[path]} in SGLang")
    return diffs


@dataclass
class Answer:
    status: int
    kind: str  # json, sse, text
    body: Any
    lines: list[str] = field(default_factory=list)


def answer_of(resp: requests.Response) -> Answer:
    ctype = resp.headers.get("content-type", "")
    if "event-stream" in ctype:
        lines = resp.text.split("\n")
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        return Answer(resp.status_code, "sse", chunks, lines)
    try:
        return Answer(resp.status_code, "json", resp.json())
    except ValueError:
        return Answer(resp.status_code, "text", resp.text)


def framing(lines: list[str]) -> str:
    """SSE framing as a word: ``data-lines+blank, [DONE] last`` when it is SGLang's."""
    events = "\n".join(lines).split("\n\n")
    payloads = [e for e in events if e.strip()]
    if not payloads:
        return "empty"
    if not all(e.startswith("data: ") and "\n" not in e for e in payloads):
        return "not one data: line per event"
    return "data: events, [DONE] last" if payloads[-1] == "data: [DONE]" else "no [DONE] at the end"


def compare_answers(where: str, engine: Answer, real: Answer) -> list[str]:
    diffs = []
    if engine.status != real.status:
        diffs.append(f"{where}: status {engine.status} in the engine, {real.status} in SGLang")
    if engine.kind != real.kind:
        diffs.append(f"{where}: a {engine.kind} body in the engine, {real.kind} in SGLang")
        return diffs
    if engine.kind == "json":
        diffs += compare_shapes(where, shape(engine.body), shape(real.body))
    elif engine.kind == "sse":
        if framing(engine.lines) != framing(real.lines):
            diffs.append(f"{where}: SSE {framing(engine.lines)} in the engine, {framing(real.lines)} in SGLang")
        for label, pick in (("first chunk", 0), ("last chunk", -1)):
            if engine.body and real.body:
                diffs += compare_shapes(f"{where} {label}", shape(engine.body[pick]), shape(real.body[pick]))
            elif engine.body or real.body:
                diffs.append(f"{where}: no {label} in {'SGLang' if engine.body else 'the engine'}")
        if len(engine.body) > 2 and len(real.body) > 2:
            diffs += compare_shapes(f"{where} middle chunk", shape(engine.body[1]), shape(real.body[1]))
    elif engine.body != real.body:
        diffs.append(f"{where}: text {engine.body[:80]!r} in the engine, {real.body[:80]!r} in SGLang")
    return diffs


def metric_types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def metric_sample(text: str, name: str) -> float | None:
    match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


# -- the two servers and the requests both get -------------------------------------------------------

@dataclass
class Pair:
    real: str
    engine: RefServer
    differences: list[str] = field(default_factory=list)
    seen: dict[str, tuple[Answer, Answer]] = field(default_factory=dict)

    def both(self, where: str, method: str, path: str, **kw: Any) -> tuple[Answer, Answer]:
        answers = []
        for base in (self.engine.url, self.real):
            resp = requests.request(method, base + path, timeout=120, **kw)
            answers.append(answer_of(resp))
        engine, real = answers
        self.differences += compare_answers(where, engine, real)
        self.seen[where] = (engine, real)
        return engine, real


def server_info_scope(engine: dict[str, Any], real: dict[str, Any]) -> Callable[[str], bool]:
    """Which /server_info paths are compared: the keys the harness reads and every key the engine
    sends (each must be SGLang's); in ``internal_states[0]`` the engine's keys and SGLang's own
    state (SGLang repeats every server arg there too: those are not compared twice)."""
    engine_state = engine["internal_states"][0]

    def scope(path: str) -> bool:
        top = path[1:].split(".")[0].split("[")[0]
        if top != "internal_states":
            return top in HARNESS_SERVER_INFO_KEYS or top in engine
        if path in (".internal_states", ".internal_states[]"):
            return True
        key = path[len(".internal_states[]."):].split(".")[0].split("[")[0]
        return key in engine_state or key not in real

    return scope


def generate(base: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = requests.post(base + "/generate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text[:500]
    out: dict[str, Any] = resp.json()
    return out


def _stop_requests(pair: Pair) -> None:
    """finish_reason shapes: length, a stop string and a stop token (each server's own greedy output
    gives the stop it will meet)."""
    for name, base in (("engine", pair.engine.url), ("real", pair.real)):
        first = generate(base, {"text": "The history of", "sampling_params": {**GREEDY, "max_new_tokens": 6}})
        ids, text = first["output_ids"], first["text"]
        assert len(ids) == 6 and len(text) >= 3, first
        setattr(pair, f"_{name}_stops", ({"stop": [text[1:3]]}, {"stop_token_ids": [ids[2]]}))
    for label, index in (("stop string", 0), ("stop token", 1)):
        answers = []
        for name, base in (("engine", pair.engine.url), ("real", pair.real)):
            stop = getattr(pair, f"_{name}_stops")[index]
            body = {"text": "The history of", "sampling_params": {"temperature": 0, "max_new_tokens": 6, **stop}}
            answers.append(answer_of(requests.post(base + "/generate", json=body, timeout=120)))
        pair.differences += compare_answers(f"POST /generate ({label})", *answers)
        pair.seen[f"POST /generate ({label})"] = (answers[0], answers[1])


def _flush_while_busy(pair: Pair) -> None:
    """/flush_cache while a long request decodes: SGLang refuses it (400)."""
    answers = []
    for base in (pair.engine.url, pair.real):
        body = {"text": "x", "stream": True, "sampling_params": {**GREEDY, "max_new_tokens": 2000}}
        with requests.post(base + "/generate", json=body, stream=True, timeout=120) as resp:
            lines = resp.iter_lines(decode_unicode=True)
            next(line for line in lines if line)  # decoding now
            answers.append(answer_of(requests.post(base + "/flush_cache", timeout=30)))
            resp.close()
    pair.differences += compare_answers("POST /flush_cache (busy)", *answers)
    pair.seen["POST /flush_cache (busy)"] = (answers[0], answers[1])
    for base in (pair.engine.url, pair.real):  # both idle again (the aborted request drains)
        wait_until(lambda: requests.post(base + "/flush_cache", timeout=30).status_code == 200, 60, f"{base} idle")


BAD_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("unknown top-level field", {"json": {"text": "x", "bogus": 1, "sampling_params": {"max_new_tokens": 2}}}),
    ("unknown sampling field", {"json": {"text": "x", "sampling_params": {"max_new_tokens": 2, "bogus": 1}}}),
    ("max_new_tokens not an integer", {"json": {"text": "x", "sampling_params": {"max_new_tokens": 2.5}}}),
    ("negative temperature", {"json": {"text": "x", "sampling_params": {"max_new_tokens": 2, "temperature": -1}}}),
    ("negative temperature, streamed", {"json": {"text": "x", "stream": True,
                                                 "sampling_params": {"max_new_tokens": 2, "temperature": -1}}}),
    ("top_p above 1", {"json": {"text": "x", "sampling_params": {"max_new_tokens": 2, "top_p": 2}}}),
    ("negative max_new_tokens", {"json": {"text": "x", "sampling_params": {"max_new_tokens": -1}}}),
    ("no prompt", {"json": {"sampling_params": {"max_new_tokens": 2}}}),
    ("prompt over the context", {"json": {"input_ids": [5] * 33000, "sampling_params": {"max_new_tokens": 2}}}),
    ("prompt over the context, streamed", {"json": {"input_ids": [5] * 33000, "stream": True,
                                                    "sampling_params": {"max_new_tokens": 2}}}),
    ("output over the context", {"json": {"input_ids": [5] * 10, "sampling_params": {"max_new_tokens": 40000}}}),
    ("invalid JSON", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}),
    ("wrong content type", {"data": b"text=x", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    python, why = sglang_python()
    if python is None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("conformance")
    engine = RefServer(ENGINE_ARGS, folder, "engine")
    try:
        with launch_real_sglang(folder, free_port(), python=python) as real:
            engine.wait_ready()
            yield collect(Pair(real, engine))
    finally:
        engine.stop()


def collect(pair: Pair) -> Pair:
    """Every request of the comparison, in an order that keeps the idle readings idle."""
    engine_metrics, real_metrics = (requests.get(base + "/metrics", timeout=30).text for base in (pair.engine.url, pair.real))
    engine_types, real_types = metric_types(engine_metrics), metric_types(real_metrics)
    for name in sorted(engine_types):
        if name not in real_types:
            pair.differences.append(f"/metrics {name}: only in the engine")
        elif engine_types[name] != real_types[name]:
            pair.differences.append(f"/metrics {name}: TYPE {engine_types[name]} in the engine, {real_types[name]} in SGLang")
    for name in IDLE_GAUGES:
        values = metric_sample(engine_metrics, name), metric_sample(real_metrics, name)
        if values[0] != values[1]:
            pair.differences.append(f"/metrics {name} at idle: {values[0]} in the engine, {values[1]} in SGLang")
    for path in ("/health", "/health_generate", "/model_info", "/get_model_info", "/v1/models", "/no/such/path"):
        pair.both(f"GET {path}", "GET", path)
    engine_info, real_info = pair.both("GET /server_info", "GET", "/server_info")
    pair.differences = [d for d in pair.differences if not d.startswith("GET /server_info ")]
    pair.differences += compare_shapes("GET /server_info", shape(engine_info.body), shape(real_info.body),
                                       keys=server_info_scope(engine_info.body, real_info.body))
    pair.both("GET /get_server_info", "GET", "/get_server_info")
    pair.differences = [d for d in pair.differences if not d.startswith("GET /get_server_info ")]
    if set(engine_info.body) != set(pair.seen["GET /get_server_info"][0].body):
        pair.differences.append("GET /get_server_info: other keys than /server_info in the engine")
    for method in ("POST", "GET"):
        pair.both(f"{method} /flush_cache (idle)", method, "/flush_cache")
    pair.both("POST /generate", "POST", "/generate", json={"text": "def is_prime(n):", "sampling_params": {**GREEDY, "max_new_tokens": 8}})
    pair.both("POST /generate (default max_new_tokens)", "POST", "/generate", json={"text": "Hello", "sampling_params": GREEDY})
    pair.both("POST /generate (input_ids)", "POST", "/generate", json={"input_ids": [5, 6, 7], "sampling_params": {**GREEDY, "max_new_tokens": 4}})
    pair.both("POST /generate (streamed)", "POST", "/generate",
              json={"text": "Hello", "stream": True, "sampling_params": {**GREEDY, "max_new_tokens": 6}})
    _stop_requests(pair)
    for label, kw in BAD_REQUESTS:
        pair.both(f"POST /generate ({label})", "POST", "/generate", **kw)
    for path, body in (("/tokenize", {"prompt": "Hello world"}), ("/tokenize", {"prompt": ["Hello", "world"]}),
                       ("/v1/tokenize", {"prompt": "Hello world"}), ("/tokenize", {"prompt": 5}),
                       ("/detokenize", {"tokens": [5, 6, 7]}), ("/detokenize", {"tokens": [[5], [6, 7]]}),
                       ("/v1/detokenize", {"tokens": [5, 6, 7]}), ("/detokenize", {"tokens": "x"})):
        pair.both(f"POST {path} {json.dumps(body)}", "POST", path, json=body)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    pair.both("POST /v1/chat/completions", "POST", "/v1/chat/completions", json={**chat, "return_meta_info": True})
    pair.both("POST /v1/chat/completions (streamed)", "POST", "/v1/chat/completions", json={**chat, "stream": True})
    pair.both("POST /v1/completions", "POST", "/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 4, "temperature": 0})
    _flush_while_busy(pair)
    return pair




@pytest.mark.slow
def test_every_difference_from_real_sglang_is_declared(pair: Pair) -> None:
    declared = declared_differences()
    undeclared = [d for d in pair.differences if not any(fnmatch.fnmatchcase(d, p) for p in declared)]
    stale = [p for p in declared if not any(fnmatch.fnmatchcase(d, p) for d in pair.differences)]
    assert not undeclared, ("differences between the engine and real SGLang 0.5.23 that docs/conformance.md does not "
                            "declare (fix the engine, or declare one with the SGLang file:line):\n  " + "\n  ".join(undeclared))
    assert not stale, "docs/conformance.md declares differences that no longer show:\n  " + "\n  ".join(stale)


@pytest.mark.slow
def test_what_the_harness_reads_agrees(pair: Pair) -> None:
    """The values (not just the shapes) the harness's code depends on, read from both servers."""
    for where in ("POST /generate", "POST /generate (input_ids)"):
        engine, real = pair.seen[where]
        for answer in (engine, real):
            meta = answer.body["meta_info"]
            assert meta["finish_reason"] == {"type": "length", "length": len(answer.body["output_ids"])}
            assert meta["completion_tokens"] == len(answer.body["output_ids"])
            assert isinstance(meta["cached_tokens"], int) and meta["e2e_latency"] > 0
    for answer in pair.seen["POST /generate (default max_new_tokens)"]:
        assert answer.body["meta_info"]["completion_tokens"] == 128  # SGLang's default max_new_tokens
    for answer in pair.seen["POST /generate (stop string)"]:
        reason = answer.body["meta_info"]["finish_reason"]
        assert reason["type"] == "stop" and isinstance(reason["matched"], str), reason
    for answer in pair.seen["POST /generate (stop token)"]:
        reason = answer.body["meta_info"]["finish_reason"]
        assert reason["type"] == "stop" and isinstance(reason["matched"], int), reason
    for answer in pair.seen["POST /generate (streamed)"]:
        counts = [c["meta_info"]["completion_tokens"] for c in answer.body]
        assert counts == sorted(counts) and counts[-1] == 6
        assert all(len(c["output_ids"]) == c["meta_info"]["completion_tokens"] for c in answer.body)
        assert "e2e_latency" in answer.body[-1]["meta_info"] and answer.body[-1]["meta_info"]["finish_reason"]
        assert all(c["meta_info"]["finish_reason"] is None for c in answer.body[:-1])
    for label in ("prompt over the context, streamed", "negative temperature, streamed"):
        for answer in pair.seen[f"POST /generate ({label})"]:  # an error in a stream: a data: {"error": ...} event
            assert answer.status == 200 and answer.kind == "sse" and "error" in answer.body[0], answer
    for answer in pair.seen["POST /flush_cache (busy)"]:
        assert answer.status == 400
    for answer in pair.seen['POST /tokenize {"prompt": "Hello world"}']:
        assert answer.body["count"] == len(answer.body["tokens"]) and answer.body["max_model_len"] == 32768
