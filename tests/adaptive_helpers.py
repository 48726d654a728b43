"""The adaptive sweep's matrix and the check of its records, shared by the adaptive plugin and
stand-in tests.

Why a helper module and not the test module itself: a test module importing another one ties
two test files together (the other's module-level set-up runs wherever it is imported, and a
rename there breaks tests elsewhere); tests/test_codebase.py holds test modules to importing
helpers only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.service.manager import REFERENCE_LABEL
from tests.suite_helpers import MATRIX


# -- end to end: the real plugin, real engines -------------------------------------------------
SWEEP = {"block_size": 8, "budget": [4, 8, 12, 16], "topk": [4, 6], "window": ["default", "none"]}
LIMIT_LINE = re.compile(r"adaptive sweep: (\d+) restarts spent \(service launches\) of (\d+) a full sweep would take")


def sweep_matrix(directory: Path, workloads: list[dict[str, Any]]) -> Path:
    """The shipped 18-config matrix with this test's (few, short) cells."""
    path = directory / "configs.yaml"
    defaults = yaml.safe_load(MATRIX.read_text())["cell_defaults"]  # output length, prompts
    path.write_text(yaml.safe_dump({"default": "bs8_b8_k4", "matrix": [SWEEP, "bs16_b16_k4", "bs16_b32_k8"],
                                    "cell_defaults": defaults, "cells": workloads}))
    return path


def _records(results: Path, kind: str) -> list[dict[str, Any]]:
    return [r for path in results.glob("records-*.jsonl") for line in path.read_text().splitlines()
            if (r := json.loads(line)).get("kind") == kind]


def check_sweep(result: pytest.RunResult, results: Path, limit: int, cells: int) -> dict[str, Any]:
    """What every adaptive session must show: launches == the printed count (at most the limit:
    the advisor stops early once every cell's best is decided), predicted rows with intervals in
    results.json, recommendations among the measured configs."""
    text = result.stdout.str()
    printed = LIMIT_LINE.search(text)
    assert printed, text[-3000:]
    launches = [r for r in _records(results, "launch") if r.get("config") != REFERENCE_LABEL]
    restarts = len(launches)
    assert restarts == int(printed.group(1)) and 3 <= restarts <= limit, (restarts, printed.group(0))
    assert int(printed.group(2)) == 18
    payload: dict[str, Any] = json.loads((results / "results.json").read_text())
    sweep = payload["adaptive_sweep"]
    assert sweep["restarts"] == restarts == len(sweep["measured"])
    assert sorted(sweep["measured"]) == sorted({r["config"] for r in launches})
    predicted = payload["predicted"]
    assert len(predicted) == (18 - restarts) * cells
    for row in predicted:
        low, high = row["output_throughput_interval"]
        assert row["predicted"] is True and row["status"] == "predicted"
        assert row["config"] not in sweep["measured"]
        assert 0 < low <= row["output_throughput"] <= high
    assert {r["config"] for r in payload["throughput"]} == set(sweep["measured"])  # predicted rows are apart
    assert len(sweep["recommendations"]) == cells
    assert all(rec["config"] in sweep["measured"] for rec in sweep["recommendations"])
    assert f"{(18 - restarts) * cells} deselected" in text
    assert text.count(" predicted\n") >= len(predicted)  # the sweep table's rows
    return payload
