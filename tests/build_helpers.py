"""A build's profile run on the reference engine in the build's dialect: the launcher swapped, the
rest as written (tests/test_shipped_profiles.py, tests/test_dialects.py,
tests/test_installed_profiles.py), and a new build to declare: one profile, one dialect entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.profile import load_profile
from tests.suite_helpers import REPO

LAUNCHER = "python -m sglang.launch_server"
SERVICES = REPO / "suites" / "services"

#: The shipped profiles that name the engine dialect speaking their build's flags (``dialect:``):
#: each is run here as it ships, the launcher swapped for the engine in that dialect.
BUILDS = {path.name: str(raw["dialect"]) for path in sorted(SERVICES.glob("*.yaml"))
          if isinstance(raw := yaml.safe_load(path.read_text()), dict) and raw.get("dialect") and raw.get("controller") == "process"}


def as_refserver(name: str | Path, directory: Path) -> Path:
    """The profile (a shipped one by name, or a path) with the reference engine in place of the SGLang
    launcher, in the profile's ``dialect:``; a ``dialects.yaml`` in the profile's own folder joins
    the shipped declaration (``--dialects``), as a new build's would."""
    source = SERVICES / name if isinstance(name, str) else name
    raw = yaml.safe_load(source.read_text())
    own = source.parent / "dialects.yaml"
    engine = "{python} -m pytest_ddtree.refserver"
    speaks = f"{engine} --dialect {raw['dialect']}" + (f" --dialects {own}" if source.parent != SERVICES and own.is_file() else "")
    command = " ".join(raw["command"].split())
    if command.startswith(engine):  # the engine's own profile: the same flags, parsed in the build's dialect
        raw["command"] = speaks + command[len(engine):].replace("--clock-scale 10", "--clock-scale 50")
    else:
        assert command.startswith(LAUNCHER), f"{name}: the command must start with {LAUNCHER!r} (tests substitute it)"
        raw["command"] = f"{speaks} --clock-scale 50" + command[len(LAUNCHER):]
    raw.update(port="auto", ready_timeout_s=60, stop_timeout_s=5, gpu_release_timeout_s=5)
    path = directory / f"refserver-{source.name}"
    path.write_text(yaml.safe_dump(raw))
    return path


def check_ran_as_named(pytester: pytest.Pytester, result: pytest.RunResult, name: str | Path, configs: list[str]) -> None:
    """The health suite passed for every config, and the engine ran what each name says, also for
    the fields /server_info cannot show (the fork's environment variables)."""
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed") == 3 * len(configs), result.stdout.str()[-3000:]
    profile = load_profile(SERVICES / name if isinstance(name, str) else name)
    out = result.stdout.str()
    unproven = [f for f in ("budget", "topk")
                if (f not in profile.settable_fields() and f not in profile.applied.values()) or f in profile.unverifiable]
    if unproven:  # the report names every field the harness could not read back, with the reason
        assert "ddtree config fields not read back" in out
        for field_name in unproven:
            assert re.search(rf"^{field_name}: (not settable|env .*unverifiable: )", out, re.M), out[-3000:]
    logs = {p.name: p.read_text() for p in (pytester.path / "results" / "logs").glob("*.log")}
    for config_name in configs:
        config = parse_config_name(config_name)
        text = next(t for n, t in logs.items() if n.startswith(config_name + "-"))
        line = re.search(r"Speculative: algorithm=DFLASH block_size=(\d+) budget=(\d+) topk=(\d+)", text)
        assert line is not None, text[-2000:]
        # EAGLE's depth is its steps: the engine runs it as block size steps + 1; an axis the name
        # leaves out (a width the build derives) is the build's own, compared where it follows
        values = config.values()
        want = {"block_size": config.block_size if config.block_size is not None
                else int(values["steps"]) + 1 if "steps" in values else None,
                "budget": config.budget, "topk": config.topk if config.topk is not None else values.get("tree_width")}
        got = dict(zip(("block_size", "budget", "topk"), map(int, line.groups())))
        assert {k: got[k] for k, v in want.items() if v is not None} == {k: v for k, v in want.items() if v is not None}, config_name


#: A fork that switches DDTree on with a flag of its own and sizes the tree with renamed flags: the
#: rules are PR 27509's, the spellings are new (a flag's ``dest`` is the name the rule reads).
NEW_DIALECT = """\
mytree:
  extends: upstream
  help: "a fork: --speculative-tree-verify turns DDTree on, sized by --speculative-tree-block-size and -budget"
  flags:
    --speculative-tree-verify: {type: switch, help: "verify a DDTree instead of the chain"}
    --speculative-tree-block-size: {type: positive, dest: speculative_ddtree_block_size, help: "the draft block size"}
    --speculative-tree-budget: {type: int, dest: speculative_ddtree_budget, help: "non-root tree nodes"}
  resolve:
    - {algorithm: NONE, rule: plain}
    - {flag: speculative_tree_verify, rule: ddtree-pr27509}
    - {rule: dflash-chain}
  startup_lines:
    - "Initialized DDTREE v2 worker. block_size={block_size}, tree_budget={budget}, draft_window_size={window}, compact_cache={compact}"
"""

NEW_PROFILE = """\
name: sglang-mytree
description: a fork whose DDTree is switched on by --speculative-tree-verify
dialect: mytree
controller: process
command: "python -m sglang.launch_server --model-path /models/target --host 127.0.0.1 --port {port} --enable-metrics {config_args}"
speculative_args: "--speculative-algorithm DFLASH --speculative-tree-verify --speculative-draft-model-path /models/drafter"
url: "http://127.0.0.1:{port}"
port: 30000
default_window: 2048
default: bs8_b8_k8
config_args:
  block_size: "--speculative-tree-block-size {value}"
  budget: "--speculative-tree-budget {value}"
  window: "--speculative-draft-window-size {value}"
fixed:
  topk: budget
applied:
  speculative_num_draft_tokens: block_size
  speculative_ddtree_budget: budget
  speculative_draft_window_size: window
lossless_args: ""
"""
