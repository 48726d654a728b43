"""An external service running another config than the one asked fails with the key diff (#10.3).

Before: the config's tests were skipped and the run exited 0, so a sweep against a shared
deployment "passed" configs it never measured.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.refserver_helpers import RefServer, config_args
from tests.suite_helpers import REFERENCE_PROFILE, REPO, run_suite


def test_external_service_on_another_config_fails_with_the_diff(pytester: pytest.Pytester, tmp_path: Path) -> None:
    server = RefServer(config_args("bs8_b8_k4_w2048"), tmp_path).wait_ready()
    try:
        raw = yaml.safe_load(REFERENCE_PROFILE.read_text())
        profile = tmp_path / "external.yaml"
        profile.write_text(yaml.safe_dump({
            "name": "shared", "controller": "external", "url": server.url, "port": server.port,
            "default_window": raw["default_window"], "config_args": raw["config_args"], "applied": raw["applied"],
            "health_path": "/health", "lossless": "golden",
        }))
        result = run_suite(pytester, profile, "-k", "answers_health", suite="test_health.py", config="bs8_b8_k4,bs8_b12_k4")
    finally:
        server.stop()
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    assert outcomes.get("skipped", 0) == 0
    assert outcomes["passed"] == 1 and outcomes["errors"] == 1  # bs8_b8_k4 runs; bs8_b12_k4's fixture fails
    result.stdout.fnmatch_lines([
        "*service does not run config bs8_b12_k4*external service*",
        "*speculative_num_draft_tokens*12*8*",
        "*never restarts an external service*",
    ])


def test_ddtree_url_gates_a_running_server_with_no_profile_file(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """``--ddtree-url URL`` (bench_serving's --base-url): the config the service runs, read from
    its /server_info, is the one gated, under its own name; the service is never restarted."""
    server = RefServer(config_args("bs8_b12_k6_w2048"), tmp_path).wait_ready()
    try:
        result = pytester.runpytest_subprocess(
            str(REPO / "suites" / "test_health.py"), f"--rootdir={REPO}", f"--ddtree-url={server.url}",
            f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
            "-p", "no:cacheprovider", timeout=180)
        asked_other = pytester.runpytest_subprocess(
            str(REPO / "suites" / "test_health.py"), f"--rootdir={REPO}", f"--ddtree-url={server.url}",
            "--ddtree-config=bs8_b8_k4", "-p", "no:cacheprovider", timeout=60)
        assert server.proc.poll() is None  # still the one we started: nothing restarted it
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([f"ddtree: service profile external-127.0.0.1:{server.port} ({server.url}), controller external",
                                 "ddtree: configs bs8_b12_k6"])
    assert result.parseoutcomes()["passed"] == 3
    # every field is fixed (never restarted) and proven by what the service shows, not "not settable"
    assert re.search(r"^bs8_b12_k6\s+proven by behaviour\s+(reported|proven by behaviour)\s+reported\s+reported\s*$",
                     result.stdout.str(), re.M), result.stdout.str()[-3000:]
    assert "config fields not read back" not in result.stdout.str()
    assert asked_other.ret == pytest.ExitCode.USAGE_ERROR
    assert "bs8_b8_k4 asks budget=8" in asked_other.stderr.str(), asked_other.stderr.str()


@pytest.mark.parametrize(("args", "message"), [
    (["--ddtree-url=http://127.0.0.1:9"], "cannot read its /server_info"),
    (["--ddtree-url=127.0.0.1:30000"], "give the service's base URL"),
    (["--ddtree-url=http://127.0.0.1:9", f"--ddtree-service={REFERENCE_PROFILE}"], "give one of them"),
])
def test_a_ddtree_url_that_cannot_be_gated_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    pass\n")
    result = pytester.runpytest_subprocess(*args, f"--ddtree-matrix={REPO / 'suites' / 'configs.yaml'}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str(), result.stderr.str()


def test_a_minimal_external_profile_needs_no_launch_keys() -> None:
    """A service the harness never launches needs no config_args, and its url no {port}."""
    from pytest_ddtree.service.profile import parse_profile

    profile = parse_profile({"name": "shared", "controller": "external", "url": "http://gpu-host:30000",
                             "fixed": {"block_size": 8, "budget": 7, "topk": 1}, "control": "none", "lossless": "golden"})
    assert profile.url == "http://gpu-host:30000" and profile.config_args == {}


def test_the_golden_bless_command_of_a_service_the_harness_cannot_launch_names_a_profile_that_can() -> None:
    """Under --ddtree-url the session's own bless command cannot launch the plain reference: the command
    printed drops --ddtree-url and blesses with a profile (the engine's golden copy, else a placeholder named
    as one); a profile the harness launches keeps its own command."""
    from pytest_ddtree.gates import lossless
    from pytest_ddtree.service.profile import load_profile, parse_profile

    external = parse_profile({"name": "shared", "controller": "external", "url": "http://gpu-host:30000",
                              "fixed": {"block_size": 8, "budget": 7, "topk": 1}, "control": "none", "lossless": "golden"})
    create = "pytest suites/test_lossless.py --ddtree-update-baselines --ddtree-url=http://gpu-host:30000 --ddtree-config=bs8_b7_k1"
    other = lossless.golden_bless_command(external, create, {"version": "0.5.23"})
    assert other.startswith("pytest suites/test_lossless.py --ddtree-update-baselines --ddtree-service=PROFILE.yaml "
                            "--ddtree-config=bs8_b7_k1 (this service was not started by the harness"), other
    assert "--ddtree-url" not in lossless.golden_bless_command(external, create, {"version": "refserver-0.2.0"})
    launched = load_profile(REFERENCE_PROFILE)
    assert lossless.golden_bless_command(launched, "pytest suites/test_lossless.py --ddtree-update-baselines", {}) == \
        "pytest suites/test_lossless.py --ddtree-update-baselines"


def _engine_info(window: int | None, clock_scale: float = 1.0) -> dict[str, object]:
    """The reference engine's /server_info keys that show its config (as it answers them)."""
    return {"version": "refserver-0.1.0", "speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8,
            "speculative_num_draft_tokens": 8, "speculative_eagle_topk": 4, "speculative_draft_window_size": window,
            "speculative_dflash_draft_window_size": window, "clock_scale": clock_scale}


@pytest.mark.parametrize(("window", "name"), [(None, "bs8_b8_k4_wnone"), (2048, "bs8_b8_k4"), (1024, "bs8_b8_k4_w1024")])
def test_ddtree_url_names_the_window_the_service_runs_as_the_baselines_do(window: int | None, name: str) -> None:
    """A config name without a window suffix means window 2048 in the shipped profiles and their
    baselines; the engine started as the docs' first command runs none, so it is bs8_b8_k4_wnone, and a
    session that names it bs8_b8_k4 is refused before anything runs, never judged against w2048's baseline."""
    from pytest_ddtree.measure.matrix import load_matrix
    from pytest_ddtree.selection import select
    from pytest_ddtree.service.external import profile_from_server_info
    from pytest_ddtree.service.profile import parse_profile
    from pytest_ddtree.service.validated_profile import SelectionError

    profile = parse_profile(profile_from_server_info("http://127.0.0.1:30000", _engine_info(window), True))
    matrix = load_matrix(REPO / "suites" / "configs.yaml")
    assert [c.name for c in select(None, matrix, profile).configs] == [name]
    assert "window" in profile.applied.values()  # read back like block size, budget and topk
    others = [c for c in ("bs8_b8_k4", "bs8_b8_k4_wnone") if c != name]
    for other in others:
        with pytest.raises(SelectionError) as refused:
            profile.check_selection(select([other], matrix, profile).configs)
        assert f"{other} asks window=" in str(refused.value) and "this build cannot set window" in str(refused.value)
    assert "clock scale 1.0" in str(profile.description)


def test_a_baseline_of_another_clock_scale_is_not_compared_and_says_so(tmp_path: Path) -> None:
    """The engine by hand runs at clock scale 1 unless told; the committed baselines are of scale 10: every
    time and tok/s differs tenfold, so no cell is compared and each says why (was: -90% in every cell)."""
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.gates.throughput.cells import read_baseline
    from pytest_ddtree.service.fingerprint import fingerprint

    blessed = fingerprint(_engine_info(2048, clock_scale=10))
    (tmp_path / "refserver").mkdir()
    (tmp_path / "refserver" / "bs8_b8_k4.yaml").write_text(yaml.safe_dump({
        "config": "bs8_b8_k4", "fingerprint": {"details": blessed.details, "digest": blessed.digest, "name": "refserver"},
        "metrics": {}}))
    for scale, compared in ((1.0, False), (10, True)):
        store = BaselineStore(tmp_path, "refserver", fingerprint=fingerprint(_engine_info(2048, clock_scale=scale)))
        baseline = read_baseline(store, "bs8_b8_k4")
        if compared:
            assert baseline.incomparable is None
        else:
            assert baseline.incomparable is not None and baseline.section == {}
            assert "blessed on the reference engine at clock scale 10, and this engine runs at 1" in baseline.incomparable
            assert "--clock-scale 10" in baseline.incomparable


def _docs_launch_commands() -> dict[str, list[str]]:
    """docs/reference-engine.md's "Run it by hand" commands that name the config they run (``# bs8_b8_k4 ...``):
    config name -> the flags after ``--port 30000``, as a user would copy them."""
    text = (REPO / "docs" / "reference-engine.md").read_text()
    joined = re.sub(r"\\\n\s*", "", text)
    commands: dict[str, list[str]] = {}
    for line in joined.splitlines():
        found = re.match(r"\s*python -m pytest_ddtree\.refserver --port 30000 (.*?)\s+#\s*(bs\w+)", line)
        if found:
            commands[found.group(2)] = found.group(1).split()
    return commands


@pytest.mark.slow
@pytest.mark.parametrize("config", ["bs8_b8_k4", "bs8_b16_k4"])
def test_the_docs_launch_commands_are_judged_against_the_committed_baselines(
        pytester: pytest.Pytester, tmp_path: Path, config: str) -> None:
    """The engine started exactly as docs/reference-engine.md says, gated with ``--ddtree-url`` against the
    committed baselines: the session names the config the comment names and compares its cell with the
    blessed one (the clock scale, window and build facts all agree), never "not compared"."""
    commands = _docs_launch_commands()
    assert config in commands, f"docs/reference-engine.md has no launch command for {config}: {sorted(commands)}"
    server = RefServer(commands[config], tmp_path).wait_ready()
    try:
        result = pytester.runpytest_subprocess(
            str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}", f"--ddtree-url={server.url}",
            "--ddtree-cell=c1_short", "--ddtree-require-baselines",
            f"--ddtree-results={pytester.path / 'results'}", "-p", "no:cacheprovider", timeout=300)
    finally:
        server.stop()
    out = result.stdout.str()
    assert f"ddtree: configs {config}" in out, out[-3000:]
    assert "not compared" not in out and "blessed on the reference engine at" not in out, out[-3000:]
    row = re.search(rf"^{config}\s+c1_short\s.*\s([-+]\d+\.\d)%\s+(pass|regression)\s*$", out, re.M)
    assert row, out[-3000:]
    # c1_short, one request at a time, sits within a few percent of its baseline on any box
    assert abs(float(row.group(1))) < 30, row.group(0)


@pytest.mark.slow
def test_the_lossless_skip_under_ddtree_url_prints_a_bless_command_that_works_as_printed(tmp_path: Path) -> None:
    """A hand-started engine under ``--ddtree-url`` has no golden transcripts: the lossless gate skips, a
    bless under --ddtree-url skips too (it cannot launch the service's plain reference; it errored on it),
    and the command the skip prints, run as printed from a checkout, writes them; the next session is
    judged against them and passes."""
    import os
    import shlex
    import shutil
    import subprocess
    import sys

    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "suites", checkout / "suites", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    baselines = tmp_path / "my baselines"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    server = RefServer(config_args("bs8_b8_k4_w2048"), tmp_path).wait_ready()

    def session(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "suites/test_lossless.py", f"--ddtree-url={server.url}",
                               f"--ddtree-baselines={baselines}", *argv, "-p", "no:cacheprovider", "-rA"],
                              cwd=checkout, env=env, capture_output=True, text=True, timeout=300, check=False)

    try:
        first = session()
        bless_here = session("--ddtree-update-baselines")
        printed = re.search(r"no usable golden transcripts in .+?; create them with: (.*)$", first.stdout, re.M)
        assert first.returncode == 0 and "1 skipped" in first.stdout and printed is not None, first.stdout[-3000:]
        assert bless_here.returncode == 0 and "1 skipped" in bless_here.stdout, bless_here.stdout[-3000:]
        command = printed.group(1)
        words = shlex.split(command.split(" && ", 1)[-1])
        assert command.startswith("sed ") and "--ddtree-url" not in command and f"--ddtree-baselines={baselines}" in words, command
        bless = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True, timeout=300,
                               check=False)
        assert bless.returncode == 0 and "1 passed" in bless.stdout, bless.stdout[-3000:] + bless.stderr[-2000:]
        # the bless into --ddtree-baselines DIR says to review DIR (outside the checkout: its whole path), not baselines/
        assert f"review with: git diff -- {shlex.quote(str(baselines.resolve()) + '/')}" in bless.stdout, bless.stdout[-3000:]
        judged = session("--ddtree-require-baselines")
    finally:
        server.stop()
    assert judged.returncode == 0 and "1 passed" in judged.stdout, judged.stdout[-3000:]
    assert "from a launch with lossless_args" in judged.stdout, judged.stdout[-3000:]
