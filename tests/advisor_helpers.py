"""The adaptive advisor's synthetic truth, shared by the advisor's tests and the recommendation tests.

A closed-form cost surface (the refserver's ClockModel shape with a saturating accept curve);
the full-matrix figures live in benchmarks/bench_advisor.py.
"""

from __future__ import annotations

import math

from pytest_ddtree.adaptive.advisor import CellPoint, ConfigPoint

CONFIGS = [ConfigPoint(f"bs8_b{b}_k{k}", 8, b, k) for b in (4, 8, 12, 16) for k in (4, 6)] + [
    ConfigPoint("bs8_b8_k4_wnone", 8, 8, 4),
    ConfigPoint("bs16_b16_k4", 16, 16, 4),
]
CELLS = [
    CellPoint("c1_short", 1, 128, 64),
    CellPoint("c32_short", 32, 128, 64),
    CellPoint("c8_4k", 8, 4096, 64),
]


def truth(c: ConfigPoint, w: CellPoint, falling_topk6: bool = False) -> float:
    acc = 1 + 3.6 * (1 - math.exp(-c.budget / 5.0)) * (1.05 if c.block_size == 16 else 1.0)
    if falling_topk6 and c.topk == 6:
        acc *= 1 - 0.05 * max(0, c.budget - 8)
    n = w.concurrency
    step = 0.04 + n * (0.00025 * (c.budget + 1) + 0.00005 * c.block_size + 5e-7 * (w.context_tokens + 32))
    wave = 0.02 + 5e-5 * n * w.context_tokens + (w.output_tokens / acc) * step
    return n * w.output_tokens / wave
