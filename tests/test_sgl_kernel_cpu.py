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

from tests.sglang_lane import CALLS_LOG_ENV, STANDIN_DIR, sglang_python

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
