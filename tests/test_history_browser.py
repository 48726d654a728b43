"""The history page of a synthetic history (60 sessions, a 4% step, a creep), in headless Chromium.

``ddtree-report --history`` writes it; the browser checks that the change points are marked where
the detector put them, that the filters work, that a click on a point opens its session's report,
and that the page reaches for nothing outside its file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.report.html.history import build_history_html
from pytest_ddtree.report import changepoints
from pytest_ddtree.report.history import HistoryStore
from tests import history_helpers as synthetic
from tests.browser_helpers import browser_missing_reason, dialogs_of, open_page

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def history_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("history")
    db = root / "history.db"
    synthetic.write_synthetic_history(str(db), results_root=root / "results")
    out = root / "history.html"
    proc = subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", f"sqlite:///{db}", "-o", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_the_summary_for_ci_names_the_newest_change_points_with_their_builds(history_page: tuple[Path, str]) -> None:
    _, stdout = history_page
    lines = stdout.splitlines()
    assert lines[0].startswith("history: 60 sessions, 12 series") and "change points" in lines[0]
    assert lines[2].startswith("  - bs8_b8_k4 c8_4k output_throughput (refserver): regression of -")
    assert "began at session 20261001T00" in lines[2] and "(build 0.5.3 " in lines[2]
    assert lines[-1] == f"wrote {history_page[0]}"


@pytest.mark.skipif(bool(browser_missing_reason()), reason=browser_missing_reason() or "")
def test_the_page_marks_the_change_points_filters_and_links_each_point_to_its_report(history_page: tuple[Path, str], tmp_path: Path) -> None:
    page_path, _ = history_page
    assert page_path.stat().st_size < 1_500_000
    with open_page(page_path, tmp_path / "profile") as opened:
        page = opened.page
        changes = page.eval_on_selector_all("#change-table tr[data-index]", "rs => rs.map(r => [r.dataset.config, +r.dataset.index, +r.dataset.size])")
        shown = page.eval_on_selector_all("figure.trend", "fs => fs.filter(f => f.style.display !== 'none').map(f => f.dataset.config + ' ' + f.dataset.cell + ' ' + f.dataset.metric)")
        marks: dict[str, Any] = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('figure.trend')]
            .filter(f => f.style.display !== 'none')
            .map(f => [f.dataset.config + ' ' + f.dataset.cell, (f.querySelector('.js-plotly-plot').layout.shapes || []).filter(s => s.type === 'line').map(s => s.x0)]))""")
        # Filters: one config shows its two cells.
        page.select_option("#filter-config", "bs8_b8_k4")
        filtered = page.eval_on_selector_all("figure.trend", "fs => fs.filter(f => f.style.display !== 'none').length")
        # A click on the step's first regressed point opens that session's report.
        page.evaluate("() => { window.__opened = []; window.open = (u) => { window.__opened.push(u); return null; }; }")
        target = page.evaluate("""() => {
            const f = [...document.querySelectorAll('figure.trend')].find(f => f.style.display !== 'none' && f.dataset.cell === 'c8_4k');
            const div = f.querySelector('.js-plotly-plot'); const trace = div.data[0]; const i = 40;
            const xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis, box = div.querySelector('.nsewdrag').getBoundingClientRect();
            return {x: box.left + xa.l2p(trace.x[i]), y: box.top + ya.l2p(trace.y[i]), link: trace.customdata[i]};
        }""")
        page.mouse.move(target["x"], target["y"])
        page.mouse.click(target["x"], target["y"])
        page.wait_for_function("() => window.__opened.length > 0", timeout=30_000)
        opened_links = page.evaluate("() => window.__opened")
        # Captions sit above the chart, clear of Plotly's toolbar.
        overlap = page.evaluate("""() => [...document.querySelectorAll('figure.trend')].filter(f => f.style.display !== 'none').some(f => {
            const c = f.querySelector('figcaption').getBoundingClientRect(), m = f.querySelector('.modebar-container');
            if (!m) return false; const r = m.getBoundingClientRect(); return c.bottom > r.top && c.top < r.bottom; })""")
        assert opened.console_errors == [] and opened.foreign_requests == []
    assert [c[0] for c in changes] == ["bs8_b8_k4", "bs8_b16_k4", "bs8_b16_k4"]
    assert abs(changes[0][1] - synthetic.STEP_AT) <= 2 and -0.05 < changes[0][2] < -0.03
    assert len(shown) == len(synthetic.CONFIGS) * len(synthetic.CELLS) and all(s.endswith("output_throughput") for s in shown)
    # The dashed line sits between the last session before the step and the first after it (1-based ordinals).
    assert marks["bs8_b8_k4 c8_4k"] == [changes[0][1] + 0.5]
    assert len(marks["bs8_b16_k4 c8_4k"]) == 2 and marks["bs4_b8_k2 c8_4k"] == [] and marks["bs8_b8_k4 c1_short"] == []
    assert filtered == 2
    assert opened_links == [target["link"]] and target["link"].endswith("s40/report.html")
    assert (page_path.parent / target["link"]).is_file()
    assert not overlap


def test_a_series_of_one_session_is_shown_as_one_point(tmp_path: Path) -> None:
    with HistoryStore(str(tmp_path / "h.db")) as store:
        store.append(*synthetic.synthetic_session(0))
        cells = store.cells()
    analysed = changepoints.analyse(cells)
    page = build_history_html(analysed, source="h.db", output_dir=tmp_path, summary=changepoints.summary_text(analysed))
    assert "bs8_b8_k4 c8_4k: output_throughput (refserver): one session so far" in page
    assert '"xaxis": {"title": {"text": "session (oldest first)"}, "type": "category", "tickvals": [1]' in page
    assert "Too few sessions to tell: " in page and "No change point" not in page


def test_the_history_ticks_whole_sessions_and_draws_the_noise_band(tmp_path: Path) -> None:
    """Session 1, 2, 3 (not 1.5), and the band the level's sessions and repeats spread over, so a
    1% wobble on an autoscaled axis does not look like a cliff."""
    import json
    import re

    with HistoryStore(str(tmp_path / "h.db")) as store:
        for n in range(5):
            store.append(*synthetic.synthetic_session(n))
        cells = store.cells()
    analysed = changepoints.analyse(cells)
    page = build_history_html(analysed, source="h.db", output_dir=tmp_path, summary=changepoints.summary_text(analysed))
    found = re.search(r'<script type="application/json" id="ddtree-figures">(.*?)</script>', page, re.S)
    assert found is not None
    figures = json.loads(found.group(1).replace("<\\/", "</"))
    layout = next(iter(figures.values()))["layout"]
    assert layout["xaxis"]["tickvals"] == [1, 2, 3, 4, 5] and layout["xaxis"]["ticktext"] == ["1", "2", "3", "4", "5"]
    band = [shape for shape in layout["shapes"] if shape.get("name") == "noise band"]
    assert band and band[0]["layer"] == "below" and band[0]["y0"] < band[0]["y1"]
    low, high = layout["yaxis"]["range"]
    level = [t for t in next(iter(figures.values()))["data"] if t["name"] == "level between change points"][0]["y"][0]
    assert low <= level * 0.95 and high >= level * 1.05


@pytest.mark.skipif(bool(browser_missing_reason()), reason=browser_missing_reason() or "")
def test_hostile_folder_and_build_names_give_safe_links_and_every_chart_draws(tmp_path: Path) -> None:
    """A results folder named ``javascript:alert(1)`` beside the page (a relative link would have
    read as that scheme) and an engine version holding ``<!--<script>`` (raw in the charts' JSON
    it swallowed the page): every link is relative from ``./``, a click opens the report itself,
    every chart draws, no injected script runs."""
    import dataclasses

    hostile = "0.5.3<!--<script>alert(1)</script>"
    db = tmp_path / "h.db"
    with HistoryStore(str(db)) as store:
        for index in range(3):
            session, cells = synthetic.synthetic_session(index, results_root=tmp_path / "javascript:alert(1)")
            session = dataclasses.replace(session, build=dataclasses.replace(session.build, engine_version=hostile))
            store.append(session, cells)
        analysed = changepoints.analyse(store.cells())
    out = tmp_path / "history.html"
    out.write_text(build_history_html(analysed, source=str(db), output_dir=tmp_path, summary=changepoints.summary_text(analysed)))
    with open_page(out, tmp_path / "profile") as opened:
        page = opened.page
        dialogs = dialogs_of(page)
        page.reload(wait_until="load")
        hrefs = page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))")
        drawn = page.evaluate("""() => [...document.querySelectorAll('figure.trend')].filter(f => f.style.display !== 'none')
            .map(f => !!f.querySelector('.js-plotly-plot'))""")
        page.evaluate("() => { window.__opened = []; window.open = (u) => { window.__opened.push(u); return null; }; }")
        target = page.evaluate("""() => {
            const f = [...document.querySelectorAll('figure.trend')].find(f => f.style.display !== 'none');
            const div = f.querySelector('.js-plotly-plot'); const trace = div.data[0]; const i = 1;
            const xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis, box = div.querySelector('.nsewdrag').getBoundingClientRect();
            return {x: box.left + xa.l2p(trace.x[i]), y: box.top + ya.l2p(trace.y[i])};
        }""")
        page.mouse.move(target["x"], target["y"])
        page.mouse.click(target["x"], target["y"])
        page.wait_for_function("() => window.__opened.length > 0", timeout=30_000)
        opened_links = page.evaluate("() => window.__opened")
        assert opened.console_errors == [] and opened.foreign_requests == []
    assert dialogs == []
    assert drawn and all(drawn)
    assert hrefs and all(h.startswith("./javascript%3Aalert%281%29/") for h in hrefs), hrefs
    assert len(opened_links) == 1 and opened_links[0].startswith("./javascript%3Aalert%281%29/")
    from urllib.parse import unquote
    assert (tmp_path / unquote(opened_links[0])).is_file()
