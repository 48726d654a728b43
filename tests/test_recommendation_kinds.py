"""Each kind of recommendation names the config chosen by the metric it prints, with the figure it prints.

One test per kind, each on records where the printed metric and a competing one disagree (the
config with the best tok/s per request is not the one with the best aggregate tok/s, the server's
average accept length ranks the configs otherwise than tokens per verify, ...): a recommendation
chosen by the other metric names the other config, so each test fails on the mix-up it is about.
The kinds: ``report/text.py recommendations`` (best aggregate throughput, best single-request
speed, the crossover, best acceptance, the drafter-bound budget and block-size steps),
``report/frontier.py deployment`` (the deploy answer at a closed-loop load; the open-loop one is
``tests/test_openloop.py``'s headroom test; the Pareto frontier) and the adaptive sweep's per-cell
pick (``adaptive/advisor.py``, ``adaptive/sweep.py summary_lines``).
"""

from __future__ import annotations

import html
from typing import Any

import pytest

from pytest_ddtree.metrics import ACCEPT_LENGTH, PER_REQUEST_OUTPUT_THROUGHPUT
from pytest_ddtree.records.cells import normalize
from pytest_ddtree.report import frontier
from pytest_ddtree.report import text as report
from tests.report_helpers import throughput_rec


def rec(config: str, conc: int, ctx: int, tps: float, accept: float, per_req: float | None = None,
        server_accept: float | None = None) -> dict[str, Any]:
    """A throughput record; ``server_accept`` the server's own avg_spec_accept_length (information only)."""
    out = throughput_rec(config, conc, ctx, tps, accept, per_req=per_req)
    if server_accept is not None:
        out["metrics"][ACCEPT_LENGTH] = server_accept
    return out


def said(records: list[dict[str, Any]], start: str) -> list[str]:
    return [line for line in report.recommendations(records) if line.startswith(start)]


#: At 4k context: bs8_b12_k4 serves the most tok/s in aggregate at both loads, bs8_b16_k4 each request
#: fastest at both (the campaign's reading: 730 against 725 aggregate, 723.8 against 751.6 per request).
SWEEP = [
    rec("bs8_b12_k4", 1, 4096, 730.0, 4.9, per_req=723.8), rec("bs8_b16_k4", 1, 4096, 725.0, 5.1, per_req=751.6),
    rec("bs8_b12_k4", 8, 4096, 2000.0, 4.9, per_req=240.0), rec("bs8_b16_k4", 8, 4096, 1900.0, 5.1, per_req=260.0),
]


def test_best_aggregate_throughput_is_chosen_by_output_tok_s_not_per_request() -> None:
    (line,) = said(SWEEP, "Best aggregate throughput")
    assert line == ("Best aggregate throughput at concurrency 8, context 4k: bs8_b12_k4 with 2000.0 output tok/s "
                    "(+5.3% over the slowest, bs8_b16_k4).")


def test_best_single_request_speed_is_chosen_by_tok_s_per_request_not_aggregate() -> None:
    (line,) = said(SWEEP, "Best single-request speed")
    assert line == ("Best single-request speed (concurrency 1, context 4k): bs8_b16_k4 with 751.6 tok/s per request "
                    "(+3.8% over the slowest, bs8_b12_k4).")
    # a config without the per-request figure (an older results file): every config is ranked by the
    # aggregate then, and the line says "tok/s", not "per request"
    older = [dict(r, metrics={k: v for k, v in r["metrics"].items() if k != PER_REQUEST_OUTPUT_THROUGHPUT})
             if r["config"] == "bs8_b12_k4" else r for r in SWEEP]
    (line,) = said(older, "Best single-request speed")
    assert line == ("Best single-request speed (concurrency 1, context 4k): bs8_b12_k4 with 730.0 tok/s "
                    "(+0.7% over the slowest, bs8_b16_k4).")


def test_the_crossover_names_the_winners_the_two_lines_above_it_name() -> None:
    (line,) = said(SWEEP, "Crossover")
    assert line.startswith("Crossover at context 4k: bs8_b12_k4 wins at concurrency 8, bs8_b16_k4 at concurrency 1 ")
    # where one config wins both (per request at c1, aggregate at c8) there is no crossover, whatever c1's aggregate says
    same = [rec("bs8_b12_k4", 1, 4096, 730.0, 4.9, per_req=700.0), rec("bs8_b16_k4", 1, 4096, 725.0, 5.1, per_req=751.6),
            rec("bs8_b12_k4", 8, 4096, 1800.0, 4.9), rec("bs8_b16_k4", 8, 4096, 1900.0, 5.1)]
    assert said(same, "Crossover") == []


def test_best_acceptance_is_chosen_by_tokens_per_verify_not_the_servers_average_nor_tok_s() -> None:
    """Tokens per verify (sum of completion tokens over sum of verifies of the measured requests) is the
    gated acceptance; the server's avg_spec_accept_length is information only, and here ranks the other way."""
    records = [rec("bs8_b8_k4", 1, 128, 95.0, 4.2, server_accept=5.6), rec("bs8_b16_k4", 1, 128, 90.0, 4.8, server_accept=4.1),
               rec("bs8_b8_k4", 8, 128, 600.0, 4.4, server_accept=5.4), rec("bs8_b16_k4", 8, 128, 560.0, 4.6, server_accept=4.0)]
    (line,) = said(records, "Best acceptance")
    assert line == "Best acceptance: bs8_b16_k4 with 4.70 accepted tokens per verify step (median over its cells)."


def test_the_drafter_bound_budget_step_is_judged_on_tokens_per_verify() -> None:
    """The last budget step of a family raised tokens per verify 4.70 -> 4.80 (+2%) while the server's
    average rose 4.0 -> 5.5 and tok/s fell: the finding names that step with the gated figures."""
    records = [rec(f"bs8_b{b}_k4", c, 128, tps * (1 if c == 1 else 8), acc, server_accept=server)
               for b, tps, acc, server in ((4, 80.0, 3.5, 3.0), (8, 95.0, 4.7, 4.0), (16, 90.0, 4.8, 5.5)) for c in (1, 8)]
    # the server's histograms say why, of the step's upper config (bs8_b8_k4's go deeper and are not the finding)
    for r in records:
        r["accept_histogram"] = {"bs8_b16_k4": [10, 10, 20, 20, 20, 10, 5, 5], "bs8_b8_k4": [0, 0, 0, 10, 20, 30, 20, 20]
                                 }.get(r["config"], [0, 50, 50])
    (line,) = said(records, "Acceptance is drafter-bound")
    assert "the last budget step raised acceptance by at most +2%, e.g. budget 8 -> 16 (bs8_b8_k4 -> bs8_b16_k4) only " \
           "4.70 -> 4.80; the server's acceptance histograms show why: in bs8_b16_k4 half of its verifies stop before " \
           "depth 4, and 5% reach its bound of 7 drafts" in line, line
    # judged on the server's average (+37%) it would not be drafter-bound: with the gated figure rising too, it is not
    rising = [dict(r, metrics={**r["metrics"], report.TOKENS_PER_VERIFY: r["metrics"][ACCEPT_LENGTH]}) for r in records]
    assert said(rising, "Acceptance is drafter-bound") == []


def test_report_html_shows_the_drafter_bound_sentence_the_recommendations_print() -> None:
    """The page's drafter-bound paragraph is the recommendation's sentence: worked out again over every cell,
    an inconclusive c8 cell (bs8_b16_k4 at 5.6 tokens per verify) lifted bs8_b16_k4's median to 5.2, +11%,
    and the page said nothing while its recommendations said drafter-bound at 4.70 -> 4.80."""
    from pytest_ddtree.records.words import Status
    from pytest_ddtree.report.html import build_html

    records = [rec("bs8_b8_k4", 1, 128, 95.0, 4.7), rec("bs8_b16_k4", 1, 128, 90.0, 4.8),
               rec("bs8_b8_k4", 8, 128, 600.0, 4.7), throughput_rec("bs8_b16_k4", 8, 128, 560.0, 5.6, status=Status.INCONCLUSIVE)]
    payload = report.session_summary(records).json
    (line,) = [r for r in payload["recommendations"] if r.startswith("Acceptance is drafter-bound")]
    assert "budget 8 -> 16 (bs8_b8_k4 -> bs8_b16_k4) only 4.70 -> 4.80" in line, line
    page = build_html(payload)
    paragraph = html.unescape(page.split('<p id="drafter-bound">', 1)[1].split("</p>", 1)[0])
    assert line in paragraph, paragraph


def test_the_drafter_bound_block_size_step_compares_each_block_sizes_best_tokens_per_verify() -> None:
    """Block 8's best is bs8_b16_k4 at 4.80 tokens per verify (bs8_b12_k4 has the server's highest average,
    6.0); block 16's is 5.00: +4%, drafter-bound, named with those two configs and figures."""
    records = [rec(config, c, 128, 90.0 * c, acc, server_accept=server)
               for config, acc, server in (("bs8_b12_k4", 4.75, 6.0), ("bs8_b16_k4", 4.8, 4.5), ("bs16_b16_k4", 5.0, 7.5))
               for c in (1, 8)]
    for r in records:  # block 16's drafter is right 8 deep in 3% of its verifies: where it stops, from the server
        r["accept_histogram"] = [10, 10, 20, 20, 20, 10, 5, 2, 3] if r["config"] == "bs16_b16_k4" else [0, 0, 0, 0, 0, 0, 50, 50]
    (line,) = said(records, "Acceptance is drafter-bound")
    assert "block size 8 -> 16 raised the best acceptance only 4.80 (bs8_b16_k4) -> 5.00 (bs16_b16_k4); the server's " \
           "acceptance histograms show why: in bs16_b16_k4 3% of verifies accepted 8 or more drafts, though its tree " \
           "allows 15" in line, line


def test_the_pareto_frontier_is_chosen_on_both_axes_and_holds_each_winner_named_above_it() -> None:
    """The frontier of tok/s per request against aggregate tok/s keeps the single-request winner (bs8_b16_k4
    at c1) and the aggregate winner (bs8_b12_k4 at c8) and leaves out bs8_b8_k4, beaten on both at each load
    though it has the best acceptance: the Pareto line never contradicts the lines above it."""
    records = [*SWEEP, rec("bs8_b8_k4", 1, 4096, 700.0, 5.5, per_req=700.0), rec("bs8_b8_k4", 8, 4096, 1850.0, 5.5, per_req=230.0)]
    throughput = normalize(records)
    (line,) = [s for s in frontier.deployment(throughput, records)["sentences"] if s.startswith("Pareto frontier")]
    assert line == ("Pareto frontier at context 4096 (tok/s per request against aggregate tok/s): bs8_b16_k4 at c1_4k, "
                    "bs8_b12_k4 at c1_4k, bs8_b16_k4 at c8_4k, bs8_b12_k4 at c8_4k; every other config is beaten on both "
                    "somewhere on it.")
    advice = report.recommendations(records)
    assert any(a.startswith("Best single-request speed (concurrency 1, context 4k): bs8_b16_k4") for a in advice), advice
    assert any(a.startswith("Best aggregate throughput at concurrency 8, context 4k: bs8_b12_k4") for a in advice), advice
    assert any(a.startswith("Best acceptance: bs8_b8_k4") for a in advice), advice


def test_the_deploy_answer_at_a_closed_loop_load_is_chosen_by_goodput_not_output_tok_s() -> None:
    """At a fixed number of users the config to deploy is the one with the most good answers a second:
    bs8_b4_k4 (151.3 req/s good, 9000 tok/s) over bs8_b16_k4 (140.0 req/s, 9700 tok/s), and never
    bs8_b2_k4, whose goodput is the highest but whose p99 TTFT misses the SLO."""
    slo = {"label": "p99 ttft<=300ms", "goodput_slos_ms": {"ttft": 300.0}, "percentile": 99.0}

    def cell(config: str, goodput: float, tps: float, ttft: float) -> Any:  # the fields the deploy answer reads
        return {"config": config, "cell": "c32_short", "workload": {"concurrency": 32, "context_tokens": 128}, "slo": slo,
                "measurement_status": "valid",
                "metrics": {"request_goodput": goodput, "output_throughput": tps, "p99_ttft_ms": ttft}}

    records = [cell("bs8_b4_k4", 151.3, 9000.0, 250.0), cell("bs8_b16_k4", 140.0, 9700.0, 120.0),
               cell("bs8_b2_k4", 160.0, 9900.0, 420.0)]
    (sentence,) = frontier.deployment(records, [])["sentences"]
    assert sentence == ("For SLO p99 ttft<=300ms at load c32_short (concurrency 32, context 128): deploy bs8_b4_k4 (goodput "
                        "151.30 req/s, 9000.0 output tok/s; 2 of 3 configs meet it).")


def test_the_adaptive_pick_prints_the_figure_of_the_config_it_names_and_says_where_the_fit_broke_a_tie() -> None:
    """In c1_short bs8_b12_k4 measured 96.6 tok/s, 1% above bs8_b16_k4's 95.6 (noise: the truth is the other
    way); the fit over every cell breaks the near tie for bs8_b16_k4. The line names bs8_b16_k4 with its own
    95.6 and says that bs8_b12_k4 measured the higher figure the table shows; a clear pick says nothing more."""
    pytest.importorskip("scipy")
    from pytest_ddtree.adaptive.advisor import Measurement, Planner
    from pytest_ddtree.adaptive.sweep import summary_lines
    from pytest_ddtree.records.shapes import AdaptiveSweepData
    from tests.advisor_helpers import CELLS, CONFIGS, truth

    configs = [c for c in CONFIGS if c.topk == 4 and c.block_size == 8 and "wnone" not in c.name]
    by_name = {c.name: c for c in configs}
    planner = Planner(configs, CELLS, max_restarts=4, default="bs8_b8_k4")
    for c in configs:
        for w in CELLS:
            noisy = c.name == "bs8_b12_k4" and w.name == "c1_short"
            planner.record(Measurement(c.name, w.name, truth(by_name["bs8_b16_k4"], w) * 1.01 if noisy else truth(c, w)))
    picks = {r.cell: r for r in planner.recommendations()}
    tie = picks["c1_short"]
    assert (tie.config, round(tie.tok_s, 1), tie.measured_best, round(tie.measured_best_tok_s or 0, 1)) == (
        "bs8_b16_k4", 95.6, "bs8_b12_k4", 96.6)
    assert (picks["c32_short"].config, picks["c32_short"].measured_best) == ("bs8_b4_k4", None)
    outcome: AdaptiveSweepData = {
        "restarts": 4, "full_sweep_restarts": 4, "max_restarts": 4, "measured": [c.name for c in configs], "failed": [],
        "not_measured": [], "predicted": [], "prior": None,
        "recommendations": [
            {"cell": "c1_short", "config": tie.config, "output_throughput": round(tie.tok_s, 3), "challenger": None,
             "challenger_high": None, "measured_best": "bs8_b12_k4", "measured_best_output_throughput": 96.588},
            {"cell": "c32_short", "config": "bs8_b4_k4", "output_throughput": 901.749, "challenger": None, "challenger_high": None}]}
    lines = summary_lines(outcome)
    assert ("c1_short: bs8_b16_k4 (95.6 tok/s measured; bs8_b12_k4 measured 96.6, within 2% of it, and the fit over every "
            "cell prefers bs8_b16_k4)") in lines, lines
    assert "c32_short: bs8_b4_k4 (901.7 tok/s measured)" in lines, lines


def test_the_adaptive_challenger_is_the_highest_prediction_and_the_line_prints_it() -> None:
    """A pick's challenger is the unmeasured config predicted fastest in the cell among those whose interval
    reaches above the pick (not the widest interval): the line prints that prediction beside the interval's top."""
    pytest.importorskip("scipy")
    from pytest_ddtree.adaptive.advisor import Measurement, Planner
    from pytest_ddtree.adaptive.sweep import summary_lines
    from pytest_ddtree.records.shapes import AdaptiveSweepData
    from tests.advisor_helpers import CELLS, CONFIGS, truth

    planner = Planner(CONFIGS, CELLS, max_restarts=3, default="bs8_b8_k4")
    for name in ("bs8_b4_k4", "bs8_b16_k4"):
        for w in CELLS:
            planner.record(Measurement(name, w.name, truth(planner.by_name[name], w)))
    preds = planner.predictions()
    picks = [r for r in planner.recommendations() if r.challenger is not None]
    assert picks, "two corners measured leave rivals whose intervals reach above the picks"
    for r in picks:
        rivals = {n: p for (n, cell), p in preds.items() if cell == r.cell and p.high > r.tok_s
                  and planner.by_name[n].shape not in planner.measured_shapes()}
        assert r.challenger_tok_s == max(p.tok_s for p in rivals.values()) == rivals[str(r.challenger)].tok_s, r
    outcome: AdaptiveSweepData = {
        "restarts": 2, "full_sweep_restarts": 10, "max_restarts": 3, "measured": ["bs8_b4_k4", "bs8_b16_k4"], "failed": [],
        "not_measured": [], "predicted": [], "prior": None,
        "recommendations": [{"cell": "c8_4k", "config": "bs8_b16_k4", "output_throughput": 170.4, "challenger": "bs8_b8_k4",
                             "challenger_high": 190.25, "challenger_output_throughput": 173.9}]}
    assert ("c8_4k: bs8_b16_k4 (170.4 tok/s measured); bs8_b8_k4 (not measured, predicted 173.9) may reach 190.2: measure "
            "it or run the full sweep to be sure") in summary_lines(outcome)
