"""The ``pytest_ddtree_*`` hooks a project implements (pytest_ddtree/hookspec.py), through pytester."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_ddtree.records.words import RecordKind
from tests.suite_helpers import REPO, reference_profile, run_suite


def test_a_conftest_names_the_hardware_profile_and_the_baselines_are_filed_under_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_ddtree_hardware_profile(config, fingerprint):\n"
        "    assert fingerprint.name == 'refserver', fingerprint  # what the harness would have used\n"
        "    assert fingerprint.build['engine_version'].startswith('refserver')\n"
        "    return 'rack 7/' + config.getoption('ddtree_config')[0]  # made safe as a folder name\n"
    )
    pytester.makepyfile(test_named="def test_store(ddtree_baselines):\n"
                                   "    assert ddtree_baselines.hardware_profile == 'rack-7-bs8_b8_k4'\n")
    result = run_suite(pytester, reference_profile(pytester.path))
    result.assert_outcomes(passed=1)


def test_an_implementation_with_an_argument_the_hook_lacks_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_ddtree_hardware_profile(config, fingerprint, rack):\n    return None\n")
    pytester.makepyfile(test_named="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*pytest_ddtree_hardware_profile*rack*"])


HOOKS_PLUGIN = '''
import json, pathlib

def _write(**call):
    with pathlib.Path("hooked.jsonl").open("a") as out:
        out.write(json.dumps(call) + "\\n")

def pytest_ddtree_cell_measured(config, ddtree_config, cell, figures, samples):
    _write(hook="cell_measured", ddtree_config=ddtree_config, cell=cell, figures=figures, samples=samples)

def pytest_ddtree_verdict(config, ddtree_config, cell, verdict):
    _write(hook="verdict", ddtree_config=ddtree_config, cell=cell, verdict=verdict)
'''


def _hooked_session(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, list[dict[str, Any]]]:
    """The throughput suite on one config and one cell (no control, no baseline) with HOOKS_PLUGIN:
    its result and the hooks' calls, in order."""
    matrix = pytester.path / "configs.yaml"
    matrix.write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4]\ncell_defaults: {output_tokens: 16}\ncells:\n"
                      "  - {name: c1_tiny, concurrency: 1, context_tokens: 32, requests: 2, warmup_requests: 1}\n")
    (pytester.path / "hooks_plugin.py").write_text(HOOKS_PLUGIN)
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_throughput.py"), f"--ddtree-service={reference_profile(pytester.path, control='none')}",
        f"--ddtree-matrix={matrix}", f"--ddtree-results={pytester.path / 'results'}",
        f"--ddtree-baselines={pytester.path / 'baselines'}", "--ddtree-config=bs8_b8_k4", "--ddtree-cell=c1_tiny",
        "-p", "hooks_plugin", "-p", "no:cacheprovider", *args, timeout=120)
    calls = [json.loads(line) for line in (pytester.path / "hooked.jsonl").read_text().splitlines()]
    assert [(c["hook"], c["ddtree_config"], c["cell"]) for c in calls] == [
        ("cell_measured", "bs8_b8_k4", "c1_tiny"), ("verdict", "bs8_b8_k4", "c1_tiny"), ("verdict", None, None)], calls
    return result, calls


def test_a_plugin_hears_each_cell_measured_and_each_verdict_made(pytester: pytest.Pytester) -> None:
    """The cell's figures and samples as its record has them, its verdict (a warning: no baseline
    yet) and then the session's, in that order."""
    result, (measured, cell_verdict, session_verdict) = _hooked_session(pytester)
    assert result.ret == 0, result.stdout.str()
    results = pytester.path / "results"
    summary = json.loads((results / "results.json").read_text())
    (record,) = [r for path in results.glob("records-*.jsonl") for line in path.read_text().splitlines()
                 if (r := json.loads(line))["kind"] == RecordKind.THROUGHPUT]
    assert measured["figures"] == record["metrics"] and measured["figures"]["output_throughput"] > 0
    assert measured["samples"] == record["samples"] and len(measured["samples"]["output_throughput"]) == record["repeats"]
    verdict = cell_verdict["verdict"]
    assert verdict["decision"] == "warn" and "create it with" in verdict["message"], verdict
    assert {k: verdict[k] for k in ("cell", "status", "reasons", "metrics")} == record["verdict"]
    assert session_verdict["verdict"] == {"decision": "pass", "message": summary["verdict"], "failed_checks": []}


def test_a_failed_cell_and_its_failed_session_reach_the_verdict_hook(pytester: pytest.Pytester) -> None:
    """--ddtree-require-baselines: the same cell, with no baseline, fails, and so does the session."""
    result, (_, cell_verdict, session_verdict) = _hooked_session(pytester, "--ddtree-require-baselines")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert cell_verdict["verdict"]["decision"] == "fail", cell_verdict
    assert cell_verdict["verdict"]["message"].endswith("(--ddtree-require-baselines)"), cell_verdict
    verdict = session_verdict["verdict"]
    assert verdict["decision"] == "fail" and verdict["message"].startswith("FAILED: 1 test(s) failed"), verdict
