"""suites/test_throughput.py end to end against real reference engines (pytester).

The engines run tiny workloads at a fast simulated clock, so each session takes seconds;
faults make the engine slower (``slowdown``) or flaky (``http500-rate``) on demand.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.gates.throughput import baseline
from pytest_ddtree.gates.throughput import launches as launches_mod
from tests.bench_serving_contract import check_result
from tests.suite_helpers import set_control

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py

MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4, bs8_b4_k4]
cell_defaults: {output_tokens: 32}
cells:
  - {name: c1_tiny, concurrency: 1, context_tokens: 48, requests: 2, warmup_requests: 1}
  - {name: c4_tiny, concurrency: 4, context_tokens: 48, requests: 8, warmup_requests: 4}
  - {name: c1_huge, concurrency: 1, context_tokens: 999999, requests: 1, warmup_requests: 0}
"""


def _setup(pytester: pytest.Pytester, repo_root: Path, engine_args: str = "", pool: int = 1,
           control: str = "none") -> tuple[Path, Path]:
    """A reference profile at clock scale 5 and the module's matrix, with the profile's
    ``control:``. By default the sessions measure none: the non-speculative launch decodes ~5x
    as many steps per token as a DDTree config, so measuring it at the start and the end of every
    session was most of each test's time; the test of the control's second launch names a config
    as the control, and test_control.py measures the non-speculative one."""
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    set_control(raw, control)
    extra = f"--clock-scale 5 {engine_args}".strip()
    raw["command"] = raw["command"].replace("{config_args}", f"{extra} {{config_args}}")
    raw["pool"] = pool
    raw["max_context"] = 4096
    profile = pytester.path / f"profile{abs(hash(engine_args))}.yaml"
    profile.write_text(yaml.safe_dump(raw))
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(MATRIX)
    return profile, matrix


def _run(pytester: pytest.Pytester, repo_root: Path, profile: Path, matrix: Path, *args: str,
         config: str = "bs8_b8_k4") -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"),
        f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}",
        f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        f"--ddtree-config={config}", "-p", "no:cacheprovider", "-rA", *args, timeout=240,
    )


def _records(pytester: pytest.Pytester, kind: str = "throughput") -> list[dict[str, Any]]:
    out = []
    for path in (pytester.path / "results").glob("records-*.jsonl"):
        out += [r for line in path.read_text().splitlines() if (r := json.loads(line)).get("kind") == kind]
    return out


@pytest.mark.slow  # over 20 s on a 2-core box
def test_update_then_pass_then_slowdown_fails_then_corrupt_errors(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile, matrix = _setup(pytester, repo_root)
    # 1. no baseline: a warning with the command that creates it
    result = _run(pytester, repo_root, profile, matrix)
    result.assert_outcomes(passed=2, skipped=1, warnings=2)
    result.stdout.fnmatch_lines(["*c1_tiny: no baseline for this cell in *bs8_b8_k4.yaml; create it with: "
                                 "pytest suites --ddtree-update-baselines*--ddtree-config=bs8_b8_k4*",
                                 "*c1_huge: context 999999 tokens exceeds the profile's max_context 4096*"])
    # 2. the update flow writes reviewable YAML through the main process, also under xdist
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, profile, matrix, "--ddtree-update-baselines", "-n", "2",
                  config="bs8_b8_k4,bs8_b4_k4")
    result.assert_outcomes(passed=4, skipped=2)
    for config in ("bs8_b8_k4", "bs8_b4_k4"):
        data = yaml.safe_load((pytester.path / "baselines" / "refserver" / f"{config}.yaml").read_text())
        assert sorted(data["metrics"]) == ["c1_tiny", "c4_tiny"]
        gate = data["metrics"]["c4_tiny"]["gates"]["output_throughput"]
        assert gate["direction"] == "higher" and gate["tolerance"] == 0.05
        (session,) = gate["sessions"]
        assert len(session["samples"]) >= 3 and session["session"]
        assert data["fingerprint"]["name"] == "refserver"
    assert not list((pytester.path / "baselines").rglob("*.tmp"))
    # 3. unchanged engine passes; table and results land in the results folder
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, profile, matrix)
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*ddtree throughput sweep*", "*bs8_b8_k4*c4_tiny*4*pass*"])
    assert "Best aggregate throughput" not in result.stdout.str()  # one config: nothing was compared, nothing to recommend
    results = json.loads((pytester.path / "results" / "results.json").read_text())
    cell = next(c for c in results["throughput"] if c["cell"] == "c4_tiny")
    assert cell["output_throughput"] > 0 and cell["completed"] == 8 and cell["ddtree_tokens_per_verify"] > 1
    # every key SGLang's bench_serving writes per result, with its type (tests/bench_serving_contract.py)
    assert check_result(cell) == [], check_result(cell)
    assert cell["server_info"]["speculative_algorithm"] == "DFLASH" and cell["request_rate"] == float("inf")
    # bench_serving's accept_length is the server's avg_spec_accept_length, None while the server omits it
    # (fewer decode batches than --decode-log-interval, as in this tiny cell)
    state = cell["server_info"]["internal_states"][0]
    assert cell["accept_length"] == state.get("avg_spec_accept_length") or cell["accept_length"] > 1
    # 4. a slower engine fails the gate, saying by how much and how sure
    slow, _ = _setup(pytester, repo_root, "--fault slowdown=1.3")
    shutil.rmtree(pytester.path / "results")
    # one cell: a regression is confirmed by 12 fresh repeats on the slowed engine, per flagged cell
    result = _run(pytester, repo_root, slow, matrix, "--ddtree-cell=c4_tiny")
    assert result.ret == 1
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*bs8_b8_k4 c4_tiny: REGRESSION*",
                                 "*output_throughput: * tok/s, -*% (95% t-interval on log values *): REGRESSION beyond the *"
                                 "reproduced by the confirmation (12 fresh repeats)*"])
    assert _records(pytester, "throughput-confirm-repeat"), "confirmation repeats are recorded as measured"
    assert "blessed on another setup" not in result.stdout.str()  # the same engine, slowed: nothing else to say
    # 4b. the engine at another clock scale (its simulated accelerator) is another accelerator: its
    # times are not compared with the baseline's, and each cell says why and what to do
    other, _ = _setup(pytester, repo_root, "--clock-scale 4")
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, other, matrix, "--ddtree-cell=c4_tiny")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*blessed on the reference engine at clock scale 5, and this engine runs at 4*"
                                 "start the engine with --clock-scale 5*"])
    # 4c. a slower engine on another setup at the same clock fails, and the failure says that the
    # baseline was blessed on another setup (the file's fingerprint), not only that it is slower
    changed, _ = _setup(pytester, repo_root, "--disable-overlap-schedule --fault slowdown=1.3")
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, changed, matrix, "--ddtree-cell=c4_tiny")
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*bs8_b8_k4 c4_tiny: REGRESSION*",
                                 "*bs8_b8_k4.yaml was blessed on another setup than this service's: disable_overlap_schedule "
                                 "'False' when blessed, 'True' here; *--ddtree-update-baselines*"])
    # 5. a corrupt baseline is a clear error naming the file and the fix
    (pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").write_text("metrics: {c1_tiny: [oops\n")
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, profile, matrix)
    result.assert_outcomes(failed=2, skipped=1)
    result.stdout.fnmatch_lines(["*corrupt baseline *bs8_b8_k4.yaml: YAML error*Fix or delete it*"])


@pytest.mark.slow
def test_errors_make_cells_invalid_and_require_baselines_fails(pytester: pytest.Pytester, repo_root: Path) -> None:
    flaky, matrix = _setup(pytester, repo_root, "--fault http500-rate=0.8")
    result = _run(pytester, repo_root, flaky, matrix, "--ddtree-require-baselines")
    result.assert_outcomes(failed=2, skipped=1)
    result.stdout.fnmatch_lines(["*INVALID measurement (not a regression, not a pass)*", "*HTTP 500*"])
    recs = _records(pytester)
    assert {r["status"] for r in recs} == {"invalid"}
    assert all(r["measurement_status"] == "invalid" and r["problems"] for r in recs)
    assert _records(pytester, "throughput-repeat"), "each repeat is recorded as it is measured"
    # the same without faults: a missing baseline fails under --ddtree-require-baselines
    profile, _ = _setup(pytester, repo_root)
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, profile, matrix, "--ddtree-require-baselines", "--ddtree-cell=c1_*")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*no baseline for this cell*create it with: pytest suites --ddtree-update-baselines*"
                                 "(--ddtree-require-baselines)*"])


WHAT_TO_DO = "*rerun on a quieter machine (fewer -n workers, nothing else running) or raise --ddtree-repeats*"


def test_a_cell_that_stays_inconclusive_is_reported_and_fails_only_under_require_baselines(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    # A baseline of three blessed sessions, as the bless flow writes it (blessing here would
    # itself be refused whenever the loaded test machine makes the measurement inconclusive).
    entry = None
    for session in ("s1", "s2", "s3"):
        entry = baseline.baseline_cell_entry(
            {"concurrency": 1, "context_tokens": 48, "output_tokens": 32, "requests": 2,
             "prompts": "documents via /tokenize"},
            {"output_throughput": [400.0, 404.0, 398.0], "ddtree_tokens_per_verify": [4.5, 4.5, 4.5],
             "median_ttft_ms": [14.0, 14.2, 13.9]}, entry, session=session)
    (pytester.path / "baselines" / "refserver").mkdir(parents=True)
    (pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").write_text(
        yaml.safe_dump({"config": "bs8_b8_k4", "metrics": {"c1_tiny": entry}}))
    # The same engine with a clock 5000x faster than real time: each forward pass is due within
    # microseconds, less than the host needs to run it, so the engine cannot keep its clock
    # (busy a few % of the measured time) and its repeats disagree even after the extra
    # repeats: the numbers describe the machine, and the cell stays inconclusive for either reason.
    racing, matrix = _setup(pytester, repo_root, "--clock-scale 5000")
    for args in ((), ("--ddtree-require-baselines",)):
        shutil.rmtree(pytester.path / "results", ignore_errors=True)
        result = _run(pytester, repo_root, racing, matrix, "--ddtree-cell=c1_tiny", *args)
        (rec,) = _records(pytester)
        assert rec["status"] == "inconclusive" and rec["measurement_status"] == "inconclusive", rec
        if not args:  # reported with its reason, not a pass and not a failure
            result.assert_outcomes(skipped=1)
            assert result.ret == 0
            result.stdout.fnmatch_lines(["*ddtree throughput sweep*", "*bs8_b8_k4*c1_tiny*inconclusive*",
                                         "*SKIPPED*bs8_b8_k4 c1_tiny: INCONCLUSIVE*" + WHAT_TO_DO])
        else:  # the CI mode: a cell it could not judge fails the run, saying why and what to do
            result.assert_outcomes(failed=1)
            assert result.ret == 1
            result.stdout.fnmatch_lines(["*bs8_b8_k4 c1_tiny: INCONCLUSIVE*",
                                         WHAT_TO_DO,
                                         "*inconclusive fails under --ddtree-require-baselines: a CI run must not pass "
                                         "a cell it could not judge*"])


@pytest.mark.slow
def test_benchmark_records_carry_the_figures(pytester: pytest.Pytester, repo_root: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest-benchmark disables itself when it sees an xdist worker's environment (ours, when
    # these tests run under -n): the inner session is not one.
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(var, raising=False)
    profile, matrix = _setup(pytester, repo_root)
    bench = pytester.path / "bench.json"
    result = _run(pytester, repo_root, profile, matrix, f"--benchmark-json={bench}", "--ddtree-cell=c4_*")
    result.assert_outcomes(passed=1, warnings=1)
    (entry,) = json.loads(bench.read_text())["benchmarks"]
    info = entry["extra_info"]
    assert info["cell"] == "c4_tiny" and info["config"] == "bs8_b8_k4" and info["status"] == "missing"
    assert info["output_throughput"] > 0 and info["completed"] == 8
    assert entry["stats"]["rounds"] == info["repeats"] >= 3
    # its rounds replay the counted repeats' measured durations, not a timing of their own
    durations = sorted(r["metrics"]["duration"] for r in _records(pytester, "throughput-repeat") if not r.get("spoiled"))
    assert math.isclose(entry["stats"]["min"], durations[0], rel_tol=1e-6), (entry["stats"], durations)
    assert math.isclose(entry["stats"]["max"], durations[-1], rel_tol=1e-6), (entry["stats"], durations)
    # without pytest-benchmark the gate still runs
    result = _run(pytester, repo_root, profile, matrix, "-p", "no:benchmark", "--ddtree-cell=c4_*")
    result.assert_outcomes(passed=1, warnings=1)


THREE_CELLS = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4, bs8_b4_k4]
cell_defaults: {output_tokens: 32}
cells:
  - {name: c1_tiny, concurrency: 1, context_tokens: 48, requests: 2, warmup_requests: 1}
  - {name: c2_tiny, concurrency: 2, context_tokens: 48, requests: 4, warmup_requests: 2}
  - {name: c4_tiny, concurrency: 4, context_tokens: 48, requests: 8, warmup_requests: 4}
"""


def _scale_blessed_throughput(path: Path, factor: float) -> None:
    """Make a blessed config ``factor`` times as fast in every session of every cell (output tok/s)."""
    data = yaml.safe_load(path.read_text())
    for cell in data["metrics"].values():
        for session in cell["gates"]["output_throughput"]["sessions"]:
            session["samples"] = [v * factor for v in session["samples"]]
    path.write_text(yaml.safe_dump(data))


@pytest.mark.slow  # over 20 s on a 2-core box
def test_a_config_slower_as_a_whole_fails_the_session_against_the_other_configs(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    """The session-end check of finish.py, through the plugin under xdist: bless two configs,
    then make one config's baseline three times as fast as the engine is (as if that config had
    regressed as a whole since); the run fails naming that config against the other one.

    Three times, not 10-25%: this is the wiring (records -> main process -> summary, exit status,
    results.json); how small a move the check catches is benchmarks/bench_gate_e2e.py's job.
    On a loaded 2-core box a blessed cell can be 20-30% off (seen: a bless beside another
    test run), which a 25% move does not clear and a threefold one does."""
    profile, matrix = _setup(pytester, repo_root)
    matrix.write_text(THREE_CELLS)
    both = "bs8_b8_k4,bs8_b4_k4"
    result = _run(pytester, repo_root, profile, matrix, "--ddtree-update-baselines", "-n", "2", config=both)
    result.assert_outcomes(passed=6)
    _scale_blessed_throughput(pytester.path / "baselines" / "refserver" / "bs8_b4_k4.yaml", 3.0)
    shutil.rmtree(pytester.path / "results")
    result = _run(pytester, repo_root, profile, matrix, "-n", "2", config=both)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*ddtree configs against their session*",
                                 "bs8_b4_k4: output_throughput moved -*% against its baseline (all its cells together) "
                                 "while the session's other 1 config(s) moved *: -*% relative, beyond the tolerance *"
                                 "a REGRESSION of this config against the rest of the session*Compared with: bs8_b8_k4*"])
    # a failure of the session, where pytest users look: a failed test in the short summary and the counts
    # (its cells fail too here: a threefold baseline is beyond any cell's tolerance as well)
    result.stdout.fnmatch_lines(["FAILED *ddtree::configs-against-session - bs8_b4*"])
    cells_failed = sum(1 for line in result.outlines if line.startswith("FAILED ") and "test_throughput[" in line)
    assert result.parseoutcomes().get("failed") == cells_failed + 1, result.stdout.str()[-2000:]
    found = json.loads((pytester.path / "results" / "results.json").read_text())["configs_against_session"]
    by_config = {f["config"]: f for f in found if f["metric"] == "output_throughput"}
    assert by_config["bs8_b4_k4"]["status"] == "regression" and by_config["bs8_b4_k4"]["relative"] < -0.4
    assert by_config["bs8_b8_k4"]["status"] == "pass"


#: A plugin for the sessions under test that logs each ``validate_section`` call and its caller.
SPY = "ddtree_validate_spy"
_SPY_SOURCE = """
import json, os, sys
from pytest_ddtree.gates.throughput import baseline, cells, measurement

_real = baseline.validate_section


def _spy(section, where):
    with open(os.environ["DDTREE_VALIDATE_SPY"], "a") as out:
        out.write(json.dumps({"where": where, "caller": sys._getframe(1).f_code.co_name}) + "\\n")
    return _real(section, where)


for _module in (baseline, cells, measurement):  # each looks the name up in its own globals
    _module.validate_section = _spy
"""


def _spy_on_validate_section(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the sessions' spy logs (``SPY``: pytester's folder is on their PYTHONPATH)."""
    pytester.makepyfile(**{SPY: _SPY_SOURCE})
    log = pytester.path / "validate_section.jsonl"
    monkeypatch.setenv("DDTREE_VALIDATE_SPY", str(log))
    return log


def _control_launches(pytester: pytest.Pytester) -> int:
    """How many launches of the control the session measured (its launch policy decides)."""
    return len({r.get("control_launch") for r in _records(pytester, "throughput-control")})


def _each_cell_path_validates_its_baseline_once(log: Path, configs: int, relaunches: list[dict[str, Any]],
                                                control_launches: int, judged: bool) -> None:
    """#35: the suite's campaign of a config, each relaunch of one and each launch of the control
    read and validate their baseline once (``cells.read_baseline``), whatever their number of cells;
    the judged sessions' noise priors read every config's file once per process and per relaunch
    (``blessed_judging``), and nothing else validates a baseline section."""
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    by_file: dict[tuple[str, str], int] = {}
    for call in calls:
        key = (call["caller"], Path(call["where"]).stem)
        by_file[key] = by_file.get(key, 0) + 1
    assert {caller for caller, _ in by_file} <= {"read_baseline", "_blessed_sections"}, by_file
    relaunched = {(r["config"], r["relaunch"]) for r in relaunches}
    read = {stem: n for (caller, stem), n in by_file.items() if caller == "read_baseline"}
    expected = {"control": control_launches}
    for config in ("bs8_b8_k4", "bs8_b4_k4", "bs8_b12_k4")[:configs]:
        expected[config] = 1 + sum(1 for name, _ in relaunched if name == config)
    assert read == expected, (read, expected, sorted(relaunched))
    priors = {stem: n for (caller, stem), n in by_file.items() if caller == "_blessed_sections"}
    if judged:
        assert priors == {config: 1 + len(relaunched) for config in expected if config != "control"}, priors
    else:  # a bless judges nothing: no priors read
        assert priors == {}, priors


@pytest.mark.slow  # over 20 s on a 2-core box
def test_a_process_of_three_configs_relaunches_the_config_that_stands_out_and_measures_the_control_again(
        pytester: pytest.Pytester, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's end (ddtree_control's teardown), through the plugin in one process: bless three
    configs (the control at the start and the end, pooled), make one config's baseline three times
    as fast as the engine is; the judged run relaunches that config (records throughput-relaunch),
    measures the control once more at the end (control_launch 2) and fails the config on all its
    launches, saying so in the summary."""
    # an inner session inherits its parent's xdist variables (a test run under -n): they say nothing of
    # its own process (one, no -n), whose share is all three configs, at control_min_configs (3)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    profile, matrix = _setup(pytester, repo_root, control="bs16_b16_k4")
    matrix.write_text(THREE_CELLS.replace("[bs8_b8_k4, bs8_b4_k4]", "[bs8_b8_k4, bs8_b4_k4, bs8_b12_k4]"))
    three = "bs8_b8_k4,bs8_b4_k4,bs8_b12_k4"
    spied = _spy_on_validate_section(pytester, monkeypatch)
    result = _run(pytester, repo_root, profile, matrix, "--ddtree-update-baselines", "-p", SPY, config=three)
    result.assert_outcomes(passed=9)
    control = yaml.safe_load((pytester.path / "baselines" / "refserver" / "control.yaml").read_text())
    blessed = control["metrics"]["c1_tiny"]["gates"]["output_throughput"]["sessions"]
    assert len(blessed) == 1 and len(blessed[0]["samples"]) >= 6  # both launches of the control
    _each_cell_path_validates_its_baseline_once(spied, 3, [], _control_launches(pytester), judged=False)
    _scale_blessed_throughput(pytester.path / "baselines" / "refserver" / "bs8_b4_k4.yaml", 3.0)
    shutil.rmtree(pytester.path / "results")
    spied.unlink()
    result = _run(pytester, repo_root, profile, matrix, "-p", SPY, config=three)
    assert result.ret == 1, result.stdout.str()
    relaunches = _records(pytester, "throughput-relaunch")
    _each_cell_path_validates_its_baseline_once(spied, 3, relaunches, _control_launches(pytester), judged=True)
    # bs8_b4_k4 is relaunched; on a busy box an unchanged config's launch can stand out by chance
    # and be relaunched too (the screen is meant to be lenient: a relaunch costs only time).
    assert "bs8_b4_k4" in {r["config"] for r in relaunches}, relaunches
    assert {r["cell"] for r in relaunches if r["config"] == "bs8_b4_k4"} == {"c1_tiny", "c2_tiny", "c4_tiny"}
    # the relaunch measured each cell RELAUNCH_REPEATS times (clean ones; a loaded box's spoiled ones are
    # retaken) and confirmed none of its flagged cells (its cells are all three times slower than the
    # baseline): it is judged on the config's common change, which no confirmation moves
    clean: dict[tuple[str, int], int] = {}
    for r in _records(pytester, "throughput-relaunch-repeat"):
        if r["config"] == "bs8_b4_k4" and not r.get("spoiled"):
            clean[(r["cell"], r["relaunch"])] = clean.get((r["cell"], r["relaunch"]), 0) + 1
    assert set(clean.values()) == {launches_mod.RELAUNCH_REPEATS}, clean
    assert not [r for r in _records(pytester, "throughput-confirm-repeat") if r.get("relaunch")]
    assert all(r["verdict"]["status"] == "flagged" for r in relaunches if r["config"] == "bs8_b4_k4"), relaunches
    repeats = [(r["kind"], r["cell"], r.get("relaunch"), r["repeat"]) for kind in ("throughput-repeat", "throughput-confirm-repeat",
               "throughput-relaunch-repeat") for r in _records(pytester, kind) if r["config"] == "bs8_b4_k4"]
    assert len(set(repeats)) == len(repeats)
    # the control at the start and the end (launches 1 and 2); the launch policy may add end launches
    # while the uniform shift reads inconclusive (a config three times slower pulls it), up to the
    # reference profile's control_max_launches, numbered on
    launches = {r.get("control_launch") for r in _records(pytester, "throughput-control")}
    assert {1, 2} <= launches and launches == set(range(1, len(launches) + 1)) and len(launches) <= 6, launches
    result.stdout.fnmatch_lines(["*ddtree configs against their session*",
                                 "bs8_b4_k4: output_throughput moved -*relaunched * time(s)*a REGRESSION*"])
