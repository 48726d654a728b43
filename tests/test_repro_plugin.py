"""The plugin wiring of --ddtree-package: a real `pytest suites` session writes a package that verifies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ddtree.repro import verify_package

REPO = Path(__file__).resolve().parent.parent


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO), "SOURCE_DATE_EPOCH": "1700000000"},
    )


def test_suite_session_writes_a_verified_package(tmp_path: Path) -> None:
    """`pytest suites --ddtree-config=bs8_b8_k4 --ddtree-package DIR` on the reference engine."""
    out = tmp_path / "pkgs"
    proc = _pytest(str(REPO / "suites" / "test_health.py"), "--ddtree-config=bs8_b8_k4",
                   "--ddtree-package", str(out), "--ddtree-package-name", "ref",
                   "--ddtree-results", str(tmp_path / "results"), cwd=REPO)
    text = proc.stdout + proc.stderr
    assert "reproduction package written and verified" in text, text[-3000:]
    pkg = out / "ref"
    report = verify_package(pkg)
    assert report.ok, report.format()
    launches = json.loads((pkg / "services/launch-commands.json").read_text())
    assert any(item["config"] == "bs8_b8_k4" and "--speculative-num-draft-tokens 8" in (item["command"] or "")
               for item in launches), launches
    assert json.loads((pkg / "configs/configs.json").read_text())["recommended"] == "bs8_b8_k4"
    assert (pkg / "bench/results.json").is_file()
    meta = json.loads((pkg / "package.json").read_text())
    assert meta["created"] == "2023-11-14T22:13:20Z"
    if proc.returncode != 0:  # a failing session still packages, and REPRODUCE.md says which tests failed
        assert meta["failed_tests"] and "FAILED" in (pkg / "REPRODUCE.md").read_text()


def test_unwritable_package_dir_is_a_usage_error_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _pytest(str(REPO / "suites" / "test_health.py"), "--ddtree-config=bs8_b8_k4",
                   "--ddtree-package", str(blocker / "sub"), "--ddtree-results", str(tmp_path / "results"), cwd=REPO)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "cannot create or write" in proc.stderr
