"""Each build runs its own part of the matrix: selection within what a profile's build expresses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_ddtree.configs import ConfigError, parse_config_name
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.selection import build_matrix, select
from pytest_ddtree.service.profile import ProfileError, SelectionError, load_profile, parse_profile

REPO = Path(__file__).resolve().parent.parent
SERVICES = REPO / "suites" / "services"
MATRIX = load_matrix(REPO / "suites" / "configs.yaml")


def names(configs: object) -> list[str]:
    return [c.name for c in configs]  # type: ignore[attr-defined]


def test_upstream_dflash_runs_the_projection_of_the_matrix() -> None:
    profile = load_profile(SERVICES / "sglang-upstream-dflash.yaml")
    build = build_matrix(profile, MATRIX)
    assert names(build.configs) == ["bs8_b7_k1", "bs8_b7_k1_wnone", "bs16_b15_k1"]
    assert build.default.name == "bs8_b7_k1"
    assert len(build.left_out) == len(MATRIX.configs)  # none of the 18 runs under its own name
    first = build.left_out[0]
    assert first.config == "bs8_b4_k4" and first.fields == ("budget", "topk") and first.runs_as == "bs8_b7_k1"
    assert "topk=4, but this build cannot set topk: it is always 1" in first.line()
    default = select(None, MATRIX, profile)
    assert names(default.configs) == ["bs8_b7_k1"]
    assert [lo.config for lo in default.left_out] == ["bs8_b8_k4"]  # the summary says why the default moved


def test_pr27509_takes_topk_from_the_budget() -> None:
    build = build_matrix(load_profile(SERVICES / "sglang-ddtree-pr27509.yaml"), MATRIX)
    assert build.default.name == "bs8_b8_k8"
    assert "bs16_b32_k32" in names(build.configs) and "bs8_b4_k4_wnone" in names(build.configs)
    assert all(c.topk == c.budget for c in build.configs)


def test_allowed_values_leave_configs_out_with_the_field_and_the_values() -> None:
    profile = load_profile(SERVICES / "sglang-dflash-tree-pr31069.yaml")
    selection = select(["all"], MATRIX, profile)
    assert all(c.topk in (4, 8, 16) for c in selection.configs) and len(selection.configs) == 10
    left = {lo.config: lo for lo in selection.left_out}
    assert set(left) == {c.name for c in MATRIX.configs if c.topk == 6}
    assert left["bs8_b8_k6"].fields == ("topk",) and left["bs8_b8_k6"].runs_as is None
    assert "topk=6, but this build accepts topk 4, 8, 16 only" in left["bs8_b8_k6"].reason
    with pytest.raises(SelectionError, match=r"bs8_b8_k6 asks topk=6, but this build accepts topk 4, 8, 16 only"):
        profile.check_selection([parse_config_name("bs8_b8_k6")])


def test_a_window_the_build_does_not_use_is_not_an_axis() -> None:
    profile = load_profile(SERVICES / "sglang-subsir-tree-verify.yaml")
    selection = select(["all"], MATRIX, profile)
    assert not any(c.name.endswith("_wnone") for c in selection.configs) and len(selection.configs) == 10
    twin = next(lo for lo in selection.left_out if lo.config == "bs8_b8_k4_wnone")
    assert twin.runs_as == "bs8_b8_k4" and "no window code" in twin.reason
    with pytest.raises(SelectionError, match="would run the same launch"):  # named together: refused
        profile.check_selection([parse_config_name("bs8_b8_k4"), parse_config_name("bs8_b8_k4_wnone")])


def test_globs_select_within_the_build_and_a_glob_it_cannot_run_is_an_error() -> None:
    profile = load_profile(SERVICES / "sglang-dflash-tree-pr31069.yaml")
    selection = select(["bs8_b8_*"], MATRIX, profile)
    assert names(selection.configs) == ["bs8_b8_k4", "bs8_b8_k4_wnone"]
    assert [lo.config for lo in selection.left_out] == ["bs8_b8_k6", "bs8_b8_k6_wnone"]
    with pytest.raises(ConfigError, match=r"(?s)'bs8_b\*_k6' selects no config this build can run.*bs8_b4_k6: topk=6"):
        select(["bs8_b*_k6"], MATRIX, profile)
    with pytest.raises(ConfigError, match="matches no config"):
        select(["bs9_*"], MATRIX, profile)


def test_the_reference_engine_runs_the_whole_matrix() -> None:
    selection = select(["all"], MATRIX, load_profile(SERVICES / "reference.yaml"))
    assert selection.configs == MATRIX.configs and not selection.left_out


def test_a_profile_can_give_its_build_its_own_matrix_and_default(tmp_path: Path) -> None:
    raw = yaml.safe_load((SERVICES / "sglang-upstream-dflash.yaml").read_text())
    raw.update(matrix=[{"block_size": 8, "budget": 7, "topk": 1, "window": [4096, "none"]}], default="bs16_b15_k1")
    profile = parse_profile(raw)
    build = build_matrix(profile, MATRIX)
    assert build.default.name == "bs16_b15_k1" and "profile's matrix" in build.origin
    assert names(build.configs) == ["bs16_b15_k1", "bs8_b7_k1_w4096", "bs8_b7_k1_wnone"]
    assert {lo.config for lo in build.left_out} == {c.name for c in MATRIX.configs}
    raw.update(matrix=[{"block_size": [8, 16], "budget": 7, "topk": 1}], default=None)
    with pytest.raises(ConfigError, match="matrix: bs16_b7_k1 asks budget=7"):
        build_matrix(parse_profile(raw), MATRIX)
    raw.update(matrix=["bs8_b8_k4"], default=None)
    with pytest.raises(ConfigError, match="matrix: bs8_b8_k4 asks budget=8"):
        build_matrix(parse_profile(raw), MATRIX)
    raw.update(matrix=[])
    with pytest.raises(ProfileError, match="matrix: lists no config"):
        parse_profile(raw)


@pytest.mark.parametrize("info", [
    {"speculative_algorithm": None},  # a plain server, measured only: the row specnone
    {"speculative_algorithm": "DDTREE", "speculative_num_draft_tokens": 8, "speculative_ddtree_budget": 16,
     "speculative_draft_window_size": 2048},  # SGLang's DDTREE build running bs8_b16_k16
], ids=["plain", "ddtree"])
def test_a_session_that_names_no_config_is_not_told_the_matrix_default_was_left_out(info: dict[str, object]) -> None:
    """--ddtree-url (or any profile with its own default:) with no --ddtree-config runs the profile's
    default; configs.yaml's default (bs8_b8_k4) was never asked for, so nothing is said to be left out
    (it said "bs8_b8_k4: not in the profile's matrix", or the running server's fixed fields); asked for
    (all), it still is, with the reason."""
    from pytest_ddtree.service.external import profile_from_server_info

    profile = parse_profile(profile_from_server_info("http://127.0.0.1:30000", info, False, measure_only=True))
    selection = select(None, MATRIX, profile)
    assert len(selection.configs) == 1 and selection.configs[0].name != MATRIX.default.name
    assert selection.left_out == () and selection.summary_lines() == []
    asked = select(["all"], MATRIX, profile)
    assert asked.configs == selection.configs and MATRIX.default.name in [lo.config for lo in asked.left_out]
