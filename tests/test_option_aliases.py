"""A renamed option's old spelling (``Option.aliases``) still works and says the new one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree import options


class _Config:
    """What resolve_settings reads of a pytest config: the given options and ini keys by dest."""

    def __init__(self, root: Path, given: dict[str, Any], ini: dict[str, Any] | None = None) -> None:
        self.rootpath, self.given, self.ini = root, given, ini or {}

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.given.get(name, default)

    def getini(self, name: str) -> Any:
        return self.ini.get(name)


def test_the_old_flag_counts_as_the_new_one_and_leaves_a_note(tmp_path: Path) -> None:
    settings = options.resolve_settings(_Config(tmp_path, {"ddtree_workload": ["c1_short"]}))
    assert settings.cells == ("c1_short",)
    assert settings.deprecated == ("--ddtree-workload is deprecated: use --ddtree-cell (same values)",)


def test_both_spellings_of_a_repeatable_option_add_up(tmp_path: Path) -> None:
    settings = options.resolve_settings(_Config(tmp_path, {"ddtree_cell": ["c8_*"], "ddtree_workload": ["c1_short"]}))
    assert settings.cells == ("c8_*", "c1_short")
    assert len(settings.deprecated) == 1


def test_the_new_spelling_alone_leaves_no_note(tmp_path: Path) -> None:
    settings = options.resolve_settings(_Config(tmp_path, {"ddtree_cell": ["c1_short"]}))
    assert settings.cells == ("c1_short",) and settings.deprecated == ()


def test_an_aliased_ini_key_is_read_and_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An option with an ini key gets its old ini key too (the repeats option, renamed here for the test)."""
    renamed = dataclasses.replace(options.OPTION["repeats"], aliases=("repeat_count",))
    monkeypatch.setitem(options.OPTION, "repeats", renamed)
    monkeypatch.setattr(options, "OPTIONS", tuple(renamed if o.name == "repeats" else o for o in options.OPTIONS))
    settings = options.resolve_settings(_Config(tmp_path, {}, {"ddtree_repeat_count": "5"}))
    assert settings.repeats == 5
    assert settings.deprecated == ("--ddtree-repeat-count (ini ddtree_repeat_count) is deprecated: use --ddtree-repeats",)
    assert options.resolve_settings(_Config(tmp_path, {"ddtree_repeats": 4}, {"ddtree_repeat_count": "5"})).repeats == 4

    registered: list[str] = []

    class _Group:
        def addoption(self, *opts: str, **attrs: Any) -> None:
            registered.extend(opts)

    class _Parser:
        def getgroup(self, name: str, description: str = "") -> _Group:
            return _Group()

        def addini(self, name: str, help: str, type: Any = None, default: Any = None) -> None:
            registered.append(name)

    options.add_options(_Parser())
    assert {"--ddtree-repeats", "--ddtree-repeat-count", "ddtree_repeats", "ddtree_repeat_count"} <= set(registered)


def test_the_old_flag_warns_in_a_run(pytester: pytest.Pytester, repo_root: Path) -> None:
    """Through pytest: the value reaches the cell selection (its usage error names the new flag), and a
    run that goes on shows the PytestDeprecationWarning."""
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    pass\n")
    args = [f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}",
            f"--ddtree-service={repo_root / 'suites' / 'services' / 'reference.yaml'}", "-p", "no:cacheprovider"]
    typo = pytester.runpytest_subprocess("--ddtree-workload=c1_shrt", *args)
    assert typo.ret == pytest.ExitCode.USAGE_ERROR
    typo.stderr.fnmatch_lines(["*--ddtree-cell 'c1_shrt' matches no cell*did you mean 'c1_short'*"])
    ran = pytester.runpytest_subprocess("--ddtree-workload=c1_short", "--collect-only", "-q", *args)
    assert ran.ret == 0, ran.stderr.str()
    ran.stdout.fnmatch_lines(["*PytestDeprecationWarning: --ddtree-workload is deprecated: use --ddtree-cell*"])


def test_the_matrix_reads_its_old_keys_with_a_warning(tmp_path: Path) -> None:
    """configs.yaml's ``workloads:``, ``workload_defaults:`` and rate_search's ``workload:`` still load,
    as ``cells:``, ``cell_defaults:`` and ``cell:``, each with a FutureWarning saying the new name."""
    from pytest_ddtree.measure.matrix import load_matrix

    cells = "  - {name: c1, concurrency: 1, context_tokens: 64, requests: 2}\n  - {name: r4, max_concurrency: 4, " \
            "context_tokens: 64, requests: 4, request_rate: 4}\n"
    new, old = tmp_path / "new.yaml", tmp_path / "old.yaml"
    new.write_text("cell_defaults: {output_tokens: 16}\ncells:\n" + cells + "rate_search: {cell: r4, min_rate: 1, max_rate: 8}\n")
    old.write_text("workload_defaults: {output_tokens: 16}\nworkloads:\n" + cells + "rate_search: {workload: r4, min_rate: 1, max_rate: 8}\n")
    with pytest.warns(FutureWarning) as caught:
        read_old = load_matrix(old)
    assert sorted(str(w.message).split(": ", 1)[1] for w in caught) == [
        "'workload_defaults' is deprecated: call it 'cell_defaults' (same contents)",
        "'workloads' is deprecated: call it 'cells' (same contents)",
        "rate_search's 'workload' is deprecated: call it 'cell' (same contents)"]
    read_new = load_matrix(new)
    assert read_old.cells == read_new.cells and read_old.cells[0].output_tokens == 16
    assert read_old.rate_search is not None and read_new.rate_search is not None
    assert read_old.rate_search[0] == read_new.rate_search[0]


def test_a_matrix_with_both_spellings_of_a_key_is_an_error(tmp_path: Path) -> None:
    from pytest_ddtree.configs import ConfigError
    from pytest_ddtree.measure.matrix import load_matrix

    both = tmp_path / "both.yaml"
    both.write_text("workloads: []\ncells: []\n")
    with pytest.raises(ConfigError, match="both 'workloads' and 'cells'"):
        load_matrix(both)
