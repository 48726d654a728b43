"""End to end: suites/test_throughput.py against real reference engines whose topk or window is
accepted, reported and ignored. No signal shows those fields, so only configs that differ in them
alone can: identical greedy acceptance is reported as "shows no effect on this build" (summary,
results.json, report.html), never as applied; the fields that behaviour does prove say so.
Acceptance only, no timing: these tests need no measurement turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

MATRIX = """\
default: bs8_b12_k4_wnone
matrix: [bs8_b12_k1_wnone, bs8_b12_k4_wnone, bs8_b12_k4_w4]
cell_defaults: {output_tokens: 32}
cells:
  - {name: c1_tiny, concurrency: 1, context_tokens: 48, requests: 3, warmup_requests: 0}
"""
CONFIGS = "bs8_b12_k1_wnone,bs8_b12_k4_wnone,bs8_b12_k4_w4"


def run_sweep(pytester: pytest.Pytester, repo_root: Path, engine_args: str) -> dict[str, Any]:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    raw["command"] = raw["command"].replace("--clock-scale 10", f"--clock-scale 50 {engine_args}")
    raw["pool"] = 1
    (pytester.path / "profile.yaml").write_text(yaml.safe_dump(raw))
    (pytester.path / "configs.yaml").write_text(MATRIX)
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={pytester.path / 'profile.yaml'}",
        f"--ddtree-matrix={pytester.path / 'configs.yaml'}", f"--ddtree-results={pytester.path / 'results'}",
        f"--ddtree-baselines={pytester.path / 'baselines'}", f"--ddtree-config={CONFIGS}", "--ddtree-repeats=3",
        "-p", "no:cacheprovider", "-p", "no:randomly", timeout=240,
    )
    result.assert_outcomes(passed=3, warnings=3)
    payload: dict[str, Any] = json.loads((pytester.path / "results" / "results.json").read_text())
    payload["stdout"] = result.stdout.str()
    payload["html"] = (pytester.path / "results" / "report.html").read_text()
    payload["raw_records"] = [json.loads(line) for line in (pytester.path / "results" / "records-main.jsonl").read_text().splitlines()]
    return payload


@pytest.mark.slow
def test_ignored_topk_and_window_are_reported_as_without_effect(pytester: pytest.Pytester, repo_root: Path) -> None:
    payload = run_sweep(pytester, repo_root, "--fault unused-config=topk,unused-config=window")
    found = {(f["field"], tuple(f["configs"])) for f in payload["no_effect"]}
    assert found == {("topk", ("bs8_b12_k1_wnone", "bs8_b12_k4_wnone")), ("window", ("bs8_b12_k4_w4", "bs8_b12_k4_wnone"))}
    assert "ddtree config fields without effect" in payload["stdout"]
    assert "topk shows no effect on this build: bs8_b12_k1_wnone and bs8_b12_k4_wnone" in payload["stdout"]
    assert "window shows no effect on this build" in payload["html"]
    applied = payload["applied"]["bs8_b12_k4_wnone"]
    assert applied["topk"]["status"] == "reported; shows no effect on this build"
    assert applied["window"]["status"] == "reported; shows no effect on this build"
    assert "ddtree applied, by evidence" in payload["stdout"]
    # what behaviour did prove is in the applied column; topk and window are never "proven"
    # the ready launches of the configs (not a start that lost its port, not the non-speculative control)
    launches = [r["launch"] for r in payload["records"]
                if r.get("kind") == "launch" and r["launch"].get("outcome") == "ready" and r["launch"]["config"] in CONFIGS]
    assert {launch["config"] for launch in launches} == set(CONFIGS.split(","))
    for launch in launches:
        fields = launch["applied_evidence"]["fields"]
        assert fields["budget"]["status"] == "proven by behaviour"
        assert fields["topk"]["status"] == fields["window"]["status"] == "reported"
    assert "budget proven by behaviour" in payload["html"]
    # acceptance by depth, per config and cell, in results.json and in the report
    cell = payload["throughput"][0]
    shares = cell["acceptance_by_depth"]
    assert 1 <= len(shares) <= 7 and all(0 < s <= 1 for s in shares) and shares == sorted(shares, reverse=True)
    # summed over every valid repeat, retaken ones too (greedy acceptance does not depend on the host's
    # speed): each repeat verified the same number of times, which is the cell's count where it was judged
    record = next(r for r in payload["raw_records"] if r.get("kind") == "throughput"
                  and (r["config"], r["cell"]) == (cell["config"], cell["cell"]))
    per_repeat = {sum(h) for h in record["repeat_histograms"]}
    assert len(per_repeat) == 1 and sum(cell["accept_histogram"]) == per_repeat.pop() * len(record["repeat_histograms"])
    if cell.get("ddtree_spec_verify_ct") is not None:
        assert sum(record["repeat_histograms"][0]) == cell["ddtree_spec_verify_ct"]
    assert 'id="acceptance-by-depth"' in payload["html"]


@pytest.mark.slow
def test_a_working_topk_and_window_are_not_reported(pytester: pytest.Pytester, repo_root: Path) -> None:
    payload = run_sweep(pytester, repo_root, "")
    assert payload["no_effect"] == []
    assert "fields without effect" not in payload["stdout"]
