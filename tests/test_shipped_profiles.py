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

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.selection import Selection, select
from pytest_ddtree.service.profile import load_profile
from tests.build_helpers import BUILDS, SERVICES, as_refserver, check_ran_as_named
from tests.sglang_lane import server_env, sglang_python
from tests.suite_helpers import MATRIX, REPO, run_suite

def test_each_shipped_dialect_is_the_engines() -> None:
    """A profile's ``dialect:`` names one the engine speaks (else its stand-in run would fail at
    launch, far from the typo)."""
    from pytest_ddtree.refserver.dialects import load
    assert len(BUILDS) >= 10 and set(BUILDS.values()) <= set(load()), BUILDS


def build_selection(name: str, requested: list[str] | None) -> Selection:
    return select(requested, load_matrix(MATRIX), load_profile(SERVICES / name))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_shipped_profile_runs_its_default_in_its_dialect(pytester: pytest.Pytester, name: str) -> None:
    default = build_selection(name, None).configs[0].name
    result = run_suite(pytester, as_refserver(name, pytester.path), suite="test_health.py", config=None, timeout=300)
    check_ran_as_named(pytester, result, name, [default])
    assert f"ddtree: configs {default}" in result.stdout.str()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILDS))
def test_shipped_profile_runs_all_in_its_dialect(pytester: pytest.Pytester, name: str) -> None:
    """``--ddtree-config=all`` runs the build's matrix and says what it left out, and why."""
    selection = build_selection(name, ["all"])
    configs = [c.name for c in selection.configs]
    result = run_suite(pytester, as_refserver(name, pytester.path), suite="test_health.py", config="all", timeout=400)
    check_ran_as_named(pytester, result, name, configs)
    out = result.stdout.str()
    results = json.loads((pytester.path / "results").joinpath("results.json").read_text()) if (
        pytester.path / "results" / "results.json").exists() else None
    if selection.left_out:
        assert "ddtree selection" in out, out[-3000:]
        for left in selection.left_out:
            assert left.line() in out, left.line()
        if results is not None:
            assert [lo["config"] for lo in results["selection"]["left_out"]] == [lo.config for lo in selection.left_out]


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


@pytest.mark.parametrize(
    ("name", "config", "expected"),
    [
        ("sglang-dflash-tree-pr31069.yaml", "bs8_b8_k6", "topk=6, but this build accepts topk 4, 8, 16 only"),
        ("sglang-upstream-dflash.yaml", "bs8_b8_k4", "budget=8, but this build cannot set budget: it is = block_size - 1 (7 here"),
    ],
)
def test_a_named_config_the_build_cannot_run_is_a_usage_error(pytester: pytest.Pytester, name: str, config: str,
                                                               expected: str) -> None:
    result = run_suite(pytester, as_refserver(name, pytester.path), suite="test_health.py", config=config)
    assert result.ret == 4, result.stdout.str()[-2000:]
    assert f"{config} asks {expected}" in result.stderr.str(), result.stderr.str()
    assert not (pytester.path / "results" / "logs").exists(), "a service was started before the usage error"


# -- real SGLang's own argument parser ---------------------------------------------------------------

#: Run in the real-SGLang venv: each argv through ``prepare_server_args`` (0.5.23's parser and its
#: argument-time checks; nothing is loaded), one JSON answer per argv: the resolved
#: ``speculative_algorithm`` (None: the server would not speculate), or why the parser refused it
#: (an argparse refusal is its last stderr line).
PARSE_SCRIPT = """
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
        out.append({"algorithm": args.speculative_algorithm})
    except SystemExit:
        out.append({"refused": (err.getvalue().strip().splitlines() or ["exit"])[-1]})
    except Exception as exc:
        out.append({"refused": f"{type(exc).__name__}: {exc}"})
print("PARSED " + json.dumps(out))
"""


def strip_fork_flags(argv: list[str], fork_flags: set[str]) -> list[str]:
    """``argv`` without exactly the profile's fork flags (and the value after one that takes one)."""
    out: list[str] = []
    skip_value = False
    for i, token in enumerate(argv):
        if skip_value:
            skip_value = False
            continue
        if token in fork_flags:
            skip_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        out.append(token)
    return out


def sglang_argvs() -> dict[str, list[str]]:
    """Each shipped SGLang profile's command line for its plain launch (``<profile> plain``: the
    control, the lossless reference, the golden bless) and for every config of its matrix, after the
    launcher, fork flags stripped; and, per fork flag, the line with it kept (it must be refused)."""
    argvs: dict[str, list[str]] = {}
    for path in sorted(SERVICES.glob("*.yaml")):
        profile = load_profile(path)
        fork_flags = set(yaml.safe_load(path.read_text()).get("fork_flags") or {})  # checked by load_profile
        command = " ".join((profile.command or "").split())
        if "-m sglang.launch_server " not in command:
            continue  # the engine's own profiles
        assert profile.lossless_args is not None, f"{path.name} has no plain launch (lossless_args)"
        launches = {"plain": profile.render_command(None, 30000, profile.lossless_args)}
        launches.update((config.name, profile.render_command(config, 30000)) for config in build_selection(path.name, ["all"]).configs)
        for name, line in launches.items():
            rendered = shlex.split(line)
            argv = rendered[rendered.index("sglang.launch_server") + 1:]
            argvs[f"{path.name} {name}"] = strip_fork_flags(argv, fork_flags)
            for flag in (f for f in sorted(fork_flags) if f in argv):  # a config may leave its axis out
                argvs[f"{path.name} {name} keeping {flag}"] = strip_fork_flags(argv, fork_flags - {flag})
    return argvs


@pytest.mark.slow
def test_every_shipped_command_line_parses_under_real_sglangs_parser() -> None:
    """SGLang 0.5.23's own parser (``sglang.srt.server_args.prepare_server_args``) reads every
    shipped profile's command line, for its plain launch and every config of its matrix: a misspelt
    flag, a value of the wrong type or a flag 0.5.23 does not have fails here, unless the profile
    names it under ``fork_flags`` with the fork that adds it; and each flag named there really is one
    0.5.23 refuses. The plain launch resolves to no speculative algorithm (so the control and the
    lossless reference exist), every config's to the profile's own."""
    python, why = sglang_python()
    if python is None:
        pytest.skip(why)
    argvs = sglang_argvs()
    profiles = {name.split()[0] for name in argvs}
    assert len(profiles) >= 9 and all(f"{p} plain" in argvs for p in profiles), sorted(argvs)
    done = subprocess.run([str(python), "-c", PARSE_SCRIPT], input=json.dumps(list(argvs.values())), capture_output=True,
                          text=True, timeout=240, env={**os.environ, **server_env()}, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("PARSED ")), None)
    assert line is not None, done.stderr[-3000:]
    answers = dict(zip(argvs, json.loads(line[len("PARSED "):])))
    refused = {name: answer["refused"] for name, answer in answers.items() if " keeping " not in name and "refused" in answer}
    assert not refused, f"SGLang 0.5.23's parser refuses shipped command lines: {refused}"
    for name, answer in answers.items():
        if " keeping " in name:
            flag = name.split(" keeping ")[1]
            assert "unrecognized arguments" in answer.get("refused", "") and flag in answer["refused"], (name, answer)
            continue
        argv = argvs[name]
        if name.endswith(" plain"):
            assert answer["algorithm"] is None and "--speculative-algorithm" not in argv, (name, answer, argv)
        else:
            assert answer["algorithm"] == argv[argv.index("--speculative-algorithm") + 1], (name, answer, argv)


# -- a config with a non-DDTree axis (EAGLE3's steps), gated end to end and blessed --------------------

EAGLE3_CONFIG = "b7_k4_steps3"  # num_steps 3, topk 4, 8 draft tokens (the root counted)


def _eagle3_launch_evidence(results: Path) -> dict[str, Any]:
    for path in results.glob("records-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            launch = rec.get("launch") if isinstance(rec, dict) else None
            if isinstance(launch, dict) and launch.get("config") == EAGLE3_CONFIG and "applied_evidence" in launch:
                return dict(launch["applied_evidence"])
    raise AssertionError(f"no launch record of {EAGLE3_CONFIG} with applied evidence in {results}")


@pytest.mark.slow
def test_an_eagle3_config_is_proven_gated_and_blessed(pytester: pytest.Pytester) -> None:
    profile = as_refserver("sglang-eagle3.yaml", pytester.path)
    raw = yaml.safe_load(profile.read_text())  # losslessness checked live against the shipped plain launch
    raw.update(lossless="instance", coding_min_pass=None)
    profile.write_text(yaml.safe_dump(raw))
    suites = [str(REPO / "suites" / name) for name in ("test_health.py", "test_coding.py", "test_lossless.py")]
    bless = run_suite(pytester, profile, *suites, "--ddtree-update-baselines", config=EAGLE3_CONFIG, timeout=400)
    out = bless.stdout.str()
    assert bless.ret == 0, out[-3000:]
    assert f"ddtree: configs {EAGLE3_CONFIG}" in out
    baseline = yaml.safe_load((pytester.path / "baselines" / "refserver" / f"{EAGLE3_CONFIG}.yaml").read_text())
    assert baseline["coding"]["default"], baseline
    # the steps were proven by behaviour: the copy probe reached min(steps, budget) = 3 accepted
    # drafts and never more; /server_info showed the three EAGLE keys
    fields = _eagle3_launch_evidence(pytester.path / "results")["fields"]
    assert fields["steps"]["status"] == "proven by behaviour", fields["steps"]
    assert "bound of 3 accepted drafts" in fields["steps"]["detail"]
    assert fields["budget"]["status"] in ("reported", "proven by behaviour") and fields["topk"]["status"] == "reported"
    assert fields["block_size"]["status"] == "not settable"
    # gated against what was blessed: the same config passes with baselines required
    gate = run_suite(pytester, profile, *suites, "--ddtree-require-baselines", config=EAGLE3_CONFIG, timeout=400)
    assert gate.ret == 0, gate.stdout.str()[-3000:]
    assert "missing" not in gate.parseoutcomes()
    # and a DDTree name the build cannot run is refused before anything starts
    refused = run_suite(pytester, profile, suites[0], "--ddtree-allow-unlisted", config="b7_k4_steps3_tw2", timeout=120)
    assert refused.ret == 4 and "has no flag for tree_width" in refused.stderr.str(), refused.stderr.str()[-2000:]


# -- a GPU profile's golden transcripts, blessed by the command the skip message prints --------------

@pytest.mark.slow
def test_the_golden_bless_command_a_gpu_profile_prints_works_as_printed(pytester: pytest.Pytester) -> None:
    """A shipped GPU profile (``lossless: golden``) without transcripts skips the lossless gate and
    prints the command that blesses them; that command, run as printed from a checkout, launches the
    profile's plain server (no speculative flag), writes ``golden/``, and the next session is judged
    against it. Only the launcher is the engine's (upstream DFLASH's dialect)."""
    checkout = pytester.path / "checkout"
    shutil.copytree(REPO / "suites", checkout / "suites", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    profile = as_refserver("sglang-upstream-dflash.yaml", checkout)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def session(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", *argv, "-p", "no:cacheprovider", "-rA"], cwd=checkout,
                              env=env, capture_output=True, text=True, timeout=400, check=False)

    first = session("suites/test_lossless.py", f"--ddtree-service={profile}")
    assert first.returncode == 0 and "1 skipped" in first.stdout, first.stdout[-3000:]
    printed = re.search(r"no usable golden transcripts in \S+; create them with: (pytest .*)$", first.stdout, re.M)
    assert printed is not None, first.stdout[-3000:]
    words = shlex.split(printed.group(1))
    assert words[:2] == ["pytest", "suites/test_lossless.py"] and "--ddtree-update-baselines" in words, words
    bless = session(*words[1:])
    assert bless.returncode == 0 and "1 passed" in bless.stdout, bless.stdout[-3000:]
    reference = json.loads((checkout / "baselines" / "refserver" / "golden" / "reference.json").read_text())
    assert "--speculative" not in reference["command"] and "--model-path /models/Kimi-K2.6" in reference["command"], reference
    judged = session("suites/test_lossless.py", f"--ddtree-service={profile}", "--ddtree-require-baselines")
    assert judged.returncode == 0 and "1 passed" in judged.stdout, judged.stdout[-3000:]
    assert "blessed" in judged.stdout and "from a launch with lossless_args" in judged.stdout, judged.stdout[-3000:]
