"""What the service's behaviour proves (pytest_ddtree/service/proof.py): hostile input is bounded and
never crashes, and each signal confirms or contradicts a config the way SGLang's source says."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_ddtree.service import proof
from pytest_ddtree.service.proof import HistogramError

BS8_B8 = {"block_size": 8, "budget": 8, "topk": 4, "window": 2048}
ALL = ("block_size", "budget", "topk", "window")


@pytest.mark.parametrize("meta, problem", [
    ({"spec_accept_histogram": "1,2"}, "not a list"),
    ({"spec_accept_histogram": [1, -1]}, "not a count"),
    ({"spec_accept_histogram": [1, True]}, "not a count"),
    ({"spec_accept_histogram": [1, 2.5]}, "not a count"),
    ({"spec_accept_histogram": [0] * 5000}, "buckets"),
    ({"spec_correct_drafts_histogram": [1, 2], "spec_accept_histogram": [2, 1]}, "disagree"),
    ({"spec_accept_histogram": [1, 2], "spec_verify_ct": 5}, "spec_verify_ct says 5"),
])
def test_a_malformed_histogram_is_an_invalid_response(meta: dict[str, Any], problem: str) -> None:
    with pytest.raises(HistogramError, match=problem):
        proof.histogram_of(meta, meta.get("spec_verify_ct"))


def test_histogram_names_and_absence() -> None:
    assert proof.histogram_of({"spec_accept_histogram": [1, 2]}, 3) == [1, 2]
    assert proof.histogram_of({"spec_correct_drafts_histogram": [0, 2]}, 2) == [0, 2]
    assert proof.histogram_of({"spec_verify_ct": 3}, 3) is None
    assert proof.histogram_of("junk") is None


def test_bound_and_acceptance_by_depth() -> None:
    assert proof.accept_bound(BS8_B8) == 7
    assert proof.accept_bound({"block_size": 8, "budget": 4}) == 4
    assert proof.accept_bound({"block_size": 8, "budget": None}) == 7
    assert proof.bound_violation([1, 0, 0, 0, 0, 2], 4) is not None and proof.bound_violation([1, 0, 0, 0, 2], 4) is None
    # 10 verifies: 2 accepted 0, 3 accepted 1, 5 accepted 3
    assert proof.acceptance_by_depth([2, 3, 0, 5]) == [0.8, 0.5, 0.5]
    assert proof.acceptance_by_depth([]) == [] and proof.acceptance_by_depth([0, 0]) == []


def test_startup_lines_and_topk_override_are_parsed() -> None:
    log = "\n".join([
        "[x] DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk=4 to 1.",
        "[x] Initialized DFLASH draft runner. attention_backend=fa3, model=Foo, block_size=16, draft_window_size=None, "
        "compact_cache=False",
        "[x] Initialized DDTREE v2 worker. block_size=16, tree_budget=32, draft_window_size=2048",
        "x" * 10000,
    ])
    got = proof.parse_startup_log(log)
    assert (got.block_size, got.budget, got.window, got.topk_override) == (16, 32, 2048, (4, 1))
    assert not proof.parse_startup_log("nothing here\n").found


def test_metric_value_reads_one_sample_and_ignores_lookalikes() -> None:
    text = ('sglang:spec_num_draft_tokens_total{a="b"} 99\nsglang:spec_num_draft_tokens{model_name="m"} 8\n'
            "sglang:spec_num_draft_tokens junk\n")
    assert proof.metric_value(text, "sglang:spec_num_draft_tokens") == 8
    assert proof.metric_value("", "sglang:spec_num_draft_tokens") is None


def probe_of(hists: list[list[int]], bound: int) -> proof.ProbeResult:
    answers = iter(hists)

    def generate(text: str, sampling: Any) -> Any:
        hist = next(answers)
        return {"meta_info": {"spec_verify_ct": sum(hist), "spec_accept_histogram": hist}}

    return proof.run_copy_probe(generate, bound)


def test_probe_stops_at_the_bound_and_proves_the_block_size() -> None:
    probe = probe_of([[1, 2, 3], [0, 1, 0, 0, 0, 0, 0, 4], [9]], 7)
    assert probe.requests == 2 and probe.reached
    result = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=probe, startup=None, metrics_text=None)
    assert not result.failures
    assert result.fields["block_size"].status == proof.PROVEN and "copy probe reached" in result.fields["block_size"].detail
    assert result.fields["budget"].status == proof.REPORTED  # budget 8 > 7: the histogram cannot show it
    assert result.fields["topk"].status == proof.REPORTED


def test_probe_above_the_bound_or_piled_below_it_fails_with_the_histogram() -> None:
    above = proof.judge({"block_size": 8, "budget": 4, "topk": 4, "window": None}, settable=ALL, reported=ALL,
                        probe=probe_of([[0, 1, 2, 3, 4, 5, 6]], 4), startup=None, metrics_text=None)
    assert above.failures and "more than 4 drafts" in above.failures[0] and "[0, 1, 2, 3, 4, 5, 6]" in above.failures[0]
    ceiling = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=probe_of([[2, 3, 0, 14]] * 4, 7), startup=None,
                          metrics_text=None)
    # a pile-up below the bound is a note, not a failure: a drafter trained for 3 drafts looks the same
    assert not ceiling.failures and "pile up at 3" in ceiling.notes[0]
    assert "pile up at 3" in ceiling.fields["block_size"].detail
    tie = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=probe_of([[3, 4, 5, 2, 6, 6, 3, 2, 6]] * 4, 15),
                      startup=None, metrics_text=None)
    assert not tie.notes  # the top bucket must hold most verifies
    # a weak drafter that tails off below the bound proves nothing, and fails nothing
    weak = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=probe_of([[9, 5, 2, 1]] * 4, 7), startup=None,
                       metrics_text=None)
    assert not weak.failures and weak.fields["block_size"].status == proof.REPORTED


def test_probe_errors_malformed_vs_failed_request() -> None:
    def bad(text: str, sampling: Any) -> Any:
        return {"meta_info": {"spec_verify_ct": 2, "spec_accept_histogram": [1, "x"]}}

    def down(text: str, sampling: Any) -> Any:
        raise OSError("connection refused")

    invalid = proof.run_copy_probe(bad, 7)
    assert invalid.errors and "invalid response" in invalid.errors[0]
    assert proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=invalid, startup=None, metrics_text=None).failures
    failed = proof.run_copy_probe(down, 7)
    assert failed.failed_requests and not failed.errors and failed.requests == proof.PROBE_REQUESTS
    assert not proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=failed, startup=None, metrics_text=None).failures


def test_startup_and_metric_evidence_confirm_or_contradict() -> None:
    good = proof.parse_startup_log("Initialized DDTree worker. block_size=8, tree_budget=8, topk=4\n"
                                   "Initialized DFLASH draft runner. block_size=8, draft_window_size=2048, compact_cache=True")
    result = proof.judge(BS8_B8, settable=ALL, reported=("window",), probe=None, startup=good,
                         metrics_text='sglang:spec_num_draft_tokens{m="x"} 8\n')
    assert not result.failures
    assert result.fields["budget"].status == proof.PROVEN and "tree_budget" not in result.fields["budget"].detail
    assert "spec_num_draft_tokens" in result.fields["block_size"].detail
    assert result.fields["topk"].status == proof.NOT_PROVEN and result.fields["window"].status == proof.REPORTED
    bad = proof.parse_startup_log("overriding speculative_eagle_topk=4 to 1.\n"
                                  "Initialized DFLASH draft runner. block_size=4, draft_window_size=None, compact_cache=False")
    failures = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=None, startup=bad,
                           metrics_text="sglang:spec_num_draft_tokens 4\n").failures
    assert any("block_size=4" in f for f in failures) and any("overrode topk" in f for f in failures)
    assert any("draft_window_size=None" in f for f in failures) and any("is 4" in f for f in failures)
    fixed = proof.judge({"block_size": 8, "budget": 7, "topk": 1, "window": None}, settable=("block_size",),
                        reported=("block_size",), probe=None, startup=None, metrics_text=None)
    assert fixed.fields["topk"].status == proof.NOT_SETTABLE
    # a fixed field /server_info reads back is shown as such (a service under --ddtree-url fixes every field)
    shown = proof.judge({"block_size": 8, "budget": 7, "topk": 1, "window": None}, settable=(),
                        reported=("block_size", "budget", "topk", "window"), probe=None, startup=None, metrics_text=None)
    assert {f.status for f in shown.fields.values()} == {proof.REPORTED}


def cell_record(config: str, cell: str, hist: list[int], context: int = 48) -> dict[str, Any]:
    return {"config": config, "cell": cell, "measurement_status": "valid", "repeat_histograms": [hist] * (2 + len(config) % 3),
            "workload": {"context_tokens": context, "prompts": "documents via /tokenize"}}


def test_no_effect_needs_identical_acceptance_where_the_field_could_matter() -> None:
    same, other = [3, 2, 5], [4, 2, 1, 3]
    records = [
        cell_record("bs8_b4_k1", "c1", same), cell_record("bs8_b4_k4", "c1", same),     # topk 1 vs 4 binds: no effect
        cell_record("bs8_b4_k6", "c1", same),                                              # k4 vs k6 at budget 4: cannot matter
        cell_record("bs8_b8_k1_w8", "c1", same), cell_record("bs8_b8_k1_wnone", "c1", other),  # the window worked
        cell_record("bs8_b8_k4_w4096", "c1", same), cell_record("bs8_b8_k4_wnone", "c1", same),  # 48 tokens < 4096: cannot matter
    ]
    findings = proof.no_effect(records, default_window=2048)
    assert [(f["field"], f["configs"]) for f in findings] == [("topk", ["bs8_b4_k1", "bs8_b4_k4"]), ("topk", ["bs8_b4_k1", "bs8_b4_k6"])]
    assert findings[0]["message"].startswith("topk shows no effect on this build: bs8_b4_k1 and bs8_b4_k4 (topk 1/4)")
    # a cell where they differ clears the field; configs named without a window need the profile's default
    records.append(cell_record("bs8_b4_k1", "c2", same))
    records.append(cell_record("bs8_b4_k4", "c2", other))
    assert not [f for f in proof.no_effect(records, None) if f["configs"] == ["bs8_b4_k1", "bs8_b4_k4"]]


def test_a_zero_or_absent_gauge_is_no_evidence() -> None:
    """SGLang 0.5.23 publishes sglang:spec_num_draft_tokens at 0 until the decode_log_interval-th
    decode batch (metrics_collector.py:131, metrics_reporter.py:933-934, 1098): a 0 or no sample
    neither fails nor proves the block size; a non-zero value does either."""
    for text in ('sglang:spec_num_draft_tokens{model_name="m"} 0.0\n', "sglang:num_running_reqs 1\n", ""):
        result = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=None, startup=None, metrics_text=text)
        assert not result.failures and result.fields["block_size"].status == proof.REPORTED, text
    contradicted = proof.judge(BS8_B8, settable=ALL, reported=ALL, probe=None, startup=None,
                               metrics_text="sglang:spec_num_draft_tokens 16.0\n")
    assert contradicted.failures == ["/metrics sglang:spec_num_draft_tokens is 16 while a request decodes, "
                                     "the config's block size is 8"]


def test_the_histogram_bound_tells_which_way_a_budget_flag_counts_the_root() -> None:
    """On the first config whose budget binds (budget < block_size - 1), a budget flag read the
    other way round serves one node more or less, and the probe says which."""
    bs8_b4 = {"block_size": 8, "budget": 4, "topk": 4, "window": 2048}
    one_more = proof.judge(bs8_b4, settable=ALL, reported=ALL, probe=probe_of([[0, 0, 0, 0, 1, 5]], 4), startup=None,
                           metrics_text=None)
    assert len(one_more.failures) == 1 and "does not count the root node" in one_more.failures[0]
    one_less = proof.judge(bs8_b4, settable=ALL, reported=ALL, probe=probe_of([[1, 1, 2, 9]] * 2, 4), startup=None,
                           metrics_text=None)
    assert not one_less.failures and "may count the root node" in one_less.notes[0]
    further = proof.judge(bs8_b4, settable=ALL, reported=ALL, probe=probe_of([[0, 0, 0, 0, 0, 0, 5]], 4), startup=None,
                          metrics_text=None)
    assert "root" not in further.failures[0]  # two more: another fault, not the root


def test_a_gauge_showing_the_trees_node_count_is_no_evidence() -> None:
    """A tree build whose speculative_num_draft_tokens is the node count may publish budget + 1
    on the gauge: neither a failure nor a proof; any other value still fails."""
    bs8_b4 = {"block_size": 8, "budget": 4, "topk": 4, "window": 2048}
    nodes = proof.judge(bs8_b4, settable=ALL, reported=ALL, probe=None, startup=None,
                        metrics_text="sglang:spec_num_draft_tokens 5.0\n")
    assert not nodes.failures and "node count" in nodes.notes[0]
    assert proof.judge(bs8_b4, settable=ALL, reported=ALL, probe=None, startup=None,
                       metrics_text="sglang:spec_num_draft_tokens 6.0\n").failures
