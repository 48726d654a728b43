"""The README's report screenshot: the campaign matrix on the reference engine, in headless Chromium.

    python benchmarks/report_screenshot.py [--results DIR] [--skip-run] [-n 2] [--out docs/report.png]

Runs ``pytest suites --ddtree-config=all`` (every suite, the campaign matrix of
suites/configs.yaml, the shipped baselines, the embedded engine) into DIR, then opens DIR's
report.html with the same browser helper as the report's tests (tests/browser_helpers.py) and
saves the top of the page as a PNG. It prints the page's figures it checked: console errors,
requests that tried to leave the file, the chart count and the page size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.browser_helpers import browser_missing_reason, open_page  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path(tempfile.gettempdir()) / "ddtree-campaign")
    parser.add_argument("--skip-run", action="store_true", help="screenshot an existing results folder")
    parser.add_argument("-n", default="2", help="xdist workers for the session (default 2)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "report.png")
    parser.add_argument("--height", type=int, default=1300, help="CSS pixels of the page's top to keep")
    parser.add_argument("--scale", type=float, default=0.7, help="device pixels per CSS pixel (smaller PNG)")
    args = parser.parse_args()
    reason = browser_missing_reason()
    if reason:
        print(f"cannot take the screenshot: {reason}", file=sys.stderr)
        return 2
    if not args.skip_run:
        begin = time.monotonic()
        cmd = [sys.executable, "-m", "pytest", str(REPO / "suites"), "--ddtree-config=all", f"--ddtree-results={args.results}",
               "-n", args.n, "-p", "no:cacheprovider", "-q"]
        code = subprocess.run(cmd, cwd=REPO).returncode
        print(f"session: exit {code} after {time.monotonic() - begin:.0f} s (results in {args.results})")
    page_path = args.results / "report.html"
    with tempfile.TemporaryDirectory() as profile, open_page(page_path, Path(profile), viewport=(1400, args.height), scale=args.scale) as opened:
        charts = opened.page.eval_on_selector_all(".js-plotly-plot", "ds => ds.length")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        opened.page.screenshot(path=str(args.out), clip={"x": 0, "y": 0, "width": 1400, "height": args.height})
        print(f"console errors: {len(opened.console_errors)} {opened.console_errors[:3]}")
        print(f"requests that tried to leave the file: {len(opened.foreign_requests)}")
        print(f"charts: {charts}; page {page_path.stat().st_size / 2**20:.1f} MiB; screenshot {args.out} "
              f"{args.out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
