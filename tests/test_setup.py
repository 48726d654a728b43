"""The set-up a user follows: README's commands, what .ci/run installs, the package metadata."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_main_job_installs_the_package_alone_and_ci_installs_as_the_readme_says() -> None:
    readme = (REPO / "README.md").read_text()
    assert "pip install -e . && pytest suites --ddtree-config=bs8_b8_k4" in readme
    tests_line = re.search(r"pip install -e '\.\[test\]' && (pytest tests .*)", readme)
    assert tests_line is not None, "README's command for the plugin's own tests"
    ci = (REPO / ".ci" / "run").read_text()
    assert "python -m pip install --quiet -e '.[test]'" in ci
    assert f"python -m {tests_line.group(1).split(' -n')[0]}" in ci and "-n 2 --dist loadfile" in ci


def test_the_license_is_an_spdx_expression_the_build_backend_reads() -> None:
    """A table ``license`` stops building on setuptools' 2027-02-18 deadline; the SPDX string
    needs setuptools 77 (PEP 639), and a license classifier beside it is an error there."""
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2.0"$', text, re.M), "an SPDX license string in [project]"
    assert "License ::" not in text
    requires = re.search(r"^requires = \[(.*)\]", text, re.M)
    assert requires is not None
    minimum = re.search(r'"setuptools>=(\d+)', requires.group(1))
    assert minimum is not None and int(minimum.group(1)) >= 77
