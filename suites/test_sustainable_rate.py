"""The sustainable rate: per config, the highest request rate that meets the session's latency SLO.

Collected with the throughput suite's fixtures; runs where the matrix has a ``rate_search:`` key
(the workload to search, its lowest and highest rate) and the session an SLO (``--ddtree-slo``,
or an ``slo:`` key in the matrix or the profile), and skips saying which is missing otherwise
(docs/gates/throughput.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.gate.throughput import sample_record, sustainable_rate
from pytest_ddtree.load import LoadError
from pytest_ddtree.plugin import session_of
from pytest_ddtree.vocabulary import RecordKind

if TYPE_CHECKING:  # the fixtures' types (plugin.py hands them out)
    from pytest_ddtree.options import Settings
    from pytest_ddtree.results import SessionRecorder
    from pytest_ddtree.service.manager import RunningService



def test_sustainable_rate(
    request: pytest.FixtureRequest,
    ddtree_config: DDTreeConfig,
    ddtree_service: RunningService,
    ddtree_settings: Settings,
    ddtree_recorder: SessionRecorder,
) -> None:
    """The highest request rate this config sustains under the session's SLO (the matrix's ``rate_search:``).

    Each probed rate is an open-loop cell of the search's workload with the usual repeats; the
    search doubles the rate until one misses the SLO, then bisects (docs/gates/throughput.md)."""
    session = session_of(request.config)
    search = session.matrix.rate_search if session is not None else None
    slo = session.slo if session is not None else None
    if search is None:
        pytest.skip("no rate_search: in the matrix (workload, min_rate, max_rate): no sustainable rate is searched")
    if slo is None:
        pytest.skip("no SLO to sustain: give --ddtree-slo ttft_ms=..,tpot_ms=.. or an slo: key in the matrix or profile")
    workload, plan = search
    max_context = ddtree_service.profile.max_context
    if max_context is not None and workload.context_tokens > max_context:
        pytest.skip(f"{workload.name}: context {workload.context_tokens} tokens exceeds the profile's max_context {max_context}")
    config = ddtree_config.name
    try:
        result = sustainable_rate(
            ddtree_service.client, workload, slo, plan, ddtree_settings.repeats,
            lambda name, r, res: ddtree_recorder.record(RecordKind.THROUGHPUT_REPEAT, config, sample_record(name, r, res)),
            tokenizer_path=ddtree_service.profile.tokenizer_path(), vocab_size=ddtree_service.profile.vocab_size,
            dataset=str(ddtree_settings.dataset) if ddtree_settings.dataset else None,
            accept_bound=ddtree_service.accept_bound())
    except LoadError as exc:
        pytest.fail(f"{config}: {exc}", pytrace=False)
    ddtree_recorder.record(RecordKind.SUSTAINABLE_RATE, config, result.record(workload.name, slo))
    if result.sustainable is None:
        first = result.probes[0] if result.probes else None
        pytest.fail(f"{config} does not meet {slo.label} even at {plan.min_rate:g} req/s"
                    + (f": {first.reason}" if first is not None and first.reason else ""), pytrace=False)
