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
from typing import NamedTuple

from pytest_ddtree.measure import stats
from pytest_ddtree.report.history import HistoryError, SessionEntry, StoredCell, check_usable
from pytest_ddtree.metrics import ACCEPT_LENGTH, MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT, TOKENS_PER_VERIFY
from pytest_ddtree.records.words import Status

#: The extra that brings the change-point library.
HISTORY_EXTRA = "pytest-ddtree[history]"
MAX_PVALUE = 1e-5
#: Otava's sliding window for its first (split) pass, in sessions.
WINDOW_SESSIONS = 30
#: ``--ddtree-history-check``: a regression whose first session is among this many newest
#: sessions of its series fails the session (older ones were seen, and accepted or fixed).
CHECK_RECENT_SESSIONS = 5

#: Sessions a series needs before a change in it can be told at ``MAX_PVALUE``: with 1% noise between
#: sessions, a 20% step in the newest session was found 0 of 20 times after 2 sessions, 17 of 20 after
#: 6 and 20 of 20 after 7 (Otava at p < 1e-5); fewer, and "no change point" says nothing.
MIN_SESSIONS_TO_TELL = 8

#: Which way is better, per metric (the gate's gated metrics).
DIRECTIONS: dict[str, str] = {OUTPUT_THROUGHPUT: "higher", TOKENS_PER_VERIFY: "higher", MEDIAN_TTFT_MS: "lower"}
#: Sample keys stored by sessions before a gate was renamed: old name -> current series name.
OLD_METRIC_NAMES: dict[str, str] = {ACCEPT_LENGTH: TOKENS_PER_VERIFY}


class ChangePointsUnavailable(RuntimeError):
    """The change-point library is not installed."""


def check_available() -> None:
    try:
        import otava.analysis  # noqa: F401
    except ImportError:
        raise ChangePointsUnavailable(f"change points need Apache Otava: pip install '{HISTORY_EXTRA}'") from None


def history_problem(url: str, change_points: bool) -> str | None:
    """Why ``--ddtree-history`` cannot be used (the usage error's message), or None: what a session can
    check before it measures, not after hours of measuring: the history URL, its driver and, with
    ``--ddtree-history-check``, the change-point library (here, not in history.py, so that the
    history store does not import its own reader)."""
    try:
        check_usable(url)
        if change_points:
            check_available()
    except (HistoryError, ChangePointsUnavailable) as exc:
        return f"--ddtree-history: {exc}"
    return None


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
    fingerprint: str = ""  # the session's build fingerprint (``history.Build.fingerprint``)
    #: The session's calibration probe: (command + figure, its geometric mean over the runs); empty: none.
    calibration: tuple[tuple[str, float], ...] = ()
    exit_status: int | None = None  # the session's pytest exit status (None: not recorded)


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


def session_calibration(session: SessionEntry) -> tuple[tuple[str, float], ...]:
    """A session's calibration figures, each its geometric mean over the runs, keyed by the probe's
    command and the figure's name: a new probe (or a renamed figure) starts a level of its own
    rather than reading as a slower machine."""
    out = []
    for figure, values in sorted(session.calibration.items()):
        centre = _log_centre([v for v in values if stats.is_number(v) and math.isfinite(v)])
        if centre is not None:
            out.append((f"{session.calibration_command or ''}\x1f{figure}", math.exp(centre)))
    return tuple(out)


def build_series(cells: Sequence[StoredCell], metrics: Sequence[str] = tuple(DIRECTIONS)) -> list[Series]:
    """One series per hardware profile x config x cell x metric, oldest session first.

    Cells whose measurement was invalid are left out: their numbers describe a broken run, not
    the build (the gate never judged them either).
    """
    by_key: dict[SeriesKey, Series] = {}
    calibrations: dict[str, tuple[tuple[str, float], ...]] = {}
    for c in cells:
        if c.session.session_id not in calibrations:
            calibrations[c.session.session_id] = session_calibration(c.session)
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
                                       c.session.report_path, c.session.build.fingerprint(),
                                       calibrations[c.session.session_id], c.session.exit_status))
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
    half = stats.t_inverse_cdf(0.975, max(df, 1.0)) * se
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


def summary_text(all_series: Sequence[Series], limit: int = 20, builds: Sequence[BuildHistory] | None = None) -> str:
    """The plain-text summary a CI log shows (``builds``: ``analyse_builds(all_series)`` where the caller has it)."""
    sessions = {p.session_id for s in all_series for p in s.points}
    found = newest_change_points(all_series, limit)
    total = sum(len(s.change_points) for s in all_series)
    head = (f"history: {len(sessions)} sessions, {len(all_series)} series (hardware profile x config x cell x metric), "
            f"{total} change point{'s' if total != 1 else ''} (Apache Otava E-divisive, p < {MAX_PVALUE:g})")
    build_lines = build_summary_lines(analyse_builds(all_series) if builds is None else builds)
    short = too_few_sessions(all_series)
    if not found:
        return "\n".join([head, no_change_headline(all_series), *build_lines])
    lines = [head, f"newest {len(found)}:" if total > len(found) else "newest first:"]
    lines += [f"  - {cp.describe()}" for cp in found]
    if short:
        lines.append(f"{len(short)} other series have fewer than {MIN_SESSIONS_TO_TELL} sessions: too few sessions to tell")
    return "\n".join([*lines, *build_lines])


def too_few_sessions(all_series: Sequence[Series]) -> list[Series]:
    """The series with fewer sessions than a change needs to be told in them."""
    return [s for s in all_series if len(s.points) < MIN_SESSIONS_TO_TELL]


def no_change_headline(all_series: Sequence[Series]) -> str:
    """What a history with no change point says: level within the noise only where every series had
    the sessions to tell; else how many did not, and how the newest session sits against the earlier
    ones (what the chart shows), so the words never contradict the picture."""
    short = too_few_sessions(all_series)
    if not short:
        return "no change point: every series is level within its noise"
    shifts = [shift for s in short if (shift := newest_shift(s)) is not None]
    newest = (f"; the newest session against the earlier ones: {min(shifts) * 100:+.1f}% to {max(shifts) * 100:+.1f}% "
              f"over {len(shifts)} series (not tested)") if shifts else ""
    return (f"too few sessions to tell: {len(short)} of {len(all_series)} series have fewer than {MIN_SESSIONS_TO_TELL} sessions, "
            f"and a change in the newest session needs about {MIN_SESSIONS_TO_TELL - 1} before it to be told at "
            f"p < {MAX_PVALUE:g}{newest}")


def newest_shift(series: Series) -> float | None:
    """The newest session's value against the median of the earlier ones, as a fraction (None: one session)."""
    if len(series.points) < 2:
        return None
    return series.points[-1].value / stats.median([p.value for p in series.points[:-1]]) - 1.0


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



# -- the build as a whole: a step common to every series of a session ---------------------------------
#
# Why a joint test and not Otava per series: a build that slows everything by 5%, the control
# included, moves each series by about its own noise plus the day's, so per series it hides until
# many sessions have passed, and within one session it cannot be told from a slower day (the
# control moves with the configs). Across sessions it can: a day is one session's, a build stays.
# So every session gets one number, its **level**: the median over its output tok/s series (every
# config x cell and the control's cells) of the log-ratio against each series' own level in the
# history. A median, because one config that regressed alone is that config's change (its series'
# change point), not the build's; output tok/s only, because a build's speed is what a build-level
# change moves (acceptance is the drafter's and does not move with the day, TTFT is twice as noisy
# and gated per cell). The level's session-to-session spread is the day-to-day shift (~2% on GPU
# servers), which the history itself measures. Otava over the levels would do, but it is built for
# a finished series (p < 1e-5 over a whole window): a step three sessions old is below its
# threshold, and a CI check has to see it then. Hence a sequential test read as the check runs:
# at each session the newest ``BUILD_LOOKS`` begin points are tested (a t-test of the sessions from
# the begin point on against up to ``BUILD_WINDOW`` sessions before it, the spread from those
# sessions, ``BUILD_ALPHA / BUILD_LOOKS`` per look and direction, a step of ``BUILD_MIN_STEP`` at
# least); a change found is re-tested with every later session and dropped when they no longer
# support it (one slow day is not a build), and it is settled once ``BUILD_LOOKS`` sessions are
# past it. The false-alarm rate, the share of
# sessions of an unchanged history that the check fails, and how soon a 3% and a 5% step is found
# are measured on synthetic histories by ``benchmarks/bench_build_changes.py``.

#: The metric whose series make a session's level.
BUILD_METRIC = OUTPUT_THROUGHPUT
#: Begin points tested at each session, and sessions after which a change is settled (and
#: ``--ddtree-history-check`` no longer fails the sessions of its new level).
BUILD_LOOKS = CHECK_RECENT_SESSIONS
#: Sessions of the old level a change needs before it (the spread is estimated from them).
BUILD_MIN_BEFORE = 6
#: At most this many sessions of the old level are compared (a level drifts over months).
BUILD_WINDOW = 30
#: Each session's chance of a false build-level change (both directions, all looks together).
BUILD_ALPHA = 0.02
#: The smallest session-to-session spread of the level the test assumes (a quiet reference engine
#: would otherwise turn a 0.5% wobble into a "build change").
BUILD_NOISE_FLOOR = 0.003
#: The smallest step called a build-level change (log): a level that moves less is a config or two
#: moving the median, not the build (and no CI team acts on it).
BUILD_MIN_STEP = 0.01
KIND_BUILD = "the build changed"
KIND_CONFIGS_ONLY = "the speculative configs changed, the control held"
KIND_NO_CONTROL = "the speculative configs changed (no control in the history)"


@dataclass(frozen=True)
class BuildPoint:
    """One session's level (log, against each series' own level) and the control's alone."""

    session_id: str
    started_at: float
    build: str
    fingerprint: str
    level: float
    control: float | None
    series: int
    #: The log-change of the session's calibration probe against the history's calibration level
    #: (its figures' geometric mean); None: the session ran no probe.
    calibration: float | None = None


@dataclass(frozen=True)
class BuildChange:
    """A step common to every series: where it began, how large, and the builds on either side."""

    hardware_profile: str
    index: int  # the first session of the new level
    size: float  # after / before - 1 of the sessions' level
    interval: tuple[float, float]  # 95% interval of the size
    control_size: float | None  # the control's own step at the same place
    before: BuildPoint
    after: BuildPoint
    detected_at: BuildPoint  # the session whose check first saw it
    sessions_before: int
    sessions_after: int
    settled: bool  # more than BUILD_LOOKS sessions at its new level: no longer re-tested
    regression: bool
    calibrated: bool = False  # each session's level less its calibration probe's change (every session tested had one)

    @property
    def kind(self) -> str:
        if self.control_size is None:
            return KIND_NO_CONTROL
        moved_with = self.control_size * self.size > 0 and abs(self.control_size) >= abs(self.size) / 2
        return KIND_BUILD if moved_with else KIND_CONFIGS_ONLY

    def describe(self) -> str:
        low, high = self.interval
        control = ("" if self.control_size is None else f", the control {self.control_size:+.1%}")
        calibrated = ("; calibrated: each session's level less its calibration probe's change, so not the machine's "
                      "day" if self.calibrated else "")
        return (f"{self.kind} ({self.hardware_profile}): every series {self.size:+.1%} (95% interval {low:+.1%} to "
                f"{high:+.1%}{control}; a {'regression' if self.regression else 'improvement'}{calibrated}) from session "
                f"{self.after.session_id} (build {self.after.build}, {self.after.fingerprint}); the last session "
                f"before it was {self.before.session_id} (build {self.before.build}, {self.before.fingerprint}); "
                f"{self.sessions_before} sessions before, {self.sessions_after} since; seen at session "
                f"{self.detected_at.session_id}")


@dataclass
class BuildHistory:
    """The sessions' levels of one hardware profile and their build-level changes."""

    hardware_profile: str
    points: list[BuildPoint] = field(default_factory=list)
    changes: list[BuildChange] = field(default_factory=list)


def build_points(all_series: Sequence[Series]) -> dict[str, list[BuildPoint]]:
    """Each session's level per hardware profile, oldest first (``Series`` of ``BUILD_METRIC``,
    the control's among them: config ``control``)."""
    from pytest_ddtree.gates.throughput.baseline import CONTROL

    per_profile: dict[str, dict[str, tuple[Point, list[float], list[float]]]] = {}
    for s in all_series:
        if s.key.metric != BUILD_METRIC or not s.points:
            continue
        logs = [math.log(p.value) for p in s.points]
        centre = stats.median(logs)
        sessions = per_profile.setdefault(s.key.hardware_profile, {})
        for point, y in zip(s.points, logs):
            _, every, control = sessions.setdefault(point.session_id, (point, [], []))
            every.append(y - centre)
            if s.key.config == CONTROL:
                control.append(y - centre)
    out: dict[str, list[BuildPoint]] = {}
    for profile, sessions in per_profile.items():
        rows = sorted(sessions.values(), key=lambda row: (row[0].started_at, row[0].session_id))
        changes = _calibration_changes([p for p, _, _ in rows])
        out[profile] = [BuildPoint(p.session_id, p.started_at, p.build, p.fingerprint, stats.median(every),
                                   stats.median(control) if control else None, len(every), calibration)
                        for (p, every, control), calibration in zip(rows, changes)]
    return out


def _calibration_changes(points: Sequence[Point]) -> list[float | None]:
    """Each session's calibration against the history's: the mean over its figures of the log-ratio
    to that figure's median over the sessions (a geometric mean of the ratios); None: no probe."""
    logs: dict[str, list[float]] = {}
    for p in points:
        for key, value in p.calibration:
            logs.setdefault(key, []).append(math.log(value))
    centres = {key: stats.median(values) for key, values in logs.items()}
    return [stats.mean([math.log(v) - centres[k] for k, v in p.calibration]) if p.calibration else None for p in points]


class _Test(NamedTuple):
    t: float
    threshold: float
    step: float
    se: float
    calibrated: bool


def _levels(points: Sequence[BuildPoint], lo: int, hi: int, split: int) -> tuple[list[float], bool]:
    """The levels of sessions ``lo..hi - 1``: less their calibration where every one of them has a
    probe's (a window of mixed sessions is tested as measured: half a correction is a step) and the
    calibrated levels before ``split`` spread less than the measured ones (a probe noisier than the
    day it corrects would only add its noise)."""
    window = points[lo:hi]
    measured = [p.level for p in window]
    if not window or any(p.calibration is None for p in window):
        return measured, False
    calibrated = [p.level - (p.calibration or 0.0) for p in window]
    before = split - lo
    if before >= 2 and stats.stdev(calibrated[:before]) >= stats.stdev(measured[:before]):
        return measured, False
    return calibrated, True


def _step(points: Sequence[BuildPoint], start: int, index: int, end: int) -> _Test | None:
    """The t-test of sessions ``index..end`` against up to ``BUILD_WINDOW`` before ``index`` (from
    ``start``); None with too few before."""
    lo = max(start, index - BUILD_WINDOW)
    levels, calibrated = _levels(points, lo, end + 1, index)
    before, after = levels[:index - lo], levels[index - lo:]
    if len(before) < BUILD_MIN_BEFORE or not after:
        return None
    spread = max(BUILD_NOISE_FLOOR, stats.stdev(before))
    se = spread * math.sqrt(1.0 / len(after) + 1.0 / len(before))
    step = stats.mean(after) - stats.mean(before)
    threshold = stats.t_inverse_cdf(1.0 - BUILD_ALPHA / (2 * BUILD_LOOKS), len(before) - 1)
    return _Test(step / se, threshold, step, se, calibrated)


def _significant(test: _Test | None) -> bool:
    return test is not None and abs(test.t) >= test.threshold and abs(test.step) >= BUILD_MIN_STEP


def build_changes(profile: str, points: Sequence[BuildPoint]) -> list[BuildChange]:
    """The build-level changes of one hardware profile's sessions: the sequential test above, run
    session by session as ``--ddtree-history-check`` would have run it (so the history page and the
    check agree on every session)."""
    found: list[tuple[int, int, int]] = []  # (index, detected at, start of the level before it)
    start = 0
    for n in range(len(points)):
        if found and n - found[-1][0] < BUILD_LOOKS:  # the newest change, re-tested with this session
            index, _, before = found[-1]
            test = _step(points, before, index, n)
            first = _step(points, before, index, found[-1][1])
            if test is None or first is None or not _significant(test) or test.t * first.t < 0:
                found.pop()  # the sessions since no longer support it
                start = before
            else:
                continue
        best: tuple[float, int] | None = None
        for index in range(max(start + BUILD_MIN_BEFORE, n - BUILD_LOOKS + 1), n + 1):
            test = _step(points, start, index, n)
            if test is not None and _significant(test) and (best is None or abs(test.t) / test.threshold > best[0]):
                best = (abs(test.t) / test.threshold, index)
        if best is not None:
            found.append((best[1], n, start))
            start = best[1]
    out: list[BuildChange] = []
    bounds = [index for index, _, _ in found] + [len(points)]
    for k, (index, detected, before) in enumerate(found):
        end = bounds[k + 1] - 1
        test = _step(points, before, index, end)
        assert test is not None
        half = 1.96 * test.se

        def control(p: BuildPoint) -> float | None:
            if p.control is None:
                return None
            return p.control - (p.calibration or 0.0) if test.calibrated else p.control

        left = [c for p in points[max(before, index - BUILD_WINDOW):index] if (c := control(p)) is not None]
        right = [c for p in points[index:end + 1] if (c := control(p)) is not None]
        control_size = math.expm1(stats.mean(right) - stats.mean(left)) if left and right else None
        out.append(BuildChange(
            hardware_profile=profile, index=index, size=math.expm1(test.step),
            interval=(math.expm1(test.step - half), math.expm1(test.step + half)), control_size=control_size,
            before=points[index - 1], after=points[index], detected_at=points[detected],
            sessions_before=index, sessions_after=len(points) - index,
            settled=len(points) - index > BUILD_LOOKS, regression=test.step < 0, calibrated=test.calibrated))
    return out


def analyse_builds(all_series: Sequence[Series]) -> list[BuildHistory]:
    """Every hardware profile's sessions with their build-level changes."""
    return [BuildHistory(profile, points, build_changes(profile, points))
            for profile, points in sorted(build_points(all_series).items())]


def check_build(histories: Sequence[BuildHistory], session_id: str) -> list[BuildChange]:
    """The build-level regressions this session belongs to that are not settled yet (they began
    among the newest ``BUILD_LOOKS`` sessions and every session since supports them):
    ``--ddtree-history-check`` fails the session on them, naming the build."""
    out: list[BuildChange] = []
    for h in histories:
        ids = [p.session_id for p in h.points]
        if session_id not in ids or not h.changes:
            continue
        newest = h.changes[-1]
        if newest.regression and not newest.settled and ids.index(session_id) >= newest.index:
            out.append(newest)
    return out


def check_history(cells: Sequence[StoredCell], session_id: str) -> tuple[str, list[str]]:
    """What ``--ddtree-history-check`` says of session ``session_id`` over the stored ``cells``: the
    summary for the CI log, and the regressions it starts (each series' and the build's), described."""
    analysed = analyse(cells)
    builds = analyse_builds(analysed)  # once: the summary says them too
    regressions = [cp.describe() for cp in check_session(analysed, session_id)]
    regressions += [c.describe() for c in check_build(builds, session_id)]
    return summary_text(analysed, limit=5, builds=builds), regressions


def build_summary_lines(histories: Sequence[BuildHistory], limit: int = 5) -> list[str]:
    """What the CI log says about the build as a whole (newest change first)."""
    changes = sorted((c for h in histories for c in h.changes), key=lambda c: c.after.started_at, reverse=True)
    sessions = max((len(h.points) for h in histories), default=0)
    probed = max((sum(p.calibration is not None for p in h.points) for h in histories), default=0)
    calibrated = (f", less its calibration probe's change where every session tested has one ({probed} of "
                  f"{sessions} have)" if probed else "")
    head = (f"the build as a whole ({sessions} sessions; each session's median output tok/s change over its "
            f"series, the control's included{calibrated}): ")
    if not changes:
        return [head + "no build-level change"]
    return [head + f"{len(changes)} build-level change{'s' if len(changes) != 1 else ''}",
            *(f"  - {c.describe()}" for c in changes[:limit])]
