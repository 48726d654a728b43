"""Service profile validation and rendering."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.profile import ProfileError, load_profile

SHIPPED = ["reference.yaml", "sglang-dflash-tree.yaml", "sglang-ddtree.yaml"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_and_warn_about_flags(repo_root: Path, name: str) -> None:
    path = repo_root / "suites" / "services" / name
    profile = load_profile(path)
    assert profile.default_window == 2048
    assert profile.applied, "every shipped profile checks that the config applied"
    if name != "reference.yaml":
        assert "CHECK THE FLAG MAPPING" in path.read_text()


def test_rendering_omits_a_field_whose_value_is_none(repo_root: Path) -> None:
    profile = load_profile(repo_root / "suites" / "services" / "sglang-dflash-tree.yaml")
    args = profile.render_config_args(parse_config_name("bs8_b12_k6"))
    assert args == [
        "--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "12",
        "--speculative-eagle-topk", "6", "--speculative-draft-window-size", "2048",
    ]
    no_window = profile.render_config_args(parse_config_name("bs8_b12_k6_wnone"))
    assert "--speculative-draft-window-size" not in no_window
    assert profile.env["SGLANG_DFLASH_TREE_VERIFY"] == "1"
    assert profile.expected_applied(parse_config_name("bs8_b12_k6_wnone")) == {
        "speculative_num_draft_tokens": 12, "speculative_eagle_topk": 6, "speculative_draft_window_size": None,
    }


def test_ddtree_fork_profile_uses_its_budget_flag(repo_root: Path) -> None:
    profile = load_profile(repo_root / "suites" / "services" / "sglang-ddtree.yaml")
    command = profile.render_command(parse_config_name("bs8_b16_k4"), 30000)
    assert "--speculative-algorithm DDTREE" in command and "--speculative-ddtree-budget 16" in command
    assert profile.controller == "systemd" and profile.unit == "sglang-ddtree.service"


def _write(tmp_path: Path, repo_root: Path, **changes: object) -> Path:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"comand": "x"}, r"profile.yaml: comand: unknown key"),
        ({"controller": "docker"}, r"profile.yaml: controller: must be one of process, systemd, external"),
        ({"command": "python -m server {config_args}"}, r"profile.yaml: command: must contain \{port\}"),
        ({"command": "python -m server --port {port}"}, r"command: must contain \{config_args\}"),
        ({"command": "python -m server --port {prot} {config_args}"}, r"command: unknown placeholder"),
        ({"config_args": {"budget": "--budget"}}, r"config_args.budget: must be a flag template"),
        ({"config_args": {"tree": "--t {value}"}}, r"config_args.tree: unknown config field"),
        ({"applied": {"speculative_eagle_topk": "top_k"}}, r"applied.speculative_eagle_topk: must name a config field"),
        ({"url": None}, r"profile.yaml: url: missing required key"),
        ({"port": "any"}, r"port: must be an integer or 'auto'"),
        ({"ready_timeout_s": -1}, r"ready_timeout_s: must be positive"),
        ({"pool": 0}, r"pool: must be at least 1"),
        ({"lossless_args": None}, r"lossless_args: lossless: instance needs"),
        ({"controller": "systemd"}, r"unit: the systemd controller needs the unit name"),
    ],
)
def test_profile_errors_name_file_key_and_problem(tmp_path: Path, repo_root: Path, changes: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile(_write(tmp_path, repo_root, **changes))


def test_yaml_syntax_error_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\ncontroller: process\ncommand: [unclosed\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: YAML syntax error at line \d+"):
        load_profile(path)
