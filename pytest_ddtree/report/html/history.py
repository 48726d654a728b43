"""The history page (``ddtree-report --history URL``): a trend chart per config x cell x metric.

One self-contained file like report.html (data, styles and the vendored chart runtime inline),
so it opens offline from a CI artifact. Each chart plots one value per session (the geometric
mean of its repeats, the number the change points are found on), the level of each segment
between change points, and a dashed line at each change point labelled with its size. A point
links to its session's report.html when the history knows that folder. Filters (config, cell,
metric, hardware profile) only hide charts; a chart is drawn the first time it is shown, so a
campaign's hundreds of series do not all render at load.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from pytest_ddtree.gates.throughput import verdicts as verdicts_mod
from pytest_ddtree.records.words import Status
from pytest_ddtree.report.changepoints import (MAX_PVALUE, MIN_SESSIONS_TO_TELL, ChangePoint, Point, Series,
                                              newest_change_points, newest_shift, no_change_headline)
from pytest_ddtree.report.html import charts
from pytest_ddtree.report.html.model import fmt_time
from pytest_ddtree.report.history import redact

HISTORY_HTML = "ddtree-history.html"
_REGRESSION_COLOR, _IMPROVEMENT_COLOR = "#c62828", "#2e7d32"


def _link(report_path: str | None, output_dir: Path) -> str:
    """A link to a session's report that works from where the page is written: an http(s) URL as
    it is, else a path relative to the page, percent-encoded and starting ``./`` or ``../``, so
    that no segment reads as a scheme (a results folder named ``javascript:...``); "" for none.

    A report path comes from the history database, which other sessions (or anyone) wrote."""
    if not report_path:
        return ""
    if urlsplit(report_path).scheme in ("http", "https") and urlsplit(report_path).netloc:
        return checked_link(quote(report_path, safe=":/?#[]@!$&'()*+,;=%"))
    try:
        relative = os.path.relpath(Path(report_path), output_dir)
    except ValueError:  # another drive (Windows): no relative link exists
        return ""
    encoded = quote(relative.replace(os.sep, "/"), safe="/")
    return checked_link(encoded if encoded.startswith(("./", "../")) else "./" + encoded)


def checked_link(url: str) -> str:
    """``url`` when the page may link to it (http, https, or relative starting ``./`` or ``../``),
    else "": the one check before any link is written (the click handler repeats it)."""
    if url.startswith(("./", "../")):
        return url
    parts = urlsplit(url)
    return url if parts.scheme in ("http", "https") and parts.netloc else ""


def _figure(series: Series, ordinal: dict[str, int], output_dir: Path) -> dict[str, Any]:
    points = series.points
    xs = [ordinal[p.session_id] for p in points]
    unit = verdicts_mod.SPECS[series.key.metric].unit if series.key.metric in verdicts_mod.SPECS else ""
    hover = [f"{p.session_id}<br>{fmt_time(p.started_at)}<br>build {p.build}<br>{p.status or ''}: "
             f"{', '.join(f'{v:.4g}' for v in p.samples)}" for p in points]
    traces: list[dict[str, Any]] = [{
        "type": "scatter", "mode": "lines+markers", "name": "session (geometric mean of repeats)", "x": xs,
        "y": [p.value for p in points], "text": hover, "customdata": [_link(p.report_path, output_dir) for p in points],
        "hovertemplate": "%{text}<br>%{y:.4g} " + unit + "<extra></extra>", "marker": {"size": 6, "color": "#1565c0"},
        "line": {"width": 1, "color": "#90caf9"},
    }]
    bounds = [0, *(cp.index for cp in series.change_points), len(points)]
    level_x: list[float | None] = []
    level_y: list[float | None] = []
    band_x: list[float | None] = []
    band_low: list[float | None] = []
    band_high: list[float | None] = []
    for start, stop in zip(bounds, bounds[1:]):
        segment = points[start:stop]
        mean = _geometric_mean([p.value for p in segment])
        low, high = _noise_band(segment, mean)
        level_x += [xs[start], xs[stop - 1], None]
        level_y += [mean, mean, None]
        band_x += [xs[start] - 0.4, xs[stop - 1] + 0.4, None]
        band_low += [low, low, None]
        band_high += [high, high, None]
    traces.append({"type": "scatter", "mode": "lines", "name": "level between change points", "x": level_x, "y": level_y,
                   "line": {"color": "#424242", "width": 2}, "hoverinfo": "skip"})
    # The noise band of each level, under the points: the range its own sessions and repeats spread
    # over. Without it an autoscaled axis turns a 1% wobble into a cliff.
    shapes: list[dict[str, Any]] = [
        {"type": "rect", "layer": "below", "x0": x0, "x1": x1, "y0": y0, "y1": y1, "fillcolor": "rgba(21,101,192,0.12)",
         "line": {"width": 0}, "name": "noise band"}
        for x0, x1, y0, y1 in zip(band_x[0::3], band_x[1::3], band_low[0::3], band_high[0::3])]
    annotations = []
    for cp in series.change_points:
        x = (ordinal[cp.before.session_id] + ordinal[cp.after.session_id]) / 2
        color = _REGRESSION_COLOR if cp.regression else _IMPROVEMENT_COLOR
        shapes.append({"type": "line", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1,
                       "line": {"color": color, "dash": "dash", "width": 2}})
        annotations.append({"x": x, "yref": "paper", "y": 0.98, "yanchor": "top", "xanchor": "left", "showarrow": False,
                            "text": f"{cp.size:+.1%}", "font": {"color": color, "size": 12}, "bgcolor": "rgba(255,255,255,0.8)"})
    # whole sessions only, a tick per session up to about a dozen of them; the y axis at least +-5% of
    # the level, so that what the band calls noise also looks like it
    step = max(1, math.ceil(len(points) / 12))
    values = [p.value for p in points] + [v for v in band_low + band_high if v is not None]
    centre = _geometric_mean([p.value for p in points])
    y_range = [min(min(values), centre * 0.95), max(max(values), centre * 1.05)]
    pad = 0.05 * (y_range[1] - y_range[0])
    layout: dict[str, Any] = {
        "xaxis": {"title": {"text": "session (oldest first)"}, "tickmode": "array", "tickvals": xs[::step],
                  "ticktext": [str(x) for x in xs[::step]], "range": [xs[0] - 0.6, xs[-1] + 0.6]},
        "yaxis": {"title": {"text": unit or series.key.metric}, "range": [y_range[0] - pad, y_range[1] + pad]},
        "margin": {"l": 60, "r": 10, "t": 30, "b": 45}, "height": 300, "showlegend": False, "hovermode": "closest",
        "shapes": shapes, "annotations": annotations,
    }
    if len(points) == 1:
        charts.single_x(layout, xs[0])
    return {"data": traces, "layout": layout}


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _noise_band(segment: Sequence[Point], level: float) -> tuple[float, float]:
    """The 95% range around ``level`` of one level's sessions: the spread of their values between
    sessions and of the repeats within each (log values; the gate's own view of noise), at least
    the spread of one session's repeats where the level has a single session."""
    logs = [math.log(p.value) for p in segment]
    within = [math.log(s) - math.log(p.value) for p in segment for s in p.samples if s > 0]
    spreads = [_sd(logs), _sd(within)]
    sd = max(v for v in spreads if v is not None) if any(v is not None for v in spreads) else 0.0
    return level * math.exp(-1.96 * sd), level * math.exp(1.96 * sd)


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _change_row(cp: ChangePoint, output_dir: Path) -> dict[str, Any]:
    return {"cp": cp, "after_link": _link(cp.after.report_path, output_dir), "before_link": _link(cp.before.report_path, output_dir)}


#: pytest's exit statuses, as the sessions table words them.
_EXIT_WORDS = {0: "passed", 1: "failed", 2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests ran"}
#: Cell verdicts the sessions table counts, worst first.
_COUNTED = (Status.REGRESSION, Status.INVALID, Status.INCONCLUSIVE, Status.FLAGGED, Status.MISSING)


#: The verdict of a --ddtree-measure-only session that ended well: it judged nothing, so it did not pass.
MEASURED_SESSION = "measured: nothing judged (--ddtree-measure-only)"


def session_verdicts(all_series: Sequence[Series]) -> dict[str, str]:
    """Each session's verdict for the sessions table: its exit status in words, and how many of its cells
    ended regressed, invalid, inconclusive, flagged or without a baseline (counted once per cell).

    A ``--ddtree-measure-only`` session (its cells stored with the status ``measured``, which no gated
    session gives) exits 0 without having judged anything: its verdict is :data:`MEASURED_SESSION`, not
    "passed"; its figures still enter the series, as the same measurements of the same cells."""
    exits: dict[str, int | None] = {}
    cells: dict[str, dict[str, set[tuple[str, str]]]] = {}
    measure_only: set[str] = set()
    for s in all_series:
        for p in s.points:
            exits.setdefault(p.session_id, p.exit_status)
            if p.status in _COUNTED:
                cells.setdefault(p.session_id, {}).setdefault(str(p.status), set()).add((s.key.config, s.key.cell))
            elif p.status == Status.MEASURED:
                measure_only.add(p.session_id)
    out: dict[str, str] = {}
    for session, code in exits.items():
        word = "not recorded" if code is None else _EXIT_WORDS.get(code, f"exit {code}")
        if session in measure_only:
            word = MEASURED_SESSION if code == 0 else f"{word} (--ddtree-measure-only)"
        counts = cells.get(session, {})
        detail = ", ".join(f"{len(counts[str(k)])} {k}" for k in _COUNTED if str(k) in counts)
        out[session] = f"{word}: {detail}" if detail else word
    return out


def build_history_html(all_series: Sequence[Series], *, source: str, output_dir: Path, summary: str) -> str:
    """The page for ``all_series`` (with their change points); ``source`` is the history URL."""
    from pytest_ddtree.report.html import template

    sessions: dict[str, Any] = {}
    for s in all_series:
        for p in s.points:
            sessions.setdefault(p.session_id, p)
    ordered = sorted(sessions.values(), key=lambda p: (p.started_at, p.session_id))
    ordinal = {p.session_id: n for n, p in enumerate(ordered, start=1)}
    figures: dict[str, Any] = {}
    trends = []
    # Series that changed first, the newest change first: what a team looks at; then the level ones.
    newest = {id(s): max(cp.after.started_at for cp in s.change_points) for s in all_series if s.change_points}
    ordered_series = sorted(all_series, key=lambda s: -newest.get(id(s), float("-inf")))
    for n, s in enumerate(ordered_series):
        figure_id = f"trend-{n}"
        figures[figure_id] = _figure(s, ordinal, output_dir)
        caption = f"{s.key.config} {s.key.cell}: {s.key.metric} ({s.key.hardware_profile})"
        if len(s.points) == 1:
            caption += ": one session so far"
        elif len(s.points) < MIN_SESSIONS_TO_TELL and not s.change_points and (shift := newest_shift(s)) is not None:
            # as the headline says it: the level line through these points is not a finding of "level"
            caption += f": {len(s.points)} sessions, too few to tell (the newest {shift * 100:+.1f}% against the earlier ones)"
        trends.append({"id": figure_id, "key": s.key, "caption": caption, "change_points": len(s.change_points)})
    runtime = charts.plotly_runtime()
    verdicts = session_verdicts(all_series)
    return str(template("history.html.j2").render(
        source=redact(source), generated=fmt_time(time.time()), summary=summary, max_pvalue=f"{MAX_PVALUE:g}",
        sessions=[{"n": ordinal[p.session_id], "point": p, "link": _link(p.report_path, output_dir),
                   "verdict": verdicts.get(p.session_id, "")} for p in ordered],
        no_change=no_change_headline(all_series),
        changes=[_change_row(cp, output_dir) for cp in newest_change_points(all_series, limit=50)],
        trends=trends,
        configs=sorted({s.key.config for s in all_series}), cells=sorted({s.key.cell for s in all_series}),
        metrics=sorted({s.key.metric for s in all_series}), profiles=sorted({s.key.hardware_profile for s in all_series}),
        charts_available=runtime is not None, runtime_file=charts.RUNTIME_FILE,
        plotly_js=(runtime or "").replace("</script", "<\\/script"), figures_json=charts.figure_json(figures if runtime else {}),
        fmt_time=fmt_time,
    ))
