"""An open-loop cell blessed at its SLO's edge records its goodput and does not judge it
(``gates/throughput/baseline.py``): at the edge goodput is a cliff on a slower launch while its
blessed sessions agree (#33, bench_rate_gate.py); clear of it, goodput is judged and a real drop fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ddtree.gates.throughput import baseline, cells, measurement, rule, verdicts
from pytest_ddtree.measure import load, openloop, stats
from pytest_ddtree.measure import slo as slo_mod
from pytest_ddtree.metrics import REQUEST_GOODPUT, SLO_LATENCY_SHARE, TOKENS_PER_VERIFY
from pytest_ddtree.records.cells import normalize
from pytest_ddtree.records.words import Status
from pytest_ddtree.report import text as report

SLO = slo_mod.parse_slo("tpot_ms=50,percentile=99")
OPEN = load.Cell("r4", 64, 128, 16, 64, open_loop=openloop.Arrivals(4.0))
CLOSED = [load.Cell(f"c{c}", c, 128, 16, 16) for c in (1, 2, 4)]


def _entry(share: float | None, goodput: float = 3.9) -> dict[str, object]:
    """Three blessed sessions of an open-loop cell, each of worst share ``share`` (None: kept none)."""
    entry: dict[str, object] = {}
    for i, session in enumerate(("s1", "s2", "s3")):
        samples = {REQUEST_GOODPUT: [goodput * (1 + 0.003 * (j - 1)) for j in range(3)],
                   TOKENS_PER_VERIFY: [4.0, 4.01, 3.99]}
        entry = baseline.baseline_cell_entry({"concurrency": 64}, samples, existing=entry or None, session=session,
                                         slo_share=None if share is None else share - 0.01 * i)
    return entry


def test_a_bless_keeps_each_sessions_worst_share_and_a_hand_edited_one_is_refused() -> None:
    entry = _entry(0.62)
    sessions = entry["gates"][REQUEST_GOODPUT]["sessions"]  # type: ignore[index]
    assert [s[baseline.SESSION_KEY] for s in sessions] == [0.62, 0.61, 0.6]  # carried over as sessions are added
    assert baseline.SESSION_KEY not in entry["gates"][TOKENS_PER_VERIFY]["sessions"][0]  # type: ignore[index]
    assert baseline.blessed_share(entry) == 0.62  # the worst of them
    assert baseline.validate_section({"r4": entry}, "f.yaml")["r4"] == entry
    assert baseline.blessed_share(_entry(None)) is None  # blessed before the share was kept
    for bad in ("high", True, -0.5, 0, float("inf")):
        sessions[1][baseline.SESSION_KEY] = bad
        with pytest.raises(verdicts.BaselineFormatError, match=r"r4.gates.request_goodput.sessions\[1\].slo_latency_share "
                                                           r"must be a positive number .* bless the cell again"):
            baseline.validate_section({"r4": entry}, "f.yaml")
    # a session's worst share over its repeats (a repeat without one, e.g. no request succeeded, is left out)
    assert baseline.session_share([{SLO_LATENCY_SHARE: 0.7}, {SLO_LATENCY_SHARE: 0.91}, {SLO_LATENCY_SHARE: None}]) == 0.91
    assert baseline.session_share([{}]) is None


def test_the_edges_margin_comes_from_the_latencys_between_session_spread() -> None:
    # the budget's z (2% over 18 configs) times the measured sd of the SLO latency between sessions
    assert baseline.Z_EDGE == pytest.approx(3.06, abs=0.01)
    assert 1 - baseline.EDGE_MARGIN == pytest.approx(2.718281828 ** (-baseline.Z_EDGE * baseline.SLO_LATENCY_BETWEEN_SESSIONS_SD))
    assert 0.15 < baseline.EDGE_MARGIN < 0.35


def _judge(base: dict[str, object], today: dict[str, list[float]], *, rate_gate: bool = False) -> verdicts.CellVerdict:
    """The open-loop cell judged with three closed-loop cells of an unchanged config (first pass and
    its confirmation on the same figures)."""
    closed_base = {c.name: baseline.baseline_cell_entry({"concurrency": c.concurrency}, {TOKENS_PER_VERIFY: [4.0, 4.01, 3.99]},
                                                    session="s1") for c in CLOSED}
    inputs = {c.name: verdicts.CellInput(closed_base[c.name], {TOKENS_PER_VERIFY: [4.0, 4.0, 4.0]}) for c in CLOSED}
    judged = measurement.judged_gated(OPEN, None, base, SLO, slo_edge=not rate_gate)
    inputs[OPEN.name] = verdicts.CellInput(measurement.judged_baseline(base, SLO, OPEN, slo_edge=not rate_gate),
                                       {k: v for k, v in today.items() if judged is None or k in judged})
    first = rule.judge_config(inputs)
    flagged = {n: inputs[n].current for n, v in first.items() if v.flagged}
    return (rule.judge_config(inputs, flagged) if flagged else first)[OPEN.name]


def test_goodput_blessed_clear_of_the_edge_is_judged_and_a_real_drop_fails() -> None:
    base = _entry(0.55)
    assert measurement.edge_exemption(base, SLO, OPEN) is None
    held = _judge(base, {REQUEST_GOODPUT: [3.9, 3.91, 3.89], TOKENS_PER_VERIFY: [4.0] * 3})
    assert held.status == Status.PASS and held.metric(REQUEST_GOODPUT) is not None
    # this session's repeats crossed the edge (a regression): its own share exempts nothing
    dropped = _judge(base, {REQUEST_GOODPUT: [2.9, 2.95, 2.85], TOKENS_PER_VERIFY: [4.0] * 3})
    assert dropped.status == Status.REGRESSION
    assert (dropped.metric(REQUEST_GOODPUT) or pytest.fail("goodput not judged")).status == Status.REGRESSION


@pytest.mark.parametrize("share, where", [(0.94, "at the SLO's edge when blessed: the SLO's p99 latency at 94% of its target"),
                                          (1.3, "past the SLO's edge when blessed (its blessed repeats missed the SLO")])
def test_goodput_blessed_at_or_past_the_edge_is_recorded_not_judged_and_says_why(share: float, where: str) -> None:
    base = _entry(share)
    edge = measurement.edge_exemption(base, SLO, OPEN)
    assert edge is not None and edge.metrics == (REQUEST_GOODPUT,) and where in edge.reason
    assert "the sustainable rate's gate judges the config's capacity" in edge.reason
    assert f"within {baseline.EDGE_MARGIN:.0%} of its target" in edge.reason
    # the cliff on a slower launch: goodput -40% is not judged ...
    cliff = _judge(base, {REQUEST_GOODPUT: [2.3, 2.4, 2.35], TOKENS_PER_VERIFY: [4.0] * 3})
    assert cliff.status == Status.PASS and cliff.metric(REQUEST_GOODPUT) is None
    # ... but what is still judged fails on a regression this session shows: acceptance 10% down
    worse = _judge(base, {REQUEST_GOODPUT: [2.3, 2.4, 2.35], TOKENS_PER_VERIFY: [3.6] * 3})
    assert worse.status == Status.REGRESSION and (worse.metric(TOKENS_PER_VERIFY) or pytest.fail()).status == Status.REGRESSION
    # the rate gate's probe sits at the edge by design: it judges goodput there
    assert _judge(base, {REQUEST_GOODPUT: [2.3, 2.4, 2.35]}, rate_gate=True).status == Status.REGRESSION


def test_what_keeps_its_goodput_judged_a_closed_loop_cell_no_slo_or_an_old_baseline() -> None:
    base = _entry(0.94)
    assert measurement.edge_exemption(base, SLO, CLOSED[0]) is None  # closed-loop cells are untouched
    assert measurement.judged_baseline(base, SLO, CLOSED[0]) == base
    assert measurement.edge_exemption(base, None, OPEN) is None  # no SLO: goodput is not judged at all
    old = _entry(None)
    assert measurement.edge_exemption(old, SLO, OPEN) is None  # no evidence kept: judged as before
    judged = measurement.judged_baseline(old, SLO, OPEN)
    assert judged is not None and REQUEST_GOODPUT in judged["gates"]


def _repeat(tpot_ms: float, requests: int = 64) -> load.CellResult:
    """One open-loop repeat whose requests all take ``tpot_ms`` a token (16 tokens, 4 req/s)."""
    out = []
    for i in range(requests):
        start, ttft = i / 4.0, 0.01
        out.append(load.RequestResult(index=i, expected_prompt_tokens=128, expected_output_tokens=16, sent_prompt_tokens=128,
                                      ok=True, prompt_tokens=128, completion_tokens=16, spec_verify_ct=4, start=start,
                                      end=start + ttft + 15 * tpot_ms / 1000, ttft_s=ttft))
    return load.CellResult(cell=OPEN.name, workload=load.workload_dict(OPEN, "test"), requests=out,
                           duration_s=requests / 4.0 + 1, speculative=True, prompt_source="test", server_info={"version": "t"},
                           send_lag_s=[0.0] * requests, slo=SLO)


def _campaign(tpots: list[float]) -> measurement.Campaign:
    samples = [_repeat(t) for t in tpots]
    run = stats.CellRun(samples=samples, primary=[float(s.metrics()["output_throughput"] or 0) for s in samples], min_clean=3)
    return measurement.Campaign(runs={OPEN.name: run}, policy=measurement.repeat_policy(3), slo=SLO)


def test_a_bless_keeps_the_worst_share_and_a_judged_cell_at_the_edge_says_so_in_record_and_summary(tmp_path: Path) -> None:
    blessed = cells.judged_cell("bs8_b8_k4", OPEN, _campaign([40.0, 47.0, 44.0]),
                                cells.CellBaseline("bs8_b8_k4", tmp_path / "b.yaml", "refserver", {}), bless=True)
    assert blessed.slo_latency_share == pytest.approx(47.0 / 50)  # its worst repeat: p99 TPOT 47 ms of 50
    entry = baseline.baseline_cell_entry(blessed.record["workload"], blessed.samples, session="s1",
                                     slo_share=blessed.slo_latency_share)
    assert entry["gates"][REQUEST_GOODPUT]["sessions"][0][baseline.SESSION_KEY] == pytest.approx(0.94)
    judged = cells.judged_cell("bs8_b8_k4", OPEN, _campaign([42.0, 43.0, 41.0]),
                               cells.CellBaseline("bs8_b8_k4", tmp_path / "b.yaml", "refserver", {OPEN.name: entry}))
    why = judged.record["not_judged"][REQUEST_GOODPUT]
    assert why.startswith("request_goodput recorded, not judged: at the SLO's edge when blessed: the SLO's p99 "
                          "latency at 94% of its target in its worst blessed repeat")
    assert why in judged.verdict.reasons and REQUEST_GOODPUT not in judged.record["baseline"]
    assert judged.verdict.metric(REQUEST_GOODPUT) is None and judged.record["samples"][REQUEST_GOODPUT]  # recorded
    raw = [{"kind": "throughput", "config": "bs8_b8_k4", "data": judged.record}]
    assert report.unjudged_lines(normalize(raw)) == [f"bs8_b8_k4 r4: {why}"]
    summary = report.session_summary(raw, [], None)
    assert ("ddtree recorded, not judged", f"bs8_b8_k4 r4: {why}") in summary.sections
    assert f"- bs8_b8_k4 r4: {why}" in summary.markdown
    assert summary.json["throughput"][0]["not_judged"] == {REQUEST_GOODPUT: why}
