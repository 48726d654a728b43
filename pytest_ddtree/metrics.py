"""The names of what a cell measures that more than one module reads.

Why a module of its own: the gate, the load generator, the adaptive sweep, the proof of
acceptance, the change points and the report all read the gated acceptance; each importing
it from the report made the report and its own readers import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The gated acceptance: sum(completion_tokens) / sum(spec_verify_ct) over the measured requests
#: (tokens per verify step, the prefill token counted, what SGLang's own tests compute). Not
#: bench_serving's ``accept_length``, which is the server's lagging ``avg_spec_accept_length``.
TOKENS_PER_VERIFY = "ddtree_tokens_per_verify"


def tokens_per_verify(metrics: Mapping[str, Any]) -> Any:
    """The gated acceptance of a metrics dict; results written before the key was renamed
    carried it as ``accept_length`` (and had no ``ddtree_tokens_per_verify``)."""
    return metrics[TOKENS_PER_VERIFY] if TOKENS_PER_VERIFY in metrics else metrics.get("accept_length")
