"""Conformance: every SGLang behaviour the harness relies on, the SGLang source it follows, checked
against the reference engine.

Why a list: the engine is CI's stand-in for SGLang, so a harness feature that works only because
the engine is kinder than SGLang (a key SGLang lacks, a figure SGLang omits) would pass CI and fail
on the GPU box. Each entry names the behaviour and the file of SGLang (upstream main unless a fork
or PR is named) that the engine's code follows; a new harness dependency on SGLang belongs here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from tests.refserver_helpers import REPO, RefServer

UPSTREAM = "sgl-project/sglang "
HTTP_SERVER = UPSTREAM + "python/sglang/srt/entrypoints/http_server.py"
TOKENIZER_MANAGER = UPSTREAM + "python/sglang/srt/managers/tokenizer_manager.py"
METRICS_REPORTER = UPSTREAM + "python/sglang/srt/managers/scheduler_components/metrics_reporter.py"
SCHEDULER = UPSTREAM + "python/sglang/srt/managers/scheduler.py"
SPEC_HOOK = UPSTREAM + "python/sglang/srt/arg_groups/speculative_hook.py"
DDTREE_HOOK = "Rancy-Wang/sglang@ddtree-v2 (PR 27509) python/sglang/srt/arg_groups/speculative_hook.py"
SUBSIR_WORKER = "SubSir/sglang@0433712a5d69 python/sglang/srt/speculative/dflash_worker.py"

# /model_info of SGLang (http_server.py ``model_info``): exactly these keys.
SGLANG_MODEL_INFO_KEYS = {
    "model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version",
    "has_image_understanding", "has_audio_understanding", "model_type", "architectures",
}
INTERVAL = 4  # --decode-log-interval of the spec engine


@dataclass
class Engines:
    spec: RefServer
    none: RefServer
    upstream: RefServer
    ddtree: RefServer
    subsir: RefServer


@dataclass(frozen=True)
class Behaviour:
    what: str
    source: str
    check: Callable[[Engines], None]


BEHAVIOURS: list[Behaviour] = []


def behaviour(what: str, source: str) -> Callable[[Callable[[Engines], None]], Callable[[Engines], None]]:
    def register(check: Callable[[Engines], None]) -> Callable[[Engines], None]:
        BEHAVIOURS.append(Behaviour(what, source, check))
        return check

    return register


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    logs = tmp_path_factory.mktemp("conformance")
    fast = ["--clock-scale", "50"]
    specs: dict[str, tuple[list[str], dict[str, str]]] = {
        "spec": ([*fast, "--decode-log-interval", str(INTERVAL)], {}),
        "none": ([*fast, "--speculative-algorithm", "NONE"], {}),
        "upstream": ([*fast, "--dialect", "upstream", "--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "8",
                      "--speculative-eagle-topk", "4", "--speculative-draft-window-size", "2048"], {}),
        "ddtree": ([*fast, "--dialect", "ddtree", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-block-size", "8",
                    "--speculative-ddtree-budget", "12", "--speculative-num-draft-tokens", "16"], {}),
        "subsir": ([*fast, "--dialect", "subsir", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8"],
                   {"SGLANG_DFLASH_TREE_VERIFY": "1", "SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS": "13",
                    "SGLANG_DFLASH_TREE_VERIFY_TOPK": "6"}),
    }
    servers = {name: RefServer(args, logs, name, extra_env=env) for name, (args, env) in specs.items()}
    try:
        for server in servers.values():
            server.wait_ready()
        yield Engines(**servers)
    finally:
        for server in servers.values():
            server.stop()


def state(server: RefServer) -> dict[str, Any]:
    info = server.info()
    states = info["internal_states"]
    assert isinstance(states, list) and isinstance(states[0], dict)
    return states[0]


def stream(server: RefServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


GREEDY = {"temperature": 0, "ignore_eos": True}


# -- start-up and health ---------------------------------------------------------------------
@behaviour("the port stays closed while weights load; then health answers 503 until warm-up is done, then 200",
           HTTP_SERVER + " (launch_server, health_generate, _execute_server_warmup)")
def _start_up(engines: Engines) -> None:
    server = RefServer(["--load-seconds", "1", "--fault", "slow-start=1"], engines.spec.log_path.parent, "slow")
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                code = server.get("/health_generate", timeout=2).status_code
            except requests.ConnectionError:
                code = 0
            label = {0: "refused", 503: "503", 200: "200"}[code]
            if not seen or seen[-1] != label:
                seen.append(label)
            if code == 200:
                break
            time.sleep(0.05)
        assert seen == ["refused", "503", "200"], seen
    finally:
        server.stop()


@behaviour("/health and /health_generate answer 200 once ready", HTTP_SERVER + " (health_generate)")
def _health(engines: Engines) -> None:
    assert engines.spec.get("/health").status_code == engines.spec.get("/health_generate").status_code == 200


# -- /server_info and /model_info --------------------------------------------------------------
@behaviour("/server_info (= /get_server_info): every server arg top-level, version, internal_states[0]",
           HTTP_SERVER + " (server_info)")
def _server_info(engines: Engines) -> None:
    info = engines.spec.info()
    assert set(engines.spec.get("/get_server_info").json()) == set(info)
    for key in ("model_path", "port", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_eagle_topk",
                "speculative_draft_window_size", "decode_log_interval", "version"):
        assert key in info, key
    assert isinstance(info["internal_states"], list) and isinstance(info["internal_states"][0], dict)
    assert "vocab_size" not in info and "vocab_size" not in info["internal_states"][0]


@behaviour("/model_info (= /get_model_info) has SGLang's keys only", HTTP_SERVER + " (model_info)")
def _model_info(engines: Engines) -> None:
    body = engines.spec.get("/model_info").json()
    assert body == engines.spec.get("/get_model_info").json()
    assert SGLANG_MODEL_INFO_KEYS <= set(body)
    assert set(body) == SGLANG_MODEL_INFO_KEYS
    assert body["is_generation"] is True


# -- /generate ---------------------------------------------------------------------------------
@behaviour("/generate: text, output_ids, meta_info (prompt_tokens, completion_tokens, finish_reason, e2e_latency); "
           "max_new_tokens defaults to 128", TOKENIZER_MANAGER + " (_handle_batch_output); "
           + UPSTREAM + "python/sglang/srt/sampling/sampling_params.py")
def _generate(engines: Engines) -> None:
    body = engines.spec.post("/generate", json={"text": "def is_prime(n):", "sampling_params": GREEDY}).json()
    meta = body["meta_info"]
    assert isinstance(body["text"], str) and len(body["output_ids"]) == meta["completion_tokens"] == 128
    assert meta["finish_reason"] == {"type": "length", "length": 128}
    assert meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0


@behaviour("spec_accept_length = completion_tokens / spec_verify_ct, per request",
           TOKENIZER_MANAGER + " (_calculate_spec_decoding_metrics)")
def _accept_length(engines: Engines) -> None:
    meta = engines.spec.post("/generate", json={"text": "The history of", "sampling_params": {**GREEDY, "max_new_tokens": 48}}).json()["meta_info"]
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"], rel=1e-5)


@behaviour("streaming: data: lines then data: [DONE]; text, output_ids, completion_tokens cumulative; e2e_latency "
           "and the spec fields on the finished chunk only", TOKENIZER_MANAGER + " (_handle_batch_output)")
def _stream(engines: Engines) -> None:
    chunks = stream(engines.spec, {"text": "def add(a, b):", "sampling_params": {**GREEDY, "max_new_tokens": 40}})
    assert len(chunks) > 2
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 40
    assert all(len(c["output_ids"]) == c["meta_info"]["completion_tokens"] for c in chunks)
    assert all(chunks[i + 1]["text"].startswith(chunks[i]["text"]) for i in range(len(chunks) - 1))
    spec_keys = {"spec_verify_ct", "spec_accept_length", "e2e_latency"}
    for chunk in chunks[:-1]:
        assert not spec_keys & set(chunk["meta_info"]) and chunk["meta_info"]["finish_reason"] is None
    assert spec_keys <= set(chunks[-1]["meta_info"]) and chunks[-1]["meta_info"]["finish_reason"]


@behaviour("without speculation no spec fields at all", TOKENIZER_MANAGER + " (_handle_batch_output: only if speculative_algorithm)")
def _no_spec_fields(engines: Engines) -> None:
    meta = engines.none.post("/generate", json={"text": "x", "sampling_params": {**GREEDY, "max_new_tokens": 8}}).json()["meta_info"]
    assert "spec_verify_ct" not in meta and "spec_accept_length" not in meta
    assert "avg_spec_accept_length" not in state(engines.none)


@behaviour("input_ids outside the vocabulary are a 400", TOKENIZER_MANAGER + " (_validate_input_ids_in_vocab) + "
           + HTTP_SERVER + " (generate_request: ValueError -> 400)")
def _out_of_vocab(engines: Engines) -> None:
    r = engines.spec.post("/generate", json={"input_ids": [5, 10**9], "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "greater than the vocab size" in r.json()["error"]["message"]


# -- avg_spec_accept_length and /flush_cache ----------------------------------------------------
@behaviour("avg_spec_accept_length: zeroed by /flush_cache, absent until decode_log_interval decode batches have run "
           "since, then refreshed only every decode_log_interval batches",
           SCHEDULER + " (get_internal_state, flush_cache -> reset_metrics); " + METRICS_REPORTER)
def _lagging_average(engines: Engines) -> None:
    server = engines.spec
    assert server.post("/flush_cache").status_code == 200
    assert "avg_spec_accept_length" not in state(server)
    short = server.post("/generate", json={"text": "x", "sampling_params": {**GREEDY, "max_new_tokens": 3}}).json()["meta_info"]
    assert 0 < short["spec_verify_ct"] < INTERVAL
    assert "avg_spec_accept_length" not in state(server), "no figure before decode_log_interval decode batches"
    assert server.post("/flush_cache").status_code == 200
    # one request alone: each stream event is one engine step (the first is prefill), so the
    # tokens of each decode batch are the increments; the figure covers whole intervals only.
    chunks = stream(server, {"text": "def f(x):", "sampling_params": {**GREEDY, "max_new_tokens": 90}})
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    per_batch = [b - a for a, b in zip(counts, counts[1:])]
    assert len(per_batch) == chunks[-1]["meta_info"]["spec_verify_ct"] > INTERVAL
    folded = len(per_batch) // INTERVAL * INTERVAL
    assert state(server)["avg_spec_accept_length"] == pytest.approx(sum(per_batch[:folded]) / folded, abs=1e-6)


@behaviour("/flush_cache answers 400 while requests run, 200 when idle", HTTP_SERVER + " (flush_cache); " + SCHEDULER + " (flush_cache)")
def _flush_busy(engines: Engines) -> None:
    server = engines.spec
    body = {"text": "x", "sampling_params": {**GREEDY, "max_new_tokens": 3000}, "stream": True}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=120) as resp:
        lines = resp.iter_lines(decode_unicode=True)
        assert next(line for line in lines if line).startswith("data: ")  # running: its first step is out
        assert server.post("/flush_cache").status_code == 400
        for _ in lines:  # let it finish
            pass
    assert server.post("/flush_cache").status_code == 200


@behaviour("/v1/chat/completions: OpenAI shape with usage; return_meta_info adds meta_info",
           UPSTREAM + "python/sglang/srt/entrypoints/openai/serving_chat.py")
def _chat(engines: Engines) -> None:
    body = engines.spec.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Hello"}],
                                                           "temperature": 0, "max_tokens": 8, "return_meta_info": True}).json()
    assert body["usage"]["completion_tokens"] == body["choices"][0]["meta_info"]["completion_tokens"]


# -- the builds' flag handling (dialects) ----------------------------------------------------------
def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    import os

    r = subprocess.run([sys.executable, "-m", "pytest_ddtree.refserver", "--port", "0", *args], capture_output=True, text=True,
                       timeout=60, cwd=REPO, env={**os.environ, **(env or {})})
    assert r.returncode == 1, r.stderr[-2000:]
    return r.stderr


@behaviour("upstream DFLASH refuses a block size that differs from --speculative-num-draft-tokens, forces topk 1 "
           "with a warning, and makes the block size the verify width", SPEC_HOOK + " (_handle_dflash)")
def _upstream_dflash(engines: Engines) -> None:
    err = _refused("--dialect", "upstream", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "8",
                   "--speculative-dflash-block-size", "16")
    assert "but they differ. For DFLASH they must match. speculative_num_draft_tokens=8, speculative_dflash_block_size=16." in err
    info = engines.upstream.info()
    assert (info["speculative_num_draft_tokens"], info["speculative_eagle_topk"], info["speculative_draft_window_size"]) == (8, 1, 2048)
    assert "DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=4 to 1." in engines.upstream.log()
    assert "block_size=8 budget=7 topk=1" in engines.upstream.log()


@behaviour("DDTREE: --speculative-ddtree-block-size wins (a warning), --speculative-ddtree-budget is the non-root "
           "node count, topk = min(budget, vocab)", DDTREE_HOOK + " (_handle_ddtree); ddtree_utils.py")
def _ddtree(engines: Engines) -> None:
    info = engines.ddtree.info()
    assert info["speculative_algorithm"] == "DDTREE"
    assert (info["speculative_num_draft_tokens"], info["speculative_ddtree_budget"], info["speculative_eagle_topk"]) == (8, 12, 1)
    log = engines.ddtree.log()
    assert "DDTREE uses --speculative-ddtree-block-size=8 instead of --speculative-num-draft-tokens=16." in log
    assert "block_size=8 budget=12 topk=12" in log
    assert "--speculative-ddtree-budget must be >= 1, got 0." in _refused(
        "--dialect", "ddtree", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "0")


@behaviour("the SubSir fork reads tree verify, its node count (root included) and topk from the environment; tree "
           "verify without block verify refuses to start", SUBSIR_WORKER + " (DFlashWorker.__init__)")
def _subsir(engines: Engines) -> None:
    assert "block_size=8 budget=12 topk=6" in engines.subsir.log()
    info = engines.subsir.info()
    assert info["speculative_num_draft_tokens"] == 8 and "SGLANG_DFLASH_TREE_VERIFY_TOPK" not in json.dumps(info)
    err = _refused("--dialect", "subsir", "--speculative-algorithm", "DFLASH",
                   env={"SGLANG_DFLASH_TREE_VERIFY": "1", "SGLANG_DFLASH_BLOCK_VERIFY": "0"})
    assert "SGLANG_DFLASH_TREE_VERIFY=1 requires block verify (set SGLANG_DFLASH_BLOCK_VERIFY=1)" in err


@behaviour("PR 31069's tree verify takes topk from --speculative-eagle-topk and only 4, 8 or 16 (its fused expand-top-k "
           "kernel; a stored version raises ValueError for others); without --speculative-dflash-tree-verify it is the chain",
           "sgl-project/sglang PR 31069 python/sglang/srt/speculative/dflash_utils.py build_tree_verify_tokens "
           "(per the PR's description; its diff unread)")
def _pr31069(engines: Engines) -> None:
    err = _refused("--dialect", "pr31069", "--speculative-algorithm", "DFLASH", "--speculative-dflash-tree-verify",
                   "--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "8", "--speculative-eagle-topk", "6")
    assert "DFLASH tree verify supports --speculative-eagle-topk in" in err and "got 6" in err, err
    chain = _refused("--dialect", "pr31069", "--speculative-algorithm", "DFLASH", "--speculative-dflash-block-size", "8",
                     "--speculative-num-draft-tokens", "12")  # no tree: upstream's rule, the two must match
    assert "For DFLASH they must match" in chain


@pytest.mark.parametrize("item", BEHAVIOURS, ids=[b.check.__name__.strip("_") for b in BEHAVIOURS])
def test_engine_behaves_like_sglang(engines: Engines, item: Behaviour) -> None:
    item.check(engines)


def test_every_behaviour_cites_the_sglang_file_it_follows() -> None:
    for item in BEHAVIOURS:
        assert "python/sglang/srt/" in item.source, item.what
    # and the engine's code cites them too, so a reader of the engine finds the source
    engine_code = "".join(p.read_text() for p in (REPO / "pytest_ddtree" / "refserver").glob("*.py"))
    for cited in ("http_server.py", "tokenizer_manager.py", "metrics_reporter.py", "scheduler.py", "speculative_hook.py",
                  "dflash_worker.py", "ddtree_utils.py"):
        assert cited in engine_code, cited

