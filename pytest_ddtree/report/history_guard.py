"""What keeps a shared history from wedging or crashing a session: deadlines on every statement,
objects checked to be the tables they should be, and every value read checked before it is used.

Why: a history is shared by every team's sessions, and anyone who can write the file (or the
database) can put anything in it. A co-writer replaced a table by a view with INSTEAD OF triggers
and a recursive query: the session's write still succeeded, its read never returned, and SIGTERM
was ignored (the signal's Python handler runs only between bytecodes, and SQLite held the main
thread in C); a TEXT value in a numeric column (``'abc'``, ``'yesterday'``) crashed every team's
check with a traceback; ``'NaN'`` samples made a false change point; 400 sessions dated in 2200
pushed the real ones out of the window; one session of 3 million sample rows cost 1.3 GB.

So: SQLite runs a progress handler (every ``PROGRESS_OPS`` virtual-machine steps) that ends a
statement past its deadline, or at once when SIGINT or SIGTERM arrived (the signal's handler runs
inside the progress handler, whose exception SQLite's module swallows: :class:`Guard` keeps it and
raises it again); PostgreSQL gets ``statement_timeout``. Before anything is read or written, each
of the store's objects must be a table with the expected columns, without triggers. Each row read
is checked (:func:`finite`, :func:`text`, :func:`started_at`): a bad one is set aside and counted
(:class:`SetAside`), never a traceback and never a number.
"""

from __future__ import annotations

import math
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

#: How long one read of the history (every statement of it) may take, and one write: a read of the
#: most rows it keeps (below) takes ~40 s on a loaded 2-core box (docs/benchmarks.md).
READ_TIMEOUT_S = 180.0
WRITE_TIMEOUT_S = 120.0
#: SQLite virtual-machine steps between two looks at the deadline (~1 ms of work each).
PROGRESS_OPS = 20_000
#: A session dated further than this in the future is set aside (clocks of CI hosts disagree a little).
FUTURE_SKEW_S = 86_400.0
#: The most sample rows one read keeps, and the most repeats of one series in one session (repeat
#: indices 0 to MAX_REPEATS - 1; the primary key makes each one unique): a window of a year of nightly
#: sweeps is ~2 million rows; a session repeats a cell a dozen times at most.
MAX_SAMPLE_ROWS = 2_500_000
MAX_REPEATS = 200


class Interrupted(Exception):
    """A statement was ended by its deadline (the message says which)."""


@dataclass
class SetAside:
    """Rows a read did not use, by reason: what the page and the check's output say."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, reason: str, n: int = 1) -> None:
        if n:
            self.counts[reason] += n

    def note(self) -> str | None:
        """One line for the page and the check's output, or None when every row was used."""
        if not self.counts:
            return None
        shown = "; ".join(f"{n:,} {reason}" for reason, n in self.counts.most_common())
        return f"history rows set aside (not used): {shown}"


class Guard:
    """The deadline and the signals of one store's statements (see the module's docstring)."""

    def __init__(self, conn: Any, postgres: bool) -> None:
        self.conn = conn
        self.postgres = postgres
        self.deadline = math.inf
        self.what = ""
        self.caught: list[BaseException] = []
        if not postgres:
            conn.set_progress_handler(self._tick, PROGRESS_OPS)

    def _tick(self) -> int:
        """SQLite's progress handler: non-zero ends the statement."""
        return 1 if self.caught or time.monotonic() > self.deadline else 0

    @contextmanager
    def within(self, seconds: float, what: str) -> Iterator[None]:
        """Statements run inside end by ``seconds`` from now (:class:`Interrupted`), and a SIGINT or
        SIGTERM that arrives while SQLite runs one ends it at once and is raised again here."""
        self.deadline, self.what, self.caught = time.monotonic() + seconds, what, []
        if self.postgres:
            self.conn.execute(f"SET statement_timeout = {int(seconds * 1000)}")
        restore = self._wrap_signals()
        try:
            yield
        except Exception as exc:
            if self.caught:
                raise self.caught[0] from None
            if not self.postgres and time.monotonic() > self.deadline and "interrupted" in str(exc):
                raise Interrupted(f"{what} did not finish within {seconds:g} s: the database is wedged (a view, trigger "
                                  "or recursive query in place of a table?) or far too large") from None
            if self.postgres and "statement timeout" in str(exc):
                raise Interrupted(f"{what} did not finish within {seconds:g} s (statement_timeout)") from None
            raise
        finally:
            restore()
            self.deadline = math.inf
        if self.caught:
            raise self.caught[0]

    def _wrap_signals(self) -> Callable[[], None]:
        """While a statement runs, SIGINT's and SIGTERM's handlers also record what they raise."""
        if self.postgres or threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler
                signal.signal(signum, self._recording(handler))

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return restore

    def _recording(self, handler: Callable[[int, FrameType | None], Any]) -> Callable[[int, FrameType | None], Any]:
        def record(signum: int, frame: FrameType | None) -> Any:
            try:
                return handler(signum, frame)
            except BaseException as exc:
                self.caught.append(exc)
                raise
        return record


_COLUMN = re.compile(r"[(,]\s*(\w+)\s+(?:TEXT|INTEGER|DOUBLE)")


def expected_columns(migrations: Sequence[tuple[int, Sequence[str]]]) -> dict[str, set[str]]:
    """Table -> its column names, from the migrations' ``CREATE TABLE`` and ``ALTER TABLE ... ADD COLUMN``."""
    out: dict[str, set[str]] = {"ddtree_schema": {"version", "applied_at"}}
    for _, statements in migrations:
        for statement in statements:
            words = statement.split()
            if statement.startswith("CREATE TABLE"):
                out[words[2]] = set(_COLUMN.findall(statement))
            elif statement.startswith("ALTER TABLE"):
                out.setdefault(words[2], set()).add(words[5])
    return out


def schema_problems(conn: Any, postgres: bool, tables: Mapping[str, set[str]]) -> list[str]:
    """Why the store's objects are not its tables: a view (or anything but a table) under a table's
    name, a missing column, a trigger on one. Empty: every object present is a plain table."""
    out: list[str] = []
    if postgres:
        kinds = dict(conn.execute("SELECT table_name, table_type FROM information_schema.tables"
                                  " WHERE table_schema = current_schema()").fetchall())
        triggers = [r[0] for r in conn.execute("SELECT trigger_name FROM information_schema.triggers"
                                               " WHERE event_object_schema = current_schema()").fetchall()]
        rules = [r[0] for r in conn.execute("SELECT rulename FROM pg_rules WHERE schemaname = current_schema()").fetchall()]
        triggers += rules
    else:
        kinds = {name: kind for name, kind in conn.execute("SELECT name, type FROM sqlite_master WHERE type IN"
                                                           " ('table', 'view')").fetchall()}
        triggers = [f"{name} on {table}" for name, table in conn.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'").fetchall() if table in tables]
    for table, columns in tables.items():
        kind = kinds.get(table)
        if kind is None:
            continue
        if kind not in ("table", "BASE TABLE"):
            out.append(f"{table} is a {str(kind).lower()}, not a table")
            continue
        if postgres:
            have = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                                               " AND table_schema = current_schema()", (table,)).fetchall()}
        else:
            have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}
        if missing := sorted(columns - have):
            out.append(f"{table} lacks the columns {', '.join(missing)}")
    out += [f"a trigger or rule ({t}) acts on the history's tables" for t in triggers]
    return out


def finite(value: Any) -> float | None:
    """A stored number as a float, or None where it is not one (text, a blob, NaN, an infinity, a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def text(value: Any) -> str | None:
    """A stored name as text, or None where it is not text."""
    return value if isinstance(value, str) else None


def started_at(value: Any, now: float) -> float | None:
    """A session's start as a POSIX time, or None: not a finite positive number, or further in the
    future than ``FUTURE_SKEW_S``."""
    number = finite(value)
    return number if number is not None and 0 < number <= now + FUTURE_SKEW_S else None


def session_filter(postgres: bool) -> str:
    """SQL that keeps a session only where its start is a plausible time (the window's sessions)."""
    if postgres:
        return "started_at > 0 AND started_at <= ?"
    return "typeof(started_at) IN ('integer', 'real') AND started_at > 0 AND started_at <= ?"
