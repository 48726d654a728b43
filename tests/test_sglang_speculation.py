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
implements. The whole module skips, saying why, where the SGLang venv is absent.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from pytest_ddtree.service.pool import free_port
from tests.sglang_lane import (
    CALLS_LOG_ENV,
    PREDICTED_TOKENS_PER_VERIFY,
    STANDIN_DIR,
    SpecModels,
    dflash_args,
    dflash_env,
    eagle3_args,
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


@dataclass(frozen=True)
class Served:
    """What one launch answered: the requests one at a time, then CONCURRENCY at once."""

    one_at_a_time: list[Answer]
    concurrent: list[Answer]
    server_info: dict[str, Any]
    calls: Counter[str]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spec-logs")


def _prompts(models: SpecModels, algorithm: str) -> list[dict[str, Any]]:
    """NGRAM drafts from the request's own tokens: a prompt of the target's answer, at three lengths."""
    if algorithm == "NGRAM":
        return [{"input_ids": models.repeating_prompt(length)} for length in (48, 64, 80)]
    return [{"text": text} for text in TEXTS]


def _generate(url: str, prompt: dict[str, Any]) -> Answer:
    import requests

    body = {**prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    response = requests.post(url + "/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text[:2000]
    answer = response.json()
    return Answer(list(answer["output_ids"]), dict(answer["meta_info"]))


def _serve(models: SpecModels, logs: Path, name: str, args: list[str], prompts: list[dict[str, Any]],
           env: dict[str, str] | None = None) -> Served:
    import requests

    calls_log = logs / f"calls-{name}.log"
    assert SGLANG_PYTHON is not None
    with serve_sglang(models.target, free_port(), logs / f"sglang-{name}.log", args, python=SGLANG_PYTHON,
                      env={**(env or {}), CALLS_LOG_ENV: str(calls_log)}, ready_timeout_s=READY_TIMEOUT_S) as url:
        # Not measured: NGRAM's corpus takes a request's tokens only after its verifies (not its
        # prefill, sglang/srt/speculative/ngram_worker.py:396-420), so on a fresh server the first
        # request's first verify finds nothing to propose (64 tokens in 9 verifies, 7.1, not 8).
        _generate(url, prompts[0])
        one_at_a_time = [_generate(url, prompt) for prompt in prompts]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            concurrent = list(pool.map(lambda prompt: _generate(url, prompt), prompts))
        server_info = requests.get(url + "/server_info", timeout=30).json()
    calls = Counter(calls_log.read_text(encoding="utf-8").split()) if calls_log.exists() else Counter[str]()
    return Served(one_at_a_time, concurrent, server_info, calls)


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
    probe = subprocess.run(
        [str(SGLANG_PYTHON), "-c",
         "import json, sgl_kernel, torch; "
         "ops = [n.split('::', 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith('sgl_kernel::')]; "
         "print(json.dumps(sorted({*sgl_kernel.__all__, *ops})))"],
        capture_output=True, text=True, timeout=120, check=False, env={"PYTHONPATH": str(STANDIN_DIR)},
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    names = set(json.loads(probe.stdout))
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


#: algorithm label -> (its speculative args from the models, its extra environment, the /server_info it shows).
LAUNCHES: dict[str, tuple[Callable[[SpecModels], list[str]], Callable[[], dict[str, str]], dict[str, Any]]] = {
    "EAGLE3": (lambda m: eagle3_args(m.eagle3_agreeing), dict,
               {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
                "speculative_num_draft_tokens": 6}),
    "EAGLE3-disagreeing": (lambda m: eagle3_args(m.eagle3_disagreeing), dict,
                           {"speculative_algorithm": "EAGLE3", "speculative_num_draft_tokens": 6}),
    "STANDALONE": (lambda m: standalone_args(m.target), dict,
                   {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3, "speculative_eagle_topk": 2,
                    "speculative_num_draft_tokens": 6}),
    "NGRAM": (lambda m: ngram_args(), dict, {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8}),
    "DFLASH": (lambda m: dflash_args(m.dflash), dflash_env,
               {"speculative_algorithm": "DFLASH", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4}),
}


@pytest.mark.parametrize("algorithm", list(LAUNCHES))
def test_real_speculation_accepts_what_the_models_predict(algorithm: str, sglang_spec_models: SpecModels, logs: Path,
                                                          plain: dict[str, list[list[int]]],
                                                          implemented: set[str]) -> None:
    """One launch per algorithm: its tokens per verify is the prediction, alone and under
    concurrency; its greedy output is the plain server's; it called only kernels the stand-in has."""
    models = sglang_spec_models
    make_args, make_env, shown = LAUNCHES[algorithm]
    served = _serve(models, logs, algorithm, [*plain_args(), *make_args(models)], _prompts(models, algorithm),
                    make_env())
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
