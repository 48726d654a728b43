"""report.html from payloads (no browser): verdicts, missing sections, no-charts page, live progress, comparison."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates.throughput import rule, verdicts
from pytest_ddtree.gates.throughput.cells import throughput_record
from pytest_ddtree.report import text as report
from pytest_ddtree.report.html import LiveStatus, build_html, charts, load_payload, model, write_report
from pytest_ddtree.report.html.live import LiveReport
from pytest_ddtree.records.launch_shapes import LaunchEntry
from pytest_ddtree.records.words import Status, Verdict


def _launch(config: str, *, ready_s: float, started_at: float, engine_version: str | None = None) -> LaunchEntry:
    """A ready launch's entry as the service manager records it (records.LaunchEntry)."""
    entry: LaunchEntry = {"config": config, "host": None, "instance": 0, "controller": "process", "command": "python -m x",
                          "env": {}, "port": 30000, "url": "http://127.0.0.1:30000", "started_at": started_at,
                          "pid_of_harness": 1, "outcome": "ready", "ready_s": ready_s}
    if engine_version is not None:
        entry["engine_version"] = engine_version
    return entry


def _cell(config: str, cell: str, conc: int, ctx: int, tps: list[float], status: Verdict = Status.PASS,
          base: list[float] | None = None, message: str = "") -> dict[str, Any]:
    repeats = [{"output_throughput": t, "accept_length": 4.0 + (0.1 if "b8" in config else 0.0), "median_ttft_ms": 5.0,
                "ddtree_median_request_output_throughput": t / conc} for t in tps]
    change = (sorted(tps)[1] / sorted(base)[1] - 1) if base else None
    verdict = verdicts.CellVerdict(cell, status, (verdicts.MetricVerdict("output_throughput", status, "higher", 0.05, None, None, change,
                                                                 message=message),)).as_dict()
    baseline = {"output_throughput": {"median": sorted(base)[1], "samples": base, "tolerance": 0.05, "direction": "higher"}} if base else None
    data = throughput_record(config=config, cell=cell, workload={"concurrency": conc, "context_tokens": ctx, "output_tokens": 32,
                                                                      "requests": 4, "prompts": "documents"}, repeats=repeats,
                                    samples={"output_throughput": tps}, measurement_status=Status.VALID, verdict=verdict, baseline=baseline)
    return {"kind": "throughput", "time": 100.0, "worker": "main", **data}


def _payload() -> dict[str, Any]:
    records: list[dict[str, Any]] = [
        _cell("bs8_b8_k4", "c1_s", 1, 48, [100.0, 101.0, 99.0], base=[100.0, 100.5, 99.5]),
        _cell("bs8_b8_k4", "c4_s", 4, 48, [300.0, 301.0, 299.0], base=[300.0, 300.5, 299.5]),
        _cell("bs8_b4_k4", "c1_s", 1, 48, [70.0, 71.0, 69.0], status=Status.REGRESSION, base=[100.0, 100.5, 99.5],
              message="output_throughput: 100 -> 70 tok/s, -30.0%: REGRESSION beyond the 5% tolerance"),
        {"kind": "coding", "config": "bs8_b4_k4", "time": 90.0, "passed": 1, "total": 2, "set": "default",
         "gate": {"passed": False, "regressions": ["slugify"], "new_passes": []},
         "problems": [{"id": "slugify", "verdict": "failed", "code": "def slugify(s):\n    return None", "message": "AssertionError: <b>"},
                      {"id": "lru_cache", "verdict": "passed", "code": "x", "message": ""}]},
        {"kind": "lossless", "config": "bs8_b4_k4", "time": 95.0, "passed": False, "compared": 3,
         "diverged": [{"prompt_id": "p1", "position": 7, "unit": "token", "reference": "the cat", "got": "the dog", "detail": "d"}]},
        {"kind": "health", "config": "bs8_b8_k4", "time": 80.0, "completion_tokens": 16},
        {"kind": "launch", "config": "bs8_b8_k4", "time": 200.0, "worker": "main",
         "launch": _launch("bs8_b8_k4", ready_s=1.5, started_at=70.0, engine_version="refserver-0.1.0")},
        {"kind": "launch", "config": "bs8_b4_k4", "time": 200.0, "worker": "main",
         "launch": _launch("bs8_b4_k4", ready_s=2.5, started_at=85.0)},
    ]
    payload = report.session_summary(records).json
    payload["failed_tests"] = [{"nodeid": "suites/test_coding.py::test_coding[bs8_b4_k4]", "when": "call", "reason": "REGRESSED: slugify"}]
    return payload


def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_gates_show_failures_with_their_messages_and_the_rest_passes() -> None:
    rows = model.gates(_payload(), planned=["bs8_b8_k4", "bs8_b4_k4", "bs16_b16_k4"])
    bad, good = rows["bs8_b4_k4"], rows["bs8_b8_k4"]
    assert bad["throughput"].status == Status.FAIL and "REGRESSION beyond the 5% tolerance" in bad["throughput"].messages[0]
    assert bad["coding"].status == Status.FAIL and "flipped to failing against the baseline: slugify" in bad["coding"].messages
    assert any("REGRESSED: slugify" in m for m in bad["coding"].messages)  # the failed test's own reason too
    assert bad["lossless"].status == Status.FAIL and "p1: first divergence at token 7" in bad["lossless"].messages
    assert bad["health"].status == Status.NOT_MEASURED
    assert {g: r.status for g, r in good.items()} == {"health": "pass", "applied": "pass", "coding": "not measured",
                                                      "lossless": "not measured", "throughput": "pass"}
    assert {r.status for r in rows["bs16_b16_k4"].values()} == {"pending"}
    assert model.overall(rows) == "fail"


def test_page_escapes_code_and_marks_the_flip() -> None:
    page = build_html(_payload())
    assert "AssertionError: &lt;b&gt;" in page and "<b>" not in page.split("<body>")[1].split("<script")[0]
    assert 'data-flip="true"' in page and "failed (flip)" in page
    assert "the cat" in page and "the dog" in page
    environment = page.split('id="environment-table"', 1)[1]
    assert "engine version (/server_info)" in environment and "refserver-0.1.0" in environment


def test_missing_sections_render_as_not_measured() -> None:
    for payload in ({}, {"throughput": "garbage", "records": [1, None, {"kind": "coding"}]}):
        text = _text(build_html(payload))
        for what in ("Throughput: not measured", "Coding: not measured", "Lossless: not measured", "Timeline: not measured"):
            assert what in text


def test_without_the_chart_runtime_every_table_stays_and_the_missing_file_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(charts, "plotly_runtime", lambda: None)
    page = build_html(_payload())
    assert "Plotly.newPlot" not in page and charts.RUNTIME_FILE in page and "reinstall" in page
    assert page.count('<tr data-config="bs8_b8_k4" data-cell=') >= 2 and 'id="coding-grid"' in page


def test_one_panel_per_context_and_the_runtime_inline() -> None:
    payload = _payload()
    payload["throughput"].append({**payload["throughput"][0], "cell": "c1_l", "context_tokens": 512})
    page = build_html(payload)
    assert len(re.findall(r'id="chart-output_throughput-ctx-\d+"', page)) == 2
    assert "Plotly.newPlot" in page and not re.search(r"<(script|link|img)[^>]*(src|href)=", page)


def test_a_context_measured_at_one_concurrency_is_shown_as_such() -> None:
    payload = _payload()
    payload["throughput"].append({**payload["throughput"][0], "cell": "c1_l", "context_tokens": 512})
    panels = {p["context"]: p for p in charts.sweep_panels(model.cells(payload), "output_throughput", "tok/s")}
    one = panels[512]
    assert one["caption"] == "context 512: measured at concurrency 1 only"
    assert one["figure"]["layout"]["xaxis"]["type"] == "category" and one["figure"]["layout"]["xaxis"]["tickvals"] == [1]
    several = panels[48]
    assert several["caption"] == "context 48" and several["figure"]["layout"]["xaxis"]["type"] == "log"
    page = build_html(payload)
    assert "<figcaption>context 512: measured at concurrency 1 only</figcaption>" in page
    assert '"title": {"text": "context' not in page  # captions, not Plotly titles (the toolbar covered those)


def test_the_page_stays_small_with_its_charts() -> None:
    """The vendored basic bundle, not the full plotly.js: the page of a session stays far below 1.5 MB."""
    page = build_html(_payload())
    assert "Plotly.newPlot" in page and len(page.encode()) < 1_400_000
    assert "plotly.js (basic - minified)" in page


def test_live_progress_counts_each_configs_tests_and_estimates_the_end(tmp_path: Path) -> None:
    live = LiveReport(tmp_path, ["bs8_b8_k4", "bs8_b4_k4"], started_at=1000.0)
    ids = [f"suites/test_health.py::test_health[{c}]" for c in live.configs] + [
        f"suites/test_throughput.py::test_throughput[c1_s-{c}]" for c in live.configs] + ["tests/test_x.py::test_other"]
    live.plan(ids)
    assert not live.test_done(ids[0]) and live.test_done(ids[2])  # bs8_b8_k4's second (last) test
    status = live.status()
    assert (status.done, status.total, status.current) == (1, 2, [])
    assert status.eta is not None and status.eta > status.started_at  # type: ignore[operator]
    live.write_running()
    page = (tmp_path / "report.html").read_text()
    assert 'data-state="running"' in page and "running: config 1 of 2 done" in _text(page)
    assert "location.reload()" in page and 'id="live-stopped" hidden' in page
    live.write_final(load_payload(tmp_path) if (tmp_path / "results.json").exists() else {})
    final = (tmp_path / "report.html").read_text()
    assert 'data-state="finished"' in final and "location.reload" not in final
    assert not list(tmp_path.glob(".*.tmp"))


def test_comparison_uses_the_gates_own_figures() -> None:
    this = _payload()
    other = report.session_summary([_cell("bs8_b4_k4", "c1_s", 1, 48, [100.0, 100.5, 99.5]),
                                    _cell("bs8_b8_k4", "c1_s", 1, 48, [100.0, 100.5, 99.5])]).json
    rows = {(c.config, c.cell, c.metric): c for c in model.compare_sessions(this, other)}
    got = rows[("bs8_b4_k4", "c1_s", "output_throughput")]
    expected = rule.judge_metric_alone("output_throughput", {"direction": "higher", "tolerance": 0.05, "median": 100.0,
                                                         "samples": [100.0, 100.5, 99.5]}, [70.0, 71.0, 69.0])
    assert (got.change, got.status, got.message) == (expected.change, expected.status, expected.message)
    assert got.status == "regression"
    assert rows[("bs8_b8_k4", "c4_s", "output_throughput")].status == "new"
    page = build_html(this, other=other, other_label="yesterday")
    assert 'data-metric="output_throughput"' in page and "-30.0%" in page


def test_write_report_replaces_the_page_atomically(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text("old")
    write_report(path, _payload(), LiveStatus(state="finished"))
    assert path.read_text().rstrip().endswith("</html>") and [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_a_config_that_did_not_start_or_apply_fails_the_applied_gate() -> None:
    payload = {"records": [
        {"kind": "launch", "config": "bs8_b8_k4", "launch": {"config": "bs8_b8_k4", "outcome": "failed: exited with status 1"}},
        {"kind": "launch", "config": "lossless-reference", "launch": {"config": "lossless-reference", "outcome": "ready"}},
    ], "failed_tests": [
        {"nodeid": "suites/test_health.py::test_health[bs8_b4_k4]", "when": "setup",
         "reason": "bs8_b4_k4 did not apply: speculative_eagle_topk expected 4, got 1"},
    ]}
    rows = model.gates(payload, planned=["bs8_b8_k4", "bs8_b4_k4"])
    assert sorted(rows) == ["bs8_b4_k4", "bs8_b8_k4"]
    assert rows["bs8_b8_k4"]["applied"].status == Status.FAIL and rows["bs8_b8_k4"]["applied"].messages == ["failed: exited with status 1"]
    applied = rows["bs8_b4_k4"]["applied"]
    assert applied.status == Status.FAIL and "speculative_eagle_topk expected 4, got 1" in applied.messages[0]
    assert "lossless-reference" not in rows


def test_a_retaken_repeat_is_shown_with_its_reason() -> None:
    payload = _payload()
    payload["throughput"][0]["spoiled_repeats"] = [{"repeat": 1, "reason": "the service fell behind its own clock 6 times"}]
    (cell,) = [c for c in model.cells(payload) if c.cell == payload["throughput"][0]["cell"]
               and c.config == payload["throughput"][0]["config"]]
    assert "repeat 1 retaken, not counted: the service fell behind its own clock 6 times" in cell.messages
    assert "retaken, not counted" in _text(build_html(payload))


def test_charts_fill_the_page_tick_where_measured_and_draw_depth_per_config() -> None:
    """Charts as a person reads them: full width, concurrency ticks only at the measured ones (not
    2 and 16 between 1 and 32), acceptance by depth as one small panel per config, not 28 lines."""
    payload = _payload()
    for raw in payload["throughput"]:
        raw["acceptance_by_depth"] = [0.9, 0.7, 0.4, 0.1]
    cells = model.cells(payload)
    (panel,) = charts.sweep_panels(cells, "output_throughput", "tok/s")
    xaxis = panel["figure"]["layout"]["xaxis"]
    assert xaxis["type"] == "log" and xaxis["tickvals"] == [1, 4] and xaxis["ticktext"] == ["1", "4"] and "dtick" not in xaxis
    depth = charts.depth_panels(cells)
    assert [p["config"] for p in depth] == ["bs8_b4_k4", "bs8_b8_k4"]
    assert [t["name"] for t in depth[1]["figure"]["data"]] == ["c1_s", "c4_s"]
    # a cell keeps its colour in every panel
    colour = {t["name"]: t["line"]["color"] for p in depth for t in p["figure"]["data"]}
    assert all(t["line"]["color"] == colour[t["name"]] for p in depth for t in p["figure"]["data"])
    page = build_html(payload)
    assert page.count('data-figure="depth-') == 2 and "chart-acceptance-by-depth" not in page
    assert "grid-template-columns" in page and "width: 460px" not in page and "width: 940px" not in page


def test_the_session_keeps_touching_its_running_page_until_it_finishes(tmp_path: Path) -> None:
    """The heartbeat the page's script reads (document.lastModified): while the process lives its
    running page stays fresh, and the final page stops it (tests/test_htmlreport_browser.py shows
    what a page that is no longer touched does)."""
    import os

    from tests.polling import wait_until

    live = LiveReport(tmp_path, ["bs8_b8_k4"], started_at=1000.0)
    live.write_running()
    path = tmp_path / "report.html"
    os.utime(path, (1_000_000_000, 1_000_000_000))  # as if written long ago
    live.start_heartbeat(interval_s=0.05)
    try:
        wait_until(lambda: path.stat().st_mtime > 1_000_000_000, 10, "the heartbeat to touch the page")
    finally:
        live.write_final({})
    assert live._heartbeat is None


def test_the_repeats_chart_colours_each_cell_by_the_verdict_of_the_metric_it_draws() -> None:
    """A cell failed for its acceptance has tok/s dots in their band: they are drawn in the tok/s verdict's
    colour (pass), not the cell's (regression); a passing cell's dot outside the band says so."""
    base = {"output_throughput": {"median": 100.0, "samples": [99.0, 101.0], "tolerance": 0.1, "direction": "higher"}}

    def cell(name: str, status: str, metric_status: dict[str, str], samples: list[float]) -> model.CellRow:
        return model.CellRow(config="bs8_b16_k4", cell=name, concurrency=8, context_tokens=4096, status=status,
                          measurement_status="valid", values={}, change={}, samples={"output_throughput": samples},
                          baseline=base, messages=[], metric_status=metric_status)

    figure = charts.repeats_figure("bs8_b16_k4", [
        cell("c8_4k", "regression", {"output_throughput": "pass", report.TOKENS_PER_VERIFY: "regression"}, [100.0, 101.0, 99.0]),
        cell("c1_4k", "pass", {"output_throughput": "pass"}, [100.0, 79.0, 101.0]),
    ])
    assert figure is not None
    dots = {t["name"]: t for t in figure["data"] if str(t["name"]).startswith("this session")}
    assert set(dots) == {"this session (pass)"}, set(dots)
    assert dots["this session (pass)"]["marker"]["color"] == charts._STATUS_COLOR["pass"]
    assert [t for t in dots["this session (pass)"]["text"] if "outside the band" in t] == [
        "79.0, outside the band: the verdict (pass) is on the repeats together"]
    # the 0.79x outlier keeps its verdict's green but is crossed: only it, not the dots inside the band
    marks = dict(zip(dots["this session (pass)"]["y"], dots["this session (pass)"]["marker"]["symbol"]))
    assert marks == {1.0: "circle", 1.01: "circle", 0.99: "circle", 0.79: charts.OUTSIDE_SYMBOL}, marks


def test_the_repeats_table_shows_the_verdict_of_the_tok_s_it_lists_and_the_cells_beside_it() -> None:
    """The repeats table lists tok/s repeats: its verdict column is tok/s's (pass, green), with the cell's
    (regression: accept -3.9%) beside it in words, never the cell's red over tok/s figures inside their band."""
    verdict = verdicts.CellVerdict("c8_4k", Status.REGRESSION, (
        verdicts.MetricVerdict("output_throughput", Status.PASS, "higher", 0.05, None, None, 0.002, message="tok/s ok"),
        verdicts.MetricVerdict(report.TOKENS_PER_VERIFY, Status.REGRESSION, "higher", 0.02, None, None, -0.039,
                           message="accept 5.172 -> 4.971"))).as_dict()
    data = throughput_record(
        config="bs8_b16_k4", cell="c8_4k", workload={"concurrency": 8, "context_tokens": 4096, "output_tokens": 32,
                                                     "requests": 8, "prompts": "documents"},
        repeats=[{"output_throughput": t, report.TOKENS_PER_VERIFY: 4.971} for t in (1000.0, 1004.0, 998.0)],
        samples={"output_throughput": [1000.0, 1004.0, 998.0]}, measurement_status=Status.VALID, verdict=verdict,
        baseline={"output_throughput": {"median": 1001.0, "samples": [1000.0, 1001.0, 1002.0], "tolerance": 0.05,
                                        "direction": "higher"}})
    page = build_html(report.session_summary([{"kind": "throughput", "time": 1.0, "worker": "main", **data}]).json)
    table = page.split('id="repeat-table"', 1)[1].split("</table>", 1)[0]
    row = table.split('data-cell="c8_4k"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="st-pass" data-key="status">pass<br><span class="muted">the cell: regression: accept -3.9%</span>' in row, row
    assert "st-regression" not in row


def test_a_cell_judged_on_another_build_says_what_changed_since_the_bless() -> None:
    payload = _payload()
    changed = ["engine_version '0.5.23' when blessed, '0.5.24' here"]
    payload["throughput"][0]["build"] = {"blessed": {"engine_version": "0.5.23"}, "judged": {"engine_version": "0.5.24"},
                                         "changed": changed}
    first = payload["throughput"][0]
    (cell,) = [c for c in model.cells(payload) if c.cell == first["cell"] and c.config == first["config"]]
    assert f"build changed since the bless: {changed[0]}" in cell.messages
    others = [c for c in model.cells(payload) if (c.config, c.cell) != (cell.config, cell.cell)]
    assert others and not any("build changed" in m for c in others for m in c.messages)
    assert "build changed since the bless: engine_version '0.5.23' when blessed, '0.5.24' here" in _text(build_html(payload))


def _overall(page: str) -> str:
    match = re.search(r'id="overall" class="verdict-overall st-([a-z-]+)">([^<]*)<', page)
    assert match and match[1] == match[2].replace(" ", "-"), page[:2000]
    return match[2]


def test_a_measure_only_sessions_page_says_measuring_while_it_runs_and_measured_at_the_end(tmp_path: Path) -> None:
    """--ddtree-measure-only judges nothing, so its page never says "pass": "measuring" while it runs
    (its config launched and proven, its coding counted with no floor, before any cell is measured: a
    gated page says "pass" there), "measured" at the end, also where only the coding test ran; a gated
    session's page keeps "pass"; a failure still shows as one."""
    import json

    def record(entry: dict[str, Any]) -> None:  # as a worker's recorder appends it (records-<worker>.jsonl)
        with open(tmp_path / "records-gw0.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"worker": "gw0", "time": 100.0, "session": "s", **entry}) + "\n")

    record({"kind": "launch", "config": "bs8_b8_k4", "launch": _launch("bs8_b8_k4", ready_s=1.0, started_at=1.0)})
    record({"kind": "coding", "config": "bs8_b8_k4", "passed": 2, "total": 2, "set": "default", "problems": [],
            "gate": {"passed": True, "regressions": [], "floor": 0}})
    pages = {}
    for measure_only in (False, True):
        live = LiveReport(tmp_path, ["bs8_b8_k4", "bs8_b4_k4"], started_at=1000.0)
        live.measure_only = measure_only
        live.plan(["suites/test_coding.py::test_coding[bs8_b8_k4]", "suites/test_coding.py::test_coding[bs8_b4_k4]"])
        live.write_running()
        assert not live.errors, live.errors
        pages[measure_only] = (tmp_path / "report.html").read_text()
    assert (_overall(pages[False]), _overall(pages[True])) == ("pass", "measuring")
    assert 'id="measure-only"' in pages[True] and 'id="measure-only"' not in pages[False]
    record(_cell("bs8_b8_k4", "c1_s", 1, 48, [100.0, 101.0, 99.0], status=Status.MEASURED))
    live.write_running()
    assert _overall((tmp_path / "report.html").read_text()) == "measuring"
    final = load_payload(tmp_path) | {"measure_only": True}
    assert _overall(build_html(final)) == "measured"
    coding_only = {**final, "records": [r for r in final["records"] if r["kind"] != "throughput"], "throughput": []}
    assert _overall(build_html(coding_only)) == "measured"
    assert _overall(build_html({**coding_only, "measure_only": False})) == "pass"
    failed = {**final, "failed_tests": [{"nodeid": "suites/test_coding.py::test_coding[bs8_b8_k4]", "when": "call", "reason": "boom"}]}
    assert _overall(build_html(failed)) == "fail"
