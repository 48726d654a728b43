"""Change points in the history: where a config x cell's numbers moved, and by how much.

Why Apache Otava (``otava.analysis.compute_change_points``): it is the E-divisive means
detector MongoDB and DataStax run on their performance CI (Fleming et al., "Hunter: Using
Change Point Detection to Hunt for Performance Regressions", ICPE 2023), maintained under the
Apache Software Foundation and on PyPI. It finds several change points in one series without a
window tuned per benchmark, and each one comes with a t-test of the segments on either side.
MongoDB's own ``signal-processing-algorithms`` is the same algorithm's older form, but it is
pinned to Python 3.11 and numpy 1.x. Otava pulls heavy dependencies of its CLI (BigQuery, Slack,
its own Postgres driver), so it is the optional ``history`` extra, imported only here.

What goes in: one value per session, the mean of the log of its repeats (the gate's log scale:
the noise is multiplicative, so a 4% drop is the same distance at 100 and at 10000 tok/s). What
comes out, per change point: its size (after / before - 1, from the segments' geometric means),
a 95% interval of that size (Welch's t on the two segments), its p-value, and the sessions and
builds on either side, so a regression is tied to the build that brought it.

Threshold: ``MAX_PVALUE`` = 1e-5 (Otava's default is 1e-3). Measured on synthetic series of 60
sessions with 1% noise per repeat and 3 repeats (``tests/test_history.py`` builds them): at 1e-3
about 5 in 100 flat series got a change point that is not there, at 1e-5 none in 100, while a 4%
step was still found in 100 of 100 (and 96 of 100 times from the one session after it) and a 2%
step in 100 of 100. A campaign's history has hundreds of series; a false change point in a few
of them every day would teach a team to ignore the page.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_ddtree import stats
from pytest_ddtree.history import HistoryError, StoredCell, check_usable
from pytest_ddtree.metrics import TOKENS_PER_VERIFY
from pytest_ddtree.vocabulary import Status

#: The extra that brings the change-point library.
HISTORY_EXTRA = "pytest-ddtree[history]"
MAX_PVALUE = 1e-5
#: Otava's sliding window for its first (split) pass, in sessions.
WINDOW_SESSIONS = 30
#: ``--ddtree-history-check``: a regression whose first session is among this many newest
#: sessions of its series fails the session (older ones were seen, and accepted or fixed).
CHECK_RECENT_SESSIONS = 5

#: Which way is better, per metric (the gate's gated metrics).
DIRECTIONS: dict[str, str] = {"output_throughput": "higher", TOKENS_PER_VERIFY: "higher", "median_ttft_ms": "lower"}
#: Sample keys stored by sessions before a gate was renamed: old name -> current series name.
OLD_METRIC_NAMES: dict[str, str] = {"accept_length": TOKENS_PER_VERIFY}


class ChangePointsUnavailable(RuntimeError):
    """The change-point library is not installed."""


def check_available() -> None:
    try:
        import otava.analysis  # noqa: F401
    except ImportError:
        raise ChangePointsUnavailable(f"change points need Apache Otava: pip install '{HISTORY_EXTRA}'") from None


def check_history_usable(url: str, change_points: bool) -> None:
    """What a session can check before it measures: the history URL, its driver and, with
    ``--ddtree-history-check``, the change-point library (here, not in history.py, so that
    the history store does not import its own reader)."""
    check_usable(url)
    if change_points:
        try:
            check_available()
        except ChangePointsUnavailable as exc:
            raise HistoryError(str(exc)) from None


@dataclass(frozen=True)
class SeriesKey:
    hardware_profile: str
    config: str
    cell: str
    metric: str

    def label(self) -> str:
        return f"{self.config} {self.cell} {self.metric} ({self.hardware_profile})"


@dataclass(frozen=True)
class Point:
    """One session's measurement of a series."""

    session_id: str
    started_at: float
    build: str
    value: float  # geometric mean of the repeats
    samples: tuple[float, ...]
    status: str | None
    report_path: str | None


@dataclass(frozen=True)
class ChangePoint:
    key: SeriesKey
    index: int  # the first point of the new level
    size: float  # after / before - 1
    interval: tuple[float, float]  # 95% interval of the size
    pvalue: float
    before: Point  # the last session of the old level
    after: Point  # the first session of the new level
    sessions_before: int
    sessions_after: int
    regression: bool

    def describe(self) -> str:
        kind = "regression" if self.regression else "improvement"
        low, high = self.interval
        return (f"{self.key.label()}: {kind} of {self.size:+.1%} (95% interval {low:+.1%} to {high:+.1%}, p={self.pvalue:.1g}) "
                f"began at session {self.after.session_id} (build {self.after.build}); the last session before it was "
                f"{self.before.session_id} (build {self.before.build}); {self.sessions_before} sessions before, "
                f"{self.sessions_after} since")


@dataclass
class Series:
    key: SeriesKey
    points: list[Point] = field(default_factory=list)
    change_points: list[ChangePoint] = field(default_factory=list)


def _log_centre(samples: Sequence[float]) -> float | None:
    logs = [math.log(v) for v in samples if v > 0]
    return sum(logs) / len(logs) if logs else None


def build_series(cells: Sequence[StoredCell], metrics: Sequence[str] = tuple(DIRECTIONS)) -> list[Series]:
    """One series per hardware profile x config x cell x metric, oldest session first.

    Cells whose measurement was invalid are left out: their numbers describe a broken run, not
    the build (the gate never judged them either).
    """
    by_key: dict[SeriesKey, Series] = {}
    for c in cells:
        if c.status == Status.INVALID:
            continue
        stored = dict(c.samples)
        for old, new in OLD_METRIC_NAMES.items():  # one series across the rename
            if old in stored and new not in stored:
                stored[new] = stored.pop(old)
        for metric in metrics:
            samples = [v for v in stored.get(metric) or [] if stats.is_number(v) and v > 0]
            centre = _log_centre(samples)
            if centre is None:
                continue
            key = SeriesKey(c.hardware_profile or "unknown", c.config, c.cell, metric)
            series = by_key.setdefault(key, Series(key))
            verdict = c.verdicts.get(metric) or next((c.verdicts[o] for o, n in OLD_METRIC_NAMES.items()
                                                       if n == metric and o in c.verdicts), None)
            series.points.append(Point(c.session.session_id, c.session.started_at, c.session.build.label(),
                                       math.exp(centre), tuple(samples), verdict or c.status,
                                       c.session.report_path))
    return sorted(by_key.values(), key=lambda s: (s.key.hardware_profile, s.key.config, s.key.cell, s.key.metric))


def _welch_interval(left: Sequence[float], right: Sequence[float]) -> tuple[float, float]:
    """95% interval of mean(right) - mean(left) (log values), Welch's t."""
    def var(xs: Sequence[float]) -> float:
        return stats.stdev(xs) ** 2 if len(xs) >= 2 else 0.0

    diff = stats.mean(right) - stats.mean(left)
    vl, vr = var(left) / len(left), var(right) / len(right)
    se = math.sqrt(vl + vr)
    if se == 0:
        return diff, diff
    terms = (vl ** 2 / (len(left) - 1) if len(left) > 1 else 0.0) + (vr ** 2 / (len(right) - 1) if len(right) > 1 else 0.0)
    df = (vl + vr) ** 2 / terms if terms > 0 else 1.0
    half = stats.t_quantile(0.975, max(df, 1.0)) * se
    return diff - half, diff + half


def detect(series: Series, max_pvalue: float = MAX_PVALUE) -> list[ChangePoint]:
    """Otava's change points of one series (fewer than 3 sessions: none can be told)."""
    check_available()
    from otava.analysis import compute_change_points

    points = series.points
    if len(points) < 3:
        return []
    logs = [math.log(p.value) for p in points]
    with warnings.catch_warnings():  # a constant segment makes scipy warn about a zero variance
        warnings.simplefilter("ignore", RuntimeWarning)
        found, _ = compute_change_points(logs, window_len=WINDOW_SESSIONS, max_pvalue=max_pvalue)
    indices = sorted({int(c.index) for c in found if 0 < int(c.index) < len(points)})
    pvalues = {int(c.index): float(c.stats.pvalue) for c in found}
    bounds = [0, *indices, len(points)]
    direction = DIRECTIONS.get(series.key.metric, "higher")
    out: list[ChangePoint] = []
    for n, index in enumerate(indices, start=1):
        left, right = logs[bounds[n - 1]:index], logs[index:bounds[n + 1]]
        change = stats.mean(right) - stats.mean(left)
        low, high = _welch_interval(left, right)
        out.append(ChangePoint(
            key=series.key, index=index, size=math.expm1(change), interval=(math.expm1(low), math.expm1(high)),
            pvalue=pvalues.get(index, float("nan")), before=points[index - 1], after=points[index],
            sessions_before=index, sessions_after=len(points) - index,
            regression=(change < 0) if direction == "higher" else (change > 0),
        ))
    series.change_points = out
    return out


def analyse(cells: Sequence[StoredCell], max_pvalue: float = MAX_PVALUE) -> list[Series]:
    """Every series of the history with its change points."""
    all_series = build_series(cells)
    for s in all_series:
        detect(s, max_pvalue)
    return all_series


def newest_change_points(all_series: Sequence[Series], limit: int = 20) -> list[ChangePoint]:
    """The change points, newest first (by the time of the session where they began)."""
    found = [cp for s in all_series for cp in s.change_points]
    found.sort(key=lambda cp: (cp.after.started_at, cp.key.label()), reverse=True)
    return found[:limit]


def summary_text(all_series: Sequence[Series], limit: int = 20) -> str:
    """The plain-text summary a CI log shows."""
    sessions = {p.session_id for s in all_series for p in s.points}
    found = newest_change_points(all_series, limit)
    total = sum(len(s.change_points) for s in all_series)
    head = (f"history: {len(sessions)} sessions, {len(all_series)} series (hardware profile x config x cell x metric), "
            f"{total} change point{'s' if total != 1 else ''} (Apache Otava E-divisive, p < {MAX_PVALUE:g})")
    if not found:
        return head + "\nno change point: every series is level within its noise"
    lines = [head, f"newest {len(found)}:" if total > len(found) else "newest first:"]
    lines += [f"  - {cp.describe()}" for cp in found]
    return "\n".join(lines)


def check_session(all_series: Sequence[Series], session_id: str, recent: int = CHECK_RECENT_SESSIONS) -> list[ChangePoint]:
    """The regressions this session's measurements belong to and that began among the newest
    ``recent`` sessions of their series (``--ddtree-history-check`` fails the session on them)."""
    out: list[ChangePoint] = []
    for s in all_series:
        ids = [p.session_id for p in s.points]
        if session_id not in ids or not s.change_points:
            continue
        newest = s.change_points[-1]
        position = ids.index(session_id)
        if newest.regression and position >= newest.index and newest.index >= len(ids) - recent:
            out.append(newest)
    return out

