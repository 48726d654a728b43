"""A profile maps any axis to flags or environment, says which values it can express, and reads
each back from /server_info: the allowed/fixed/reason machinery per axis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.profile import ProfileError, SelectionError, ServiceProfile, load_profile, parse_profile


def _profile(**changes: Any) -> ServiceProfile:
    raw: dict[str, Any] = {
        "name": "axes", "controller": "process", "url": "http://127.0.0.1:{port}", "port": "auto",
        "command": "serve --port {port} {config_args}",
        "config_args": {
            "budget": "--speculative-num-draft-tokens {value+1}",
            "topk": "--speculative-eagle-topk {value}",
            "steps": "--speculative-num-steps {value}",
            "overlap": {"on": "", "off": "--disable-overlap-schedule"},
            "attention_backend": "--attention-backend {value}",
        },
        "config_env": {"max_nodes": {"SGLANG_DFLASH_MAX_NUM_NODES": "{value}"}},
        "fixed": {"block_size": None, "window": None},
        "allowed": {"attention_backend": ["fa3", "flashinfer"]},
        "budget_counts_root": True,
        "applied": {"speculative_num_draft_tokens": "budget + 1", "speculative_eagle_topk": "topk",
                    "speculative_num_steps": "steps", "disable_overlap_schedule": "not overlap",
                    "attention_backend": "attention_backend"},
        "unverifiable": {"max_nodes": "read by the worker from its environment"},
    }
    raw.update(changes)
    return parse_profile(raw)


def test_each_axis_reaches_the_launch_by_its_template_or_its_value_map() -> None:
    profile = _profile()
    config = parse_config_name("b7_k4_steps3_nodes64_attnfa3_overlapoff")
    assert profile.render_config_args(config) == [
        "--speculative-num-draft-tokens", "8", "--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
        "--attention-backend", "fa3", "--disable-overlap-schedule"]
    assert profile.render_env(config)["SGLANG_DFLASH_MAX_NUM_NODES"] == "64"
    assert profile.render_config_args(parse_config_name("b7_k4_steps3_overlapon")) == [
        "--speculative-num-draft-tokens", "8", "--speculative-eagle-topk", "4", "--speculative-num-steps", "3"]
    assert profile.expected_applied(config) == {
        "speculative_num_draft_tokens": 8, "speculative_eagle_topk": 4, "speculative_num_steps": 3,
        "disable_overlap_schedule": True, "attention_backend": "fa3"}
    # an axis the name leaves out is the build's own: nothing is passed, nothing expected of it
    assert "speculative_num_steps" not in profile.expected_applied(parse_config_name("b7_k4"))
    how = profile.how_fields_reach_the_service()
    assert how["overlap"].startswith("flags on: (none), off: --disable-overlap-schedule")
    assert "unverifiable" in how["max_nodes"] and how["steps"].startswith("flag --speculative-num-steps")


def test_what_a_build_cannot_express_is_refused_per_axis_with_the_reason() -> None:
    profile = _profile()
    reasons = dict(profile.why_not(parse_config_name("b7_k4_steps3_attntriton")))
    assert "accepts attention_backend fa3, flashinfer only" in reasons["attention_backend"]
    reasons = dict(profile.why_not(parse_config_name("b7_k4_steps3_tw2")))
    assert "has no flag for tree_width" in reasons["tree_width"]
    with pytest.raises(SelectionError, match="tree_width"):
        profile.check_selection([parse_config_name("b7_k4_tw2")])
    assert profile.why_not(parse_config_name("b7_k4_steps3_attnflashinfer")) == []


def test_a_fixed_axis_may_follow_another_axis() -> None:
    profile = _profile(fixed={"block_size": "steps + 1", "window": None})
    assert profile.why_not(parse_config_name("bs4_b7_k4_steps3")) == []
    (field, reason), = profile.why_not(parse_config_name("bs8_b7_k4_steps3"))
    assert field == "block_size" and "= steps + 1 (4 here" in reason


@pytest.mark.parametrize("changes, message", [
    ({"config_args": {"stpes": "--x {value}"}}, "config_args.stpes: unknown config field; did you mean 'steps'"),
    ({"config_args": {"steps": "--x {value}", "overlap": {"maybe": "--y"}}}, "config_args.overlap.maybe: overlap must be on or off"),
    ({"config_args": {"steps": {"1": "--y"}}}, "a mapping of values to flags is for a choice or bool axis"),
    ({"config_args": {"attention_backend": "--a {value+1}"}}, r"\{value\+N\} adds to a number"),
    ({"allowed": {"attention_backend": ["fa9"]}}, "allowed.attention_backend: must list values the build accepts"),
    ({"applied": {"x": "not steps"}}, "applied.x: must name a config field"),
])
def test_mapping_errors_name_the_key_and_the_valid_choice(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        _profile(**changes)


def test_a_profile_declares_an_axis_of_its_own(tmp_path: Path) -> None:
    profile = _profile(axes=[{"name": "depth_bonus_p", "token": "dbp", "type": "int"}],
                       config_env={"depth_bonus_p": {"SGLANG_DDTREE_DEPTH_BONUS": "{value}"}},
                       unverifiable={"depth_bonus_p": "an environment variable"})
    assert [a.name for a in profile.declared_axes] == ["depth_bonus_p"]
    assert profile.render_env(parse_config_name("b7_k4_dbp2"))["SGLANG_DDTREE_DEPTH_BONUS"] == "2"
    path = tmp_path / "p.yaml"
    path.write_text("name: x\ncontroller: external\nurl: http://h:1\naxes: [{name: steps, token: st, type: int}]\n")
    with pytest.raises(ProfileError, match="already"):
        load_profile(path)


def test_the_forks_tree_algorithm_is_an_axis_of_its_profile(repo_root: Path) -> None:
    """SubSir's sweep sets SGLANG_DFLASH_TREE_ALGO per launch: named, it reaches the environment and
    makes another launch; left out, the variable is not set (the fork's own default)."""
    profile = load_profile(repo_root / "suites" / "services" / "sglang-subsir-tree-verify-flags.yaml")
    fused, ddtree, plain = (parse_config_name(n) for n in ("bs8_b8_k4_algofused", "bs8_b8_k4_algoddtree", "bs8_b8_k4"))
    assert profile.render_env(ddtree)["SGLANG_DFLASH_TREE_ALGO"] == "ddtree"
    assert "SGLANG_DFLASH_TREE_ALGO" not in profile.render_env(plain)
    assert len({profile.launch_identity(c) for c in (fused, ddtree, plain)}) == 3
    profile.check_selection([fused, ddtree, plain])
    assert "tree_algo" in profile.unverifiable
