"""SGLang bench_serving's result keys and their types, for the tests of results.json.

Copied from SGLang 0.5.23 (the wheel on PyPI), ``sglang/benchmark/serving.py``: the ``result``
dict that ``benchmark()`` writes per run (lines 1855-1908) and the field types of
``BenchmarkMetrics`` (lines 1036-1089) it takes its values from; ``accept_length`` is read at
lines 1643-1662 (``internal_states[0]["avg_spec_accept_length"]`` of /server_info, else None),
``max_output_tokens_per_s`` / ``max_concurrent_requests`` are computed at lines 1200-1241.
(``python/sglang/bench_serving.py`` is only a deprecated re-export of that module there.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

NUMBER = (int, float)

#: key -> accepted types (None allowed where bench_serving writes None).
RESULT_KEYS: dict[str, tuple[type, ...]] = {
    # Arguments
    "tag": (str, type(None)),
    "backend": (str,),
    "dataset_name": (str,),
    "request_rate": (float, str),  # float (inf: all at once) or "trace"
    "max_concurrency": (int, type(None)),
    "sharegpt_output_len": (int, type(None)),
    "random_input_len": (int,),
    "random_output_len": (int,),
    "random_range_ratio": (float,),
    # Information
    "server_info": (dict, type(None)),
    # Results
    "duration": NUMBER,
    "completed": (int,),
    "total_input_tokens": (int,),
    "total_input_text_tokens": (int,),
    "total_input_vision_tokens": (int,),
    "total_output_tokens": (int,),
    "total_output_tokens_retokenized": (int,),
    "request_throughput": NUMBER,
    "input_throughput": NUMBER,
    "output_throughput": NUMBER,
    "total_throughput": NUMBER,
    **{f"{stat}_{dist}_ms": NUMBER for dist in ("e2e_latency", "ttft", "tpot", "itl")
       for stat in ("mean", "median", "std", "p90", "p95", "p99")},
    "concurrency": NUMBER,
    "accept_length": (float, type(None)),
    "max_output_tokens_per_s": NUMBER,
    "max_concurrent_requests": (int,),
}


def check_result(cell: Mapping[str, Any]) -> list[str]:
    """What in a results.json cell breaks bench_serving's contract (empty: nothing)."""
    problems = []
    for key, types in RESULT_KEYS.items():
        if key not in cell:
            problems.append(f"{key}: missing")
            continue
        value = cell[key]
        if isinstance(value, bool) or not isinstance(value, types):
            problems.append(f"{key}: {type(value).__name__} {value!r}, bench_serving writes {'/'.join(t.__name__ for t in types)}")
        elif key == "request_rate" and isinstance(value, float) and not (math.isinf(value) or value > 0):
            problems.append(f"request_rate: {value!r}")
    return problems
