#!/usr/bin/env python3
"""The GPU calibration probe for a service profile's ``calibration_command`` (docs/profiles.md,
"Calibration probe"): a fixed bf16 GEMM and a fixed device-to-device copy on the first visible GPU,
each the median of several timed rounds (CUDA events), printed as one JSON line of figures,
higher = faster::

    {"gemm_tflops": 712.3, "memcpy_gb_per_s": 3910.0, "cpu_sha256_mib_per_s": 1310.2, "cpu_sort_keys_per_s": 5.8e6}

Why these: a serving build's speed follows the accelerator's clocks (a GEMM) and its memory
bandwidth (decode reads the weights and the KV cache every step), and the host CPU (the scheduler,
the tokenizer); a day whose GPU runs slower clocks or whose host is loaded moves them, a new SGLang
build does not. The CPU half is pytest_ddtree's own probe when that package is importable here.

Run it with an interpreter of its own, not the SGLang build's: a torch that ships with the build
moves with the build, and a probe that moves with the build cancels the very step the history looks
for (``calibration_command: /opt/ddtree-calib/bin/python /path/to/calibrate_gpu.py``, a venv with a
pinned torch). It runs while no server of the session holds the GPU (before the first launch, after
the last stop).

Not run in this project's CI: its boxes have no GPU, so what is tested there is only that it fails
clearly without torch or without a GPU (exit 2, one line on stderr that says which). On one H200
four runs 8 s apart agreed within 1.9% (GEMM, after the warm-up) and 1.0% (copy); without the
warm-up the GEMM spread 10% (docs/profiles.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from typing import Any, Callable

#: The fixed work: change any of these and name new figures (the history's calibration level is per figure).
GEMM_SIZE = 8192
COPY_BYTES = 1 << 30
ROUNDS = 7
ITERATIONS = 10
#: Seconds of untimed GEMMs before the timed rounds: the GPU's clocks settle under sustained load
#: (a server's) rather than at the boost of a cold start (docs/profiles.md: its figures on an H200).
WARMUP_S = 3.0


def _fail(problem: str) -> int:
    print(f"calibrate_gpu.py: {problem}", file=sys.stderr)
    return 2


def _timed_ms(torch: Any, work: Callable[[], object], iterations: int) -> float:
    """Milliseconds per iteration of ``work`` (CUDA events around ``iterations`` calls)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        work()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / iterations


def _warm_up(torch: Any, work: Callable[[], object], seconds: float) -> None:
    """Run ``work`` untimed until ``seconds`` of it have passed on the device."""
    spent = 0.0
    while spent < seconds * 1e3:
        spent += _timed_ms(torch, work, ITERATIONS) * ITERATIONS


def gpu_figures(torch: Any, rounds: int, warmup_s: float = WARMUP_S) -> dict[str, float]:
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(COPY_BYTES, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    torch.matmul(a, b)  # untimed: cuBLAS picks its kernel on the first call
    dst.copy_(src)
    torch.cuda.synchronize()
    _warm_up(torch, lambda: torch.matmul(a, b), warmup_s)
    gemm_ms = statistics.median(_timed_ms(torch, lambda: torch.matmul(a, b), ITERATIONS) for _ in range(rounds))
    copy_ms = statistics.median(_timed_ms(torch, lambda: dst.copy_(src), ITERATIONS) for _ in range(rounds))
    return {"gemm_tflops": 2 * GEMM_SIZE ** 3 / (gemm_ms / 1e3) / 1e12,
            # a copy reads and writes every byte
            "memcpy_gb_per_s": 2 * COPY_BYTES / (copy_ms / 1e3) / 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU calibration probe: one JSON line of figures (higher = faster)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S,
                        help="seconds of untimed GEMMs before the timed rounds (default: %(default)s)")
    parser.add_argument("--no-cpu", action="store_true", help="leave out pytest_ddtree's CPU figures")
    args = parser.parse_args(argv)
    try:  # imported by name: the project's type check runs where torch is not installed
        torch: Any = importlib.import_module("torch")
    except ImportError:
        return _fail("torch is not importable by this interpreter; give the probe a venv with a pinned torch "
                     "(not the SGLang build's), or use the CPU probe: python -m pytest_ddtree.measure.calibration")
    if not torch.cuda.is_available():
        return _fail("torch sees no CUDA device here (a GPU-less host, or CUDA_VISIBLE_DEVICES empty): this probe "
                     "measures a GPU; use the CPU probe (python -m pytest_ddtree.measure.calibration) on such a host")
    figures = gpu_figures(torch, max(1, args.rounds), max(0.0, args.warmup_s))
    if not args.no_cpu:
        try:
            from pytest_ddtree.measure.calibration import cpu_probe
        except ImportError:
            pass
        else:
            figures.update(cpu_probe())
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
