"""/server_info's ``internal_states`` read over every dp rank (sglang PR 34743), not entry 0."""

from __future__ import annotations

from pytest_ddtree.measure.server_state import merge_internal_states, server_accept_length


def test_accept_length_comes_from_the_ranks_that_report_one() -> None:
    # PR 34743's example: with decode dp, rank 0 served nothing and shows null.
    info = {"internal_states": [{"avg_spec_accept_length": None}, {"avg_spec_accept_length": None},
                                {"avg_spec_accept_length": 2.90}, {"avg_spec_accept_length": 3.67},
                                {"avg_spec_accept_length": None}, {"avg_spec_accept_length": 4.64}]}
    value = server_accept_length(info)
    assert value is not None and abs(value - (2.90 + 3.67 + 4.64) / 3) < 1e-9


def test_one_rank_is_read_as_it_is_and_a_top_level_key_still_counts() -> None:
    assert server_accept_length({"internal_states": [{"avg_spec_accept_length": 3.5}]}) == 3.5
    assert server_accept_length({"avg_spec_accept_length": 2.0}) == 2.0
    assert server_accept_length({"internal_states": [{"avg_spec_accept_length": None}]}) is None
    assert merge_internal_states([{"a": 1, "status": "ready"}]) == {"a": 1, "status": "ready"}


def test_counters_are_summed_over_ranks_and_averages_are_not() -> None:
    merged = merge_internal_states([
        {"simulated_busy_seconds": 1.5, "total_output_tokens": 100, "avg_spec_accept_length": 3.0, "status": "ready"},
        {"simulated_busy_seconds": 2.5, "total_output_tokens": 40, "avg_spec_accept_length": 5.0, "status": "ready"},
    ])
    assert merged["simulated_busy_seconds"] == 4.0
    assert merged["total_output_tokens"] == 140 and isinstance(merged["total_output_tokens"], int)
    assert merged["avg_spec_accept_length"] == 4.0
    assert merged["status"] == "ready" and merged["dp_ranks"] == 2
