"""An external service running another config than the one asked fails with the key diff (#10.3).

Before: the config's tests were skipped and the run exited 0, so a sweep against a shared
deployment "passed" configs it never measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.refserver_helpers import RefServer, config_args
from tests.suite_helpers import REFERENCE_PROFILE, run_suite


def test_external_service_on_another_config_fails_with_the_diff(pytester: pytest.Pytester, tmp_path: Path) -> None:
    server = RefServer(config_args("bs8_b8_k4_w2048"), tmp_path).wait_ready()
    try:
        raw = yaml.safe_load(REFERENCE_PROFILE.read_text())
        profile = tmp_path / "external.yaml"
        profile.write_text(yaml.safe_dump({
            "name": "shared", "controller": "external", "url": server.url, "port": server.port,
            "default_window": raw["default_window"], "config_args": raw["config_args"], "applied": raw["applied"],
            "health_path": "/health", "lossless": "golden",
        }))
        result = run_suite(pytester, profile, "-k", "answers_health", suite="test_health.py", config="bs8_b8_k4,bs8_b12_k4")
    finally:
        server.stop()
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    assert outcomes.get("skipped", 0) == 0
    assert outcomes["passed"] == 1 and outcomes["errors"] == 1  # bs8_b8_k4 runs; bs8_b12_k4's fixture fails
    result.stdout.fnmatch_lines([
        "*service does not run config bs8_b12_k4*external service*",
        "*speculative_num_draft_tokens*12*8*",
        "*never restarts an external service*",
    ])
