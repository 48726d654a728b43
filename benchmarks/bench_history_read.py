#!/usr/bin/env python3
"""How long does the history reader take, and how much memory, for 1k / 100k / 3M sample rows?

Why: the reader (``HistoryStore.cells``) runs at the end of every ``--ddtree-history-check``
session and in ``ddtree-report --history``, on a database every team writes. Its window bounds the
sessions it reads, and its own bounds (``history_guard.MAX_REPEATS`` a series per session,
``MAX_SAMPLE_ROWS`` in all) bound the rows however the rows are spread; this prints what that costs.

Each size is written to a fresh SQLite file in two layouts: ``nightly`` (sessions of 1,000 sample
rows: 5 configs x 10 cells x 4 metrics x 5 repeats, one a day) and ``one session`` (every row in one
session: 50 series of N / 50 repeats each, the shape of the 3M-row session that cost 1.3 GB). Each
is read in a fresh process (so its peak RSS is the read's own) with the default window (365
sessions) and with every session (``last_sessions=0``). Printed: rows in the file, seconds of the
read, the reader process's peak RSS and its growth over the process before the read, cells and
samples kept, and what was set aside.

Usage: python benchmarks/bench_history_read.py [--sizes 1000 100000 3000000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_ddtree.report.history import HistoryStore  # noqa: E402

CONFIGS, CELLS, METRICS, REPEATS = 5, 10, 4, 5
PER_SESSION = CONFIGS * CELLS * METRICS * REPEATS
DAY = 86_400.0

_READER = """
import json, resource, sys, time
from pytest_ddtree.report.history import HistoryStore
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
begin = time.perf_counter()
with HistoryStore(sys.argv[1], create=False) as store:
    cells = store.cells(last_sessions=int(sys.argv[2]))
    aside = getattr(store, "set_aside", None)  # None: a reader older than the row checks (for comparison)
    note = aside.note() if aside is not None else None
seconds = time.perf_counter() - begin
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "growth_mb": (peak - before) / 1024, "cells": len(cells),
                  "samples": sum(len(v) for c in cells for v in c.samples.values()), "set_aside": note}))
"""


def write(path: Path, rows: int, layout: str) -> None:
    """A history of ``rows`` sample rows (its schema made by the store itself, then filled in bulk)."""
    with HistoryStore(str(path)):
        pass
    db = sqlite3.connect(path)
    start = time.time() - DAY * (rows // PER_SESSION + 2)
    sessions = max(1, rows // PER_SESSION) if layout == "nightly" else 1
    per_series = max(1, rows // (sessions * CONFIGS * CELLS * METRICS)) if layout == "nightly" else None
    series = [(f"bs8_b{c}_k4", f"cell{k}", f"metric{m}") for c in range(CONFIGS) for k in range(CELLS) for m in range(METRICS)]
    if per_series is None:
        series = series[:50]
        per_series = max(1, rows // len(series))
    with db:
        for s in range(sessions):
            sid = f"s{s:06d}"
            db.execute("INSERT INTO ddtree_sessions (session_id, started_at, host) VALUES (?, ?, 'bench')", (sid, start + s * DAY))
            db.executemany("INSERT OR IGNORE INTO ddtree_cells (session_id, config, cell, hardware_profile, status)"
                           " VALUES (?, ?, ?, 'bench', 'pass')", [(sid, c, k) for c, k, _ in series])
            db.executemany("INSERT INTO ddtree_samples VALUES (?, ?, ?, ?, ?, ?)",
                           ((sid, c, k, m, r, 1000.0 + (r % 7)) for c, k, m in series for r in range(per_series)))
    db.close()


def read(path: Path, last_sessions: int) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _READER, str(path), str(last_sessions)], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, object] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 3_000_000])
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}, "
              f"{os.cpu_count()} CPUs")
        print("| rows | layout | window | read s | peak RSS MB | growth MB | cells | samples kept | set aside |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for rows in args.sizes:
            for layout in ("nightly", "one session"):
                path = folder / f"history-{rows}-{layout.replace(' ', '-')}.db"
                path.unlink(missing_ok=True)
                write(path, rows, layout)
                stored = sqlite3.connect(path).execute("SELECT COUNT(*) FROM ddtree_samples").fetchone()[0]
                for window in (365, 0):
                    r = read(path, window)
                    if "error" in r:
                        print(f"| {stored:,} | {layout} | {window or 'all'} | failed: {r['error']} |", flush=True)
                        continue
                    print(f"| {stored:,} | {layout} | {window or 'all'} | {r['seconds']:.2f} | {r['peak_mb']:.0f} | "
                          f"{r['growth_mb']:.0f} | {r['cells']:,} | {r['samples']:,} | {r['set_aside'] or '-'} |", flush=True)
                path.unlink()
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
