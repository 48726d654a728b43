"""The axes grammar: names are one-to-one for every axis type, old names and baselines still load,
globs and ``all`` select over any axis, and configs.yaml / a profile declare axes of their own."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree import axes
from pytest_ddtree.baselines import BaselineStore
from pytest_ddtree.configs import DEFAULT_WINDOW, ConfigError, DDTreeConfig, config_in_nodeid, parse_config_name
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.selection import select
from pytest_ddtree.service.profile import parse_profile


def _value(axis: axes.Axis, rng: random.Random) -> Any:
    """One value of ``axis``, drawn to hit its edges: the minimum, big numbers, none, every word."""
    if axis.type == "bool":
        return rng.random() < 0.5
    if axis.type == "choice":
        return rng.choice(axis.values) if axis.values else rng.choice(["x", "a1", "fused9", "zz"])
    if axis.values:
        return rng.choice(axis.values)
    if axis.type == "window" and rng.random() < 0.25:
        return None
    return rng.choice([axis.minimum, axis.minimum + 1, rng.randint(axis.minimum, 64), rng.randint(100, 10**6)])


def _random_config(rng: random.Random, catalogue: tuple[axes.Axis, ...]) -> DDTreeConfig:
    chosen = [a for a in catalogue if rng.random() < 0.4] or [rng.choice(catalogue)]
    return DDTreeConfig.of({a.name: _value(a, rng) for a in chosen})


def test_every_axis_type_is_in_the_catalogue() -> None:
    assert {a.type for a in axes.catalogue()} == set(axes.AXIS_TYPES)
    assert [a.token for a in axes.CORE] == ["bs", "b", "k", "w"]


@pytest.mark.parametrize("seed", range(8))
def test_parse_of_name_is_the_config_for_generated_values_of_every_axis(seed: int) -> None:
    """Property: for configs over random subsets of the catalogue with values drawn per axis type,
    parse(name(c)) == c, and the axis values survive (not just the string)."""
    rng = random.Random(seed)
    catalogue = axes.catalogue()
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(300):
        config = _random_config(rng, catalogue)
        parsed = parse_config_name(config.name)
        assert parsed == config and parsed.name == config.name
        assert parsed.values() == config.values(), config.name
        assert "-" not in config.name  # test ids join parameters with -
        # one-to-one: a name met before stands for the same values
        assert seen.setdefault(config.name, config.values()) == config.values()


def test_each_axis_alone_and_its_edge_values() -> None:
    for axis in axes.catalogue():
        values = list(axis.values) or ([axis.minimum, 7, 123456] + ([None] if axis.type == "window" else []))
        if axis.type == "bool":
            values = [True, False]
        if axis.type == "choice" and not axis.values:
            values = ["x", "w2", "none"]
        for value in values:
            config = DDTreeConfig.of({axis.name: value})
            assert parse_config_name(config.name).values() == {axis.name: value}, (axis.name, value)


def test_a_choice_value_with_underscores_is_written_without_them() -> None:
    config = DDTreeConfig.of({"block_size": 8, "budget": 8, "topk": 4, "attention_backend": "trtllm_mha", "overlap": False})
    assert config.name == "bs8_b8_k4_attntrtllmmha_overlapoff"
    assert parse_config_name(config.name).values()["attention_backend"] == "trtllm_mha"


@pytest.mark.parametrize("bad, why", [
    ("bs8_b8_k4_steps03", "whole number"),          # leading zero
    ("bs8_b8_k4_overlapyes", "on or off"),
    ("bs8_b8_k4_attnfa9", "takes one of"),
    ("bs8_b8_k4_algoddtrees", "takes one of"),
    ("steps3_bs8_b8_k4", "canonical"),               # out of catalogue order
    ("bs8_b8_k4_steps3_steps4", "twice"),
    ("bs8_b8_k4_stpes3", "did you mean"),
])
def test_names_that_are_not_one_config_are_refused_with_the_reason(bad: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_config_name(bad)


def test_old_names_mean_what_they_always_meant() -> None:
    assert parse_config_name("bs8_b8_k4") == DDTreeConfig(8, 8, 4)
    assert parse_config_name("bs8_b8_k4").window is DEFAULT_WINDOW
    assert parse_config_name("bs8_b12_k6_wnone") == DDTreeConfig(8, 12, 6, None)
    assert parse_config_name("bs8_b12_k6_w2048") == DDTreeConfig(8, 12, 6, 2048)
    assert parse_config_name("bs8_b8_k4").sort_key()[:4] == (8, 8, 4, -1)


def test_the_committed_baselines_load_unchanged(repo_root: Path) -> None:
    """Migration: every baseline file in baselines/ is found under its old name, parses to a config
    whose name is the file's, and loads; the files are byte-for-byte what git has."""
    files = sorted((repo_root / "baselines").glob("*/*.yaml"))
    assert files
    configs = 0
    for path in files:
        store = BaselineStore(repo_root / "baselines", path.parent.name)
        if path.stem != "control":  # the control's own baseline is named for what it is
            config = parse_config_name(path.stem)
            assert config.name == path.stem and config.extra == () and config.tree_shape() is not None
            assert store.path_for(config.name) == path
            configs += 1
        data = store.load(path.stem)
        assert isinstance(data, dict) and data, path
    assert configs >= 18
    changed = subprocess.run(["git", "status", "--porcelain", "baselines"], cwd=repo_root, capture_output=True,
                             text=True, check=True).stdout
    assert changed == ""


def test_globs_and_all_select_over_any_axis(tmp_path: Path, repo_root: Path) -> None:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    raw["config_args"].update(steps="--speculative-num-steps {value}", overlap={"on": "", "off": "--disable-overlap-schedule"})
    raw["applied"].update(speculative_num_steps="steps", disable_overlap_schedule="not overlap")
    build = parse_profile(raw)  # the engine's flags, and a flag for each of the two axes
    path = tmp_path / "configs.yaml"
    path.write_text("default: bs8_b8_k4\n"
                    "matrix:\n"
                    "  - {block_size: 8, budget: 8, topk: 4, steps: [2, 3], overlap: [on, off]}\n"
                    "  - {budget: 7, topk: [1, 4], steps: 3}\n")
    matrix = load_matrix(path)
    names = matrix.names()
    assert "bs8_b8_k4_steps3_overlapoff" in names and "b7_k4_steps3" in names
    assert len(select(["all"], matrix, build).configs) == len(names) == 7
    assert {c.name for c in select(["*_steps3*"], matrix, build).configs} == {
        "bs8_b8_k4_steps3_overlapon", "bs8_b8_k4_steps3_overlapoff", "b7_k1_steps3", "b7_k4_steps3"}
    assert {c.name for c in select(["*overlapoff"], matrix, build).configs} == {"bs8_b8_k4_steps2_overlapoff",
                                                                              "bs8_b8_k4_steps3_overlapoff"}


def test_configs_yaml_declares_an_axis_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "configs.yaml"
    path.write_text("axes:\n  - {name: depth_bonus, token: dbonus, type: int}\n"
                    "default: bs8_b8_k4\nmatrix:\n  - {block_size: 8, budget: 8, topk: 4, depth_bonus: [1, 2]}\n")
    matrix = load_matrix(path)
    assert "bs8_b8_k4_dbonus2" in matrix.names()
    assert parse_config_name("bs8_b8_k4_dbonus2").values()["depth_bonus"] == 2
    path.write_text("axes:\n  - {name: depth_bonus, token: dbonus, type: choice, values: [a]}\ndefault: bs8_b8_k4\n")
    with pytest.raises(ConfigError, match="already"):  # one axis means one thing in a process
        load_matrix(path)
    # algo takes words: "algoxfused" could be tree_algo=xfused or this axis = fused
    path.write_text("axes:\n  - {name: flavour, token: algox, type: choice, values: [fused]}\ndefault: bs8_b8_k4\n")
    with pytest.raises(ConfigError, match="ambiguous"):
        load_matrix(path)
    path.write_text("axes:\n  - {name: flavour, token: wno, type: int}\ndefault: bs8_b8_k4\n")
    with pytest.raises(ConfigError, match="ambiguous"):  # wnone: the window's none, or wno = ne?
        load_matrix(path)


def test_a_config_in_a_test_id_is_found_among_other_parameters() -> None:
    assert config_in_nodeid("suites/test_throughput.py::test_x[c1_short-b7_k4_steps3]") == "b7_k4_steps3"
    assert config_in_nodeid("suites/test_x.py::test_y[bs8_b8_k4_attnfa3-c8_short]") == "bs8_b8_k4_attnfa3"
    assert config_in_nodeid("suites/test_x.py::test_y[c1_short]") is None
