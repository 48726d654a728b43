"""The calibration probe: the shipped CPU probe as a real process, a profile's calibration_command
run through a real process controller's host on loopback, hostile answers, its deadline, and its
runs in the session's records and results.json."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ddtree.service import calibration
from pytest_ddtree.service.calibration import CalibrationOutputError, parse_output, run_calibration
from pytest_ddtree.service.manager import ServiceManager
from pytest_ddtree.service.profile import ProfileError, parse_profile
from pytest_ddtree.service.ssh import LocalHost
from tests.polling import wait_until
from tests.refserver_helpers import managers  # noqa: F401 (a fixture: every manager closed, no process left)
from tests.service_helpers import BS8_B8_K4, make_manager, make_profile, pid_alive

PROBE = "{python} -m pytest_ddtree.measure.calibration --rounds 3"


def test_the_shipped_cpu_probe_prints_one_json_line_of_figures() -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest_ddtree.measure.calibration", "--rounds", "3"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    figures = json.loads(lines[0])
    assert set(figures) == {"cpu_sha256_mib_per_s", "cpu_sort_keys_per_s"}
    assert all(isinstance(v, float) and v > 0 for v in figures.values())
    assert parse_output(proc.stdout) == figures


def test_the_probe_module_does_not_import_pytest() -> None:
    code = "import sys, pytest_ddtree.measure.calibration; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("stdout, figures", [
    ('{"gemm_tflops": 712.3, "cpu_ops_per_s": 1.2e7}\n', {"gemm_tflops": 712.3, "cpu_ops_per_s": 1.2e7}),
    ("warming up\n\n  42.5  \n\n", {"calibration": 42.5}),
    ('{"a": 1}\n{"b": 2}\n', {"b": 2.0}),
])
def test_the_answer_is_the_last_non_empty_line(stdout: str, figures: dict[str, float]) -> None:
    assert parse_output(stdout) == figures


@pytest.mark.parametrize("stdout, problem", [
    ("", "printed nothing"),
    ("done\n", "not JSON"),
    ('{"x": NaN}', "NaN is not a figure"),
    ('{"x": Infinity}', "Infinity is not a figure"),
    ('{"x": -3.0}', "not a finite number > 0"),
    ('{"x": 0}', "not a finite number > 0"),
    ('{"x": true}', "not a finite number > 0"),
    ('{"x": {"y": 1}}', "not a finite number > 0"),
    ('{"x": "12"}', "not a finite number > 0"),
    ('{"x": 1e400}', "not a finite number > 0"),
    ("[1, 2]", "not a JSON object"),
    ("-5", "not a JSON object"),
    ("{}", "not a JSON object"),
    ('{"bad name": 1}', "is not a name"),
    ("[" * 2000 + "]" * 2000, "not JSON"),
    ("{" + ", ".join(f'"f{i}": 1' for i in range(40)) + "}", "40 figures"),
    ("7" * 5000, "5000 characters long"),
    ("\ufffd\ufffd{", "not JSON"),
])
def test_a_hostile_answer_is_a_clear_error(stdout: str, problem: str) -> None:
    with pytest.raises(CalibrationOutputError, match=problem.replace("(", r"\(")):
        parse_output(stdout)


def _run(command: str, timeout_s: float = 60.0) -> calibration.CalibrationRun:
    host = LocalHost()
    try:
        return run_calibration(host, command, timeout_s=timeout_s)
    finally:
        host.close()


def test_a_command_that_fails_is_named_with_its_exit_code_and_output_tail() -> None:
    run = _run("echo starting; echo 'no GPU here' >&2; exit 3")
    assert not run.figures and run.error is not None
    assert "echo starting" in run.error and "exit code 3" in run.error and "no GPU here" in run.error


def test_non_utf8_and_flooded_output_neither_crash_nor_hang() -> None:
    garbage = _run(f"{sys.executable} -c \"import sys; sys.stdout.buffer.write(bytes(range(256)) * 10)\"")
    assert garbage.error is not None and "exit code 0" in garbage.error
    flood = _run("yes 1234567890")  # never exits on its own: the output bound stops it
    assert flood.error is not None and f"more than {calibration.MAX_OUTPUT_BYTES} bytes" in flood.error


def test_a_probe_that_never_ends_is_killed_at_its_deadline(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    run = _run(f"sh -c 'echo $$ > {marker}; exec sleep 3600' & wait", timeout_s=1.5)
    assert run.error is not None and "calibration_timeout_s = 1.5 s" in run.error
    pid = int(marker.read_text())
    wait_until(lambda: not pid_alive(pid), 10, "the probe's child gone after its deadline")


def test_the_profile_key_is_validated() -> None:
    profile = make_profile(calibration_command=PROBE, calibration_timeout_s=30)
    assert profile.calibration_timeout_s == 30.0
    assert profile.render_calibration_command() == f"{sys.executable} -m pytest_ddtree.measure.calibration --rounds 3"
    assert make_profile().render_calibration_command() is None
    for bad, problem in ((dict(calibration_command="{port} x"), "unknown placeholder"),
                         (dict(calibration_timeout_s=0), "must be positive"),
                         (dict(calibration_comand=PROBE), "did you mean 'calibration_command'"),
                         (dict(calibration_command=" "), "is empty")):
        with pytest.raises(ProfileError, match=problem):
            make_profile(**bad)
    with pytest.raises(ProfileError, match="calibration_command: the external controller"):
        parse_profile({"name": "theirs", "controller": "external", "url": "http://127.0.0.1:1",
                       "calibration_command": PROBE})


def test_the_manager_probes_before_its_first_launch_and_after_its_last_stop(tmp_path: Path,
                                                                             managers: list[ServiceManager]) -> None:
    lines: list[str] = []
    m = make_manager(make_profile(calibration_command=PROBE), tmp_path, lines)
    managers.append(m)
    m.ensure(BS8_B8_K4)
    assert [run.when for run in m.calibrations] == ["start"]
    start = m.calibrations[0]
    assert start.error is None and start.host == "local" and set(start.figures) == {"cpu_sha256_mib_per_s",
                                                                                      "cpu_sort_keys_per_s"}
    assert any(line.startswith("calibration probe (start) on local") for line in lines)
    probe_line = next(i for i, line in enumerate(lines) if line.startswith("calibration probe (start) on"))
    assert probe_line < next(i for i, line in enumerate(lines) if line.startswith("starting bs8_b8_k4"))
    m.ensure(BS8_B8_K4)
    assert len(m.calibrations) == 1  # one probe a session start, not one a launch
    m.close()
    assert [run.when for run in m.calibrations] == ["start", "end"]
    assert all(run.error is None and run.figures for run in m.calibrations)
    record = m.calibrations[1].as_record()
    assert record["when"] == "end" and record["figures"] == dict(m.calibrations[1].figures)


def _reference_profile_with_probe(repo_root: Path, folder: Path, command: str = PROBE) -> Path:
    """The shipped reference profile with a calibration_command (the shipped one has none: the
    embedded engine's speed is its clock model's)."""
    import yaml

    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    assert "calibration_command" not in raw
    raw["calibration_command"] = command
    path = folder / "reference-calibrated.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_a_session_records_its_probe_runs_in_results_json_and_the_history(pytester: pytest.Pytester,
                                                                         repo_root: Path) -> None:
    profile = _reference_profile_with_probe(repo_root, pytester.path)
    results, db = pytester.path / "results", pytester.path / "history.db"
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites"), f"--rootdir={repo_root}", "-p", "no:cacheprovider", "-k", "health",
        "--ddtree-config=bs8_b8_k4", f"--ddtree-service={profile}", f"--ddtree-results={results}",
        f"--ddtree-history={db}", timeout=300)
    assert result.ret == 0, result.stdout.str()[-3000:]
    payload = json.loads((results / "results.json").read_text())
    section = payload["calibration"]
    stored = sqlite3.connect(db).execute("SELECT figure, run_index, value FROM ddtree_calibration WHERE session_id = ?"
                                         " ORDER BY figure, run_index", (payload["session_id"],)).fetchall()
    assert stored == [(name, i, run["figures"][name]) for name in sorted(section["figures"])
                      for i, run in enumerate(section["runs"])]
    assert section["command"].endswith("-m pytest_ddtree.measure.calibration --rounds 3")
    assert [run["when"] for run in section["runs"]] == ["start", "end"]
    assert all(run["figures"]["cpu_sort_keys_per_s"] > 0 and "error" not in run for run in section["runs"])
    assert set(section["figures"]) == {"cpu_sha256_mib_per_s", "cpu_sort_keys_per_s"}
    result.stdout.fnmatch_lines(["*ddtree calibration*", "start on local: cpu_sha256_mib_per_s *"])


def test_a_broken_probe_fails_the_session_and_says_why(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = _reference_profile_with_probe(repo_root, pytester.path, "echo no probe here; exit 5")
    results = pytester.path / "results"
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites"), f"--rootdir={repo_root}", "-p", "no:cacheprovider", "-k", "health",
        "--ddtree-config=bs8_b8_k4", f"--ddtree-service={profile}", f"--ddtree-results={results}", timeout=300)
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*calibration probe (start): calibration command `echo no probe here; exit 5` on local: "
                                 "exit code 5; last lines of its output: no probe here*"])
    runs = json.loads((results / "results.json").read_text())["calibration"]["runs"]
    assert [run["when"] for run in runs] == ["start", "end"] and all("exit code 5" in run["error"] for run in runs)


def test_the_gpu_probe_fails_clearly_on_a_host_without_a_gpu(repo_root: Path) -> None:
    """What can be tested here (no GPU on this project's boxes): without torch, or without a CUDA
    device, it exits 2 and says which; a calibration command with it then fails the session clearly."""
    proc = subprocess.run([sys.executable, str(repo_root / "suites" / "services" / "calibrate_gpu.py")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert ("torch is not importable" in proc.stderr) or ("torch sees no CUDA device" in proc.stderr), proc.stderr


def test_on_an_ssh_host_the_probe_runs_there_and_its_deadline_ends_it_there(tmp_path: Path) -> None:
    """A real sshd on loopback (tests/fleet_helpers.py): the shipped probe answers through ssh; a
    probe that never ends is ended on the host by its own timeout(1) at calibration_timeout_s
    (killing the local ssh alone would leave it running there); a flood is cut at the bound."""
    from pytest_ddtree.service.ssh import SSHHost
    from tests.fleet_helpers import SshFleet, sshd_binary

    if sshd_binary() is None:
        pytest.skip("sshd is not installed: apt-get install -y openssh-server openssh-client (.ci/run does this)")
    fleet = SshFleet(tmp_path / "fleet", n=1).start()
    host = SSHHost(fleet.hosts[0].target, fleet.ssh_options())
    try:
        ok = run_calibration(host, f"{sys.executable} -m pytest_ddtree.measure.calibration --rounds 1", timeout_s=60)
        assert ok.error is None and ok.host == host.name and ok.figures["cpu_sha256_mib_per_s"] > 0
        marker = tmp_path / "remote.pid"
        slow = run_calibration(host, f"echo $$ > {marker}; exec sleep 3600", timeout_s=1)
        assert slow.error is not None and "calibration_timeout_s = 1 s (killed there by timeout(1)" in slow.error
        pid = int(marker.read_text())
        wait_until(lambda: not pid_alive(pid), 15, "the remote probe gone after its deadline")
        flood = run_calibration(host, "yes 1234567890", timeout_s=60)
        assert flood.error is not None and f"more than {calibration.MAX_OUTPUT_BYTES} bytes" in flood.error
    finally:
        host.close()
        fleet.close()
