"""The history screenshot of docs/history.md: the synthetic history of the history tests, in headless Chromium.

    python benchmarks/history_screenshot.py [--out docs/history.png]

Writes the synthetic history (tests/history_helpers.py: 60 sessions, 3 configs x 2 cells, 1%
noise per repeat, a 4% step at session 40 in bs8_b8_k4's c8_4k, a creep of 1% per 10 sessions in
bs8_b16_k4's c8_4k) to a SQLite file, runs ``ddtree-report --history`` on it, filters the page to
the cell c8_4k, and saves the top of the page as a PNG. It prints what it checked: console
errors, requests that tried to leave the file, the charts shown and the page size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser_helpers import browser_missing_reason, open_page  # noqa: E402
from tests.history_helpers import write_synthetic_history  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "history.png")
    parser.add_argument("--height", type=int, default=960, help="CSS pixels of the page's top to keep")
    parser.add_argument("--scale", type=float, default=0.6, help="device pixels per CSS pixel (smaller PNG)")
    args = parser.parse_args()
    reason = browser_missing_reason()
    if reason:
        print(f"cannot take the screenshot: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as profile:
        root = Path(tmp)
        write_synthetic_history(str(root / "history.db"), results_root=root / "results")
        page_path = root / "ddtree-history.html"
        subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", str(root / "history.db"),
                        "-o", str(page_path)], cwd=REPO, check=True)
        with open_page(page_path, Path(profile), viewport=(1200, args.height), scale=args.scale) as opened:
            opened.page.select_option("#filter-cell", "c8_4k")
            opened.page.wait_for_timeout(500)
            shown = opened.page.eval_on_selector_all("figure.trend", "fs => fs.filter(f => f.style.display !== 'none').length")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            opened.page.screenshot(path=str(args.out), clip={"x": 0, "y": 0, "width": 1200, "height": args.height})
            print(f"console errors: {len(opened.console_errors)} {opened.console_errors[:3]}")
            print(f"requests that tried to leave the file: {len(opened.foreign_requests)}")
            print(f"charts shown: {shown}; page {page_path.stat().st_size / 2**20:.2f} MiB; screenshot {args.out} "
                  f"{args.out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
