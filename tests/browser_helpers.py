"""Open a report in a real headless Chromium (Debian's package, driven by Playwright).

One place knows how the browser is started, so the report tests and the README screenshot
(``benchmarks/report_screenshot.py``) look at the page the same way. Every request the page
makes is recorded and aborted unless it is the page's own file: a report that reaches for the
network fails the test instead of quietly loading something.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def browser_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None (they can)."""
    if not CHROMIUM.exists() and not shutil.which("chromium"):
        return ("Debian's chromium is not installed (/usr/bin/chromium): .ci/run installs it with "
                "apt-get install -y chromium; on your machine run that as root")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[test]' (it ships its driver; no browser download)"
    return None


@dataclass
class OpenedPage:
    page: Any
    console_errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)


def dialogs_of(page: Any) -> list[str]:
    """The messages of every dialog the page opens from now on (an ``alert()`` of injected
    script), each dismissed: a hostile-input test asserts the list stays empty."""
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    return dialogs


@contextmanager
def open_page(path: Path, profile_dir: Path, viewport: tuple[int, int] = (1400, 1000), scale: float = 1.0) -> Iterator[OpenedPage]:
    """``path`` loaded from disk in a fresh profile; console errors and foreign requests collected."""
    from playwright.sync_api import sync_playwright

    own = path.resolve().as_uri()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile_dir), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": viewport[0], "height": viewport[1]}, device_scale_factor=scale,
        )
        try:
            opened = OpenedPage(context.new_page())

            def route(r: Any) -> None:
                url = r.request.url
                if url == own or url.startswith(("data:", "about:", "blob:")):
                    r.continue_()
                else:
                    opened.foreign_requests.append(url)
                    r.abort()

            context.route("**/*", route)
            opened.page.on("console", lambda m: opened.console_errors.append(m.text) if m.type == "error" else None)
            opened.page.on("pageerror", lambda e: opened.console_errors.append(f"page error: {e}"))
            # Generous: on a loaded 2-core CI box parsing 1.2 MB of plotly.js can take many seconds.
            opened.page.set_default_timeout(180_000)
            opened.page.goto(own, wait_until="load")
            yield opened
        finally:
            context.close()


def cell_figures(page: Any) -> dict[tuple[str, str], dict[str, str]]:
    """The sweep table as the browser shows it: (config, cell) -> {key: data-value}."""
    rows: list[dict[str, Any]] = page.eval_on_selector_all(
        "#cells tr[data-cell]",
        """rows => rows.map(r => ({config: r.dataset.config, cell: r.dataset.cell,
              values: Object.fromEntries([...r.querySelectorAll('td[data-key]')].map(td => [td.dataset.key, td.dataset.value ?? td.textContent.trim()])),
              texts: Object.fromEntries([...r.querySelectorAll('td[data-key]')].map(td => [td.dataset.key, td.textContent.trim()]))}))""",
    )
    return {(r["config"], r["cell"]): {**{f"text:{k}": v for k, v in r["texts"].items()}, **r["values"]} for r in rows}
