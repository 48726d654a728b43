"""A shared history written by a careless or hostile neighbour cannot wedge, crash or mislead a reader.

Each test writes a real SQLite history (``tests/history_helpers.py``: 60 sessions, a -4% step at
session 40 in one series, a creep in another) and then does to it what a co-writer did: a view
with INSTEAD OF triggers and a recursive query in place of a table, TEXT in numeric columns,
``'NaN'`` / ``'Infinity'`` text samples, 400 sessions dated in 2200, a session of millions of
sample rows, and random values of random types in every column (the fuzz test). The reader must
end with a clear message or the clean rows' verdict, set the bad rows aside and count them.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.report import changepoints, history_guard
from pytest_ddtree.report.history import HistoryError, HistoryStore
from tests import history_helpers as synthetic
from tests.polling import wait_until
from tests.postgres_helpers import postgres_url  # noqa: F401 - a fixture

RECURSIVE = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A clean synthetic history and its verdict (the change points' summary)."""
    path = tmp_path_factory.mktemp("history") / "clean.db"
    synthetic.write_synthetic_history(str(path))
    with HistoryStore(str(path), create=False) as store:
        verdict = changepoints.summary_text(changepoints.analyse(store.cells()))
        assert store.set_aside.note() is None
    assert "change point" in verdict and "bs8_b8_k4" in verdict  # the step is found
    return path, verdict


def copy(clean: tuple[Path, str], tmp_path: Path) -> Path:
    target = tmp_path / "shared.db"
    target.write_bytes(clean[0].read_bytes())
    return target


def verdict_of(path: Path) -> tuple[str, str | None]:
    with HistoryStore(str(path), create=False) as store:
        cells = store.cells()
        return changepoints.summary_text(changepoints.analyse(cells)), store.set_aside.note()


def report(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``ddtree-report --history`` as a user runs it (bounded by a generous guard timeout)."""
    return subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", f"sqlite:///{path}",
                           "-o", str(tmp_path / "history.html")], capture_output=True, text=True, timeout=120)


def test_a_view_with_instead_of_triggers_and_a_recursive_query_is_refused_at_once(clean: tuple[Path, str],
                                                                                  tmp_path: Path) -> None:
    path = copy(clean, tmp_path)
    with sqlite3.connect(path) as db:
        db.executescript(f"""
            ALTER TABLE ddtree_samples RENAME TO ddtree_samples_kept;
            CREATE VIEW ddtree_samples AS {RECURSIVE}
              SELECT s.session_id, s.config, s.cell, s.metric, s.repeat_index, s.value FROM ddtree_samples_kept s, r;
            CREATE TRIGGER ddtree_samples_insert INSTEAD OF INSERT ON ddtree_samples BEGIN SELECT 1; END;
            CREATE TRIGGER ddtree_samples_delete INSTEAD OF DELETE ON ddtree_samples BEGIN SELECT 1; END;
        """)
    with pytest.raises(HistoryError, match="ddtree_samples is a view, not a table.*restore it from a backup"):
        HistoryStore(str(path))  # refused by the schema check (its words), before any statement could wedge
    done = report(path, tmp_path)
    assert done.returncode == 4 and "ddtree_samples is a view, not a table" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_trigger_on_a_table_is_refused(clean: tuple[Path, str], tmp_path: Path) -> None:
    path = copy(clean, tmp_path)
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TRIGGER slow AFTER INSERT ON ddtree_samples BEGIN {RECURSIVE} SELECT count(*) FROM r; END")
    with pytest.raises(HistoryError, match=r"a trigger or rule \(slow on ddtree_samples\)"):
        HistoryStore(str(path))


def test_a_statement_past_its_deadline_is_ended() -> None:
    conn = sqlite3.connect(":memory:")
    guard = history_guard.Guard(conn, postgres=False)
    with pytest.raises(history_guard.Interrupted, match="the test's read did not finish within 0.5 s: the database is wedged"):
        with guard.within(0.5, "the test's read"):
            conn.execute(f"{RECURSIVE} SELECT count(*) FROM r").fetchall()  # endless: only the deadline ends it
    with guard.within(5, "a read after"):  # the connection is usable afterwards
        assert conn.execute("SELECT 1").fetchall() == [(1,)]


_WEDGED_READER = textwrap.dedent("""
    import sqlite3, sys
    from pytest_ddtree.report import history_guard
    from pytest_ddtree.service.process import install_signal_handlers
    install_signal_handlers()
    conn = sqlite3.connect(":memory:")
    guard = history_guard.Guard(conn, postgres=False)
    print("reading", flush=True)
    try:
        with guard.within(3600, "the wedged read"):
            conn.execute("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r").fetchall()
    except BaseException as exc:
        print(f"ended by {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
""")


def _cpu_ticks(pid: int) -> int:
    """User + system CPU ticks of ``pid`` so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_wedged_read_at_once(repo_root: Path, signum: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    proc = subprocess.Popen([sys.executable, "-c", _WEDGED_READER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "reading"
        # the recursive query is running once the reader spends CPU after saying so (it does nothing else)
        started = _cpu_ticks(proc.pid)
        wait_until(lambda: _cpu_ticks(proc.pid) >= started + 20, 30, "the reader to be inside its query")
        proc.send_signal(signum)
        wait_until(lambda: proc.poll() is not None, 30, "the reader to end after the signal")
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    expected = "TerminatedBySignal: SIGTERM received" if signum == signal.SIGTERM else "KeyboardInterrupt"
    assert proc.returncode == 3 and expected in out, (out, proc.stderr.read() if proc.stderr else "")


def test_text_in_numeric_columns_is_set_aside_and_counted(clean: tuple[Path, str], tmp_path: Path) -> None:
    path = copy(clean, tmp_path)
    with sqlite3.connect(path) as db:
        sid, config, cell = db.execute("SELECT session_id, config, cell FROM ddtree_cells LIMIT 1").fetchone()
        db.execute("INSERT INTO ddtree_samples VALUES (?, ?, ?, 'output_throughput', 77, 'abc')", (sid, config, cell))
        db.execute("INSERT INTO ddtree_sessions (session_id, started_at) VALUES ('s-yesterday', 'yesterday')")
        db.execute("INSERT INTO ddtree_cells (session_id, config, cell) VALUES ('s-yesterday', ?, ?)", (config, cell))
        db.execute("INSERT INTO ddtree_samples VALUES ('s-yesterday', ?, ?, 'output_throughput', 0, 1.0)", (config, cell))
        db.execute("UPDATE ddtree_cells SET launches = 'many' WHERE session_id = ?", (sid,))
    verdict, note = verdict_of(path)
    assert verdict == clean[1]
    assert note is not None and "1 sessions whose start is not a time" in note and "1 samples that are not finite" in note
    done = report(path, tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "history rows set aside (not used)" in done.stdout


def test_nan_and_infinity_text_samples_make_no_false_change_point(clean: tuple[Path, str], tmp_path: Path) -> None:
    path = copy(clean, tmp_path)
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT session_id, config, cell FROM ddtree_cells ORDER BY session_id").fetchall()
        db.executemany("INSERT INTO ddtree_samples VALUES (?, ?, ?, 'output_throughput', 50 + ?, ?)",
                       [(*row, i, ("NaN", "Infinity", "-Infinity")[i % 3]) for i, row in enumerate(rows[:12])])
    verdict, note = verdict_of(path)
    assert verdict == clean[1]  # the real -4% step at session 40, nothing at s2
    assert note is not None and "12 samples that are not finite numbers" in note


def test_sessions_dated_in_the_far_future_do_not_push_the_real_ones_out_of_the_window(clean: tuple[Path, str],
                                                                                      tmp_path: Path) -> None:
    path = copy(clean, tmp_path)
    future = 7258118400.0  # 2200-01-01
    with sqlite3.connect(path) as db:
        cells = db.execute("SELECT config, cell FROM ddtree_cells WHERE session_id = (SELECT MIN(session_id) FROM "
                           "ddtree_cells)").fetchall()
        for n in range(400):
            sid = f"22000101T{n:06d}Z-future"
            db.execute("INSERT INTO ddtree_sessions (session_id, started_at) VALUES (?, ?)", (sid, future + n))
            db.executemany("INSERT INTO ddtree_cells (session_id, config, cell) VALUES (?, ?, ?)", [(sid, *c) for c in cells])
            db.executemany("INSERT INTO ddtree_samples VALUES (?, ?, ?, 'output_throughput', 0, 1.0)", [(sid, *c) for c in cells])
    with HistoryStore(str(path), create=False) as store:
        cells_read = store.cells(last_sessions=60)  # a window exactly as long as the real history
        assert "400 sessions whose start is not a time" in (store.set_aside.note() or "")
    assert {c.session.session_id for c in cells_read} == {synthetic.synthetic_session(i)[0].session_id for i in range(60)}
    assert changepoints.summary_text(changepoints.analyse(cells_read)) == clean[1]


def _junk(rng: random.Random) -> Any:
    """A value of a random type that is no valid number (nor text that SQLite would turn into one)."""
    return rng.choice(["NaN", "Infinity", "-Infinity", "abc", "", "yesterday", b"\x00\xff", None, "1,5",
                       "nan", "inf", " ", "\u2603", "0x10", b"", "1e999", "-1e999"])


def _any(rng: random.Random) -> Any:
    """A value of a random type for a column whose row is junk anyway (its session is not a time)."""
    return rng.choice([_junk(rng), rng.randint(-5, 5), rng.random(), 2**63 - 1, -(2**63), "bs8_b8_k4", "c1_short", "output_throughput",
                       "x" * rng.randint(0, 40)])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_random_types_in_every_column_no_exception_and_the_clean_verdict_unchanged(
        clean: tuple[Path, str], tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = copy(clean, tmp_path)
    with sqlite3.connect(path) as db:
        real = db.execute("SELECT session_id, config, cell FROM ddtree_cells").fetchall()
        junk_sessions = []
        for n in range(40):  # sessions whose start is no time: everything under them is set aside
            sid = rng.choice([f"junk-{seed}-{n}", n, float(n) + 0.5, f"junk-{seed}-{n}".encode()])
            started = rng.choice([_junk(rng), 1e13 + n, -1.0 * n, 0])
            db.execute("INSERT OR IGNORE INTO ddtree_sessions (session_id, started_at, host, engine_version, exit_status)"
                       " VALUES (?, ?, ?, ?, ?)", (sid, started, _any(rng), _any(rng), _any(rng)))
            junk_sessions.append(sid)
        for _ in range(300):
            sid = rng.choice(junk_sessions)
            db.execute("INSERT OR IGNORE INTO ddtree_cells (session_id, config, cell, hardware_profile, status, role, launches)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?)", (sid, _any(rng), _any(rng), _any(rng), _any(rng), _any(rng), _any(rng)))
            db.execute("INSERT OR IGNORE INTO ddtree_samples VALUES (?, ?, ?, ?, ?, ?)",
                       (sid, _any(rng), _any(rng), _any(rng), _any(rng), _any(rng) if _any(rng) is not None else 1.0))
            db.execute("INSERT OR IGNORE INTO ddtree_calibration VALUES (?, ?, ?, ?)", (sid, _any(rng), _any(rng), 1.0))
            db.execute("INSERT OR IGNORE INTO ddtree_verdicts VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (sid, _any(rng), _any(rng), _any(rng), _any(rng), _any(rng), _any(rng)))
        for _ in range(300):  # junk beside the real rows: values that are no number, names of other types
            sid, config, cell = rng.choice(real)
            value = _junk(rng)
            db.execute("INSERT OR IGNORE INTO ddtree_samples VALUES (?, ?, ?, ?, ?, ?)",
                       (sid, config, cell, rng.choice(["output_throughput", "ddtree_tokens_per_verify"]),
                        rng.randint(1000, 2000), value if value is not None else "NaN"))
            db.execute("INSERT OR IGNORE INTO ddtree_cells (session_id, config, cell, launches) VALUES (?, ?, ?, ?)",
                       (sid, rng.choice([7, 1.5, b"cfg"]), cell, _any(rng)))
            db.execute("INSERT OR IGNORE INTO ddtree_calibration VALUES (?, 'cpu', ?, ?)", (sid, rng.randint(1000, 2000),
                                                                                        _junk(rng) or "NaN"))
            db.execute("UPDATE ddtree_cells SET launches = ? WHERE session_id = ? AND config = ? AND cell = ?",
                       (_any(rng), sid, config, cell))
    verdict, note = verdict_of(path)
    assert verdict == clean[1]
    assert note is not None and "sessions whose start is not a time" in note


def test_postgresql_a_view_in_place_of_a_table_is_refused_and_a_statement_ends_at_its_timeout(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS hostile")
        admin.execute("CREATE DATABASE hostile")
    url = postgres_url.rsplit("/", 1)[0] + "/hostile"
    with HistoryStore(url) as store:
        store.append(*synthetic.synthetic_session(0))
        assert len(store.cells()) == len(synthetic.CONFIGS) * len(synthetic.CELLS)
    with psycopg.connect(url, autocommit=True) as conn:
        guard = history_guard.Guard(conn, postgres=True)
        with pytest.raises(history_guard.Interrupted, match="did not finish within 0.5 s .statement_timeout."):
            with guard.within(0.5, "the test's read"):
                conn.execute(f"{RECURSIVE} SELECT count(*) FROM r").fetchall()
        conn.execute("ALTER TABLE ddtree_samples RENAME TO ddtree_samples_kept")
        conn.execute(f"CREATE VIEW ddtree_samples AS {RECURSIVE} SELECT s.* FROM ddtree_samples_kept s, r")
    with pytest.raises(HistoryError, match="ddtree_samples is a view, not a table"):
        HistoryStore(url)


def test_a_read_is_bounded_in_rows_however_large_one_session_is(clean: tuple[Path, str], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = copy(clean, tmp_path)
    with sqlite3.connect(path) as db:  # one session of 60,000 repeats of one real series
        sid, config, cell = db.execute("SELECT session_id, config, cell FROM ddtree_cells LIMIT 1").fetchone()
        db.executemany("INSERT INTO ddtree_samples VALUES (?, ?, ?, 'output_throughput', ?, 1000.0)",
                       ((sid, config, cell, 3 + i) for i in range(60_000)))  # repeats 0-2 are real
    with HistoryStore(str(path), create=False) as store:
        cells = store.cells()
        kept = [c for c in cells if (c.session.session_id, c.config, c.cell) == (sid, config, cell)][0]
        assert len(kept.samples["output_throughput"]) == history_guard.MAX_REPEATS  # 3 real + 197 of the flood
        assert f"{60_000 - (history_guard.MAX_REPEATS - 3):,} sample rows beyond the read's bounds" in (store.set_aside.note() or "")
        monkeypatch.setattr(history_guard, "MAX_SAMPLE_ROWS", 500)
        assert sum(len(v) for c in store.cells() for v in c.samples.values()) <= 500
        assert "sample rows beyond the read's bounds" in (store.set_aside.note() or "")
