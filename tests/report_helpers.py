"""A session's throughput records for the report tests, shared by the report and fleet tests.

Why a helper module and not the test module itself: a test module importing another one ties
two test files together (the other's module-level set-up runs wherever it is imported, and a
rename there breaks tests elsewhere); tests/test_codebase.py holds test modules to importing
helpers only.
"""

from __future__ import annotations

from typing import Any

from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.gates.throughput.cells import throughput_record
from pytest_ddtree.records.words import Status, Verdict
from pytest_ddtree.report import text as report


def throughput_rec(config: str, conc: int, ctx: int, tps: float, accept: float, status: Verdict = Status.PASS,
         change: float | None = 0.01, per_req: float | None = None) -> dict[str, Any]:
    cell = f"c{conc}_{'short' if ctx < 1024 else f'{ctx // 1024}k'}"
    repeat = {"output_throughput": tps, report.TOKENS_PER_VERIFY: accept, "median_ttft_ms": 12.0,
              "ddtree_median_request_output_throughput": per_req or tps / conc, "completed": 4}
    verdict = verdicts.CellVerdict(cell, status, (verdicts.MetricVerdict("output_throughput", status, "higher", 0.05, None, None, change,
                                                                 message="m"),)).as_dict()
    data = throughput_record(
        config=config, cell=cell,
        workload={"concurrency": conc, "context_tokens": ctx, "output_tokens": 64, "requests": 4, "prompts": "documents"},
        repeats=[repeat, repeat, repeat], samples={"output_throughput": [tps] * 3},
        measurement_status=Status.INVALID if status == Status.INVALID else Status.VALID, verdict=verdict,
        problems=["request 1 failed: HTTP 500"] if status == Status.INVALID else [])
    return {"kind": "throughput", "worker": "gw0", "time": 1.0, **data}


RECORDS = [
    throughput_rec("bs8_b4_k4", 32, 128, 900.0, 3.9), throughput_rec("bs8_b16_k4", 32, 128, 700.0, 4.8),
    throughput_rec("bs8_b4_k4", 1, 128, 80.0, 3.9), throughput_rec("bs8_b16_k4", 1, 128, 95.0, 4.8),
    throughput_rec("bs8_b8_k4", 1, 128, 90.0, 4.7), throughput_rec("bs8_b8_k4", 32, 128, 850.0, 4.7),
    throughput_rec("bs16_b16_k4", 1, 128, 96.0, 5.0, status=Status.REGRESSION, change=-0.09),
    throughput_rec("bs16_b16_k4", 32, 128, 10.0, 5.0, status=Status.INVALID),
    {"kind": "coding", "config": "bs8_b8_k4", "status": "pass"},
]
