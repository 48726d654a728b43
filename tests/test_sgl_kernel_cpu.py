"""The lane's CPU `sgl_kernel` (tests/sglang_cpu/sgl_kernel) against its references, in SGLang's venv.

The kernels need torch, which only SGLang's venv has, so each family runs
tests/sglang_cpu/check_kernels.py there (the references: torch SDPA for attention, SGLang's own
Triton kernels of the same names under TRITON_INTERPRET=1 for the tree and cache ops); a failure
shows the script's output. Skips, saying why, where SGLang is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.sglang_lane import CALLS_LOG_ENV, STANDIN_DIR, build_tiny_model, launch_real_sglang, sglang_python

SGLANG_PYTHON, WHY_NOT = sglang_python()
CHECK_SCRIPT = STANDIN_DIR / "check_kernels.py"

pytestmark = [pytest.mark.sglang, pytest.mark.skipif(SGLANG_PYTHON is None, reason=WHY_NOT)]


def _run(*args: str, calls_log: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(STANDIN_DIR), "TRITON_INTERPRET": "1"}
    env.pop(CALLS_LOG_ENV, None)
    if calls_log is not None:
        env[CALLS_LOG_ENV] = str(calls_log)
    return subprocess.run([str(SGLANG_PYTHON), *args], env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def _checks(family: str) -> int:
    result = _run(str(CHECK_SCRIPT), family)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    agreed = re.search(rf"(\d+) element checks agreed \({family}\)", result.stdout)
    assert agreed, output[-3000:]
    return int(agreed.group(1))


def test_the_attention_kernels_agree_with_sdpa() -> None:
    # extend (causal, from the pool, non-causal, window, cap, sinks, a tree by path and by mask),
    # decode (writing K/V at loc first) and the draft branches' decode
    assert _checks("attention") > 10_000


@pytest.mark.slow
def test_the_tree_kernels_agree_with_sglangs_triton_kernels() -> None:
    # build (QLEN_ONLY and FULL_MASK) and greedy verify on trees from SGLang's draft code, NGRAM's reconstruction
    assert _checks("tree") > 2_000


@pytest.mark.slow
def test_the_cache_kernels_agree_with_sglangs_triton_kernels() -> None:
    assert _checks("cache") > 3_000


def test_every_call_is_logged_and_an_unimplemented_kernel_names_itself(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    probe = (
        "import torch, sgl_kernel\n"
        "from sgl_kernel.speculative import reconstruct_indices_from_tree_mask\n"
        "out = torch.zeros(2, dtype=torch.long)\n"
        "sgl_kernel.fill_bonus_tokens_cpu(torch.tensor([[5, 6], [7, 8]]), torch.tensor([2, 1]), out, 2)\n"
        "assert out.tolist() == [6, 7], out\n"
        "reconstruct_indices_from_tree_mask(torch.ones(1), torch.tensor([3]), *torch.zeros(4, 1, dtype=torch.long), 1, 1)\n"
        "q = torch.zeros(1, 1, 4)\n"
        "torch.ops.sgl_kernel.decode_attention_cpu.default(q, torch.zeros(2, 1, 4), torch.zeros(2, 1, 4), 1.0, 1.0,\n"
        "    torch.empty_like(q), None, None, torch.zeros(1, dtype=torch.long), torch.zeros(1), torch.zeros(1, 4,\n"
        "    dtype=torch.int32), torch.zeros(1, dtype=torch.long), torch.ones(1, dtype=torch.long), 0.5, 0.0, False,\n"
        "    0, None, None)\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('sgl_kernel.scalar_type') is None  # quantization/utils.py falls back\n"
        "sgl_kernel.rotate_input_ids_cpu()\n"
    )
    result = _run("-c", probe, calls_log=log)
    assert result.returncode != 0 and "sgl_kernel.rotate_input_ids_cpu was called" in result.stderr, result.stderr
    assert log.read_text().split() == ["fill_bonus_tokens_cpu", "reconstruct_indices_from_tree_mask_cpu",
                                       "decode_attention_cpu", "rotate_input_ids_cpu"], log.read_text()


#: Random weights large enough that attention decides the answer: SGLang's `--load-format dummy`
#: draws them in +-1e-3, where the residual stream swamps attention and any kernel gives the same tokens.
RANDOM_WEIGHTS = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
folder = Path(sys.argv[1])
c = json.loads((folder / "config.json").read_text())
g = torch.Generator().manual_seed(7)
H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
kv = c["num_key_value_heads"] * H // c["num_attention_heads"]
def r(*shape, std):
    return (torch.randn(*shape, generator=g) * std).bfloat16()
w = {"model.embed_tokens.weight": r(V, H, std=1.0), "model.norm.weight": torch.ones(H).bfloat16(),
     "lm_head.weight": r(V, H, std=0.4)}
for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    w.update({p + "self_attn.q_proj.weight": r(H, H, std=0.2), p + "self_attn.k_proj.weight": r(kv, H, std=0.2),
              p + "self_attn.v_proj.weight": r(kv, H, std=0.3), p + "self_attn.o_proj.weight": r(H, H, std=0.3),
              p + "mlp.gate_proj.weight": r(I, H, std=0.2), p + "mlp.up_proj.weight": r(I, H, std=0.2),
              p + "mlp.down_proj.weight": r(H, I, std=0.2), p + "input_layernorm.weight": torch.ones(H).bfloat16(),
              p + "post_attention_layernorm.weight": torch.ones(H).bfloat16()})
save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
"""
INTEL_AMX = ("--prefill-attention-backend", "intel_amx", "--decode-attention-backend", "intel_amx")
PROMPTS = ["a b c d e f g h a b c d e f g h a b c d e f g h", "the quick brown fox jumps over the lazy dog", "one two"]


@pytest.mark.slow
def test_real_sglang_speculating_on_these_kernels_answers_as_torch_native_does(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """EAGLE-style STANDALONE (a 3-step topk-2 tree, the model its own draft) on the intel_amx backend,
    so prefill, tree verify and the draft's decode all run here, against plain serving on SGLang's
    torch_native backend: float32, the same tokens and log-probabilities (prompt and answer)."""
    import requests
    from pytest_ddtree.service.pool import free_port

    model = build_tiny_model(tmp_path / "model")
    written = _run("-c", RANDOM_WEIGHTS, str(model))
    assert written.returncode == 0, written.stderr[-3000:]
    calls = tmp_path / "calls.log"
    monkeypatch.setenv(CALLS_LOG_ENV, str(calls))
    speculative = ("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(model),
                   "--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
    answers = {}
    for name, flags in (("torch_native", ()), ("STANDALONE", (*INTEL_AMX, *speculative))):
        with launch_real_sglang(tmp_path, free_port(), python=SGLANG_PYTHON, extra_args=(
                *flags, "--dtype", "float32", "--load-format", "safetensors", "--sleep-on-idle")) as url:
            reply = requests.post(url + "/generate", timeout=600, json={
                "text": PROMPTS, "sampling_params": {"max_new_tokens": 40, "temperature": 0},
                "return_logprob": True, "logprob_start_len": 0})
            assert reply.status_code == 200, reply.text
            answers[name] = [answer["meta_info"] for answer in reply.json()]
    for plain, speculated in zip(answers["torch_native"], answers["STANDALONE"]):
        assert speculated["spec_verify_ct"] < 40, speculated  # it did speculate, accepting drafts
        for key in ("input_token_logprobs", "output_token_logprobs"):
            # [logprob, token id, text]; the prompt's first token has no logprob
            assert [t[1] for t in plain[key]] == [t[1] for t in speculated[key]], key
            assert [t[0] for t in plain[key][1:]] == pytest.approx([t[0] for t in speculated[key][1:]], abs=1e-3), key
    called = set(calls.read_text().split())
    assert {"extend_attention_cpu", "decode_attention_cpu", "build_tree_kernel_efficient_cpu",
            "verify_tree_greedy_cpu", "build_draft_decode_metadata_cpu"} <= called, called
