"""Chart specifications (Plotly figure dicts) and the inlined Plotly runtime.

Why Plotly's "basic" partial bundle, vendored (see docs/report.md): the
pages draw only scatter and bar traces, and plotly.js's basic bundle (scatter, bar, pie; 1.2 MB
minified) is a quarter of the full one the plotly wheel ships (4.7 MB, with maps and 3-D), so a
report stays near 1.3 MB instead of 5 MB. Vendored (MIT, with its licence file, in ``vendor/``),
it needs no Python package at all and no download when a page is opened. Its charts zoom, pan,
hover and toggle series out of the box. The figures here are plain JSON-ready dicts.

Titles are the page's own captions above each chart, not Plotly titles: Plotly's toolbar sits
in the top-right corner of the plot and covered them.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT
from pytest_ddtree.report import text as report
from pytest_ddtree.configs import config_or_none, name_sort_key
from pytest_ddtree.report.html.model import CellRow, is_number
from pytest_ddtree.records.words import Status

#: The vendored runtime (package data of pytest_ddtree.report.html).
RUNTIME_FILE = "vendor/plotly-basic.min.js"

_STATUS_COLOR: dict[str, str] = {
    Status.PASS: "#2e7d32", Status.IMPROVED: "#1565c0", Status.UPDATED: "#2e7d32", Status.REGRESSION: "#c62828",
    Status.INVALID: "#6a1b9a", Status.INCONCLUSIVE: "#ef6c00", Status.MISSING: "#757575", Status.NEW: "#757575",
    Status.FLAGGED: "#ef6c00", Status.THIN: "#757575", Status.MEASURED: "#1565c0"}


#: A repeat outside its cell's band (a passing cell's 0.79x outlier): drawn in its metric's verdict colour, but
#: crossed, so a dot the verdict outvoted is not read as one inside the band.
OUTSIDE_SYMBOL = "x"


@functools.lru_cache(maxsize=1)
def plotly_runtime() -> str | None:
    """The vendored plotly.js basic bundle, or None when the file is missing (a broken install)."""
    try:
        return resources.files("pytest_ddtree.report.html").joinpath(RUNTIME_FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        return None


def _ctx_label(tokens: int | None) -> str:
    return report._ctx(tokens) if tokens is not None else "?"


def _layout(x_title: str, y_title: str, log_x: bool = False) -> dict[str, Any]:
    """A chart's layout; its title is the page's caption (see the module docstring)."""
    return {
        "xaxis": {"title": {"text": x_title}, **({"type": "log", "dtick": 0.30102999566} if log_x else {})},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "margin": {"l": 60, "r": 10, "t": 30, "b": 50},  # the top margin is the toolbar's row
        "height": 320,
        "legend": {"font": {"size": 10}},
        "hovermode": "closest",
    }


def single_x(layout: dict[str, Any], x: Any) -> None:
    """A chart whose points all share one x: a category axis with that one tick, not a log
    axis spanning 0.125..8 around it (what Plotly draws for one point)."""
    layout["xaxis"] = {"title": layout["xaxis"]["title"], "type": "category", "tickvals": [x], "range": [-0.5, 0.5]}


def measured_ticks(layout: dict[str, Any], values: Iterable[int]) -> None:
    """Ticks on a log axis only where something was measured (1, 8, 32), not at every power of two
    between them: a tick at 2, 4 and 16 reads as if those concurrencies had been measured."""
    ticks = sorted(set(values))
    layout["xaxis"].pop("dtick", None)
    layout["xaxis"].update({"tickmode": "array", "tickvals": ticks, "ticktext": [str(t) for t in ticks]})


def sweep_panels(cells: Sequence[CellRow], metric: str, y_title: str) -> list[dict[str, Any]]:
    """One figure per context length: ``metric`` against concurrency, a line per config."""
    by_ctx: dict[int | None, dict[str, list[tuple[int, float, str]]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        value = c.values.get(metric)
        if c.concurrency is None or not is_number(value) or c.measurement_status == Status.INVALID:
            continue
        by_ctx[c.context_tokens][c.config + (" (predicted)" if c.predicted else "")].append((c.concurrency, float(value), c.cell))
    panels = []
    for ctx in sorted(by_ctx, key=lambda t: t or 0):
        traces = []
        concurrencies = {p[0] for points in by_ctx[ctx].values() for p in points}
        for name in sorted(by_ctx[ctx], key=lambda n: name_sort_key(n.split(" ")[0])):
            points = sorted(by_ctx[ctx][name])
            traces.append({
                "type": "scatter", "mode": "lines+markers", "name": name,
                "x": [p[0] for p in points], "y": [p[1] for p in points], "text": [p[2] for p in points],
                "hovertemplate": f"{name}<br>%{{text}}: %{{y:.1f}}<extra></extra>",
                **({"line": {"dash": "dot"}} if name.endswith("(predicted)") else {}),
            })
        layout = _layout("concurrency", y_title, log_x=True)
        caption = f"context {_ctx_label(ctx)}"
        if len(concurrencies) == 1:
            (only,) = concurrencies
            single_x(layout, only)
            caption += f": measured at concurrency {only} only"
        else:
            measured_ticks(layout, concurrencies)
        panels.append({"id": f"{metric}-ctx-{ctx}", "context": ctx, "caption": caption,
                       "figure": {"data": traces, "layout": layout}})
    return panels


def pareto_panels(cells: Sequence[CellRow]) -> list[dict[str, Any]]:
    """One figure per context: tok/s per request (median request) against aggregate output tok/s, a
    line per config through its cells (its points over load), and the Pareto frontier over every
    config's points marked (``frontier.pareto_front``): vLLM's plot_pareto axes, per user against
    per GPU. A context with fewer than two points draws nothing."""
    from pytest_ddtree.report import frontier

    by_ctx: dict[int | None, list[tuple[float, float, tuple[str, str]]]] = defaultdict(list)
    for c in cells:
        x, y = c.values.get(frontier.AGGREGATE), c.values.get(frontier.PER_REQUEST)
        if c.predicted or c.measurement_status == Status.INVALID or not is_number(x) or not is_number(y):
            continue
        by_ctx[c.context_tokens].append((float(x), float(y), (c.config, c.cell)))
    panels = []
    for ctx in sorted(by_ctx, key=lambda t: t or 0):
        points = by_ctx[ctx]
        if len(points) < 2:
            continue
        traces: list[dict[str, Any]] = []
        for config in sorted({p[2][0] for p in points}, key=name_sort_key):
            own = sorted(p for p in points if p[2][0] == config)
            traces.append({"type": "scatter", "mode": "lines+markers", "name": config,
                           "x": [p[0] for p in own], "y": [p[1] for p in own], "text": [p[2][1] for p in own],
                           "hovertemplate": f"{config} %{{text}}<br>%{{x:.1f}} tok/s, %{{y:.1f}} tok/s per request<extra></extra>"})
        front = frontier.pareto_front(points)
        traces.append({"type": "scatter", "mode": "lines+markers", "name": "Pareto frontier",
                       "x": [p[0] for p in front], "y": [p[1] for p in front],
                       "text": [f"{p[2][0]} {p[2][1]}" for p in front],
                       "line": {"dash": "dash", "color": "#000", "shape": "hv"},
                       "marker": {"symbol": "star", "size": 13, "color": "#000"},
                       "hovertemplate": "frontier: %{text}<extra></extra>"})
        layout = _layout("aggregate output tok/s", "tok/s per request (median)")
        layout["xaxis"]["rangemode"] = "tozero"
        panels.append({"id": f"pareto-ctx-{ctx}", "context": ctx, "caption": f"context {_ctx_label(ctx)}: "
                       f"frontier {', '.join(dict.fromkeys(p[2][0] for p in front))}",
                       "frontier": [f"{p[2][0]} {p[2][1]}" for p in front], "figure": {"data": traces, "layout": layout}})
    return panels


def acceptance_figure(cells: Sequence[CellRow]) -> dict[str, Any] | None:
    """Acceptance against budget, a line per (block size, topk, window); flat last steps marked.

    The mark uses the same threshold as the text diagnosis (report.DRAFTER_BOUND_GAIN): a
    marked point is where a bigger tree stopped buying acceptance.
    """
    accept = report._config_accept([{"config": c.config, "metrics": {report.TOKENS_PER_VERIFY: report.tokens_per_verify(c.values)}}
                                    for c in cells if not c.predicted and c.measurement_status != Status.INVALID])
    groups: dict[tuple[int, int, str], list[tuple[int, float, str]]] = defaultdict(list)
    for name, value in accept.items():
        if (c := config_or_none(name)) and (shape := c.tree_shape()):
            window = "" if name.count("_w") == 0 else name.rsplit("_w", 1)[1]
            groups[(shape[0], shape[2], window)].append((shape[1], value, name))
    if not groups:
        return None
    traces: list[dict[str, Any]] = []
    flat_x: list[int] = []
    flat_y: list[float] = []
    flat_text: list[str] = []
    for (bs, k, w), members in sorted(groups.items()):
        members.sort()
        label = f"block {bs}, topk {k}" + (f", window {w}" if w else "")
        traces.append({"type": "scatter", "mode": "lines+markers", "name": label, "x": [m[0] for m in members],
                       "y": [m[1] for m in members], "text": [m[2] for m in members],
                       "hovertemplate": "%{text}: %{y:.2f}<extra></extra>"})
        if len(members) >= 2:
            (_, a1, _), (b2, a2, n2) = members[-2], members[-1]
            if a1 > 0 and (a2 - a1) / a1 < report.DRAFTER_BOUND_GAIN:
                flat_x.append(b2)
                flat_y.append(a2)
                flat_text.append(f"{n2}: {(a2 - a1) / a1:+.0%} over the previous budget")
    if flat_x:
        traces.append({"type": "scatter", "mode": "markers", "name": "drafter-bound (last budget step < "
                       f"{report.DRAFTER_BOUND_GAIN:.0%} gain)", "x": flat_x, "y": flat_y, "text": flat_text,
                       "marker": {"symbol": "x-thin-open", "size": 16, "color": "#c62828", "line": {"width": 3}},
                       "hovertemplate": "%{text}<extra></extra>"})
    layout = _layout("budget (tree nodes per verify step)", "accepted tokens per step", log_x=True)
    budgets = {x for t in traces for x in t["x"]}
    if len(budgets) == 1:
        single_x(layout, next(iter(budgets)))
    else:
        measured_ticks(layout, budgets)
    return {"data": traces, "layout": layout}


def speedup_figure(cells: Sequence[CellRow], control: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Acceptance against speedup over the control, a line per (block size, topk, window) through its
    budgets: acceptance rises with the budget while the speedup peaks at an intermediate one (the
    DDTree paper's finding), so where a line turns back is where a bigger tree stops paying. Each
    point is a config's median over its cells (speedup: config / control output tok/s per cell, from
    the control's judgement; acceptance: tokens per verify step). None without a control."""
    speedups: dict[str, list[float]] = defaultdict(list)
    for group in (control or {}).get("groups") or []:
        for name, entry in ((group or {}).get("configs") or {}).items():
            for cell in ((entry or {}).get("cells") or {}).values():
                if is_number((cell or {}).get("speedup")):
                    speedups[str(name)].append(float(cell["speedup"]))
    accept = report._config_accept([{"config": c.config, "metrics": {report.TOKENS_PER_VERIFY: report.tokens_per_verify(c.values)}}
                                    for c in cells if not c.predicted and c.measurement_status != Status.INVALID])
    groups: dict[tuple[int, int, str], list[tuple[int, float, float, str]]] = defaultdict(list)
    for name, values in speedups.items():
        config = config_or_none(name)
        shape = config.tree_shape() if config is not None else None
        if shape is None or name not in accept:
            continue
        window = "" if name.count("_w") == 0 else name.rsplit("_w", 1)[1]
        groups[(shape[0], shape[2], window)].append((shape[1], sorted(values)[len(values) // 2], accept[name], name))
    if not groups:
        return None
    traces = []
    for (bs, k, w), members in sorted(groups.items()):
        members.sort()
        traces.append({"type": "scatter", "mode": "lines+markers+text", "name": f"block {bs}, topk {k}" + (f", window {w}" if w else ""),
                       "x": [m[1] for m in members], "y": [m[2] for m in members], "text": [f"b{m[0]}" for m in members],
                       "textposition": "top center", "customdata": [m[3] for m in members],
                       "hovertemplate": "%{customdata}: %{x:.2f}x the control, %{y:.2f} tokens per step<extra></extra>"})
    layout = _layout("speedup over the control (output tok/s, median over cells)", "accepted tokens per step")
    return {"data": traces, "layout": layout}


#: One colour per cell across the acceptance-by-depth panels, so a cell reads the same in each.
_CELL_COLORS = ("#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f", "#5d4037", "#9e9d24", "#ad1457", "#455a64")


def depth_panels(cells: Sequence[CellRow]) -> list[dict[str, Any]]:
    """Acceptance by depth, one small panel per config (small multiples): in each, per cell, the
    share of verifies that accepted at least d drafts, from the server's acceptance histograms.
    Where a line falls to zero is where the drafter stops being right, whatever the tree allows:
    the drafter-bound finding, drawn. One panel per config, not every config x cell on one chart:
    28 lines on one axis with a scrolling legend read as none; a cell keeps its colour in every
    panel, and every panel the same axes, so configs compare side by side."""
    by_config: dict[str, list[CellRow]] = defaultdict(list)
    for c in cells:
        if not c.predicted and c.acceptance_by_depth:
            by_config[c.config].append(c)
    if not by_config:
        return []
    cell_names = list(dict.fromkeys(c.cell for members in by_config.values() for c in members))
    deepest = max(len(c.acceptance_by_depth) for members in by_config.values() for c in members)
    panels = []
    for n, config in enumerate(sorted(by_config, key=name_sort_key)):
        traces = []
        for c in by_config[config]:
            depths = list(range(1, len(c.acceptance_by_depth) + 1))
            traces.append({"type": "scatter", "mode": "lines+markers", "name": c.cell, "legendgroup": c.cell,
                           "x": depths, "y": c.acceptance_by_depth,
                           "line": {"color": _CELL_COLORS[cell_names.index(c.cell) % len(_CELL_COLORS)]},
                           "hovertemplate": f"{config} {c.cell}<br>>= %{{x}} drafts: %{{y:.1%}}<extra></extra>"})
        layout = _layout("drafts accepted in one verify (at least)", "share of verifies")
        layout["yaxis"].update({"tickformat": ".0%", "range": [0, 1.02]})
        layout["xaxis"].update({"range": [0.5, deepest + 0.5], "tickmode": "array", "tickvals": list(range(1, deepest + 1))})
        layout.update({"height": 260, "legend": {"orientation": "h", "y": -0.3, "font": {"size": 10}}})
        panels.append({"id": f"depth-{n}", "config": config, "caption": config, "figure": {"data": traces, "layout": layout}})
    return panels


def repeats_figure(config: str, cells: Sequence[CellRow], metric: str = OUTPUT_THROUGHPUT) -> dict[str, Any] | None:
    """Each cell's repeats and its baseline's samples, relative to the baseline median, with the band.

    Relative (1.0 = the baseline median) so cells of very different speeds share one axis; the
    shaded bar is the tolerance the gate allows, so a dot outside it on the bad side is what a
    regression looks like, and a wide cloud is what a noisy cell looks like.
    """
    xs: list[str] = []
    band_base: list[float] = []
    band_height: list[float] = []
    base_x: list[str] = []
    base_y: list[float] = []
    cur: dict[str, tuple[list[str], list[float], list[str], list[str]]] = defaultdict(lambda: ([], [], [], []))
    for c in cells:
        if c.config != config or c.predicted:
            continue
        samples = c.samples.get(metric) or []
        base = c.baseline.get(metric) or {}
        ref = base.get("median")
        if not is_number(ref) or not ref:
            ref = sorted(samples)[len(samples) // 2] if samples else None
        if not ref:
            continue
        xs.append(c.cell)
        tol = float(base["tolerance"]) if is_number(base.get("tolerance")) else 0.0
        band_base.append(1.0 - tol)
        band_height.append(2 * tol)
        for s in base.get("samples") or []:
            base_x.append(c.cell)
            base_y.append(float(s) / float(ref))
        # coloured by the drawn metric's own verdict: a cell failed for its acceptance keeps tok/s dots
        # that sit in their band green, and a passing cell's dot outside its band says so when pointed at
        status = c.metric_status.get(metric) or c.status
        xs_c, ys_c, texts, symbols = cur[status]
        for s in samples:
            xs_c.append(c.cell)
            ys_c.append(float(s) / float(ref))
            outside = tol and abs(float(s) / float(ref) - 1.0) > tol
            texts.append(f"{s:.1f}" + (f", outside the band: the verdict ({status}) is on the repeats together" if outside else ""))
            symbols.append(OUTSIDE_SYMBOL if outside else "circle")  # a green outlier is marked, not read as fine
    if not xs:
        return None
    traces: list[dict[str, Any]] = [
        {"type": "bar", "name": "tolerance band", "x": xs, "y": band_height, "base": band_base,
         "marker": {"color": "rgba(46,125,50,0.15)"}, "hoverinfo": "skip", "width": 0.6},
        {"type": "scatter", "mode": "markers", "name": "baseline samples", "x": base_x, "y": base_y,
         "marker": {"color": "#9e9e9e", "size": 8, "symbol": "circle-open"}, "offsetgroup": "b",
         "hovertemplate": "baseline %{y:.3f}<extra></extra>"},
    ]
    for status, (x, y, text, symbols) in sorted(cur.items()):
        traces.append({"type": "scatter", "mode": "markers", "name": f"this session ({status})", "x": x, "y": y,
                       "text": text, "marker": {"color": _STATUS_COLOR.get(status, "#000"), "size": 9, "symbol": symbols},
                       "hovertemplate": "%{text} (%{y:.3f} of the baseline median)<extra></extra>"})
    layout = _layout("cell", "relative to the baseline median")
    layout["yaxis"].pop("rangemode")
    layout["barmode"] = "overlay"
    return {"data": traces, "layout": layout}


#: What JSON inside a <script> element must not carry raw: ``</script`` ends the element and
#: ``<!--`` puts the HTML parser in its "script data escaped" state, where a later ``<script``
#: swallows the rest of the page (a workload or version string can hold either); ``&`` and ``>``
#: for the same reasons in other contexts; U+2028/9 end a line in older JavaScript parsers.
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def figure_json(figure: Mapping[str, Any]) -> str:
    """JSON safe to put inside a <script> element: those characters only occur inside JSON
    strings, where their ``\\u`` escapes read back as the same text."""
    import json

    text = json.dumps(figure, default=str)
    for raw, escaped in _SCRIPT_ESCAPES.items():
        text = text.replace(raw, escaped)
    return text
