"""The history store: every session's cells, samples, verdicts and build, in one database.

Why a database and not a folder of results.json files: a team that gates nightly and per pull
request asks questions across sessions (tok/s of a cell over the last 60 builds, where it
changed), from several CI jobs writing at once. SQLite (the standard library's ``sqlite3``)
is the embedded default: a file path or ``sqlite:///relative.db`` / ``sqlite:////abs/path.db``.
PostgreSQL (``postgresql://user@host:port/db``) serves a team; its driver, psycopg 3, is the
``postgres`` extra and is imported only when such a URL is used.

Guarantees, on both backends:

* **one transaction per session**: a reader never sees half a session;
* **idempotent per session id**: appending a session again replaces its rows (a re-run of the
  session end, or a retried CI step, never counts it twice);
* **concurrent writers lose nothing**: SQLite takes its write lock up front (``BEGIN
  IMMEDIATE``, waiting up to ``LOCK_TIMEOUT_S``); PostgreSQL serializes the writers of one
  session id, and the schema migration, with transaction-scoped advisory locks;
* **an older schema is migrated, never dropped**: ``ddtree_schema`` lists the migrations
  applied; opening a store applies the missing ones (only ``CREATE`` and ``ALTER ... ADD``),
  and a store written by a newer version is refused with what to do, not rewritten.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ddtree.measure.stats import is_number
from pytest_ddtree.records.words import RecordKind
from pytest_ddtree.report import history_guard as guard

if TYPE_CHECKING:
    from pytest_ddtree.records.shapes import RawRecord

#: The extra that brings the PostgreSQL driver.
POSTGRES_EXTRA = "pytest-ddtree[postgres]"
#: How long a writer waits for another writer's transaction (SQLite's lock) before giving up.
LOCK_TIMEOUT_S = 60.0
#: Advisory lock key of the schema migration (PostgreSQL): any constant unique to this store.
_MIGRATION_LOCK = 0x64647472656531  # "ddtree1"

#: The schema, as the ordered migrations that build it. Never edit a released one: add the next.
#: 1 is the first layout (sessions, cells, samples); 2 adds the build (engine build, package), the
#: cell's host and measurement status, the verdicts, and the series index; 3 adds the session's build
#: fingerprint and the cell's role: the session's non-speculative control is stored beside the
#: configs (role ``control``, with the launches its samples pool), so a build that slows everything,
#: the control included, shows as a step common to every series (``changepoints.build_changes``); 4
#: adds the session's calibration probe (``service/calibration.py``): its command and each run's
#: figures, so that a session's level can be told apart from its machine's day.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (
        "CREATE TABLE ddtree_sessions (session_id TEXT PRIMARY KEY, started_at DOUBLE PRECISION, host TEXT,"
        " engine_version TEXT, project_commit TEXT, results_dir TEXT)",
        "CREATE TABLE ddtree_cells (session_id TEXT NOT NULL, config TEXT NOT NULL, cell TEXT NOT NULL,"
        " hardware_profile TEXT, status TEXT, PRIMARY KEY (session_id, config, cell))",
        "CREATE TABLE ddtree_samples (session_id TEXT NOT NULL, config TEXT NOT NULL, cell TEXT NOT NULL,"
        " metric TEXT NOT NULL, repeat_index INTEGER NOT NULL, value DOUBLE PRECISION NOT NULL,"
        " PRIMARY KEY (session_id, config, cell, metric, repeat_index))",
    )),
    (2, (
        "ALTER TABLE ddtree_sessions ADD COLUMN engine_build TEXT",
        "ALTER TABLE ddtree_sessions ADD COLUMN package_version TEXT",
        "ALTER TABLE ddtree_sessions ADD COLUMN report_path TEXT",
        "ALTER TABLE ddtree_sessions ADD COLUMN exit_status INTEGER",
        "ALTER TABLE ddtree_sessions ADD COLUMN recorded_at DOUBLE PRECISION",
        "ALTER TABLE ddtree_cells ADD COLUMN host TEXT",
        "ALTER TABLE ddtree_cells ADD COLUMN measurement_status TEXT",
        "CREATE TABLE ddtree_verdicts (session_id TEXT NOT NULL, config TEXT NOT NULL, cell TEXT NOT NULL,"
        " metric TEXT NOT NULL, status TEXT, change DOUBLE PRECISION, message TEXT,"
        " PRIMARY KEY (session_id, config, cell, metric))",
        "CREATE INDEX ddtree_samples_series ON ddtree_samples (config, cell, metric)",
    )),
    (3, (
        "ALTER TABLE ddtree_sessions ADD COLUMN build_fingerprint TEXT",
        "ALTER TABLE ddtree_cells ADD COLUMN role TEXT",
        "ALTER TABLE ddtree_cells ADD COLUMN launches INTEGER",
    )),
    (4, (
        "ALTER TABLE ddtree_sessions ADD COLUMN calibration_command TEXT",
        "CREATE TABLE ddtree_calibration (session_id TEXT NOT NULL, figure TEXT NOT NULL, run_index INTEGER NOT NULL,"
        " value DOUBLE PRECISION NOT NULL, PRIMARY KEY (session_id, figure, run_index))",
    )),
)
#: ``ddtree_cells.role``: a speculative config's cell (NULL in stores older than migration 3), or the control's.
ROLE_CONFIG = "config"
ROLE_CONTROL = "control"
LATEST_VERSION = MIGRATIONS[-1][0]
#: Sessions a reader takes by default (the session end's change-point check, ``ddtree-report
#: --history``): a year of nightly sweeps, ~2.5 million sample rows at most in memory.
DEFAULT_WINDOW = 365
_SESSION_TABLES = ("ddtree_verdicts", "ddtree_samples", "ddtree_cells", "ddtree_calibration", "ddtree_sessions")


class HistoryError(Exception):
    """The history store cannot be used: a bad URL, a missing driver, a newer schema, a failed write."""


@dataclass(frozen=True)
class Build:
    """What a session measured: the engine, its build, and the project's own commit."""

    engine_version: str | None = None
    engine_build: str | None = None  # the engine's git commit, else a hash of its installed files
    project_commit: str | None = None
    package_version: str | None = None  # pytest-ddtree's

    def label(self) -> str:
        """Short and readable: what a chart's hover and a change point name."""
        parts = [self.engine_version or "engine ?"]
        if self.engine_build:  # "commit <sha>" or "files sha256:<hash>": the short form of either
            parts.append(self.engine_build.split()[-1].removeprefix("sha256:")[:10])
        if self.project_commit:
            parts.append(f"project {self.project_commit[:10]}")
        return " ".join(parts)

    def fingerprint(self) -> str:
        """One digest of everything the build is (a label shortens hashes; two builds can share
        one): what tells the sessions on either side of a build-level change apart."""
        text = "\x1f".join(x or "" for x in (self.engine_version, self.engine_build, self.project_commit,
                                               self.package_version))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SessionEntry:
    session_id: str
    started_at: float
    host: str | None = None
    build: Build = Build()
    results_dir: str | None = None
    report_path: str | None = None
    exit_status: int | None = None
    #: The calibration probe's figures: name -> each run's value (``service/calibration.py``); empty: no probe.
    calibration: Mapping[str, Sequence[float]] = field(default_factory=dict)
    calibration_command: str | None = None


@dataclass(frozen=True)
class CellEntry:
    config: str
    cell: str
    hardware_profile: str | None
    host: str | None = None
    status: str | None = None
    measurement_status: str | None = None
    samples: Mapping[str, Sequence[float]] = field(default_factory=dict)
    verdicts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # metric -> {status, change, message}
    role: str = ROLE_CONFIG
    launches: int | None = None  # the control's: how many launches its samples pool


@dataclass
class StoredCell:
    """One config x cell of one session, as read back (samples per metric)."""

    session: SessionEntry
    config: str
    cell: str
    hardware_profile: str | None
    status: str | None
    samples: dict[str, list[float]] = field(default_factory=dict)
    verdicts: dict[str, str | None] = field(default_factory=dict)
    role: str = ROLE_CONFIG
    launches: int | None = None


def redact(url: str) -> str:
    """The URL without its password: what messages and logs may show."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _sqlite_path(url: str) -> Path | None:
    """SQLAlchemy's spelling: sqlite:///relative.db, sqlite:////absolute.db; or a plain path."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    if url.startswith("sqlite:"):
        raise HistoryError(f"history URL {url!r}: write sqlite:///relative/path.db or sqlite:////absolute/path.db")
    if "://" in url:
        return None
    return Path(url)


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def check_url(url: str) -> None:
    """Refuse a URL no backend takes, before a session measures anything."""
    if not url.strip():
        raise HistoryError("the history URL is empty: give a file path, sqlite:///path.db or postgresql://...")
    if _sqlite_path(url) is None and not is_postgres(url):
        raise HistoryError(f"history URL {redact(url)!r}: unknown scheme; use a file path, sqlite:///path.db "
                           "(SQLite) or postgresql://user@host:port/db (PostgreSQL)")


def _check_sqlite_folder(path: Path) -> None:
    if path.parent and not path.parent.is_dir():
        raise HistoryError(f"history database {path}: the folder {path.parent} does not exist (create it, or give "
                           "another path)")


def check_usable(url: str) -> None:
    """What a session can check before it measures: the URL, a SQLite file's folder, and the
    driver (the change-point library: :func:`pytest_ddtree.report.changepoints.history_problem`)."""
    check_url(url)
    path = _sqlite_path(url)
    if path is not None:
        _check_sqlite_folder(path)
    if is_postgres(url):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise HistoryError(f"a PostgreSQL history needs the psycopg driver: pip install '{POSTGRES_EXTRA}'") from None


class HistoryStore:
    """An open history database (use as a context manager, or call ``close``)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        """``create=False`` (a reader such as ddtree-report): a SQLite file that is not there is an
        error, not a new empty history."""
        check_url(url)
        self.url = url
        self.create = create
        self.postgres = is_postgres(url)
        self._conn: Any = self._connect()
        #: The rows the last read set aside, by reason (``history_guard``): the page and the check say them.
        self.set_aside = guard.SetAside()
        try:
            self._guard = guard.Guard(self._conn, self.postgres)
            with self._guarded(guard.WRITE_TIMEOUT_S, "opening the history"):
                self._migrate()
                self._check_schema()
        except BaseException:
            self._conn.close()
            raise

    # -- connection and transactions ---------------------------------------------------------
    def _connect(self) -> Any:
        if self.postgres:
            try:
                import psycopg
            except ImportError:
                raise HistoryError(f"a PostgreSQL history ({redact(self.url)}) needs the psycopg driver: "
                                   f"pip install '{POSTGRES_EXTRA}'") from None
            try:
                # autocommit: a read outside ``_transaction`` must not leave an implicit transaction
                # open, in which a later ``_transaction`` would only be a savepoint, never committed.
                return psycopg.connect(self.url, connect_timeout=int(LOCK_TIMEOUT_S), autocommit=True)
            except psycopg.Error as exc:
                raise HistoryError(f"cannot connect to {redact(self.url)}: {str(exc).strip()}") from None
        path = _sqlite_path(self.url)
        assert path is not None
        _check_sqlite_folder(path)
        if not self.create and not path.is_file():
            raise HistoryError(f"no history database at {path} (sessions write it with --ddtree-history {path})")
        try:
            conn = sqlite3.connect(str(path), timeout=LOCK_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open the history database {path}: {exc}") from None
        return conn

    @contextmanager
    def _guarded(self, seconds: float, what: str) -> Iterator[None]:
        """Statements inside end by ``seconds`` (or at once on SIGINT / SIGTERM: ``history_guard.Guard``);
        a database error, or the deadline, is a :class:`HistoryError` saying which."""
        errors: tuple[type[BaseException], ...] = (sqlite3.Error, guard.Interrupted)
        if self.postgres:
            import psycopg

            errors = (psycopg.Error, guard.Interrupted)
        try:
            with self._guard.within(seconds, what):
                yield
        except errors as exc:
            raise HistoryError(f"history database {redact(self.url)}: {type(exc).__name__}: {str(exc).strip()}") from None

    def _check_schema(self) -> None:
        """Refuse a store whose objects are not the tables this version writes (a view, a trigger)."""
        problems = guard.schema_problems(self._conn, self.postgres, guard.expected_columns(MIGRATIONS))
        if problems:
            raise HistoryError(f"history database {redact(self.url)} is not a history this version can trust: "
                               f"{'; '.join(problems)}; restore it from a backup, or start a new one")

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._conn.execute(self._sql(sql), tuple(params))

    def _executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(r) for r in rows]
        if not rows:
            return
        if self.postgres:
            with self._conn.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)
        else:
            self._conn.executemany(sql, rows)

    @contextmanager
    def _transaction(self, lock_key: int | None = None) -> Iterator[None]:
        """One write transaction; SQLite takes its write lock first, PostgreSQL the advisory lock."""
        errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        if self.postgres:
            import psycopg

            errors = (psycopg.Error,)
        try:
            if self.postgres:
                with self._conn.transaction():
                    if lock_key is not None:
                        self._execute("SELECT pg_advisory_xact_lock(?)", (lock_key,))
                    yield
            else:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
        except errors as exc:
            raise HistoryError(f"history database {redact(self.url)}: {type(exc).__name__}: {str(exc).strip()}") from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ------------------------------------------------------------------------------
    def schema_version(self) -> int:
        rows = self._execute("SELECT MAX(version) FROM ddtree_schema").fetchall()
        return int(rows[0][0] or 0)

    def _migrate(self, target: int = LATEST_VERSION) -> None:
        with self._transaction(_MIGRATION_LOCK):
            self._execute("CREATE TABLE IF NOT EXISTS ddtree_schema (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)")
            current = self.schema_version()
            if current > LATEST_VERSION:
                raise HistoryError(f"history database {redact(self.url)} has schema version {current}, written by a newer "
                                   f"pytest-ddtree (this one knows up to {LATEST_VERSION}): upgrade pytest-ddtree to use it")
            for version, statements in MIGRATIONS:
                if current < version <= target:
                    for statement in statements:
                        self._execute(statement)
                    self._execute("INSERT INTO ddtree_schema (version, applied_at) VALUES (?, ?)", (version, time.time()))

    # -- writing -----------------------------------------------------------------------------
    def append(self, session: SessionEntry, cells: Sequence[CellEntry]) -> None:
        """Write one session (replacing an earlier copy of the same session id) in one transaction."""
        sid = session.session_id
        if not sid:
            raise HistoryError("a session without a session id cannot be appended to the history")
        lock = int.from_bytes(hashlib.sha256(sid.encode()).digest()[:7], "big")
        b = session.build
        with self._guarded(guard.WRITE_TIMEOUT_S, f"writing session {sid}"), self._transaction(lock):
            self._check_schema()
            for table in _SESSION_TABLES:
                self._execute(f"DELETE FROM {table} WHERE session_id = ?", (sid,))
            self._execute(
                "INSERT INTO ddtree_sessions (session_id, started_at, host, engine_version, project_commit, results_dir,"
                " engine_build, package_version, report_path, exit_status, recorded_at, build_fingerprint, calibration_command)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, session.started_at, session.host, b.engine_version, b.project_commit, session.results_dir,
                 b.engine_build, b.package_version, session.report_path, session.exit_status, time.time(), b.fingerprint(),
                 session.calibration_command))
            self._executemany(
                "INSERT INTO ddtree_calibration (session_id, figure, run_index, value) VALUES (?, ?, ?, ?)",
                [(sid, str(figure), i, float(v)) for figure, values in session.calibration.items()
                 for i, v in enumerate(values) if is_number(v) and math.isfinite(v) and v > 0])
            self._executemany(
                "INSERT INTO ddtree_cells (session_id, config, cell, hardware_profile, status, host, measurement_status,"
                " role, launches) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(sid, c.config, c.cell, c.hardware_profile, c.status, c.host, c.measurement_status, c.role, c.launches)
                 for c in cells])
            self._executemany(
                "INSERT INTO ddtree_samples (session_id, config, cell, metric, repeat_index, value) VALUES (?, ?, ?, ?, ?, ?)",
                [(sid, c.config, c.cell, metric, i, float(v)) for c in cells for metric, values in c.samples.items()
                 for i, v in enumerate(values) if is_number(v)])
            self._executemany(
                "INSERT INTO ddtree_verdicts (session_id, config, cell, metric, status, change, message) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(sid, c.config, c.cell, metric, _text(v.get("status")), float(v["change"]) if is_number(v.get("change")) else None,
                  _text(v.get("message"))) for c in cells for metric, v in c.verdicts.items() if isinstance(v, Mapping)])

    # -- reading -----------------------------------------------------------------------------
    def session_ids(self) -> list[str]:
        with self._guarded(guard.READ_TIMEOUT_S, "reading the session ids"):
            rows = self._execute("SELECT session_id FROM ddtree_sessions ORDER BY started_at, session_id").fetchall()
        return [str(r[0]) for r in rows]

    def cells(self, last_sessions: int | None = DEFAULT_WINDOW) -> list[StoredCell]:
        """The stored cells of the last ``last_sessions`` sessions (None or 0: all), with their
        samples, oldest session first. The window keeps a reader's memory bounded however long
        the history grows (a nightly sweep adds ~5,000 sample rows a night), and so do the read's
        own bounds (``history_guard.MAX_SAMPLE_ROWS``, ``MAX_REPEATS``) however large one session is.
        Every row is checked: one that is not what it should be (text in a number's place, NaN, a
        session dated in the future) is set aside and counted in ``set_aside``; the read ends by
        ``history_guard.READ_TIMEOUT_S``, or at once on SIGINT or SIGTERM."""
        self.set_aside = guard.SetAside()
        with self._guarded(guard.READ_TIMEOUT_S, "reading the history"):
            self._check_schema()
            return self._read_cells(last_sessions)

    def _read_cells(self, last_sessions: int | None) -> list[StoredCell]:
        aside, now = self.set_aside, time.time()
        plausible = guard.session_filter(self.postgres)
        window = f" WHERE session_id IN (SELECT session_id FROM ddtree_sessions WHERE {plausible}"
        params: tuple[Any, ...] = (now + guard.FUTURE_SKEW_S,)
        if last_sessions:
            window += " ORDER BY started_at DESC, session_id DESC LIMIT ?"
            params += (int(last_sessions),)
        window += ")"
        total = self._execute("SELECT COUNT(*) FROM ddtree_sessions").fetchall()[0][0]
        good = self._execute(f"SELECT COUNT(*) FROM ddtree_sessions WHERE {plausible}", params[:1]).fetchall()[0][0]
        aside.add("sessions whose start is not a time (text, NaN, or further than a day in the future)", total - good)
        calibration: dict[str, dict[str, list[float]]] = {}
        for sid, figure, _, value in self._execute(
            "SELECT session_id, figure, run_index, value FROM ddtree_calibration" + window + " ORDER BY run_index", params
        ).fetchall():
            if (number := guard.finite(value)) is None or guard.text(sid) is None or guard.text(figure) is None:
                aside.add("calibration rows that are not numbers")
            else:
                calibration.setdefault(sid, {}).setdefault(figure, []).append(number)
        sessions: dict[str, SessionEntry] = {}
        for row in self._execute(
            "SELECT session_id, started_at, host, engine_version, engine_build, project_commit, package_version,"
            " results_dir, report_path, exit_status, calibration_command FROM ddtree_sessions" + window, params
        ).fetchall():
            started, t = guard.started_at(row[1], now), guard.text
            if started is None or t(row[0]) is None:
                aside.add("sessions whose start is not a time (text, NaN, or further than a day in the future)")
                continue
            sessions[row[0]] = SessionEntry(
                session_id=row[0], started_at=started, host=t(row[2]),
                build=Build(engine_version=t(row[3]), engine_build=t(row[4]), project_commit=t(row[5]),
                            package_version=t(row[6])),
                results_dir=t(row[7]), report_path=t(row[8]),
                exit_status=row[9] if isinstance(row[9], int) and not isinstance(row[9], bool) else None,
                calibration=calibration.get(row[0], {}), calibration_command=t(row[10]))
        out: dict[tuple[str, str, str], StoredCell] = {}
        for sid, config, cell, profile, status, role, launches in self._execute(
            "SELECT session_id, config, cell, hardware_profile, status, role, launches FROM ddtree_cells" + window, params
        ).fetchall():
            if not all(isinstance(x, str) for x in (sid, config, cell)):
                aside.add("cells whose names are not text")
            elif sid in sessions:  # role NULL: a cell stored before the control was (always a config's)
                number = guard.finite(launches)
                out[(sid, config, cell)] = StoredCell(sessions[sid], config, cell, guard.text(profile), guard.text(status),
                                                      role=ROLE_CONTROL if role == ROLE_CONTROL else ROLE_CONFIG,
                                                      launches=int(number) if number is not None else None)
        self._read_samples(out, window, params)
        for sid, config, cell, metric, status in self._execute(
            "SELECT session_id, config, cell, metric, status FROM ddtree_verdicts" + window, params
        ).fetchall():
            if (stored := out.get((sid, config, cell))) is not None and isinstance(metric, str):
                stored.verdicts[metric] = guard.text(status)
        return sorted(out.values(), key=lambda c: (c.session.started_at, c.session.session_id, c.config, c.cell))

    def _read_samples(self, out: Mapping[tuple[str, str, str], StoredCell], window: str, params: tuple[Any, ...]) -> None:
        """The window's samples into their cells, streamed (a row at a time, not a list of millions)
        and bounded: at most ``MAX_REPEATS`` repeats of a series per session, ``MAX_SAMPLE_ROWS`` in all."""
        total = self._execute("SELECT COUNT(*) FROM ddtree_samples" + window, params).fetchall()[0][0]
        sql = self._sql("SELECT session_id, config, cell, metric, value FROM ddtree_samples" + window
                        + " AND repeat_index >= 0 AND repeat_index < ? ORDER BY repeat_index LIMIT ?")
        args = (*params, guard.MAX_REPEATS, guard.MAX_SAMPLE_ROWS)
        rows = self._conn.cursor().stream(sql, args) if self.postgres else self._conn.execute(sql, args)
        seen = bad = 0
        for sid, config, cell, metric, value in rows:
            seen += 1
            stored = out.get((sid, config, cell))
            if stored is None:
                continue  # a sample of a cell set aside, or of no cell
            # guard.finite inlined (the loop runs per row): a float that is finite, or an int (not a bool)
            if ((type(value) is float and value - value == 0.0) or type(value) is int) and type(metric) is str:
                stored.samples.setdefault(metric, []).append(float(value))
            else:
                bad += 1
        self.set_aside.add("samples that are not finite numbers (text, NaN, an infinity)", bad)
        self.set_aside.add(f"sample rows beyond the read's bounds ({guard.MAX_REPEATS} repeats of a series in a session, "
                           f"{guard.MAX_SAMPLE_ROWS:,} rows in all)", int(total) - seen)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


# -- from a session's results to history entries ------------------------------------------------
def cells_from_payload(payload: Mapping[str, Any]) -> list[CellEntry]:
    """The measured throughput cells of a results.json payload (predicted and invalid rows too:
    their status is history; only numbers are samples)."""
    out: list[CellEntry] = []
    for raw in payload.get("throughput") or []:
        if not isinstance(raw, Mapping) or raw.get("cell") is None or raw.get("predicted"):
            continue
        samples = _mapping(raw.get("samples"))
        metric_verdicts = _mapping(_mapping(raw.get("verdict")).get("metrics"))
        out.append(CellEntry(
            config=str(raw.get("config")), cell=str(raw["cell"]),
            hardware_profile=_text(raw.get("hardware_profile")), host=_text(raw.get("host")),
            status=_text(raw.get("status")), measurement_status=_text(raw.get("measurement_status")),
            samples={str(k): [float(v) for v in values if is_number(v) and math.isfinite(float(v))]
                     for k, values in samples.items() if isinstance(values, list)},
            verdicts={str(k): dict(v) for k, v in metric_verdicts.items() if isinstance(v, Mapping)},
        ))
    return out


def control_cells(records: Sequence[RawRecord]) -> list[CellEntry]:
    """The session's control cells (``RecordKind.THROUGHPUT_CONTROL``), one per hardware profile,
    host and cell, every launch's samples pooled (results.json keeps the control's judgement, not
    its samples, so they come from the session's records). Stored with role ``control``: the
    series a build-level change must move too, where the speculative configs alone cannot tell a
    slower build from a slower day."""
    from pytest_ddtree.records import shapes as records_mod
    from pytest_ddtree.gates.throughput.verdicts import FAILING
    from pytest_ddtree.gates.throughput.baseline import CONTROL

    pooled: dict[tuple[str | None, str | None, str], CellEntry] = {}
    for rec in records_mod.control_records(records):
        if rec.get("bless_refused"):
            continue
        key = (_text(rec.get("hardware_profile")), _text(rec.get("host")), str(rec["cell"]))
        samples = {str(k): [float(v) for v in values if is_number(v) and math.isfinite(float(v))]
                   for k, values in (rec.get("samples") or {}).items() if isinstance(values, list)}
        earlier = pooled.get(key)
        if earlier is not None:
            samples = {k: [*earlier.samples.get(k, ()), *samples.get(k, ())] for k in {*earlier.samples, *samples}}
        verdict = _mapping(_mapping(rec.get("verdict")).get("metrics"))
        status = _text(rec.get("status"))
        if earlier is not None and earlier.status in FAILING:  # the launches disagree: a failing one stands
            status = earlier.status
        pooled[key] = CellEntry(
            config=CONTROL, cell=key[2], hardware_profile=key[0], host=key[1], status=status,
            measurement_status=_text(rec.get("measurement_status")), samples=samples,
            verdicts=earlier.verdicts if earlier is not None else
            {str(k): dict(v) for k, v in verdict.items() if isinstance(v, Mapping)},
            role=ROLE_CONTROL, launches=1 if earlier is None else (earlier.launches or 1) + 1)
    return list(pooled.values())


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def engine_version_of(payload: Mapping[str, Any]) -> str | None:
    """The engine's version as /server_info reported it at launch (the first launch that said);
    results.json is a file, so its launch entries (``records.LaunchEntry``) are read key by key."""
    for record in payload.get("records") or []:
        if isinstance(record, Mapping) and record.get("kind") == RecordKind.LAUNCH:
            launch: Mapping[str, object] = _mapping(record.get("launch")) or record
            if version := launch.get("engine_version"):
                return str(version)
    return None


def git_commit(folder: Path) -> str | None:
    """The project's commit (``git rev-parse HEAD`` in ``folder``), None outside a repository.
    A dirty work tree is marked: its numbers are not the commit's."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=20)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return commit + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "") if commit else None


_ENGINE_BUILD_SCRIPT = r"""
import hashlib, json, sys
from importlib import metadata
try:
    dist = metadata.distribution(sys.argv[1])
except metadata.PackageNotFoundError:
    sys.exit(0)
direct = dist.read_text("direct_url.json")
if direct:
    vcs = json.loads(direct).get("vcs_info") or {}
    if vcs.get("commit_id"):
        print("commit " + vcs["commit_id"]); sys.exit(0)
record = dist.read_text("RECORD") or ""
print("files sha256:" + hashlib.sha256(record.encode()).hexdigest()[:16])
"""


def engine_build(python: str | None, distribution: str = "sglang", timeout_s: float = 60.0) -> str | None:
    """The engine's build for the service's interpreter: the git commit pip recorded for an
    install from a repository (``direct_url.json``), else a hash of its RECORD (the list of its
    installed files with their hashes, so any rebuild changes it). None where it is not installed
    or not reachable: the embedded reference engine, a remote service."""
    if not python:
        return None
    import subprocess

    try:
        proc = subprocess.run([python, "-c", _ENGINE_BUILD_SCRIPT, distribution], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = proc.stdout.strip()[:200]
    return text or None if proc.returncode == 0 else None


def calibration_of(payload: Mapping[str, Any]) -> tuple[dict[str, list[float]], str | None]:
    """A results.json's calibration probe: each figure's value per run (runs with an error left
    out) and the command; results.json is a file, so every value is checked."""
    from pytest_ddtree.service.calibration import run_figures

    section = _mapping(payload.get("calibration"))
    runs = section.get("runs")
    figures = run_figures(runs if isinstance(runs, list) else [])
    command = section.get("command")
    return figures, str(command)[:2000] if figures and isinstance(command, str) else None


def session_from_payload(payload: Mapping[str, Any], *, session_id: str, started_at: float, results_dir: Path | None,
                         build: Build, exit_status: int | None = None, host: str | None = None) -> SessionEntry:
    report = results_dir / "report.html" if results_dir is not None else None
    calibration, command = calibration_of(payload)
    return SessionEntry(
        session_id=session_id, started_at=started_at, host=host or os.uname().nodename,
        build=build, results_dir=str(results_dir) if results_dir is not None else None,
        report_path=str(report) if report is not None and report.is_file() else None, exit_status=exit_status,
        calibration=calibration, calibration_command=command)
