#!/usr/bin/env python3
"""How soon does the history see a whole build slower, the control included, and how often does
it cry wolf?

Why: within one session a build that slows every launch by 5%, the non-speculative control too,
cannot be told from a slower day (the gate's control moves with the configs, and the uniform
shift over the control is zero); across sessions it can, as a step common to every series
(``changepoints.build_changes``). This benchmark measures that detector on synthetic histories
through the history's own reader functions (``changepoints.build_series`` on ``history.StoredCell``
rows as ``HistoryStore.cells`` returns them, then ``analyse_builds`` and ``check_build`` exactly as
``--ddtree-history-check`` runs them at the end of each session, on the history up to that session).

A history: ``--sessions`` sessions (60) of the campaign, ``--configs`` configs (18) x ``--cells``
cells (6) of output tok/s plus the control's cells (the same cells, its launches pooled), each cell
``--repeats`` repeats (3) with lognormal noise ``--noise`` (3%), each session a day shift
exp(N(0, ``--day``)) (2%) common to all its launches, each launch (every config's and each of the
control's ``--control-launches``) exp(N(0, ``--launch``)) (2%) of its own. Scenarios:

* ``unchanged``: no change; every session checked; the figure is the share of sessions the check
  fails (false alarms per session) and of histories with any false change;
* ``step3`` / ``step5``: from session ``--step-at`` (40) on, every series 3% / 5% slower, the
  control included; found within k sessions when the check of the k-th session of the new level
  (or an earlier one) fails naming a build-level regression that begins within
  ``--tolerance`` (2) sessions of the step. Sessions checked before the step count as false alarms.

With ``--calibration`` every session also carries its calibration probe (``service/calibration.py``):
``--calibration-runs`` (2: before the first launch, after the last stop) runs, each exp(N(0,
``--calibration-noise``)) (0.5%) of its own times exp(``--calibration-tracks`` x the day's shift)
(1.0: the probe sees the whole day; 0.5: half of it, the rest is the server's own). The probe sees
neither the launches' shifts nor the build's step: it does not depend on the build. Its draws come
from a generator of their own, so the same seed gives the same history with and without it.

Usage: python benchmarks/bench_build_changes.py [--histories 1000] [--trials 400] [--jobs N] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT  # noqa: E402
from pytest_ddtree.report import changepoints  # noqa: E402
from pytest_ddtree.gates.throughput.baseline import CONTROL  # noqa: E402
from pytest_ddtree.report.history import ROLE_CONTROL, Build, SessionEntry, StoredCell  # noqa: E402
from bench_gate import wilson  # noqa: E402  (the gate benchmark's interval, one definition)

SCENARIOS = {"unchanged": 0.0, "step3": 0.03, "step5": 0.05}


def probe(probe_rng: random.Random, args: argparse.Namespace, day: float) -> dict[str, tuple[float, ...]]:
    """The session's calibration probe (``--calibration``): each run sees ``--calibration-tracks`` of
    the day's shift, none of the launches' or the build's, with noise of its own."""
    if not args.calibration:
        return {}
    return {"cpu_ops_per_s": tuple(1.0e7 * math.exp(args.calibration_tracks * day + probe_rng.gauss(0.0, args.calibration_noise))
                                   for _ in range(args.calibration_runs))}


def history(rng: random.Random, args: argparse.Namespace, step: float,
            probe_rng: random.Random | None = None) -> list[StoredCell]:
    """One synthetic history's stored cells (what ``HistoryStore.cells`` returns). The probe draws
    from ``probe_rng``, so a history with and without it is the same history."""
    probe_rng = probe_rng or random.Random(0)
    truth = {(c, k): rng.uniform(80.0, 1200.0) for c in range(args.configs) for k in range(args.cells)}
    control_truth = [rng.uniform(40.0, 600.0) for _ in range(args.cells)]
    out: list[StoredCell] = []
    for s in range(args.sessions):
        build = Build(engine_version="0.5.23", engine_build=f"commit {s:08x}", project_commit=f"{s:040x}")
        day = rng.gauss(0.0, args.day)
        session = SessionEntry(f"s{s:03d}", 1.79e9 + s * 86400.0, host="gpu-1", build=build,
                               calibration=probe(probe_rng, args, day), calibration_command="probe")
        slower = math.log1p(-step) if s >= args.step_at else 0.0
        for c in range(args.configs):
            launch = rng.gauss(0.0, args.launch)
            for k in range(args.cells):
                values = [truth[(c, k)] * math.exp(day + launch + slower + rng.gauss(0.0, args.noise))
                          for _ in range(args.repeats)]
                out.append(StoredCell(session, f"cfg{c}", f"c{k}", "gpu", "pass", {OUTPUT_THROUGHPUT: values}))
        launches = [rng.gauss(0.0, args.launch) for _ in range(args.control_launches)]
        for k in range(args.cells):
            values = [control_truth[k] * math.exp(day + shift + slower + rng.gauss(0.0, args.noise))
                      for shift in launches for _ in range(args.repeats)]
            out.append(StoredCell(session, CONTROL, f"c{k}", "gpu", "pass", {OUTPUT_THROUGHPUT: values},
                                  role=ROLE_CONTROL, launches=args.control_launches))
    return out


def check_each_session(cells: list[StoredCell]) -> list[list[changepoints.BuildChange]]:
    """What ``--ddtree-history-check`` says at the end of each session: the history up to it."""
    full = changepoints.build_series(cells, metrics=(changepoints.BUILD_METRIC,))
    sessions = sorted({c.session.session_id for c in cells})
    verdicts = []
    for n, sid in enumerate(sessions):
        prefix = [changepoints.Series(s.key, [p for p in s.points if p.session_id <= sid]) for s in full]
        verdicts.append(changepoints.check_build(changepoints.analyse_builds(prefix), sid) if n else [])
    return verdicts


def _task(job: tuple[str, int, int, dict[str, Any]]) -> dict[str, Any]:
    scenario, seed, n, raw = job
    args = argparse.Namespace(**raw)
    rng = random.Random(seed)
    probe_rng = random.Random(seed * 7 + 1)
    out: dict[str, Any] = {"histories": 0, "sessions_checked": 0, "false_alarms": 0, "histories_with_false": 0,
                           "found_within": [0] * (args.sessions - args.step_at + 1), "sizes": [], "misplaced": 0}
    for _ in range(n):
        step = SCENARIOS[scenario]
        verdicts = check_each_session(history(rng, args, step, probe_rng))
        out["histories"] += 1
        last = args.sessions if not step else args.step_at
        false = sum(1 for v in verdicts[:last] if v)
        out["sessions_checked"] += last
        out["false_alarms"] += false
        out["histories_with_false"] += bool(false)
        if step:
            for k, v in enumerate(verdicts[args.step_at:], start=1):
                hit = [c for c in v if abs(c.index - args.step_at) <= args.tolerance]
                if hit:
                    out["found_within"][k] += 1
                    out["sizes"].append(hit[0].size)
                    break
                if v:
                    out["misplaced"] += 1
    return {"scenario": scenario, **out}


def fig(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k / max(1, n):.2%} of {n} [{lo:.2%}, {hi:.2%}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--histories", type=int, default=1000, help="unchanged histories")
    ap.add_argument("--trials", type=int, default=400, help="histories per step scenario")
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--sessions", type=int, default=60)
    ap.add_argument("--step-at", type=int, default=40)
    ap.add_argument("--tolerance", type=int, default=2, help="sessions a found change may be off the true step")
    ap.add_argument("--configs", type=int, default=18)
    ap.add_argument("--cells", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--control-launches", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.03, help="repeat noise (log sd)")
    ap.add_argument("--day", type=float, default=0.02, help="day-to-day shift per session (log sd)")
    ap.add_argument("--launch", type=float, default=0.02, help="per-launch shift (log sd)")
    ap.add_argument("--calibration", action="store_true", help="every session runs the calibration probe")
    ap.add_argument("--calibration-noise", type=float, default=0.005, help="the probe's own noise per run (log sd)")
    ap.add_argument("--calibration-tracks", type=float, default=1.0,
                    help="how much of the day's shift the probe sees (1.0: all of it)")
    ap.add_argument("--calibration-runs", type=int, default=2, help="probe runs a session (start and end)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    raw = {k: v for k, v in vars(args).items() if k != "json"}
    jobs = []
    for ki, scenario in enumerate(args.scenarios):
        total = args.histories if scenario == "unchanged" else args.trials
        for ci in range(0, total, 10):
            jobs.append((scenario, args.seed * 1_000_003 + ki * 10_007 + ci, min(10, total - ci), raw))
    print(f"build-level change points: {args.sessions}-session histories, {args.configs} configs x {args.cells} cells "
          f"+ the control ({args.control_launches} launches), {args.repeats} repeats at {args.noise:.0%}, day shift "
          f"{args.day:.0%}, per-launch {args.launch:.0%}; "
          + (f"calibration probe: {args.calibration_runs} runs a session at {args.calibration_noise:.1%}, seeing "
             f"{args.calibration_tracks:.0%} of the day; " if args.calibration else "no calibration probe; ")
          + f"looks {changepoints.BUILD_LOOKS}, alpha "
          f"{changepoints.BUILD_ALPHA:g} a session, window {changepoints.BUILD_WINDOW}", flush=True)
    t0 = time.monotonic()
    totals: dict[str, dict[str, Any]] = {}
    with multiprocessing.Pool(max(1, args.jobs)) as pool:
        for part in pool.imap_unordered(_task, jobs):
            t = totals.setdefault(part["scenario"], {})
            for k, v in part.items():
                if k == "scenario":
                    continue
                if isinstance(v, list) and k == "found_within":
                    t[k] = [a + b for a, b in zip(t.get(k, [0] * len(v)), v)]
                elif isinstance(v, list):
                    t.setdefault(k, []).extend(v)
                else:
                    t[k] = t.get(k, 0) + v
    print(f"{len(jobs)} chunks on {args.jobs} processes in {time.monotonic() - t0:.0f} s")
    ok = True
    for scenario in args.scenarios:
        t = totals[scenario]
        n = t["histories"]
        print(f"{scenario}: {n} histories; sessions the check failed before any change: "
              f"{fig(t['false_alarms'], t['sessions_checked'])} (target <= 1%); histories with any: "
              f"{fig(t['histories_with_false'], n)}")
        ok &= t["false_alarms"] <= 0.01 * t["sessions_checked"]
        if SCENARIOS[scenario]:
            cumulative = 0
            parts = []
            for after, count in enumerate(t["found_within"]):
                cumulative += count
                if after in (1, 2, 3, 5, 10, args.sessions - args.step_at):
                    parts.append(f"{after}: {fig(cumulative, n)}")
            within3 = sum(t["found_within"][:4])
            sizes = sorted(t["sizes"])
            print("  found within k sessions of the new level: " + "; ".join(parts))
            print(f"  within 3 sessions: {within3 / n:.1%} (target >= 95%); median size reported "
                  f"{sizes[len(sizes) // 2]:+.1%}" if sizes else "  never found")
            ok &= within3 >= 0.95 * n
    if args.json:
        args.json.write_text(json.dumps({"args": raw, "totals": totals}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
