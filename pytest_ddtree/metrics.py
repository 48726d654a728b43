"""The names of what a cell measures that more than one module reads.

Why a module of its own: the gate, the load generator, the adaptive sweep, the proof of
acceptance, the change points, the report and the benchmarks all read these figures by name;
a name spelled as a bare string in each splits silently on a rename or a typo, and each
importing it from the report made the report and its own readers import each other. Each
constant is the on-disk key itself (results, baselines, history), so the files are unchanged;
tests/test_codebase.py fails on one of them spelled bare anywhere else in the package, the
suites or the benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: Output tokens per second over the cell's whole run (bench_serving's ``output_throughput``):
#: the gate's headline figure.
OUTPUT_THROUGHPUT: Final = "output_throughput"

#: The median over requests of each request's own output tok/s (what one user sees; the
#: aggregate grows with concurrency, this falls).
PER_REQUEST_OUTPUT_THROUGHPUT: Final = "ddtree_median_request_output_throughput"

#: Median time to first token, ms (bench_serving's ``median_ttft_ms``).
MEDIAN_TTFT_MS: Final = "median_ttft_ms"

#: Requests per second that met the session's SLO (bench_serving's ``request_goodput``); only
#: where an SLO is set.
REQUEST_GOODPUT: Final = "request_goodput"

#: The SLO's percentile latency over its target, the largest over the SLO's targets, of one repeat's
#: requests that succeeded (1: the SLO's edge; above it the repeat missed the SLO); only where an
#: SLO is set. An open-loop cell's blessed repeats keep their worst in its baseline, where it says
#: whether the cell's goodput stood clear of the edge (``gates/throughput/baseline.py``).
SLO_LATENCY_SHARE: Final = "ddtree_slo_latency_share"

#: The gated acceptance: sum(completion_tokens) / sum(spec_verify_ct) over the measured requests
#: (tokens per verify step, the prefill token counted, what SGLang's own tests compute). Not
#: bench_serving's ``accept_length``, which is the server's lagging ``avg_spec_accept_length``.
TOKENS_PER_VERIFY: Final = "ddtree_tokens_per_verify"

#: bench_serving's ``accept_length`` (the server's ``avg_spec_accept_length``), and the name the
#: gated acceptance had before it was renamed ``ddtree_tokens_per_verify``.
ACCEPT_LENGTH: Final = "accept_length"


def tokens_per_verify(metrics: Mapping[str, Any]) -> Any:
    """The gated acceptance of a metrics dict; results written before the key was renamed
    carried it as ``accept_length`` (and had no ``ddtree_tokens_per_verify``)."""
    return metrics[TOKENS_PER_VERIFY] if TOKENS_PER_VERIFY in metrics else metrics.get(ACCEPT_LENGTH)
