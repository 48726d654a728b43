"""The plugin's service lifecycle end to end: pytester runs against real reference engines.

Each test writes a service profile derived from the shipped reference profile (with a fault
injected into the engine's command line where needed), a small gate file, and runs pytest in a
subprocess, exactly as a user would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.polling import wait_until
from tests.suite_helpers import default_sigint
from tests.suite_helpers import reference_profile, wait_healthy

GATE = '''
import json, os, time
from pathlib import Path

def _note(name, ddtree_service, ddtree_config):
    info = ddtree_service.client.server_info()
    out = Path(os.environ["GATE_OUT"]) / f"{name}-{ddtree_config.name}-{os.getpid()}.json"
    out.write_text(json.dumps({"config": ddtree_config.name, "url": ddtree_service.url,
                               "topk": info.get("speculative_eagle_topk"),
                               "budget": info.get("speculative_num_draft_tokens"),
                               "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                               "t": time.time()}))

def test_one(ddtree_service, ddtree_config):
    _note("one", ddtree_service, ddtree_config)
    ddtree_service.client.generate(text="def add(a, b):", sampling_params={"max_new_tokens": 4, "temperature": 0})

def test_two(ddtree_service, ddtree_config):
    _note("two", ddtree_service, ddtree_config)
    ddtree_service.client.generate(text="def add(a, b):", sampling_params={"max_new_tokens": 4, "temperature": 0})

def test_three(ddtree_service, ddtree_config):
    ddtree_service.client.generate(text="def add(a, b):", sampling_params={"max_new_tokens": 4, "temperature": 0})

def test_four(ddtree_service, ddtree_config):
    ddtree_service.client.generate(text="def add(a, b):", sampling_params={"max_new_tokens": 4, "temperature": 0})
'''


def write_profile(directory: Path, repo_root: Path, engine_args: str = "", command_prefix: str = "", **overrides: Any) -> Path:
    return reference_profile(directory, engine_args, command_prefix=command_prefix, **overrides)


def run_gate(pytester: pytest.Pytester, repo_root: Path, profile: Path, *args: str, timeout: float = 120) -> pytest.RunResult:
    pytester.makepyfile(test_gate=GATE)
    out = pytester.path / "gate-out"
    out.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:  # the variable reaches the subprocess and no later test
        mp.setenv("GATE_OUT", str(out))
        result = pytester.runpytest_subprocess(
            f"--ddtree-service={profile}",
            f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}",
            f"--ddtree-results={pytester.path / 'results'}",
            "-p", "no:cacheprovider", "-p", "no:randomly", "-rA",
            *args,
            timeout=timeout,
        )
    return result


def notes(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((pytester.path / "gate-out").glob("*.json"))]


def test_two_configs_each_started_once_and_verified(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root)
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b4_k4,bs8_b12_k6")
    result.assert_outcomes(passed=8)
    starts = [line for line in result.outlines + result.errlines if "starting bs8_" in line]
    assert len(starts) == 2, starts
    seen = {(n["config"], n["budget"], n["topk"]) for n in notes(pytester)}
    assert seen == {("bs8_b4_k4", 4, 4), ("bs8_b12_k6", 12, 6)}
    result.stdout.fnmatch_lines(["*ddtree: service profile reference*", "*ddtree: configs bs8_b4_k4, bs8_b12_k6*"])


def test_crash_on_start_fails_fast_with_log_tail_and_the_sweep_goes_on(pytester: pytest.Pytester, repo_root: Path) -> None:
    # A readiness deadline longer than the run's own 120 s limit: a run that waited it out would end
    # there (pytester's timeout), not pass.
    profile = write_profile(pytester.path, repo_root, "--fault crash-on-start", ready_timeout_s=300)
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b4_k4,bs8_b8_k4")
    result.assert_outcomes(errors=8)  # a fixture that cannot provide the service errors the test
    text = result.stdout.str()
    assert "During handling of the above exception" not in text
    assert "exited while starting" in text and "exit code" in text and "last lines of the service log" in text
    # one start per config, not one per test: the failure is remembered
    starts = [line for line in result.outlines + result.errlines if "starting bs8_" in line]
    assert len(starts) == 2, starts
    # Fast = on the exit, not on the readiness deadline: the exit ended each wait, and no wait
    # ended by its deadline.
    assert "not ready after" not in text


@pytest.mark.slow
def test_slow_start_past_the_deadline_fails_with_the_log_tail(pytester: pytest.Pytester, repo_root: Path) -> None:
    # 8 s: long enough for the engine to bind its port (then it answers 503 while it "loads") even on
    # a loaded 2-core box, where its Python start-up alone took over 2 s in a CI run
    profile = write_profile(pytester.path, repo_root, "--fault slow-start=60", ready_timeout_s=8)
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b4_k4", "-k", "one")
    # The 8 s deadline ended the wait: a run that waited for the engine's 60 s start would have
    # passed the test (errors=0), and its error, if any, would not name the 8 s deadline.
    result.assert_outcomes(errors=1, deselected=3)
    result.stdout.fnmatch_lines(["*not ready after 8 s*HTTP 503*", "*last lines of the service log*"])


@pytest.mark.slow
def test_refused_connections_during_a_3s_load_are_tolerated(pytester: pytest.Pytester, repo_root: Path) -> None:
    # The port stays closed for 3 s (connection refused), then the engine loads for 1 s more (503).
    profile = write_profile(pytester.path, repo_root, "--load-seconds 1", command_prefix="{python} -c \"import time; time.sleep(3)\" && ", ready_timeout_s=30)
    raw = yaml.safe_load(profile.read_text())
    raw["command"] = "sh -c " + _sh_quote(raw["command"].replace("&& ", "&& exec "))
    profile.write_text(yaml.safe_dump(raw))
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b4_k4", "-k", "one")
    result.assert_outcomes(passed=1, deselected=3)


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_ignored_config_fails_the_applied_check_with_a_diff(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root, "--fault ignore-config=topk")
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b8_k4", "-k", "one or two")
    result.assert_outcomes(errors=2, deselected=2)
    result.stdout.fnmatch_lines(["*speculative_eagle_topk*4*1*"])


@pytest.mark.slow
def test_service_dying_mid_run_fails_the_rest_of_its_config_and_the_next_config_runs(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root, "--fault exit-after=2", copy_probe=False)  # it counts requests
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b4_k4,bs8_b8_k4")
    outcomes = result.parseoutcomes()
    # The third request of a config may reach the engine while it exits (a connection error in
    # the test itself) or after the harness noticed the exit (an error at setup): either way
    # the rest of the config fails, and the next config starts fresh and passes its first two.
    assert outcomes.get("passed") == 4 and outcomes.get("failed", 0) + outcomes.get("errors", 0) == 4, outcomes
    for config in ("bs8_b4_k4", "bs8_b8_k4"):
        result.stdout.fnmatch_lines([f"PASSED test_gate.py::test_one[[]{config}[]]*", f"PASSED test_gate.py::test_two[[]{config}[]]*"])
        result.stdout.re_match_lines([rf"(FAILED|ERROR) test_gate.py::test_four\[{config}\]"])
    assert "exited during the run" in result.stdout.str()


@pytest.mark.slow
def test_xdist_runs_two_instances_without_port_or_config_clash(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root)
    result = run_gate(pytester, repo_root, profile, "--ddtree-config=bs8_b4_k4,bs8_b16_k4", "-n", "2")
    result.assert_outcomes(passed=8)
    seen = notes(pytester)
    by_config: dict[str, set[tuple[str, str]]] = {}
    for note in seen:
        by_config.setdefault(note["config"], set()).add((note["worker"], note["url"]))
        assert note["budget"] == {"bs8_b4_k4": 4, "bs8_b16_k4": 16}[note["config"]]
    # each config ran on one worker and one instance; the two configs used different ports
    assert all(len(v) == 1 for v in by_config.values()), by_config
    urls = {next(iter(v))[1] for v in by_config.values()}
    workers = {next(iter(v))[0] for v in by_config.values()}
    assert len(urls) == 2 and len(workers) == 2, by_config


def _engine_processes(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "pytest_ddtree.refserver" in cmdline and marker in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_sigint_stops_every_engine(pytester: pytest.Pytester, repo_root: Path) -> None:
    marker = f"--seed {4242 + os.getpid() % 1000}"
    profile = write_profile(pytester.path, repo_root, marker)
    pytester.makepyfile(test_slow="def test_slow(ddtree_service):\n    print('READY', flush=True)\n    import time; time.sleep(60)\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", f"--ddtree-service={profile}",
         f"--ddtree-matrix={repo_root / 'suites' / 'configs.yaml'}", f"--ddtree-results={pytester.path / 'results'}",
         "--ddtree-config=bs8_b4_k4", "test_slow.py"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, preexec_fn=default_sigint,
    )
    try:
        stdout = proc.stdout
        assert stdout is not None
        wait_until(lambda: (line := stdout.readline()) == "" or "READY" in line, 60, "the test's READY line", interval=0)
        assert _engine_processes(marker), "the engine should be running while the test sleeps"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until(lambda: _engine_processes(marker) == [], 5, "SIGINT to leave no engine process behind")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED


FAKES = Path(__file__).resolve().parent / "fakes"


@pytest.mark.slow
def test_systemd_profile_round_trip_restores_the_default_and_packages_the_dropin(
    pytester: pytest.Pytester, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A systemd profile driven through the plugin, with fake systemctl/journalctl on PATH that
    really run the unit's ExecStart: the config's drop-in is written and applied, and at session
    end the unit is back on its default config with the drop-in gone."""
    from pytest_ddtree.service.pool import free_port

    state = pytester.path / "systemd"
    (state / "system").mkdir(parents=True)
    monkeypatch.setenv("DDTREE_FAKE_SYSTEMD", str(state))
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    port = free_port()
    engine = f"{sys.executable} -m pytest_ddtree.refserver --host 127.0.0.1 --port {port} --clock-scale 10 --speculative-algorithm DFLASH"
    (state / "system" / "engine.service").write_text(
        f"[Service]\nExecStart={engine} --speculative-num-draft-tokens 8 --speculative-eagle-topk 4\n"
    )
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "start", "engine.service"], check=True)
    try:
        profile = write_profile(
            pytester.path, repo_root, controller="systemd", unit="engine.service",
            dropin_dir=str(state / "system"), port=port, pool=1,
            lossless="golden", lossless_args=None,
        )
        raw = yaml.safe_load(profile.read_text())
        raw["command"] = engine + " {config_args}"
        raw["url"] = f"http://127.0.0.1:{port}"
        profile.write_text(yaml.safe_dump(raw))
        package_dir = pytester.path / "packages"
        result = run_gate(
            pytester, repo_root, profile, "--ddtree-config=bs8_b12_k6", "-k", "one or two",
            f"--ddtree-package={package_dir}", "--ddtree-package-name=sysd",
        )
        result.assert_outcomes(passed=2, deselected=2)
        assert {n["budget"] for n in notes(pytester)} == {12}
        # back on the default: no drop-in, the unit restarted with the unit file's ExecStart
        assert not list((state / "system").glob("engine.service.d/*.conf"))
        client = wait_healthy(f"http://127.0.0.1:{port}", what="the default config")
        info = client.server_info()
        assert (info["speculative_num_draft_tokens"], info["speculative_eagle_topk"]) == (8, 4)
        # the package recorded the drop-in the session wrote
        dropins = list((package_dir / "sysd" / "services").rglob("*.conf"))
        assert dropins and "--speculative-num-draft-tokens 12" in dropins[0].read_text()
        verify = subprocess.run([sys.executable, "-m", "pytest_ddtree.repro", "verify", str(package_dir / "sysd")], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        subprocess.run(["systemctl", "stop", "engine.service"], check=False)


@pytest.mark.slow
def test_the_workers_exit_timeout_is_raised_for_this_session_only(pytester: pytest.Pytester) -> None:
    """xdist's Ctrl-C grace (NodeManager.EXIT_TIMEOUT, 10 s) is raised on this session's node
    manager to the profile's stop timeout plus a margin, never on the class for the whole process."""
    from tests.suite_helpers import MATRIX

    pytester.makeconftest(
        "import json, pytest\n"
        "@pytest.hookimpl(trylast=True)\n"
        "def pytest_xdist_setupnodes(config, specs):\n"
        "    from xdist.workermanage import NodeManager\n"
        "    nodes = config.pluginmanager.get_plugin('dsession').nodemanager\n"
        "    (config.rootpath / 'timeouts.json').write_text(json.dumps([nodes.EXIT_TIMEOUT, NodeManager.EXIT_TIMEOUT]))\n"
    )
    pytester.makepyfile(test_one="def test_one(ddtree_settings):\n    pass\n")
    profile = reference_profile(pytester.path, stop_timeout_s=7)
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider", f"--ddtree-service={profile}",
                                           f"--ddtree-matrix={MATRIX}", f"--ddtree-results={pytester.path / 'results'}")
    result.assert_outcomes(passed=1)
    assert json.loads((pytester.path / "timeouts.json").read_text()) == [37.0, 10]
