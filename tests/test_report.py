"""Sweep table, recommendations (incl. the crossover and drafter-bound diagnosis), JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.report import text as report
from pytest_ddtree.records.words import Status, Verdict
from tests.report_helpers import RECORDS, throughput_rec


def test_sweep_table_rows_and_order() -> None:
    table = report.render_sweep_table(RECORDS)
    lines = table.splitlines()
    assert lines[0].split() == ["config", "cell", "conc", "ctx", "prompts", "out", "tok/s", "accept", "TTFT", "p50", "ms",
                                "TPOT", "p50", "ms", "ITL", "p50", "ms", "req/s", "vs", "baseline", "status"]
    body = [line.split() for line in lines[2:]]
    assert [r[0] for r in body][:2] == ["bs8_b4_k4", "bs8_b4_k4"]  # config order, then cell
    assert body[0][1] == "c1_short" and body[1][1] == "c32_short"
    assert any(r[-1] == "invalid" and r[0] == "bs16_b16_k4" for r in body)
    assert "-9.0%" in table and "900.0 ±0%" in table
    assert report.render_sweep_table([]) == "no throughput results"


def test_recommendations_show_the_crossover_and_drafter_bound() -> None:
    advice = report.recommendations(RECORDS)
    text = "\n".join(advice)
    assert "Best aggregate throughput at concurrency 32, context 128: bs8_b4_k4 with 900.0" in text
    assert "Best single-request speed (concurrency 1, context 128): bs16_b16_k4" in text
    assert "Crossover at context 128: bs8_b4_k4 wins at concurrency 32, bs16_b16_k4 at concurrency 1" in text
    assert "Best acceptance: bs16_b16_k4 with 5.00" in text
    assert "Acceptance is drafter-bound" in text and "block size 8 -> 16" in text
    assert "budget 8 -> 16" in text  # 4.7 -> 4.8 is +2%: more tree, no more acceptance
    # invalid cells never win anything
    assert "10.0" not in text


def test_drafter_bound_budget_step() -> None:
    out = report.drafter_bound({"bs8_b8_k4": 4.7, "bs8_b16_k4": 4.8, "bs8_b4_k4": 3.5})
    assert out and "budget 8 -> 16" in out[0] and "at most +2%" in out[0]
    assert report.drafter_bound({"bs8_b8_k4": 4.0, "bs8_b16_k4": 4.8}) == []
    # windows and defaults mixed (a None window must sort)
    mixed = {"bs8_b8_k4": 4.7, "bs8_b16_k4": 4.8, "bs8_b8_k4_wnone": 4.7, "bs8_b16_k4_wnone": 4.75, "bs8_b8_k4_w1024": 4.1}
    assert "budget 8 -> 16" in report.drafter_bound(mixed)[0]


def test_markdown_and_json(tmp_path: Path) -> None:
    md = report.render_markdown(RECORDS)
    assert "| config" in md and "### Recommendations" in md
    assert "**bs16_b16_k4 c32_short**: invalid: request 1 failed: HTTP 500" in md
    js = report.results_json(RECORDS)
    cell = next(c for c in js["throughput"] if c["config"] == "bs8_b4_k4" and c["cell"] == "c32_short")
    assert cell["output_throughput"] == 900.0 and cell[report.TOKENS_PER_VERIFY] == 3.9
    assert cell["status"] == "pass" and cell["samples"]["output_throughput"] == [900.0] * 3

    summary = report.session_summary(RECORDS, results_dir=tmp_path)
    assert summary.json["records"] == [RECORDS[-1]]
    titles = [title for title, _ in summary.sections]
    assert titles[:2] == ["ddtree correctness gates", "ddtree throughput sweep"]
    assert "Recommendations:" in summary.sections[1][1]
    assert "## Correctness gates" in summary.markdown
    assert "Other gates" not in summary.markdown and "None" not in summary.markdown
    assert summary.plot_error is None


def test_plot_is_optional(tmp_path: Path) -> None:
    import importlib.util

    wrote = report.plot_png(RECORDS, tmp_path / "p.png")
    assert wrote == (tmp_path / "p.png").exists()
    assert wrote == (importlib.util.find_spec("matplotlib") is not None)  # the `plot` extra
    if wrote:
        assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gate_rows_put_correctness_next_to_each_config_and_count_its_failures() -> None:
    from pytest_ddtree.report.text import gate_rows

    records: list[dict[str, Any]] = [
        {"kind": "health", "config": "bs8_b8_k4"},
        {"kind": "coding", "config": "bs8_b8_k4", "passed": 4, "total": 5, "set": "default"},
        {"kind": "lossless", "config": "bs8_b8_k4", "passed": False, "compared": 30, "diverged": [{}, {}]},
        {"kind": "lossless", "config": "bs8_b4_k4", "passed": True, "compared": 30, "diverged": []},
        {"kind": "throughput", "config": "bs16_b16_k4"},
        {"kind": "health", "config": "bs8_b4_k4", "passed": False, "problems": ["empty completion"]},
    ]
    failed = [{"nodeid": "suites/test_coding.py::test_coding_gate[bs8_b8_k4]"},
              {"nodeid": "suites/test_throughput.py::test_throughput[c1_short-bs8_b8_k4]"}]
    assert gate_rows(records, failed) == [
        ["bs8_b4_k4", "FAILED", "-", "identical", "0"],
        ["bs8_b8_k4", "ok", "4/5 (default)", "2/30 diverged", "2"],
    ]


def _moved(status: Verdict, **changes: tuple[Any, float]) -> dict[str, Any]:
    metrics = tuple(verdicts.MetricVerdict(key, st, "higher", 0.05, None, None, change) for key, (st, change) in changes.items())
    return {"status": status, "verdict": verdicts.CellVerdict("c1_long", status, metrics).as_dict()}


def test_status_names_the_metric_that_moved() -> None:
    """'c1_long -2.0% improved' read as if tok/s improved; the acceptance did (issue #32)."""
    improved = _moved(Status.IMPROVED, output_throughput=(Status.PASS, -0.02), **{report.TOKENS_PER_VERIFY: (Status.IMPROVED, 0.095)})
    assert report.status_text(improved) == "improved: accept +9.5%"
    both = _moved(Status.REGRESSION, output_throughput=(Status.REGRESSION, -0.113), **{report.TOKENS_PER_VERIFY: (Status.IMPROVED, 0.095)})
    assert report.status_text(both) == "regression: tok/s -11.3%; accept +9.5% improved"
    assert report.status_text(_moved(Status.PASS, output_throughput=(Status.PASS, 0.01))) == "pass"
    assert report.status_text(_moved(Status.INVALID, output_throughput=(Status.INVALID, 0.01))) == "invalid"


def test_one_config_recommends_nothing() -> None:
    """'Best ... bs8_b8_k4' for every cell of a one-config session compares nothing."""
    alone = [r for r in RECORDS if r.get("config") == "bs8_b8_k4" and r.get("kind") == "throughput"]
    assert report.recommendations(alone) == []
    # an inconclusive cell takes no part: c32 then has one config left, and recommends nothing
    shaky = [throughput_rec("bs8_b4_k4", 32, 128, 900.0, 3.9, status=Status.INCONCLUSIVE), throughput_rec("bs8_b16_k4", 32, 128, 700.0, 4.8),
             throughput_rec("bs8_b4_k4", 1, 128, 80.0, 3.9), throughput_rec("bs8_b16_k4", 1, 128, 95.0, 4.8)]
    text = "\n".join(report.recommendations(shaky))
    assert "concurrency 32" not in text and "bs16_b16_k4" not in text


def test_each_recommendation_is_chosen_by_the_figure_it_prints() -> None:
    """At concurrency 1 the per-request winner is printed with its per-request figure (was: the aggregate
    winner, bs8_b12_k4 723.8 tok/s per request, while bs8_b16_k4 measured 751.6); at the top concurrency
    the aggregate winner with its aggregate figure, even where another config serves each request faster."""
    records = [
        throughput_rec("bs8_b12_k4", 1, 4096, 730.0, 4.9, per_req=723.8), throughput_rec("bs8_b16_k4", 1, 4096, 725.0, 5.1, per_req=751.6),
        throughput_rec("bs8_b12_k4", 8, 4096, 2000.0, 4.9, per_req=240.0), throughput_rec("bs8_b16_k4", 8, 4096, 1900.0, 5.1, per_req=260.0),
    ]
    text = "\n".join(report.recommendations(records))
    assert ("Best single-request speed (concurrency 1, context 4k): bs8_b16_k4 with 751.6 tok/s per request "
            "(+3.8% over the slowest, bs8_b12_k4)") in text, text
    assert "Best aggregate throughput at concurrency 8, context 4k: bs8_b12_k4 with 2000.0 output tok/s (+5.3% over the slowest, bs8_b16_k4)" in text, text
    assert "Crossover at context 4k: bs8_b12_k4 wins at concurrency 8, bs8_b16_k4 at concurrency 1" in text, text
    assert "Best acceptance: bs8_b16_k4 with 5.10" in text


def test_the_session_verdict_names_what_failed_first() -> None:
    from pytest_ddtree.finish import SessionFailure, verdict_line

    failed = [{"nodeid": "suites/test_throughput.py::test_throughput[bs8_b16_k4-c8_4k]", "when": "call",
               "reason": "bs8_b16_k4 c8_4k: REGRESSION\n  - accept -3.9%"}]
    assert verdict_line(1, failed, [SessionFailure("control", "control moved")]) == (
        "FAILED: 1 test(s) failed (test_throughput[bs8_b16_k4-c8_4k]: bs8_b16_k4 c8_4k: REGRESSION); "
        "session check(s) failed: control")
    assert verdict_line(0, [], []) == "PASSED: every gate and session check passed"
    assert verdict_line(2, [], []).startswith("INTERRUPTED: ")
    assert verdict_line(0, [], [SessionFailure("uniform-shift", "x")]) == "FAILED: session check(s) failed: uniform-shift"



def test_a_bless_says_how_to_review_the_folder_it_wrote(tmp_path: Path, monkeypatch: Any) -> None:
    from pytest_ddtree.finish import review_command

    monkeypatch.chdir(tmp_path)
    assert review_command(tmp_path / "baselines") == "git diff -- baselines/"
    assert review_command(tmp_path / "my dir" / "b") == "git diff -- 'my dir/b/'"
    elsewhere = tmp_path.parent / "elsewhere"
    assert review_command(elsewhere) == f"git diff -- {elsewhere.resolve()}/"


def test_a_cell_s_progress_has_a_bar_where_the_terminal_has_room(monkeypatch: Any) -> None:
    from pytest_ddtree import progress

    activity = progress.Activity("bs8_b8_k4 c8_4k: repeat 1/3", requests=16, requests_done=4)
    monkeypatch.setenv("COLUMNS", "200")
    assert activity.text(activity.started + 2).endswith(", 4/16 requests [#####...............]")
    monkeypatch.setenv("COLUMNS", "60")
    assert activity.text(activity.started + 2).endswith(", 4/16 requests")
