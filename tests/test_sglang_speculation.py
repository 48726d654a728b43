"""Real speculation on this CPU: real SGLang 0.5.23 serving EAGLE3, STANDALONE, NGRAM and DFLASH,
with tokens per verify known before the server starts.

The models (tests/sglang_lane.py, ``build_spec_models``) make acceptance a matter of
construction: a target whose greedy answer is one token whatever it reads, EAGLE3 drafts that
always propose that token (every draft accepted: 4 tokens a verify on a 3-step tree) or another
(none: 1), the target as its own STANDALONE draft (4), NGRAM on a prompt of that token (8 of 8),
a DFlash draft whose block reads as that token (its block of 4). Each algorithm is launched once
(tests/sglang_lane.py has the launch recipe, docs/sglang-cpu.md the figures), asked at
concurrency 1 and 3, and checked for: tokens per verify (sum of completion_tokens over sum of
spec_verify_ct, SGLang's own per-request accept length) equal to the prediction; greedy output
equal to the plain launch of the same target; every ``sgl_kernel`` call one the CPU stand-in
implements.

The EAGLE3 and DFLASH launches also answer a conformance drive first (``_drive``), which the
reference engine in that build's dialect (``--dialect eagle3``, ``--dialect upstream``) answers too:
the speculative fields are compared field by field. Why: the harness's speculative path (tokens per
verify, the histogram, the gauges it takes as evidence, the verify counter) was written against the
engine. Compared: the ``/server_info`` speculative keys and their values; the ``meta_info`` keys and
their arithmetic (proposed drafts, accept rate on a tree, accept length counting the prefill's token,
the histogram); where a stream carries them (the finished chunk only); the ``/metrics`` series (names,
types, their value at idle, when they are first written: the decode-log interval, and the verify
counter's moves: once per finished request, the start-up's warm-up generation included). Values that
depend on the models (how much is accepted) are not compared, only what they must satisfy on both.
Every difference is declared in docs/conformance.md ("Speculative fields") with the SGLang file:line;
a new one fails, and a declared one that no longer shows fails too.

The whole module skips, saying why, where the SGLang venv is absent; each algorithm is launched once
(``launched``) for every test that reads it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import requests

from pytest_ddtree.service.pool import free_port
from tests.refserver_helpers import REPO, RefServer
from tests.sglang_lane import (
    CALLS_LOG_ENV,
    PREDICTED_TOKENS_PER_VERIFY,
    STANDIN_DIR,
    SpecModels,
    dflash_args,
    dflash_env,
    eagle3_args,
    implemented_kernels,
    ngram_args,
    plain_args,
    serve_sglang,
    sglang_python,
    standalone_args,
)

SGLANG_PYTHON, WHY_NOT = sglang_python()

# Every test here waits on a real server's start-up (20-60 s): all slow.
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.skipif(SGLANG_PYTHON is None, reason=WHY_NOT)]

#: Seconds a launch gets to answer /health: ~20-40 s warm; a cold first start compiles (Inductor C++
#: for the EAGLE family, NGRAM's corpus module) and a loaded 2-core box stretches both (240 s ran out once).
READY_TIMEOUT_S = 600.0
#: Tokens each request asks for (ignore_eos: every request runs to it).
MAX_NEW_TOKENS = 64
#: How far tokens per verify may be from the prediction (the disagreeing draft reads 64/63 = 1.016:
#: the prefill's token comes without a verify).
TOLERANCE = 0.05
#: Requests in flight at once in the concurrent round.
CONCURRENCY = 3
#: Text prompts: the constant target answers the same after any of them.
TEXTS = ("Hello world, this is", "The quick brown fox jumps over", "Once upon a time there was")


@dataclass(frozen=True)
class Answer:
    output_ids: list[int]
    meta: dict[str, Any]


#: The conformance drive: decode batches between two writes of SGLang's gauges (--decode-log-interval's
#: default), the /server_info keys compared by value, and each algorithm's engine flags for the same config.
INTERVAL = 40
GREEDY = {"temperature": 0, "ignore_eos": True}
SERVER_INFO_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                    "speculative_num_draft_tokens", "speculative_dflash_block_size", "speculative_draft_window_size",
                    "decode_log_interval", "enable_metrics")
ENGINE_FLAGS = {
    "EAGLE3": ["--dialect", "eagle3", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"],
    "DFLASH": ["--dialect", "upstream", "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "4"],
}
PAGE = REPO / "docs" / "conformance.md"


@dataclass
class Seen:
    """What one server answered to the module's requests, in order."""

    server_info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)  # moment -> /metrics text
    answers: list[dict[str, Any]] = field(default_factory=list)  # meta_info of the non-streamed answers
    chunks: list[dict[str, Any]] = field(default_factory=list)  # the streamed answer's chunks' meta_info
    decode_batches_first: int = 0  # verifies of the first answer (one request alone: one per decode batch)


def _series(text: str) -> dict[str, tuple[str | None, float | None]]:
    """``sglang:spec_*`` series -> (TYPE, the first sample's value)."""
    types = dict(re.findall(r"^# TYPE (sglang:spec_\S+) (\S+)$", text, re.M))
    out: dict[str, tuple[str | None, float | None]] = {}
    for name in {*types, *re.findall(r"^(sglang:spec_[a-z_]+)", text, re.M)}:
        base = name.removesuffix("_created")
        if base != name:
            continue
        match = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        out[name] = (types.get(name), float(match.group(1)) if match else None)
    return out


def _drive(url: str) -> Seen:
    """The same requests to either server: idle /metrics, one answer (fewer verifies than an
    interval), /metrics, one streamed answer, then answers until past the first decode-log interval."""
    seen = Seen(server_info=requests.get(url + "/server_info", timeout=30).json())
    seen.metrics["idle"] = requests.get(url + "/metrics", timeout=30).text
    body = {"text": "Hello world, this is", "sampling_params": {"max_new_tokens": 32, **GREEDY}}
    first = requests.post(url + "/generate", json=body, timeout=300).json()["meta_info"]
    seen.answers.append(first)
    seen.decode_batches_first = int(first["spec_verify_ct"])
    seen.metrics["after one request"] = requests.get(url + "/metrics", timeout=30).text
    with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=300) as resp:
        for line in resp.iter_lines():
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                seen.chunks.append(json.loads(line[5:])["meta_info"])
    long = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4 * INTERVAL * 4, **GREEDY}}
    seen.answers.append(requests.post(url + "/generate", json=long, timeout=600).json()["meta_info"])
    seen.metrics["past an interval"] = requests.get(url + "/metrics", timeout=30).text
    return seen


@dataclass(frozen=True)
class Served:
    """What one launch answered: the requests one at a time, then CONCURRENCY at once."""

    one_at_a_time: list[Answer]
    concurrent: list[Answer]
    server_info: dict[str, Any]
    calls: Counter[str]
    seen: Seen | None = None  # the conformance drive's answers, where the launch had one


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spec-logs")


def _prompts(models: SpecModels, algorithm: str) -> list[dict[str, Any]]:
    """NGRAM drafts from the request's own tokens: a prompt of the target's answer, at three lengths."""
    if algorithm == "NGRAM":
        return [{"input_ids": models.repeating_prompt(length)} for length in (48, 64, 80)]
    return [{"text": text} for text in TEXTS]


def _generate(url: str, prompt: dict[str, Any]) -> Answer:
    body = {**prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    response = requests.post(url + "/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text[:2000]
    answer = response.json()
    return Answer(list(answer["output_ids"]), dict(answer["meta_info"]))


def _serve(models: SpecModels, logs: Path, name: str, args: list[str], prompts: list[dict[str, Any]],
           env: dict[str, str] | None = None, *, drive: bool = False) -> Served:
    calls_log = logs / f"calls-{name}.log"
    assert SGLANG_PYTHON is not None
    with serve_sglang(models.target, free_port(), logs / f"sglang-{name}.log", args, python=SGLANG_PYTHON,
                      env={**(env or {}), CALLS_LOG_ENV: str(calls_log)}, ready_timeout_s=READY_TIMEOUT_S) as url:
        seen = _drive(url) if drive else None  # first: it reads the series at idle
        # Not measured: NGRAM's corpus takes a request's tokens only after its verifies (not its
        # prefill, sglang/srt/speculative/ngram_worker.py:396-420), so on a fresh server the first
        # request's first verify finds nothing to propose (64 tokens in 9 verifies, 7.1, not 8).
        _generate(url, prompts[0])
        one_at_a_time = [_generate(url, prompt) for prompt in prompts]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            concurrent = list(pool.map(lambda prompt: _generate(url, prompt), prompts))
        server_info = requests.get(url + "/server_info", timeout=30).json()
    calls = Counter(calls_log.read_text(encoding="utf-8").split()) if calls_log.exists() else Counter[str]()
    return Served(one_at_a_time, concurrent, server_info, calls, seen)


@pytest.fixture(scope="module")
def plain(sglang_spec_models: SpecModels, logs: Path, implemented: set[str]) -> dict[str, list[list[int]]]:
    """The plain launch's greedy answers, for the text prompts and for NGRAM's (the lossless reference);
    after ``implemented``, which skips the module before any launch where the stand-in has no kernels."""
    models = sglang_spec_models
    served = _serve(models, logs, "plain", plain_args(), _prompts(models, "EAGLE3") + _prompts(models, "NGRAM"))
    assert served.server_info["speculative_algorithm"] is None
    answers = [answer.output_ids for answer in served.one_at_a_time]
    assert answers == [answer.output_ids for answer in served.concurrent]
    return {"text": answers[:len(TEXTS)], "NGRAM": answers[len(TEXTS):]}


@pytest.fixture(scope="module")
def implemented() -> set[str]:
    """The kernel names the CPU stand-in implements: its exported functions and its torch.ops.sgl_kernel ops."""
    assert SGLANG_PYTHON is not None
    names = implemented_kernels(SGLANG_PYTHON)
    if not names >= NEEDED_KERNELS:
        pytest.skip(f"the CPU sgl_kernel stand-in ({STANDIN_DIR}) lacks {sorted(NEEDED_KERNELS - names)}: "
                    "the intel_amx speculative path calls them")
    return names


#: What every launch here calls (sglang/srt/layers/attention/intel_amx_backend.py:290-313: prefill and
#: the verify); a stand-in without it cannot serve the lane at all.
NEEDED_KERNELS = {"extend_attention_cpu"}


def _tokens_per_verify(answers: list[Answer]) -> float:
    verifies = sum(int(answer.meta["spec_verify_ct"]) for answer in answers)
    assert verifies > 0, [answer.meta for answer in answers]
    return sum(int(answer.meta["completion_tokens"]) for answer in answers) / verifies


#: The disagreeing EAGLE3 draft (1.0 a verify) is served by tests/test_sglang_spec_plugin.py, through
#: the plugin, judged against the agreeing draft's bless: one launch less for the lane here.
#: algorithm label -> (its speculative args from the models, its extra environment, the /server_info it shows).
LAUNCHES: dict[str, tuple[Callable[[SpecModels], list[str]], Callable[[], dict[str, str]], dict[str, Any]]] = {
    "EAGLE3": (lambda m: eagle3_args(m.eagle3_agreeing), dict,
               {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
                "speculative_num_draft_tokens": 6}),
    "STANDALONE": (lambda m: standalone_args(m.target), dict,
                   {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
                    "speculative_num_draft_tokens": 6}),
    "NGRAM": (lambda m: ngram_args(), dict, {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}),
    "DFLASH": (lambda m: dflash_args(m.dflash), dflash_env,
               {"speculative_algorithm": "DFLASH", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4}),
}


@pytest.fixture(scope="module")
def launched(sglang_spec_models: SpecModels, logs: Path, implemented: set[str]) -> Callable[[str], Served]:
    """Each algorithm's one launch (made by the first test that asks for it; a server holds 3-5 GB, so
    none outlives its answers): EAGLE3 and DFLASH answer the conformance drive first."""
    cache: dict[str, Served] = {}

    def launch(algorithm: str) -> Served:
        if algorithm not in cache:
            make_args, make_env, _ = LAUNCHES[algorithm]
            cache[algorithm] = _serve(sglang_spec_models, logs, algorithm, [*plain_args(), *make_args(sglang_spec_models)],
                                      _prompts(sglang_spec_models, algorithm), make_env(), drive=algorithm in ENGINE_FLAGS)
        return cache[algorithm]

    return launch


@pytest.mark.parametrize("algorithm", list(LAUNCHES))
def test_real_speculation_accepts_what_the_models_predict(algorithm: str, launched: Callable[[str], Served],
                                                          plain: dict[str, list[list[int]]],
                                                          implemented: set[str]) -> None:
    """One launch per algorithm: its tokens per verify is the prediction, alone and under
    concurrency; its greedy output is the plain server's; it called only kernels the stand-in has."""
    _, _, shown = LAUNCHES[algorithm]
    served = launched(algorithm)
    assert {key: served.server_info[key] for key in shown} == shown
    predicted = PREDICTED_TOKENS_PER_VERIFY[algorithm]
    for answers in (served.one_at_a_time, served.concurrent):
        assert _tokens_per_verify(answers) == pytest.approx(predicted, abs=TOLERANCE), [a.meta for a in answers]
        reference = plain["NGRAM" if algorithm == "NGRAM" else "text"]
        assert [answer.output_ids for answer in answers] == reference
    if algorithm in ("EAGLE3", "STANDALONE"):  # every verify took the tree's full depth: 3 drafts
        assert {tuple(a.meta["spec_correct_drafts_histogram"][:3]) for a in served.one_at_a_time} == {(0, 0, 0)}
    assert served.calls["extend_attention_cpu"], "no extend_attention_cpu: the server did not verify through intel_amx"
    assert set(served.calls) <= implemented, sorted(set(served.calls) - implemented)


@pytest.fixture(scope="module")
def engine_seen(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Seen]:
    """The reference engine's answers to the conformance drive, in each algorithm's dialect."""
    cache: dict[str, Seen] = {}

    def drive(algorithm: str) -> Seen:
        if algorithm not in cache:
            logs = tmp_path_factory.mktemp(f"engine-{algorithm}")
            engine = RefServer(["--clock-scale", "50", "--enable-metrics", *ENGINE_FLAGS[algorithm]], logs, "engine")
            try:
                cache[algorithm] = _drive(engine.wait_ready().url)
            finally:
                engine.stop()
        return cache[algorithm]

    return drive


def _at_idle(name: str, series: tuple[str | None, float | None]) -> tuple[str | None, float | bool | None]:
    """A series at idle as compared: its type and value; the verify counter's value only as whether
    it moved (the start-up's warm-up verified; how many times depends on the models' acceptance)."""
    kind, value = series
    return (kind, bool(value)) if name == "sglang:spec_verify_calls_total" else (kind, value)


def _differences(algorithm: str, engine: Seen, real: Seen) -> list[str]:
    found: list[str] = []
    for key in SERVER_INFO_KEYS:
        mine, theirs = engine.server_info.get(key, "<absent>"), real.server_info.get(key, "<absent>")
        if mine != theirs:
            found.append(f"/server_info {key}: {mine!r} in the engine, {theirs!r} in SGLang")
    mine_keys = {k for k in engine.answers[0] if k.startswith("spec_")}
    their_keys = {k for k in real.answers[0] if k.startswith("spec_")}
    found += [f"meta_info {k}: only in the engine" for k in sorted(mine_keys - their_keys)]
    found += [f"meta_info {k}: only in SGLang" for k in sorted(their_keys - mine_keys)]
    for who, seen in (("the engine", engine), ("SGLang", real)):
        with_spec = [i for i, meta in enumerate(seen.chunks) if any(k.startswith("spec_") for k in meta)]
        if with_spec != [len(seen.chunks) - 1]:
            found.append(f"stream: spec_* keys in chunks {with_spec} of {len(seen.chunks)} in {who}")
    for moment in engine.metrics:
        mine_series, their_series = _series(engine.metrics[moment]), _series(real.metrics[moment])
        for name in sorted({*mine_series, *their_series}):
            if name not in their_series:
                found.append(f"/metrics {name}: only in the engine")
            elif name not in mine_series:
                found.append(f"/metrics {name}: only in SGLang")
            elif moment == "idle" and _at_idle(name, mine_series[name]) != _at_idle(name, their_series[name]):
                found.append(f"/metrics {name} at idle: {mine_series[name]} in the engine, {their_series[name]} in SGLang")
    return sorted(set(found))


def declared() -> dict[tuple[str, str], str]:
    """(algorithm, difference) -> its SGLang source, from the page's "Speculative fields" table."""
    rows: dict[tuple[str, str], str] = {}
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^\|\s*(EAGLE3|DFLASH)\s*\|\s*`([^`]+)`\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*$", line)
        if match:
            rows[(match.group(1), match.group(2))] = match.group(3)
    return rows


@pytest.mark.parametrize("algorithm", list(ENGINE_FLAGS))
def test_every_difference_of_the_speculative_fields_is_declared(algorithm: str, launched: Callable[[str], Served],
                                                                engine_seen: Callable[[str], Seen]) -> None:
    engine, real = engine_seen(algorithm), launched(algorithm).seen
    assert real is not None
    found = _differences(algorithm, engine, real)
    page = {diff for (alg, diff) in declared() if alg == algorithm}
    assert not [d for d in found if d not in page], f"undeclared differences for {algorithm} (docs/conformance.md):\n" + \
        "\n".join(d for d in found if d not in page)
    assert not [d for d in page if d not in found], f"declared for {algorithm} but no longer seen: {sorted(page - set(found))}"
    assert all(re.search(r"sglang/\S+\.py:\d+", source) for (alg, _), source in declared().items() if alg == algorithm)


@pytest.mark.parametrize("algorithm", list(ENGINE_FLAGS))
def test_the_speculative_arithmetic_holds_on_both(algorithm: str, launched: Callable[[str], Served],
                                                  engine_seen: Callable[[str], Seen]) -> None:
    """What the harness derives from meta_info and /metrics means the same on both servers."""
    engine, real = engine_seen(algorithm), launched(algorithm).seen
    assert real is not None
    for who, seen in (("engine", engine), ("SGLang", real)):
        draft_tokens = int(seen.server_info["speculative_num_draft_tokens"])
        for meta in seen.answers:
            verify_ct, tokens = int(meta["spec_verify_ct"]), int(meta["completion_tokens"])
            hist = meta["spec_correct_drafts_histogram"]
            assert sum(hist) == verify_ct, (who, meta)
            assert meta["spec_num_correct_drafts"] == sum(i * n for i, n in enumerate(hist)), (who, meta)
            # proposed drafts are config arithmetic, trees too: verify_ct x (num_draft_tokens - 1)
            assert meta["spec_num_proposed_drafts"] == verify_ct * (draft_tokens - 1), (who, meta)
            assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"]), (who, meta)
            # the accept length counts the prefill's token: completion_tokens / spec_verify_ct
            assert meta["spec_accept_length"] == pytest.approx(tokens / verify_ct, rel=1e-5), (who, meta)
        idle = _series(seen.metrics["idle"])
        warm_up = idle["sglang:spec_verify_calls_total"][1] or 0  # the start-up's warm-up generation verified too
        assert all(value == 0 for name, (_, value) in idle.items() if name != "sglang:spec_verify_calls_total"), (who, idle)
        one = _series(seen.metrics["after one request"])
        # fewer decode batches than an interval: no gauge written yet; the counter has the finished request
        assert seen.decode_batches_first < INTERVAL, (who, seen.decode_batches_first)
        assert one["sglang:spec_num_draft_tokens"][1] == 0 and one["sglang:spec_accept_length"][1] == 0, (who, one)
        assert one["sglang:spec_verify_calls_total"][1] == warm_up + seen.answers[0]["spec_verify_ct"], (who, one)
        past = _series(seen.metrics["past an interval"])
        assert past["sglang:spec_num_draft_tokens"][1] == draft_tokens, (who, past)
        assert past["sglang:spec_num_steps"][1] == seen.server_info["speculative_num_steps"], (who, past)
        assert (past["sglang:spec_accept_length"][1] or 0) >= 1, (who, past)
        total = sum(int(m["spec_verify_ct"]) for m in seen.answers) + int(seen.chunks[-1]["spec_verify_ct"])
        assert past["sglang:spec_verify_calls_total"][1] == warm_up + total, (who, past, total)
