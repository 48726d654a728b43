"""Each shipped SGLang profile, run as it ships against the reference engine in its build's dialect.

What is substituted, and only that: the launcher. ``python -m sglang.launch_server`` becomes
``python -m pytest_ddtree.refserver --dialect <build>`` (plus a fast simulated clock), the port
becomes ``auto`` and the start timeout shrinks to CI size. Every flag after the launcher, the
config mapping (``config_args``, ``config_env``, ``fixed``), the ``applied`` read-back and the
environment stay as shipped, and the engine parses them the way that build does (refusals,
silent overrides, environment variables; see refserver/dialects.py). A wrong flag name, a value
the build would override, or a field the build would not read fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pytest_ddtree.configs import load_matrix, parse_config_name
from pytest_ddtree.service.profile import load_profile
from tests.suite_helpers import MATRIX, REPO, run_suite

LAUNCHER = "python -m sglang.launch_server"
SERVICES = REPO / "suites" / "services"

# shipped profile -> (dialect, configs outside the matrix that the build can express)
BUILDS = {
    "sglang-upstream-dflash.yaml": ("upstream", ["bs8_b7_k1", "bs8_b7_k1_wnone", "bs16_b15_k1"]),
    "sglang-ddtree-pr27509.yaml": ("ddtree", ["bs8_b8_k8", "bs16_b16_k16_wnone"]),
    "sglang-subsir-tree-verify.yaml": ("subsir", []),
}


def as_refserver(name: str, directory: Path) -> Path:
    """The shipped profile with the reference engine in place of the SGLang launcher."""
    dialect = BUILDS[name][0]
    raw = yaml.safe_load((SERVICES / name).read_text())
    command = " ".join(raw["command"].split())
    assert command.startswith(LAUNCHER), f"{name}: the command must start with {LAUNCHER!r} (tests substitute it)"
    raw["command"] = f"{{python}} -m pytest_ddtree.refserver --dialect {dialect} --clock-scale 50" + command[len(LAUNCHER):]
    raw.update(port="auto", ready_timeout_s=60, stop_timeout_s=5, gpu_release_timeout_s=5)
    path = directory / f"refserver-{name}"
    path.write_text(yaml.safe_dump(raw))
    return path


def ci_configs(name: str) -> list[str]:
    """Every matrix config the profile can express (one per launch), then the build's own extras."""
    profile = load_profile(SERVICES / name)
    matrix = load_matrix(MATRIX)
    extras = [parse_config_name(n) for n in BUILDS[name][1]]
    return [c.name for c in profile.expressible([*matrix.configs, *extras])]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_shipped_profile_passes_the_health_suite_in_its_dialect(pytester: pytest.Pytester, name: str) -> None:
    configs = ci_configs(name)
    assert configs, f"{name} can express no config at all"
    profile = as_refserver(name, pytester.path)
    result = run_suite(pytester, profile, suite="test_health.py", config=",".join(configs), timeout=300)
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed") == 3 * len(configs), result.stdout.str()[-3000:]
    # The report names every field the harness could not read back, with the profile's reason.
    out = result.stdout.str()
    unproven = [f for f in ("budget", "topk") if f not in load_profile(SERVICES / name).settable_fields()
                or f in load_profile(SERVICES / name).unverifiable]
    if unproven:
        assert "ddtree config fields not read back" in out
        for field_name in unproven:
            assert re.search(rf"^{field_name}: (not settable|env .*unverifiable: )", out, re.M), out[-3000:]
    # The engine ran what each name says, also for fields /server_info cannot show (the fork's env).
    logs = {p.name: p.read_text() for p in (pytester.path / "results" / "logs").glob("*.log")}
    for config_name in configs:
        config = parse_config_name(config_name)
        text = next(t for n, t in logs.items() if n.startswith(config_name + "-"))
        line = re.search(r"Speculative: algorithm=DFLASH block_size=(\d+) budget=(\d+) topk=(\d+)", text)
        assert line is not None, text[-2000:]
        assert tuple(map(int, line.groups())) == (config.block_size, config.budget, config.topk), config_name


def test_subsir_profile_covers_the_whole_matrix() -> None:
    matrix = load_matrix(MATRIX)
    assert ci_configs("sglang-subsir-tree-verify.yaml") == [c.name for c in matrix.configs]


@pytest.mark.parametrize(
    ("name", "edit"),
    [("sglang-ddtree-pr27509.yaml", None), ("reference.yaml", "topk")],
)
def test_configs_differing_in_topk_exit_4_before_any_restart(pytester: pytest.Pytester, name: str, edit: str | None) -> None:
    if edit is None:
        profile = as_refserver(name, pytester.path)
    else:  # the reference profile with topk unmapped: derived by the build, never set
        raw = yaml.safe_load((SERVICES / name).read_text())
        del raw["config_args"]["topk"], raw["applied"]["speculative_eagle_topk"]
        profile = pytester.path / "no-topk.yaml"
        profile.write_text(yaml.safe_dump(raw))
    result = run_suite(pytester, profile, suite="test_health.py", config="bs8_b8_k4,bs8_b8_k6")
    assert result.ret == 4, result.stdout.str()[-2000:]
    errors = result.stderr.str()
    assert "cannot set topk" in errors and "bs8_b8_k6" in errors, errors
    assert not (pytester.path / "results" / "logs").exists(), "a service was started before the usage error"
