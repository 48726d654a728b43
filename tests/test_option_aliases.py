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
