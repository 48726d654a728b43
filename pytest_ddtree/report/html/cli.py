"""``ddtree-report RESULTS_DIR [--against OTHER_RESULTS_DIR] [-o report.html]`` or ``ddtree-report --history URL [--history-sessions N]``.

Rebuilds the page of a results folder (after an upgrade of the report, or from a session that
was killed before it finished: the records are enough), and with ``--against`` puts another
session's figures beside each cell with the change, judged by the throughput gate itself. With
``--history`` it draws the history database's trends and change points instead, and prints the
newest change points as text for a CI log.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_ddtree.report.html import REPORT_HTML, build_html, load_payload
from pytest_ddtree.report.html.history import HISTORY_HTML
from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.report.history import DEFAULT_WINDOW

#: Exit status of a usage error (as pytest's): a folder that is not a results folder.
USAGE_ERROR = 4


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddtree-report", description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("results", type=Path, nargs="?", default=None,
                        help="a session's results folder (results.json or records-*.jsonl)")
    parser.add_argument("--history", default=None, metavar="URL",
                        help="a history database (path, sqlite:///path.db or postgresql://...): write its trend page "
                             f"(default ./{HISTORY_HTML}) and print its newest change points")
    parser.add_argument("--history-sessions", type=_sessions, default=DEFAULT_WINDOW, metavar="N",
                        help=f"with --history: the last N sessions only (default {DEFAULT_WINDOW}; 0: all of them)")
    parser.add_argument("--against", type=Path, default=None, metavar="OTHER_RESULTS_DIR",
                        help="another session's results folder: its figures and the change per config and cell")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help=f"where to write the page (default: RESULTS_DIR/{REPORT_HTML}, or "
                             f"RESULTS_DIR/report-against-<other>.html with --against)")
    args = parser.parse_args(argv)
    if (args.history is None) == (args.results is None):
        parser.print_usage(sys.stderr)
        print("ddtree-report: give either a results folder or --history URL", file=sys.stderr)
        return USAGE_ERROR
    if args.history is not None:
        return _history_page(args.history, args.output or Path(HISTORY_HTML), args.history_sessions)
    try:
        payload = load_payload(args.results)
        other = load_payload(args.against) if args.against is not None else None
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        print(f"ddtree-report: {exc}", file=sys.stderr)
        return USAGE_ERROR
    output = args.output
    if output is None:
        output = args.results / (REPORT_HTML if args.against is None else f"report-against-{args.against.resolve().name}.html")
    page = build_html(payload, other=other, other_label=str(args.against) if args.against else "", source=str(args.results))
    write_atomic(output, page)
    print(f"wrote {output}")
    return 0


def _sessions(text: str) -> int:
    """argparse type of --history-sessions: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of sessions, 0 or more (0: all), got {text!r}")
    return value


def _history_page(url: str, output: Path, last_sessions: int = DEFAULT_WINDOW) -> int:
    from pytest_ddtree.report import changepoints
    from pytest_ddtree.report.history import HistoryError, HistoryStore, redact
    from pytest_ddtree.report.html.history import build_history_html

    try:
        with HistoryStore(url, create=False) as store:
            cells = store.cells(last_sessions=last_sessions)
        analysed = changepoints.analyse(cells)
    except (HistoryError, changepoints.ChangePointsUnavailable) as exc:
        print(f"ddtree-report: {exc}", file=sys.stderr)
        return USAGE_ERROR
    summary = "\n".join(filter(None, [changepoints.summary_text(analysed), store.set_aside.note()]))
    output_dir = output.resolve().parent
    write_atomic(output, build_history_html(analysed, source=redact(url), output_dir=output_dir, summary=summary))
    print(summary)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
