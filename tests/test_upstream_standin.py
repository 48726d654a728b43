"""The throughput gate against a server that answers like upstream SGLang, not like our engine.

``tests/fakes/standin_server.py`` has no vocab_size anywhere, a ``/tokenize``, spec fields on the
finished chunk only and a lagging ``avg_spec_accept_length`` (absent after a flush, refreshed
every 40 decode batches). The main job's throughput cells (the shipped ``suites/configs.yaml``)
must all measure against it: exact prompt lengths, the accept length of the requests themselves;
and with speculation off, the cells must fail saying so.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.fakes.standin_server import verify_steps  # the stand-in's own rule, for the expected ratio
from tests.suite_helpers import MATRIX, run_suite
from tests.service_helpers import standin_profile

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py


def records(pytester: pytest.Pytester, kind: str) -> list[dict[str, Any]]:
    out = []
    for path in (pytester.path / "results").glob("records-*.jsonl"):
        out += [r for line in path.read_text().splitlines() if (r := json.loads(line)).get("kind") == kind]
    return out


@pytest.mark.slow
def test_every_main_job_cell_measures_against_an_upstream_like_server(pytester: pytest.Pytester) -> None:
    workloads = yaml.safe_load(MATRIX.read_text())["cells"]
    result = run_suite(pytester, standin_profile(pytester.path), suite="test_throughput.py", timeout=300)
    assert result.ret == 0, result.stdout.str()[-3000:]
    assert result.parseoutcomes().get("passed") == len(workloads), result.parseoutcomes()
    result.stdout.fnmatch_lines(["*ddtree throughput sweep*", "*c1_long*documents via /tokenize*"])

    contexts = {w["name"]: int(w["context_tokens"]) for w in workloads}
    cells = {r["cell"]: r for r in records(pytester, "throughput")}
    assert set(cells) == set(contexts)
    for name, cell in cells.items():
        # measured (a noisy shared machine may leave a cell's interval wide: inconclusive, not invalid)
        assert cell["measurement_status"] in ("valid", "inconclusive"), (name, cell.get("problems"))
        assert cell["workload"]["prompts"].endswith("via /tokenize")
    repeats = records(pytester, "throughput-repeat")
    assert len(repeats) >= 3 * len(contexts)
    expected = 64 / verify_steps(64)  # every request: 64 tokens, the first from prefill
    for data in repeats:
        m = data["metrics"]
        assert data["problems"] == [], data["problems"]
        # the server's own count of every request's prompt equals the cell's context length
        assert m["ddtree_server_input_tokens"] == m["total_input_tokens"] == m["completed"] * contexts[data["cell"]]
        # the gated figure is the requests' ratio, whatever the lagging server average says
        assert m["ddtree_tokens_per_verify"] == pytest.approx(expected), data["cell"]
        assert m["ddtree_spec_verify_ct"] == m["completed"] * verify_steps(64)
        server = m["accept_length"]  # bench_serving's accept_length: the server's average
        assert server is None or server != pytest.approx(expected, abs=1e-9)
    # the lagging average was recorded beside it (information), and it is not the requests' ratio
    assert any(rec["metrics"]["accept_length"] is not None for rec in repeats)


def test_speculation_off_fails_every_cell_with_the_reason(pytester: pytest.Pytester) -> None:
    # no copy probe: the cells themselves must see it (the probe would fail the launch first, below)
    profile = standin_profile(pytester.path, "--fault spec-off", copy_probe=False)
    result = run_suite(pytester, profile, "--ddtree-cell=c1_short", "--ddtree-cell=c8_short", suite="test_throughput.py", timeout=300)
    assert result.ret == 1
    assert result.parseoutcomes().get("failed") == 2, result.parseoutcomes()
    result.stdout.fnmatch_lines(["*carry no spec_verify_ct*the server does not speculate*"])


def test_speculation_off_fails_the_launch_at_the_copy_probe(pytester: pytest.Pytester) -> None:
    """/server_info says DFLASH with every applied key, but no answer carries a spec_* key."""
    result = run_suite(pytester, standin_profile(pytester.path, "--fault spec-off"), suite="test_health.py", timeout=120)
    assert result.ret == 1 and result.parseoutcomes().get("errors") == 3, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*service reports config bs8_b8_k4 in /server_info but does not serve it*",
                                 "*the server does not speculate: the copy probe's answer carries no spec_* key*"])


def test_random_prompts_without_vocab_size_fail_with_the_fix(pytester: pytest.Pytester) -> None:
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(yaml.safe_dump({
        "default": "bs8_b8_k4", "matrix": ["bs8_b8_k4"],
        "cells": [{"name": "c1_rand", "concurrency": 1, "context_tokens": 32, "output_tokens": 8, "requests": 2,
                       "prompts": "random"}]}))
    result = run_suite(pytester, standin_profile(pytester.path), f"--ddtree-matrix={matrix}", suite="test_throughput.py")
    assert result.parseoutcomes().get("failed") == 1, result.parseoutcomes()
    result.stdout.fnmatch_lines(["*c1_rand: prompts: random needs vocab_size in the service profile*"])
