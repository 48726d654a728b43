"""The suites with an open-loop cell and an SLO, run as a user runs them: goodput and bench_serving's
open-loop keys in results.json, each config's sustainable rate, and the deployment answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.bench_serving_contract import check_result
from tests.browser_helpers import browser_missing_reason, open_page

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py

MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4, bs8_b4_k4]
workload_defaults: {output_tokens: 16}
slo: {e2e_ms: 60000}
rate_search: {workload: r_tiny, min_rate: 10, max_rate: 80, resolution: 0.5, max_probes: 4}
workloads:
  - {name: c2_tiny, concurrency: 2, context_tokens: 48, requests: 4, warmup_requests: 2}
  - {name: r_tiny, request_rate: 20, arrival: constant, context_tokens: 48, requests: 8, warmup_requests: 2}
"""


@pytest.mark.slow  # two launches and a rate search each: 17 s alone on the 2-core box, more beside load
def test_open_loop_cells_goodput_and_each_configs_sustainable_rate_through_the_suites(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    raw["control"] = "none"  # the control is not what is tested here (test_control.py)
    raw["command"] = raw["command"].replace("{config_args}", "--clock-scale 5 {config_args}")
    profile = pytester.path / "profile.yaml"
    profile.write_text(yaml.safe_dump(raw))
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(MATRIX)
    # the command line's SLO beats the matrix's: a TPOT target the search can cross
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), str(repo_root / "suites" / "test_sustainable_rate.py"),
        f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}", f"--ddtree-results={pytester.path / 'results'}",
        f"--ddtree-baselines={pytester.path / 'baselines'}", "--ddtree-config=bs8_b8_k4,bs8_b4_k4",
        "--ddtree-slo=tpot_ms=4,percentile=90", "-p", "no:cacheprovider", "-rA", timeout=400)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 6 and not outcomes.get("failed"), result.stdout.str()[-3000:]
    results = json.loads((pytester.path / "results" / "results.json").read_text())
    open_cell = next(c for c in results["throughput"] if c["cell"] == "r_tiny")
    assert check_result(open_cell) == [], check_result(open_cell)  # bench_serving's keys and types
    assert open_cell["request_rate"] == 20.0 and open_cell["max_concurrency"] is None
    assert open_cell["slo"]["label"] == "p90 tpot<=4ms" and 0 <= open_cell["slo_attainment"] <= 1
    assert open_cell["request_goodput"] <= open_cell["request_throughput"] + 1e-9
    deployment = results["deployment"]
    rates = {r["config"]: r for r in deployment["sustainable_rates"]}
    assert set(rates) == {"bs8_b8_k4", "bs8_b4_k4"}
    for r in rates.values():
        assert 1 <= len(r["probes"]) <= 4 and r["probes"][0]["rate"] == 10
        assert r["sustainable_rate"] is None or r["sustainable_rate"] >= 10
    assert {e["cell"] for e in deployment["at_load"]} == {"c2_tiny", "r_tiny"}
    assert any(s.startswith("For SLO p90 tpot<=4ms at load r_tiny (20 req/s, context 48)") for s in results["recommendations"])
    result.stdout.fnmatch_lines(["*bs8_b8_k4*r_tiny*20/s*", "*Sustainable request rate under SLO p90 tpot<=4ms on r_tiny*"])
    # the closed-loop sentences read closed-loop cells only: r_tiny's 8 requests are no concurrency
    assert not any("concurrency 8" in s for s in results["recommendations"]), results["recommendations"]
    markdown = (pytester.path / "results" / "results.md").read_text()
    assert "## What to deploy" in markdown and "- For SLO p90 tpot<=4ms at load r_tiny" in markdown
    # the report: a Pareto chart per context whose frontier is results.json's, and the deployment sentences
    reason = browser_missing_reason()
    if reason is not None:
        pytest.skip(f"the report's Pareto chart is not checked: {reason}")
    with open_page(pytester.path / "results" / "report.html", pytester.path / "browser") as opened:
        panels = opened.page.eval_on_selector_all(
            "#panels-pareto .js-plotly-plot",
            "ds => ds.map(d => ({ctx: +d.dataset.context, traces: d.data.map(t => ({name: t.name, x: t.x, y: t.y}))}))")
        advice = opened.page.inner_text("body")
        assert opened.console_errors == [] and opened.foreign_requests == []
    (panel,) = panels
    (front,) = deployment["frontier"]
    assert panel["ctx"] == front["context_tokens"] == 48
    drawn = next(t for t in panel["traces"] if t["name"] == "Pareto frontier")
    assert list(zip(drawn["x"], drawn["y"])) == [(p["output_throughput"], p["ddtree_median_request_output_throughput"])
                                                 for p in front["points"]]
    per_config = {t["name"]: len(t["x"]) for t in panel["traces"] if t["name"] != "Pareto frontier"}
    assert per_config == {"bs8_b8_k4": 2, "bs8_b4_k4": 2}  # each config's points over load: c2_tiny and r_tiny
    assert "For SLO p90 tpot<=4ms at load r_tiny" in advice and "Pareto frontier at context 48" in advice
