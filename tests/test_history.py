"""The history store (SQLite and a real PostgreSQL server), its migrations, and change points.

The PostgreSQL tests start a throwaway server from Debian's ``postgresql`` package on a loopback
port (tests/postgres_helpers.py); where none can start they skip and say why.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_ddtree.report import changepoints
from pytest_ddtree.report.history import MIGRATIONS, Build, CellEntry, HistoryError, HistoryStore, SessionEntry
from tests import history_helpers as synthetic
from tests.postgres_helpers import postgres_url  # noqa: F401 - a fixture
from tests.suite_helpers import reference_profile


@pytest.fixture(params=["sqlite", "postgresql"])
def history_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty history database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    import psycopg

    base: str = request.getfixturevalue("postgres_url")
    name = f"h{abs(hash(request.node.nodeid)) % 10**8}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + f"/{name}"


def _raw_connect(url: str) -> object:
    """A plain DB-API connection (autocommit) to build an old schema by hand."""
    if url.startswith("sqlite:///"):
        return sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _session(sid: str, started_at: float, value: float = 1000.0) -> tuple[SessionEntry, list[CellEntry]]:
    cell = CellEntry(config="bs8_b8_k4", cell="c1_short", hardware_profile="refserver", status="pass",
                     samples={"output_throughput": [value, value * 1.01, value * 0.99]},
                     verdicts={"output_throughput": {"status": "pass", "change": 0.01, "message": "ok"}})
    return SessionEntry(sid, started_at, host="h", build=Build(engine_version="0.5.3")), [cell]


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tests.history_helpers import synthetic_session
    from tests.polling import wait_until
    from pytest_ddtree.report.history import HistoryStore
    url, parity, meet = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    with HistoryStore(url) as store:
        (meet / f"ready-{parity}").touch()  # both writers connected: start together
        wait_until((meet / f"ready-{1 - parity}").exists, 60, "the other writer to connect", interval=0.01)
        for index in range(parity, 16, 2):
            store.append(*synthetic_session(index))
            store.append(*synthetic_session(99))  # the same session from both writers: one copy stays
""")


def test_two_writers_at_once_both_land_and_a_session_appended_twice_is_kept_once(history_url: str, repo_root: Path,
                                                                                  tmp_path: Path) -> None:
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, history_url, str(parity), str(tmp_path)], cwd=repo_root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for parity in (0, 1)]
    for w in writers:
        _, err = w.communicate(timeout=180)
        assert w.returncode == 0, err
    with HistoryStore(history_url) as store:
        ids = store.session_ids()
        cells = store.cells()
    assert len(ids) == 17 and len(set(ids)) == 17, ids
    per_session = {sid: [c for c in cells if c.session.session_id == sid] for sid in ids}
    expected_cells = len(synthetic.CONFIGS) * len(synthetic.CELLS)
    assert all(len(v) == expected_cells for v in per_session.values()), {k: len(v) for k, v in per_session.items()}
    shared = per_session["20261001T009900Z-s99"]
    assert all(len(c.samples["output_throughput"]) == synthetic.REPEATS for c in shared)
    assert shared[0].session.build.engine_version == "0.5.3" and shared[0].verdicts["output_throughput"] == "pass"


def test_a_reader_takes_the_last_sessions_of_a_long_history(history_url: str) -> None:
    """The window bounds what a reader holds; the newest sessions are the ones kept, on both backends."""
    with HistoryStore(history_url) as store:
        for k in range(7):
            store.append(*_session(f"s{k}", 1000.0 + k, value=1000.0 + k))
        assert [c.session.session_id for c in store.cells(last_sessions=3)] == ["s4", "s5", "s6"]
        assert [c.samples["output_throughput"][0] for c in store.cells(last_sessions=3)] == [1004.0, 1005.0, 1006.0]
        assert [c.verdicts for c in store.cells(last_sessions=2)] == [{"output_throughput": "pass"}] * 2
        assert len(store.cells(last_sessions=0)) == len(store.cells(last_sessions=None)) == 7


def test_ddtree_report_history_sessions_draws_only_the_last_ones(tmp_path: Path) -> None:
    url = str(tmp_path / "history.db")
    with HistoryStore(url) as store:
        for k in range(6):
            store.append(*_session(f"nightly-run-{k}", 1000.0 + k))
    out = tmp_path / "history.html"
    run = subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", url, "--history-sessions", "2",
                          "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    page = out.read_text()
    assert "nightly-run-5" in page and "nightly-run-4" in page and "nightly-run-3" not in page
    bad = subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", url, "--history-sessions", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--history-sessions" in bad.stderr


def test_an_older_schema_is_migrated_keeping_its_sessions(history_url: str) -> None:
    conn = _raw_connect(history_url)
    mark = "?" if history_url.startswith("sqlite") else "%s"
    for statement in MIGRATIONS[0][1]:  # the first layout, as an older pytest-ddtree wrote it
        conn.execute(statement)  # type: ignore[attr-defined]
    conn.execute("CREATE TABLE ddtree_schema (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)")  # type: ignore[attr-defined]
    conn.execute("INSERT INTO ddtree_schema VALUES (1, 0)")  # type: ignore[attr-defined]
    conn.execute(f"INSERT INTO ddtree_sessions VALUES ({', '.join([mark] * 6)})",  # type: ignore[attr-defined]
                 ("old-session", 100.0, "h", "0.5.2", "abc123", "/results/old"))
    conn.execute(f"INSERT INTO ddtree_cells VALUES ({', '.join([mark] * 5)})", ("old-session", "bs8_b8_k4", "c1_short", "refserver", "pass"))  # type: ignore[attr-defined]
    conn.execute(f"INSERT INTO ddtree_samples VALUES ({', '.join([mark] * 6)})",  # type: ignore[attr-defined]
                 ("old-session", "bs8_b8_k4", "c1_short", "output_throughput", 0, 950.0))
    conn.close()  # type: ignore[attr-defined]

    with HistoryStore(history_url) as store:
        assert store.schema_version() == MIGRATIONS[-1][0]
        store.append(*_session("new-session", 200.0))
    with HistoryStore(history_url) as store:  # committed: another connection sees both
        cells = store.cells()
    old, new = cells
    assert old.session.session_id == "old-session" and old.samples == {"output_throughput": [950.0]}
    assert old.session.build.engine_version == "0.5.2" and old.session.build.project_commit == "abc123"
    assert old.session.build.engine_build is None and old.verdicts == {}
    assert new.session.session_id == "new-session" and new.verdicts == {"output_throughput": "pass"}


def test_a_schema_newer_than_this_version_is_refused_and_left_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with HistoryStore(url) as store:
        store.append(*_session("s1", 1.0))
    conn = sqlite3.connect(tmp_path / "h.db", isolation_level=None)
    conn.execute("INSERT INTO ddtree_schema VALUES (99, 0)")
    conn.close()
    with pytest.raises(HistoryError, match="newer pytest-ddtree"):
        HistoryStore(url)
    conn = sqlite3.connect(tmp_path / "h.db")
    assert conn.execute("SELECT COUNT(*) FROM ddtree_sessions").fetchone() == (1,)


def test_bad_history_urls_say_what_to_give() -> None:
    with pytest.raises(HistoryError, match="unknown scheme"):
        HistoryStore("mysql://u:secret@db/x")
    with pytest.raises(HistoryError, match="does not exist"):
        HistoryStore("/no/such/folder/h.db")
    with pytest.raises(HistoryError, match="cannot connect") as info:
        HistoryStore("postgresql://u:secret@127.0.0.1:1/x")
    assert "secret" not in str(info.value)


def test_synthetic_history_finds_the_step_and_the_creep_and_nothing_else(tmp_path: Path) -> None:
    url = str(tmp_path / "history.db")
    synthetic.write_synthetic_history(url)
    with HistoryStore(url) as store:
        cells = store.cells()
    analysed = {(s.key.config, s.key.cell, s.key.metric): s for s in changepoints.analyse(cells)}
    assert len(analysed) == len(synthetic.CONFIGS) * len(synthetic.CELLS) * 2

    step = analysed[("bs8_b8_k4", "c8_4k", "output_throughput")].change_points
    assert len(step) == 1, [cp.describe() for cp in step]
    (cp,) = step
    assert abs(cp.index - synthetic.STEP_AT) <= 2 and cp.regression
    assert -0.05 < cp.size < -0.03 and cp.interval[0] < cp.size < cp.interval[1] < 0
    assert cp.after.session_id.endswith(f"s{cp.index:02d}") and cp.after.build != cp.before.build

    creep = analysed[("bs8_b16_k4", "c8_4k", "output_throughput")].change_points
    assert creep and all(c.regression and -0.035 < c.size < 0 for c in creep), [c.describe() for c in creep]
    total = 1.0
    for c in creep:
        total *= 1 + c.size
    assert 0.93 < total < 0.985  # the creep is 6% end to end; segment means see less of it

    elsewhere = [cp.describe() for key, s in analysed.items() for cp in s.change_points
                 if key not in (("bs8_b8_k4", "c8_4k", "output_throughput"), ("bs8_b16_k4", "c8_4k", "output_throughput"))]
    assert not elsewhere, elsewhere

    summary = changepoints.summary_text(list(analysed.values()))
    assert summary.splitlines()[2].startswith("  - bs8_b8_k4 c8_4k output_throughput (refserver): regression of -")

    # --ddtree-history-check: the sessions just after the step fail, naming its build; much later ones pass.
    early = changepoints.analyse([c for c in cells if c.session.started_at < cells[0].session.started_at + 42 * 86400])
    (flagged,) = changepoints.check_session(early, "20261001T004100Z-s41")
    assert flagged.key.config == "bs8_b8_k4" and abs(flagged.index - synthetic.STEP_AT) <= 2
    assert flagged.after.build in flagged.describe()
    assert not changepoints.check_session(list(analysed.values()), "20261001T005900Z-s59")


@pytest.mark.slow
@pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py
def test_a_main_job_session_lands_in_postgresql_and_passes_the_history_check(pytester: pytest.Pytester, repo_root: Path,
                                                                              postgres_url: str) -> None:
    results = pytester.path / "results"
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites"), f"--rootdir={repo_root}", "-p", "no:cacheprovider", "-k", "throughput",
        "--ddtree-config=bs8_b8_k4", "--ddtree-cell=c1_short", f"--ddtree-results={results}",
        # a one-config session measures a control only where the profile says so (control_min_configs: 1)
        f"--ddtree-service={reference_profile(pytester.path)}",
        # no baselines: what lands in the history is the point here, not a verdict that a loaded box
        # can turn (c1_short's 3.7 ms TTFT rose +45% beside other tests in a CI run)
        f"--ddtree-baselines={pytester.path / 'no-baselines'}",
        f"--ddtree-history={postgres_url}", "--ddtree-history-check", timeout=300)
    assert result.ret == 0, result.stdout.str()[-3000:]
    # the config's cell and the control's (stored as a series of its own)
    result.stdout.fnmatch_lines(["*ddtree history*", "appended session * (2 cells, build refserver-* project *) to postgresql://*"])
    session_id = json.loads((results / "results.json").read_text())["session_id"]
    with HistoryStore(postgres_url) as store:
        cell, control = sorted((c for c in store.cells() if c.session.session_id == session_id), key=lambda c: c.config)
    assert (control.config, control.role, control.cell) == ("control", "control", "c1_short")
    assert (cell.config, cell.cell, cell.hardware_profile) == ("bs8_b8_k4", "c1_short", "refserver")
    assert len(cell.samples["output_throughput"]) >= 3 and cell.status  # a verdict of its own: no baseline here
    assert cell.session.report_path == str(results / "report.html") and cell.session.build.engine_version


@pytest.mark.slow
@pytest.mark.usefixtures("measurement_turn")  # measures throughput: see tests/machine_share.py
def test_the_history_check_fails_a_session_that_starts_a_regression_and_names_its_build(pytester: pytest.Pytester,
                                                                                         repo_root: Path) -> None:
    import yaml

    from pytest_ddtree.report.history import ROLE_CONTROL

    def median_of(name: str) -> float:
        baseline = yaml.safe_load((repo_root / "baselines" / "refserver" / f"{name}.yaml").read_text())
        return float(baseline["metrics"]["c1_short"]["gates"]["output_throughput"]["median"])

    db = pytester.path / "history.db"
    with HistoryStore(str(db)) as store:  # ten earlier sessions of the cell and the control, 30% faster than today's engine
        for n in range(10):
            cells = [CellEntry(config=name, cell="c1_short", hardware_profile="refserver", status="pass",
                               samples={"output_throughput": [median_of(name) * 1.3 * (1 + 0.01 * ((n + k) % 3 - 1))
                                                              for k in range(3)]},
                               role=ROLE_CONTROL if name == "control" else "config") for name in ("bs8_b8_k4", "control")]
            store.append(SessionEntry(f"earlier-{n}", 1.0e9 + n, build=Build(engine_version="refserver-fast", project_commit=f"{n:040x}")), cells)
    with sqlite3.connect(db) as raw:  # a careless co-writer's rows: set aside and counted, the verdict unchanged
        raw.execute("INSERT INTO ddtree_samples VALUES ('earlier-3', 'bs8_b8_k4', 'c1_short', 'output_throughput', 9, 'abc')")
        raw.execute("INSERT INTO ddtree_sessions (session_id, started_at) VALUES ('careless', 'yesterday')")
    result = pytester.runpytest_subprocess(
        str(repo_root / "suites"), f"--rootdir={repo_root}", "-p", "no:cacheprovider", "-k", "throughput",
        "--ddtree-config=bs8_b8_k4", "--ddtree-cell=c1_short", f"--ddtree-results={pytester.path / 'results'}",
        f"--ddtree-service={reference_profile(pytester.path)}",  # with its control: control_min_configs 1
        f"--ddtree-history={db}", "--ddtree-history-check", timeout=300)
    session_id = json.loads((pytester.path / "results" / "results.json").read_text())["session_id"]
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*history rows set aside (not used): 1 sessions whose start is not a time*; 1 samples that "
                                 "are not finite numbers*"])
    result.stdout.fnmatch_lines([
        "*ddtree history check*",
        f"- bs8_b8_k4 c1_short output_throughput (refserver): regression of -* began at session {session_id} (build refserver-*);"
        " the last session before it was earlier-9 (build refserver-fast project 0000000000)*",
        # the control came slower too (today's control cells are stored as their own series): the build changed
        f"- the build changed (refserver): every series -* from session {session_id} (build refserver-*"
        " the last session before it was earlier-9 (build refserver-fast project 0000000000, *); 10 sessions before, 1 since*",
    ])
    with HistoryStore(str(db)) as store:
        (control,) = [c for c in store.cells() if c.session.session_id == session_id and c.config == "control"]
    assert control.role == ROLE_CONTROL and control.launches == 1 and len(control.samples["output_throughput"]) >= 3


def test_a_bad_history_option_is_a_usage_error_before_anything_runs(pytester: pytest.Pytester, repo_root: Path) -> None:
    for args, said in ((["--ddtree-history=mysql://ci:secret@db/perf"], "is not a history database"),
                       (["--ddtree-history-check"], "needs the history to check against"),
                       (["--ddtree-history=sqlite:///missing/dir/h.db"], "missing/dir does not exist (create it")):
        result = pytester.runpytest_subprocess(str(repo_root / "suites"), f"--rootdir={repo_root}", "-p", "no:cacheprovider",
                                               "--ddtree-config=bs8_b8_k4", *args, timeout=120)
        assert result.ret == pytest.ExitCode.USAGE_ERROR and said in result.stderr.str(), result.stderr.str()
        assert "secret" not in result.stderr.str() and "starting bs8_b8_k4" not in result.stdout.str()


def test_ddtree_report_needs_a_results_folder_or_a_history(tmp_path: Path) -> None:
    from pytest_ddtree.report.html.cli import USAGE_ERROR, main

    assert main([]) == USAGE_ERROR
    assert main(["--history", f"sqlite:///{tmp_path / 'missing' / 'h.db'}"]) == USAGE_ERROR
    assert main(["--history", str(tmp_path / "h.db")]) == USAGE_ERROR and not (tmp_path / "h.db").exists()


def test_a_series_continues_across_the_gated_acceptance_rename() -> None:
    """Sessions stored before the gated acceptance was named ddtree_tokens_per_verify stored it as
    accept_length: one series holds both, with the old session's verdict."""
    from pytest_ddtree.report.changepoints import build_series
    from pytest_ddtree.report.history import SessionEntry, StoredCell

    old = StoredCell(SessionEntry("s1", 1.0), "bs8_b8_k4", "c8_4k", "refserver", "pass",
                     samples={"accept_length": [4.0, 4.1]}, verdicts={"accept_length": "pass"})
    new = StoredCell(SessionEntry("s2", 2.0), "bs8_b8_k4", "c8_4k", "refserver", "pass",
                     samples={"ddtree_tokens_per_verify": [4.2]})
    series = [s for s in build_series([old, new]) if s.key.metric == "ddtree_tokens_per_verify"]
    assert len(series) == 1 and [p.session_id for p in series[0].points] == ["s1", "s2"]
    assert not [s for s in build_series([old, new]) if s.key.metric == "accept_length"]


def _old_sqlite_store(path: Path, version: int) -> Path:
    """A SQLite file exactly as the layout of schema ``version`` wrote it, with one session 'old'
    (one cell, one sample)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE ddtree_schema (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)")
    for applied, statements in MIGRATIONS[:version]:
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO ddtree_schema VALUES (?, 0)", (applied,))
    conn.execute("INSERT INTO ddtree_sessions (session_id, started_at, host, engine_version, project_commit, engine_build)"
                 " VALUES ('old', 1.0, 'h', '0.5.2', 'abc', 'commit 1234')")
    conn.execute("INSERT INTO ddtree_cells (session_id, config, cell, hardware_profile, status) VALUES"
                 " ('old', 'bs8_b8_k4', 'c1_short', 'refserver', 'pass')")
    conn.execute("INSERT INTO ddtree_samples VALUES ('old', 'bs8_b8_k4', 'c1_short', 'output_throughput', 0, 950.0)")
    conn.close()
    return path


def test_a_store_of_the_second_schema_is_migrated_and_the_control_gets_its_own_series(tmp_path: Path) -> None:
    """A SQLite file exactly as the second layout wrote it (migrations 1 and 2, no role, no launches,
    no build fingerprint): opened, migrated, its cells read as configs; a session with the control
    stores the control's cells as their own series, with their launches and the build fingerprint."""
    from pytest_ddtree.report.history import ROLE_CONFIG, ROLE_CONTROL

    path = _old_sqlite_store(tmp_path / "old.db", 2)

    control = CellEntry(config="control", cell="c1_short", hardware_profile="refserver", status="pass",
                        samples={"output_throughput": [500.0, 505.0, 498.0, 502.0]}, role=ROLE_CONTROL, launches=2)
    entry, cells = _session("new", 2.0)
    with HistoryStore(str(path)) as store:
        assert store.schema_version() == MIGRATIONS[-1][0] == 4
        store.append(entry, [*cells, control])
    with HistoryStore(str(path), create=False) as store:
        old, new_config, new_control = store.cells()
    assert (old.role, old.launches, old.samples) == (ROLE_CONFIG, None, {"output_throughput": [950.0]})
    assert (new_config.role, new_control.role, new_control.launches) == (ROLE_CONFIG, ROLE_CONTROL, 2)
    fingerprints = dict(sqlite3.connect(path).execute("SELECT session_id, build_fingerprint FROM ddtree_sessions").fetchall())
    assert fingerprints == {"old": None, "new": entry.build.fingerprint()}
    assert new_control.session.build.fingerprint() == entry.build.fingerprint() != old.session.build.fingerprint()
    keys = {(s.key.config, s.key.cell) for s in changepoints.build_series([old, new_config, new_control])}
    assert keys == {("bs8_b8_k4", "c1_short"), ("control", "c1_short")}


def test_a_whole_build_slower_the_control_included_is_one_build_level_change_through_sqlite_and_the_cli(
        tmp_path: Path) -> None:
    """Every series 5% slower from one build on (configs and control alike, a 1% day shift): per series
    Otava sees nothing that young; the build-level change is found, sized, and tied to the builds on
    either side, by ddtree-report --history; the history check of the sessions after it fails, and a
    history without the step (the same seed) has no build-level change."""
    url = f"sqlite:///{tmp_path / 'build.db'}"
    synthetic.write_build_history(url)
    run = subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", url, "-o",
                          str(tmp_path / "h.html")], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("  - the build changed")]
    assert "(refserver): every series -" in line and "from session 20261101T001100Z-b11 (build 0.5.24 beef0b" in line
    assert "the last session before it was 20261101T001000Z-b10 (build 0.5.23 cafe0a" in line, line
    with HistoryStore(url) as store:
        cells = store.cells()
    histories = changepoints.analyse_builds(changepoints.analyse(cells))
    (change,) = histories[0].changes
    assert change.index == 11 and change.regression and -0.07 < change.size < -0.03 and change.interval[1] < 0
    assert change.control_size is not None and -0.08 < change.control_size < -0.02 and change.kind == changepoints.KIND_BUILD
    (failed,) = changepoints.check_build(histories, "20261101T001500Z-b15")
    assert failed == change and "0.5.24" in failed.describe()

    flat = f"sqlite:///{tmp_path / 'flat.db'}"
    synthetic.write_build_history(flat, step=0.0)
    with HistoryStore(flat) as store:
        histories = changepoints.analyse_builds(changepoints.analyse(store.cells()))
    assert histories[0].changes == [] and len(histories[0].points) == 16


def test_a_sessions_calibration_figures_round_trip(history_url: str) -> None:
    """Each run's figures and the probe's command are stored with the session and read back in run
    order; a session without a probe reads back none; appending the session again replaces them."""
    entry, cells = _session("probed", 1.0)
    probed = dataclasses.replace(entry, calibration={"gemm_tflops": [712.5, 709.25], "cpu_sort_keys_per_s": [5.9e6, 6.1e6]},
                                 calibration_command="/opt/calib/bin/python calibrate_gpu.py")
    with HistoryStore(history_url) as store:
        store.append(probed, cells)
        store.append(*_session("plain", 2.0))
    with HistoryStore(history_url) as store:
        assert {k: list(v) for k, v in store.cells()[0].session.calibration.items()} == {
            "gemm_tflops": [712.5, 709.25], "cpu_sort_keys_per_s": [5.9e6, 6.1e6]}
        store.append(dataclasses.replace(probed, calibration={"gemm_tflops": [700.0, 701.0]}), cells)
    with HistoryStore(history_url) as store:
        probed_back, plain = store.cells()  # oldest first
    assert plain.session.session_id == "plain" and dict(plain.session.calibration) == {}
    assert plain.session.calibration_command is None
    assert dict(probed_back.session.calibration) == {"gemm_tflops": [700.0, 701.0]}
    assert probed_back.session.calibration_command == "/opt/calib/bin/python calibrate_gpu.py"
    (key, value), = changepoints.session_calibration(probed_back.session)
    assert key.endswith("gemm_tflops") and abs(value - (700.0 * 701.0) ** 0.5) < 1e-9


def test_a_store_of_the_third_schema_is_migrated_and_its_sessions_have_no_calibration(tmp_path: Path) -> None:
    path = _old_sqlite_store(tmp_path / "third.db", 3)
    entry, cells = _session("new", 2.0)
    with HistoryStore(str(path)) as store:
        assert store.schema_version() == 4
        store.append(dataclasses.replace(entry, calibration={"calibration": [3.0]}, calibration_command="probe"), cells)
    with HistoryStore(str(path), create=False) as store:
        old, new = store.cells()
    assert dict(old.session.calibration) == {} and old.samples == {"output_throughput": [950.0]}
    assert dict(new.session.calibration) == {"calibration": [3.0]}


def test_a_3pct_slower_build_is_found_within_3_sessions_when_the_probe_sees_the_day(tmp_path: Path) -> None:
    """A 3% step of every series at session 30, on days 2% apart that the calibration probe sees:
    stored through the real store, the history check (as --ddtree-history-check runs it) of the
    third session of the new level fails naming the build, and says it is calibrated; the same
    history without the probe is not found there (a 3% step is 2.4 standard errors of a 2% day)."""
    calibrated, plain = f"sqlite:///{tmp_path / 'calibrated.db'}", f"sqlite:///{tmp_path / 'plain.db'}"
    ids = synthetic.write_calibrated_history(calibrated, calibrated=True)
    assert synthetic.write_calibrated_history(plain, calibrated=False) == ids
    with HistoryStore(calibrated) as store:
        cells = store.cells()
    third = ids[32]
    summary, regressions = changepoints.check_history(cells, third)
    (build,) = [r for r in regressions if r.startswith(changepoints.KIND_BUILD)]
    assert "(gpu-box): every series -" in build and "calibrated: each session's level less its calibration probe's" in build
    assert f"from session {ids[30]} (build 0.5.24 beef1e" in build and f"the last session before it was {ids[29]}" in build
    assert "less its calibration probe's change where every session tested has one (33 of 33 have)" in summary
    for n in range(8, 30):  # and no session before the step is failed
        assert changepoints.check_history([c for c in cells if c.session.session_id <= ids[n]], ids[n])[1] == []
    with HistoryStore(plain) as store:
        summary, regressions = changepoints.check_history(store.cells(), third)
    assert regressions == [] and "calibration" not in summary


def test_a_probe_noisier_than_the_day_it_corrects_is_left_out(tmp_path: Path) -> None:
    """A probe that spreads 10% a run (a busy shared box: docs/benchmarks.md) would bury the 2% day
    it corrects: the test reads the measured levels instead, and a 6% step found there says it is
    not calibrated; the same history with a 0.3% probe is found calibrated."""
    found = {}
    for noise in (0.003, 0.10):
        url = f"sqlite:///{tmp_path / f'noise-{noise}.db'}"
        ids = synthetic.write_calibrated_history(url, calibrated=True, probe_noise=noise, step=-0.06, sessions=36)
        with HistoryStore(url) as store:
            (history,) = changepoints.analyse_builds(changepoints.analyse(store.cells()))
        (change,) = history.changes
        assert change.after.session_id == ids[30] and change.regression
        found[noise] = change.calibrated
    assert found == {0.003: True, 0.10: False}


def test_three_sessions_the_third_20_percent_slower_are_too_few_to_tell_and_the_page_says_so(tmp_path: Path) -> None:
    """Otava at p < 1e-5 cannot tell a step from three sessions: the headline says too few sessions (and
    how the newest sits against the earlier ones, as the chart shows it), never "level within its noise";
    the sessions table has each session's verdict."""
    from pytest_ddtree.report.html.history import build_history_html

    with HistoryStore(str(tmp_path / "h.db")) as store:
        for index in range(3):
            session, cells = synthetic.synthetic_session(index)
            if index == 2:
                session = dataclasses.replace(session, exit_status=1)
                cells = [dataclasses.replace(c, status="regression", samples={k: [v * 0.8 for v in vs] for k, vs in c.samples.items()})
                         for c in cells]
            store.append(session, cells)
        stored = store.cells()
    analysed = changepoints.analyse(stored)
    summary = changepoints.summary_text(analysed)
    assert "level within its noise" not in summary
    assert f"too few sessions to tell: {len(analysed)} of {len(analysed)} series have fewer than 8 sessions" in summary, summary
    assert "the newest session against the earlier ones: -2" in summary and "% to -1" in summary, summary
    page = build_history_html(analysed, source="h.db", output_dir=tmp_path, summary=summary)
    assert "level within its noise" not in page and "Too few sessions to tell: " in page
    cells_per_session = len(synthetic.CONFIGS) * len(synthetic.CELLS)
    assert page.count("<td>passed</td>") == 2 and f"<td>failed: {cells_per_session} regression</td>" in page
    # each chart's caption says it too: its level line through three sessions is no finding of "level"
    captions = re.findall(r"<figcaption>([^<]*)</figcaption>", page)
    wrong = [c for c in captions if not re.search(r": 3 sessions, too few to tell \(the newest [-+]\d+\.\d% against the earlier ones\)$", c)]
    assert captions and not wrong, wrong
    # with the sessions to tell, a level history still says it is level
    with HistoryStore(str(tmp_path / "level.db")) as store:
        for index in range(8):
            session, cells = synthetic.synthetic_session(index)
            store.append(session, [c for c in cells if c.cell == "c1_short"])
        level = changepoints.analyse(store.cells())
    assert "no change point: every series is level within its noise" in changepoints.summary_text(level)


def test_a_measure_only_session_is_measured_in_the_sessions_table_and_its_figures_are_data(tmp_path: Path) -> None:
    """A --ddtree-measure-only session stores its cells as 'measured' (no metric verdicts): the sessions
    table says it measured, never "passed" (it judged nothing), and one that failed says both; its figures
    are points of the same series as the gated sessions' (the same cells measured the same way), so a
    step they show is a change point like any other."""
    from pytest_ddtree.report.html.history import MEASURED_SESSION, build_history_html

    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        for index in range(12):
            session, cells = synthetic.synthetic_session(index)
            if index >= 9:  # measure-only sessions, 20% slower: data like the rest
                session = dataclasses.replace(session, exit_status=1 if index == 11 else 0)
                cells = [dataclasses.replace(c, status="measured", verdicts={},
                                             samples={k: [v * 0.8 for v in vs] for k, vs in c.samples.items()})
                         for c in cells]
            store.append(session, cells)
        stored = store.cells()
    assert {c.status for c in stored if c.session.session_id.endswith("s10")} == {"measured"}
    analysed = changepoints.analyse(stored)
    series = next(s for s in analysed if s.key.metric == "output_throughput" and s.key.cell == "c1_short")
    assert len(series.points) == 12 and [p.status for p in series.points[9:]] == ["measured"] * 3
    assert series.change_points and series.change_points[0].after.session_id.endswith("s09")  # the measured step is found
    page = build_history_html(analysed, source="h.db", output_dir=tmp_path, summary=changepoints.summary_text(analysed))
    verdicts = re.findall(r"<tr data-session=\"[^\"]+\">(?:<td[^>]*>.*?</td>){4}<td>([^<]*)</td></tr>", page)
    assert verdicts == ["passed"] * 9 + [MEASURED_SESSION] * 2 + ["failed (--ddtree-measure-only)"], verdicts
    assert MEASURED_SESSION == "measured: nothing judged (--ddtree-measure-only)"
