"""The suites with an open-loop cell and an SLO, run as a user runs them: goodput and bench_serving's
open-loop keys in results.json, each config's sustainable rate, and the deployment answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bench_serving_contract import check_result
from tests.browser_helpers import browser_missing_reason, open_page
from tests.suite_helpers import set_control

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py

MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4, bs8_b4_k4]
cell_defaults: {output_tokens: 16}
slo: {e2e_ms: 60000}
rate_search: {cell: r_tiny, min_rate: 10, max_rate: 80, resolution: 0.5, max_probes: 4}
cells:
  - {name: c2_tiny, concurrency: 2, context_tokens: 48, requests: 4, warmup_requests: 2}
  - {name: r_tiny, request_rate: 20, arrival: constant, context_tokens: 48, requests: 8, warmup_requests: 2}
"""


@pytest.mark.slow  # two launches and a rate search each: 17 s alone on the 2-core box, more beside load
def test_open_loop_cells_goodput_and_each_configs_sustainable_rate_through_the_suites(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    set_control(raw, "none")  # the control is not what is tested here (test_control.py)
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


RATE_MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4]
cell_defaults: {output_tokens: 16}
rate_search: {cell: r_tiny, min_rate: 10, max_rate: 20, resolution: 0.5, max_probes: 2}
cells:
  - {name: r_tiny, request_rate: 10, arrival: constant, context_tokens: 48, requests: 8, warmup_requests: 2}
"""


def _rate_session(pytester: pytest.Pytester, repo_root: Path, results: str, engine_args: str, *args: str) -> pytest.RunResult:
    """The sustainable-rate suite alone on one config against an engine at clock scale 5 (plus
    ``engine_args``), its results in ``results/`` (a session's own folder)."""
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    set_control(raw, "none")
    raw["command"] = raw["command"].replace("{config_args}", f"--clock-scale 5 {engine_args} {{config_args}}")
    profile = pytester.path / f"profile{abs(hash(engine_args))}.yaml"
    profile.write_text(yaml.safe_dump(raw))
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(RATE_MATRIX)
    return pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_sustainable_rate.py"), f"--ddtree-service={profile}",
        f"--ddtree-matrix={matrix}", f"--ddtree-results={pytester.path / results}",
        f"--ddtree-baselines={pytester.path / 'baselines'}", "--ddtree-config=bs8_b8_k4", "-p", "no:cacheprovider",
        "-rA", *args, timeout=300)


def _rate_records(pytester: pytest.Pytester, results: str) -> list[dict[str, Any]]:
    results_json = json.loads((pytester.path / results / "results.json").read_text())
    return list(results_json["deployment"]["sustainable_rates"])


@pytest.mark.slow  # six sessions of the rate suite: a search, two blesses, two re-probes and a search again
def test_a_blessed_sustainable_rate_is_re_probed_and_a_slower_engine_fails_it(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    slo = "--ddtree-slo=tpot_ms=6,percentile=90"  # ~2 ms at clock scale 5 and 10-20 req/s; 8x slower: over 6
    # 1. an unblessed session searches, reports and warns how to bless
    first = _rate_session(pytester, repo_root, "unblessed", "", slo)
    assert first.ret == 0, first.stdout.str()[-3000:]
    first.stdout.fnmatch_lines(["*RateBaselineWarning*no blessed sustainable rate on r_tiny*bless it with*"])
    # 2. the bless stores the rate the search found, its SLO and that rate's goodput samples
    blessed = _rate_session(pytester, repo_root, "bless", "", slo, "--ddtree-update-baselines")
    assert blessed.ret == 0, blessed.stdout.str()[-3000:]
    (searched,) = _rate_records(pytester, "bless")
    assert searched["sustainable_rate"] in (10, 20) and "gate" not in searched
    # two probes (max_probes 2) between 10 and 20 req/s: 20 met is the search's max_rate, 10 met and 20
    # missed a bracket wider than the resolution; either way the rate is a bound, and the session says so
    assert searched["search_limit"] == ("max_rate" if searched["sustainable_rate"] == 20 else "max_probes"), searched
    blessed.stdout.fnmatch_lines([f"*RateSearchLimitWarning: bs8_b8_k4: its sustainable rate on r_tiny under SLO p90 "
                                  f"tpot<=6ms is {'at least 20' if searched['sustainable_rate'] == 20 else '10'} req/s*"
                                  "a bless keeps it as a rate the config sustains*"])
    baseline = yaml.safe_load((pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").read_text())
    entry = baseline["sustainable_rate"]["r_tiny"]
    assert entry["rate"] == searched["sustainable_rate"] and entry["slo"]["label"] == "p90 tpot<=6ms"
    goodput = entry["cell"]["gates"]["request_goodput"]
    assert len(goodput["sessions"][0]["samples"]) >= 3 and goodput["tolerance"] == 0.05
    assert entry["cell"]["workload"]["request_rate"] == entry["rate"]
    # 2b. a second bless keeps the blessed rate where it sustains it, and its samples join as a session
    # (a rate that moved by a bisection step started the entry over: its tolerance never saw a day)
    again = _rate_session(pytester, repo_root, "bless-again", "", slo, "--ddtree-update-baselines")
    assert again.ret == 0, again.stdout.str()[-3000:]
    (searched_again,) = _rate_records(pytester, "bless-again")
    kept = yaml.safe_load((pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").read_text())["sustainable_rate"]["r_tiny"]
    if searched_again["sustainable_rate"] >= entry["rate"]:
        assert kept["rate"] == entry["rate"] and len(kept["cell"]["gates"]["request_goodput"]["sessions"]) == 2, kept
    else:  # this session did not sustain it: the entry moves down to what it did, and starts over
        assert kept["rate"] == searched_again["sustainable_rate"]
        assert len(kept["cell"]["gates"]["request_goodput"]["sessions"]) == 1
    entry = kept
    # 3. the same engine: only the blessed rate is measured (one probe), and it holds
    same = _rate_session(pytester, repo_root, "same", "", slo)
    assert same.ret == 0, same.stdout.str()[-3000:]
    (judged,) = _rate_records(pytester, "same")
    assert [p["rate"] for p in judged["probes"]] == [entry["rate"]]
    assert judged["gate"]["status"] == "pass" and judged["sustainable_rate"] == entry["rate"], judged["gate"]
    # 4. an engine eight times slower misses the SLO at that rate on its launch and on a fresh one (the
    # rate test relaunches a failing config: one slow launch is not a slower config): it fails, saying
    # what and what to do
    slow = _rate_session(pytester, repo_root, "slow", "--fault slowdown=8", slo)
    assert slow.ret == 1, slow.stdout.str()[-3000:]
    out = slow.stdout.str()
    rate = f"{entry['rate']:g}"
    slow.stdout.fnmatch_lines([f"*bs8_b8_k4: its blessed sustainable rate {rate} req/s on r_tiny under SLO p90 "
                               "tpot<=6ms no longer holds on a fresh launch either: goodput * req/s against the blessed "
                               "* req/s (tolerance *, its between-session spread its own * blessed session(s)' (fewer "
                               "than 3 configs' rates blessed in 2+ sessions to pool)), SLO attainment *; p90 tpot * ms "
                               "> 6 ms*", "*its first launch failed: goodput * req/s against the blessed*"])
    assert out.count("3 of 3 repeat(s) had no request meeting the SLO") >= 2  # both launches' evidence
    slow.stdout.fnmatch_lines(["*If the change is intended, bless again: pytest suites --ddtree-update-baselines "
                               "--ddtree-service=* --ddtree-config=bs8_b8_k4*"])
    (failed,) = _rate_records(pytester, "slow")
    assert failed["gate"]["status"] == "regression" and failed["sustainable_rate"] is None
    assert failed["gate"]["first_launch"] == "regression" and [p["rate"] for p in failed["probes"]] == [entry["rate"]] * 2
    relaunch_repeats = [r for f in (pytester.path / "slow").glob("records*.jsonl")
                        for r in map(json.loads, f.read_text().splitlines()) if r["kind"] == "throughput-relaunch-repeat"]
    assert len(relaunch_repeats) >= 3 and {r["relaunch"] for r in relaunch_repeats} == {1}
    assert len({r["repeat"] for r in relaunch_repeats}) == len(relaunch_repeats)  # one index each: the first pass's
    # 4b. only the first launch slow (a launch that drew a slow speed), the fresh one at full speed: the
    # rate holds on the fresh launch, and the message keeps the first launch's evidence
    marker = pytester.path / "slow-launch-marker"
    unlucky = _rate_session(pytester, repo_root, "unlucky", f"--fault slow-launch=8:{marker}", slo)
    assert unlucky.ret == 0, unlucky.stdout.str()[-3000:]
    assert marker.exists()
    (held,) = _rate_records(pytester, "unlucky")
    assert held["gate"]["status"] == "pass" and held["gate"]["first_launch"] == "regression", held["gate"]
    assert held["sustainable_rate"] == entry["rate"] and held["probes"][0]["figures"]["request_goodput"] < \
        held["probes"][1]["figures"]["request_goodput"]
    assert f"its blessed sustainable rate {rate} req/s on r_tiny under SLO p90 tpot<=6ms held on a fresh launch: " \
           "goodput" in held["gate"]["message"] and "its first launch failed: goodput" in held["gate"]["message"]
    assert "re-probed, still holds on a fresh launch (its first launch: regression)." in \
        (pytester.path / "unlucky" / "results.md").read_text()
    markdown = (pytester.path / "slow" / "results.md").read_text()
    assert f"bs8_b8_k4: its blessed sustainable rate {rate} req/s under SLO p90 tpot<=6ms on r_tiny, re-probed, " \
           "no longer holds on a fresh launch (its first launch: regression)." in markdown
    # 5. another SLO than the blessed one is not judged: searched, and 'bless again'
    other = _rate_session(pytester, repo_root, "other", "", "--ddtree-slo=tpot_ms=7,percentile=90")
    assert other.ret == 0, other.stdout.str()[-3000:]
    other.stdout.fnmatch_lines(["*RateBaselineWarning*blessed under SLO p90 tpot<=6ms, this session's is "
                                "p90 tpot<=7ms*bless again*"])
    (rebless,) = _rate_records(pytester, "other")
    assert rebless["gate"]["status"] == "rebless" and rebless["probes"][0]["rate"] == 10


EDGE_MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4]
cell_defaults: {output_tokens: 16}
slo: {e2e_ms: 60000}
cells:
  - {name: c2_tiny, concurrency: 2, context_tokens: 48, requests: 4, warmup_requests: 2}
  - {name: r_tiny, request_rate: 20, arrival: constant, context_tokens: 48, requests: 8, warmup_requests: 2}
"""


@pytest.mark.slow  # three sessions of the throughput suite, a launch each
def test_an_open_loop_cell_blessed_at_the_slos_edge_records_its_goodput_and_says_why(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    set_control(raw, "none")
    raw["command"] = raw["command"].replace("{config_args}", "--clock-scale 5 {config_args}")
    profile = pytester.path / "profile.yaml"
    profile.write_text(yaml.safe_dump(raw))
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(EDGE_MATRIX)
    path = pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml"

    def session(results: str, *args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess(
            str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}",
            f"--ddtree-results={pytester.path / results}", f"--ddtree-baselines={pytester.path / 'baselines'}",
            "--ddtree-config=bs8_b8_k4", "-p", "no:cacheprovider", "-rA", *args, timeout=300)

    def set_share(value: object) -> None:
        data = yaml.safe_load(path.read_text())
        data["metrics"]["r_tiny"]["gates"]["request_goodput"]["sessions"][0]["slo_latency_share"] = value
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    # 1. a bless keeps the open-loop cell's worst share beside its goodput (an SLO of a minute: far from it)
    blessed = session("bless", "--ddtree-update-baselines")
    assert blessed.ret == 0, blessed.stdout.str()[-3000:]
    metrics = yaml.safe_load(path.read_text())["metrics"]
    share = metrics["r_tiny"]["gates"]["request_goodput"]["sessions"][0]["slo_latency_share"]
    assert 0 < share < 0.1, share
    assert "slo_latency_share" not in metrics["c2_tiny"]["gates"]["request_goodput"]["sessions"][0]  # closed-loop: untouched
    # 2. as if blessed at the edge: its goodput is recorded, not judged, and the summary says why
    set_share(0.95)
    edge = session("edge")
    assert edge.ret == 0, edge.stdout.str()[-3000:]
    edge.stdout.fnmatch_lines(["*ddtree recorded, not judged*",
                               "bs8_b8_k4 r_tiny: request_goodput recorded, not judged: at the SLO's edge when blessed: "
                               "the SLO's p99 latency at 95% of its target*"])
    cells = {c["cell"]: c for c in json.loads((pytester.path / "edge" / "results.json").read_text())["throughput"]}
    assert set(cells["r_tiny"]["not_judged"]) == {"request_goodput"} and "not_judged" not in cells["c2_tiny"]
    assert "request_goodput" not in cells["r_tiny"]["verdict"]["metrics"] and cells["r_tiny"]["request_goodput"] > 0
    assert "request_goodput" in cells["c2_tiny"]["verdict"]["metrics"]
    # 3. a hand edit that is not a share is refused, saying what to fix
    set_share("high")
    hostile = session("hostile")
    assert hostile.ret == 1, hostile.stdout.str()[-3000:]
    hostile.stdout.fnmatch_lines(["*r_tiny.gates.request_goodput.sessions[[]0[]].slo_latency_share must be a positive "
                                  "number*got 'high'*"])
