#!/usr/bin/env python3
"""How often does the throughput gate cry wolf, and how often does it catch a real drop?

Why: a gate that fails most unchanged sweeps teaches people to ignore it, and one that waves a
10% slowdown through is worse. This benchmark answers both questions by simulation, through the
gate's own functions (``throughput.repeat_policy`` and ``stats.run_interleaved`` for the
repeats, ``gate.baseline_cell_entry`` for blessing, ``gate.measurement_status`` and
``gate.judge_config`` with its confirmation run for the verdicts), under a documented noise
model:

* repeat noise: each repeat of a cell is the true value times exp(N(0, s)), with s = the
  noise level for output tok/s, 2 s for TTFT p50 (a median over few requests) and s / 3 for the
  accept length (greedy decoding barely varies);
* outlier repeats: with probability ``--outlier-rate`` a repeat is ``--outlier-size`` worse
  (a GC pause, a noisy neighbour);
* day-to-day shift: every session (the K = 3 blessed ones and today's) has its own factor
  exp(N(0, d)), common to all its configs and cells (the machine is a bit faster or slower
  that day); d / 2 for the accept length. ``--launch-shift`` adds a per-config-launch factor;
* a sweep is the campaign matrix: 18 configs x 6 cells x 3 gated metrics, 3 repeats a cell
  in the first pass, flagged cells re-measured with ``throughput.CONFIRM_REPEATS`` fresh ones.

Printed per noise level: per-cell and whole-sweep false alarms of an unchanged service
(a sweep "fails" when any cell fails; inconclusive cells count separately, since they fail
under --ddtree-require-baselines), and detection of a 10% drop of one cell's output tok/s, of
the whole config, and of half its cells.

Usage: python benchmarks/bench_gate.py [--sweeps 1000] [--noise 0.01 0.03 0.05] [--day-shift 0.02] [--jobs N]

The sweeps and trials run in independent chunks of their own seeds over ``--jobs`` processes
(default: every CPU), so 1000 sweeps per noise level take minutes on a many-core machine.
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

from pytest_ddtree import gate, stats, throughput  # noqa: E402

CONFIGS = 18
CELLS = 6
WORKLOAD = {"concurrency": 8, "context_tokens": 128, "output_tokens": 64, "requests": 16}


class Model:
    """The documented noise model (see the module docstring)."""

    def __init__(self, noise: float, day_shift: float, launch_shift: float, outlier_rate: float,
                 outlier_size: float, rng: random.Random) -> None:
        self.noise, self.day, self.launch = noise, day_shift, launch_shift
        self.outlier_rate, self.outlier_size, self.rng = outlier_rate, outlier_size, rng
        # true values per (config, cell): throughput, TTFT, accept length
        self.truth = [[(rng.uniform(80, 1200), rng.uniform(4, 400), rng.uniform(3, 5.5)) for _ in range(CELLS)]
                      for _ in range(CONFIGS)]

    def session(self) -> list[float]:
        """A session's day factor per metric (throughput, TTFT, accept)."""
        z = self.rng.gauss(0, self.day)
        return [math.exp(z), math.exp(-z), math.exp(z / 2)]

    def launch_factor(self) -> float:
        return math.exp(self.rng.gauss(0, self.launch)) if self.launch else 1.0

    def repeat(self, config: int, cell: int, day: list[float], launch: float, drop: float = 1.0) -> dict[str, float]:
        tps, ttft, acc = self.truth[config][cell]
        g = self.rng.gauss
        out = 1.0 - self.outlier_size if self.rng.random() < self.outlier_rate else 1.0
        return {
            "output_throughput": tps * day[0] * launch * drop * out * math.exp(g(0, self.noise)),
            "median_ttft_ms": ttft * day[1] / launch / out * math.exp(g(0, 2 * self.noise)),
            "accept_length": acc * day[2] * math.exp(g(0, self.noise / 3)),
        }


def _samples(runs: list[dict[str, float]]) -> dict[str, list[float]]:
    return {s.key: [r[s.key] for r in runs] for s in gate.GATED_METRICS}


def _measure(model: Model, config: int, cells: list[int], day: list[float], launch: float, repeats: int,
             drops: dict[int, float]) -> dict[int, stats.CellRun[dict[str, float]]]:
    """The suite's interleaved repeats (same policy, same early stop / extra repeats)."""
    policy = throughput.repeat_policy(repeats)
    return stats.run_interleaved(
        cells, lambda c, r: model.repeat(config, c, day, launch, drops.get(c, 1.0)),
        lambda s: s["output_throughput"], policy)


def bless(model: Model, sessions: int = gate.DEFAULT_SESSIONS_KEPT) -> list[list[dict[str, Any]]]:
    """K blessed sessions through the bless flow's own function; returns entries[config][cell]."""
    entries: list[list[dict[str, Any] | None]] = [[None] * CELLS for _ in range(CONFIGS)]
    for s in range(sessions):
        day = model.session()
        for cfg in range(CONFIGS):
            launch = model.launch_factor()
            runs = _measure(model, cfg, list(range(CELLS)), day, launch, 3, {})
            for cell, run in runs.items():
                entries[cfg][cell] = gate.baseline_cell_entry(WORKLOAD, _samples(run.samples), entries[cfg][cell],
                                                              session=f"s{s}")
    return [[e for e in row if e is not None] for row in entries]


def judge(model: Model, cfg: int, entries: list[dict[str, Any]], day: list[float],
          drops: dict[int, float]) -> dict[str, gate.CellVerdict]:
    """One config of today's session: first pass, confirmation of flagged cells, final verdicts."""
    launch = model.launch_factor()
    policy = throughput.repeat_policy(3)
    runs = _measure(model, cfg, list(range(CELLS)), day, launch, 3, drops)
    inputs = {}
    for cell, run in runs.items():
        status, why = gate.measurement_status(policy, run.primary, run.invalid, [])
        inputs[f"c{cell}"] = gate.CellInput(entries[cell], _samples(run.samples), status, why, WORKLOAD)
    first = gate.judge_config(inputs)
    flagged = [int(name[1:]) for name, v in first.items() if v.flagged]
    if not flagged:
        return first
    conf_runs = _measure(model, cfg, flagged, day, launch, throughput.CONFIRM_REPEATS, drops)
    confirmations = {f"c{c}": _samples(run.samples) for c, run in conf_runs.items()}
    return gate.judge_config(inputs, confirmations)


def false_alarms(noise: float, args: argparse.Namespace, seed: int, sweeps: int) -> dict[str, Any]:
    """Unchanged sweeps: counts (summed over chunks by ``_merge``)."""
    rng = random.Random(seed)
    counts: dict[str, Any] = {"sweeps": sweeps, "failed_sweeps": 0, "inconclusive_sweeps": 0, "cells": 0,
                              "failed_cells": 0, "inconclusive_cells": 0, "flagged_cells": 0, "session_failures": 0,
                              "failing_metrics": {}}
    by_metric: dict[str, int] = counts["failing_metrics"]
    for _ in range(sweeps):
        model = Model(noise, args.day_shift, args.launch_shift, args.outlier_rate, args.outlier_size, rng)
        baseline = bless(model)
        day = model.session()
        sweep_failed = sweep_inconclusive = False
        records = []
        for cfg in range(CONFIGS):
            verdicts = judge(model, cfg, baseline[cfg], day, {})
            records.extend({"config": f"cfg{cfg}", "verdict": v.as_dict()} for v in verdicts.values())
            for v in verdicts.values():
                counts["cells"] += 1
                counts["flagged_cells"] += any(m.first_change is not None for m in v.metrics)
                if v.failed:
                    counts["failed_cells"] += 1
                    sweep_failed = True
                    for m in v.metrics:
                        if m.status in gate.FAILING:
                            by_metric[m.metric] = by_metric.get(m.metric, 0) + 1
                elif v.status == gate.INCONCLUSIVE:
                    counts["inconclusive_cells"] += 1
                    sweep_inconclusive = True
        against_session = [f for f in gate.judge_session(gate.config_moves(records)) if f.failed]
        counts["session_failures"] += len(against_session)
        for f in against_session:
            label = f"{f.metric} (config against its session)"
            by_metric[label] = by_metric.get(label, 0) + 1
        sweep_failed |= bool(against_session)
        counts["failed_sweeps"] += sweep_failed
        counts["inconclusive_sweeps"] += sweep_inconclusive and not sweep_failed
    return counts


def detection(noise: float, args: argparse.Namespace, seed: int, dropped: list[int], trials: int,
              others: int) -> dict[str, Any]:
    """Trials where every dropped cell's output tok/s is a regression, where any is, and where the
    drop is caught at all: by a cell, or by the session-end check against ``others`` unchanged
    configs measured in the same sessions (counts)."""
    rng = random.Random(seed)
    caught = caught_any = caught_at_all = 0
    configs = list(range(1 + others))
    for _ in range(trials):
        model = Model(noise, args.day_shift, args.launch_shift, args.outlier_rate, args.outlier_size, rng)
        entries: list[list[dict[str, Any] | None]] = [[None] * CELLS for _ in configs]
        for s in range(gate.DEFAULT_SESSIONS_KEPT):
            day = model.session()
            for cfg in configs:
                runs = _measure(model, cfg, list(range(CELLS)), day, model.launch_factor(), 3, {})
                for cell, run in runs.items():
                    entries[cfg][cell] = gate.baseline_cell_entry(WORKLOAD, _samples(run.samples), entries[cfg][cell],
                                                                  session=f"s{s}")
        day = model.session()
        records = []
        verdicts: dict[str, gate.CellVerdict] = {}  # of config 0, the dropped one
        for cfg in configs:
            judged = judge(model, cfg, [e for e in entries[cfg] if e is not None], day,
                           {c: 1.0 - args.drop for c in dropped} if cfg == 0 else {})
            records.extend({"config": f"cfg{cfg}", "verdict": v.as_dict()} for v in judged.values())
            if cfg == 0:
                verdicts = judged
        found = [(m := verdicts[f"c{c}"].metric("output_throughput")) is not None and m.status == gate.REGRESSION
                 for c in dropped]
        by_session = any(f.failed and f.config == "cfg0" and f.metric == "output_throughput"
                         for f in gate.judge_session(gate.config_moves(records)))
        caught += all(found)
        caught_any += any(found)
        caught_at_all += any(found) or by_session
    return {"trials": trials, "caught": caught, "caught_any": caught_any, "caught_at_all": caught_at_all}


def _task(job: tuple[str, float, argparse.Namespace, int, int, list[int]]) -> tuple[str, float, dict[str, Any]]:
    kind, noise, args, seed, n, dropped = job
    if kind == "false_alarms":
        return kind, noise, false_alarms(noise, args, seed, n)
    # a whole or half config slower is what the session-end check is for: it needs the session's
    # other configs (--session-configs in all); one cell is judged by its config alone
    others = 0 if kind == "one_cell" else max(0, min(CONFIGS, args.session_configs) - 1)
    return kind, noise, detection(noise, args, seed, dropped, n, others)


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the chunks' counts (nested dicts of counts too)."""
    total: dict[str, Any] = {}
    for part in parts:
        for k, v in part.items():
            if isinstance(v, dict):
                inner = total.setdefault(k, {})
                for kk, vv in v.items():
                    inner[kk] = inner.get(kk, 0) + vv
            else:
                total[k] = total.get(k, 0) + v
    return total


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - i) for i in range(0, total, size)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=1000, help="simulated unchanged sweeps per noise level")
    ap.add_argument("--trials", type=int, default=1000, help="simulated drops of one cell per noise level")
    ap.add_argument("--trials-config", type=int, default=300, help="simulated drops of a whole / half config")
    ap.add_argument("--session-configs", type=int, default=CONFIGS,
                    help="configs measured in the same session in the whole / half config trials (the dropped one "
                         "and unchanged others, for the session-end check; default: the campaign's 18)")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.01, 0.03, 0.05], help="repeat noise sigma(s)")
    ap.add_argument("--day-shift", type=float, default=0.02, help="day-to-day sigma, per session")
    ap.add_argument("--launch-shift", type=float, default=0.0, help="extra sigma per config launch")
    ap.add_argument("--outlier-rate", type=float, default=0.02)
    ap.add_argument("--outlier-size", type=float, default=0.15)
    ap.add_argument("--drop", type=float, default=0.10, help="the regression to catch (0.10 = 10%% slower)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: all CPUs)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    figures: dict[str, Any] = {"model": {k: v for k, v in vars(args).items() if k != "json"}}
    print(f"gate simulation: {CONFIGS} configs x {CELLS} cells x {len(gate.GATED_METRICS)} metrics, "
          f"K={gate.DEFAULT_SESSIONS_KEPT} blessed sessions, 3 repeats + {throughput.CONFIRM_REPEATS} confirmation, "
          f"day shift {args.day_shift:.0%}, launch shift {args.launch_shift:.0%}, "
          f"outliers {args.outlier_rate:.0%} x {args.outlier_size:.0%}, drop {args.drop:.0%}")
    # Independent chunks, each with its own seed (seed, kind, noise, chunk), spread over --jobs
    # processes: the figures do not depend on the number of processes.
    kinds = {"false_alarms": (args.sweeps, 10, []), "one_cell": (args.trials, 50, [0]),
             "whole_config": (args.trials_config, 50, list(range(CELLS))),
             "half_config": (args.trials_config, 50, list(range(CELLS // 2)))}
    jobs = []
    for ni, noise in enumerate(args.noise):
        for ki, (kind, (total, size, dropped)) in enumerate(kinds.items()):
            for ci, n in enumerate(_chunks(total, size)):
                seed = args.seed * 1_000_003 + ni * 10_007 + ki * 1_009 + ci
                jobs.append(("false_alarms" if kind == "false_alarms" else kind, noise, args, seed, n, dropped))
    t0 = time.monotonic()
    parts: dict[tuple[str, float], list[dict[str, Any]]] = {}
    with multiprocessing.Pool(max(1, args.jobs)) as pool:
        for kind, noise, part in pool.imap_unordered(_task, jobs):
            parts.setdefault((kind, noise), []).append(part)
    print(f"{len(jobs)} chunks on {args.jobs} processes in {time.monotonic() - t0:.0f} s")
    ok = True
    for noise in args.noise:
        c = _merge(parts[("false_alarms", noise)])
        fa = {"sweeps": c["sweeps"], "cells": c["cells"], "sweep_false_alarm": c["failed_sweeps"] / c["sweeps"],
              "sweep_inconclusive": c["inconclusive_sweeps"] / c["sweeps"],
              "cell_false_alarm": c["failed_cells"] / c["cells"],
              "cell_inconclusive": c["inconclusive_cells"] / c["cells"],
              "cell_confirmation_runs": c["flagged_cells"] / c["cells"], "failing_metrics": c["failing_metrics"],
              "config_against_session_failures": c["session_failures"]}
        rates = {}
        for kind in ("one_cell", "whole_config", "half_config"):
            d = _merge(parts[(kind, noise)])
            rates[kind] = {"trials": d["trials"], "caught": d["caught"], "rate": d["caught"] / d["trials"],
                           "rate_any_cell": d["caught_any"] / d["trials"], "rate_caught": d["caught_at_all"] / d["trials"]}
        one, whole, half = rates["one_cell"], rates["whole_config"], rates["half_config"]
        figures[f"{noise}"] = {"false_alarms": fa, **rates}
        target = abs(noise - 0.03) < 1e-9
        fa_ok, det_ok = fa["sweep_false_alarm"] + fa["sweep_inconclusive"] <= 0.02, one["rate"] >= 0.95
        if target:
            ok &= fa_ok and det_ok

        def mark(good: bool, target: bool = target) -> str:
            return ("OK" if good else "FAIL") if target else "info"
        print(f"noise {noise:.0%}:")
        print(f"  unchanged, {fa['sweeps']} sweeps: sweep fails {fa['sweep_false_alarm']:.1%}, sweep inconclusive "
              f"{fa['sweep_inconclusive']:.1%} {mark(fa_ok)} (<= 2% together); per cell {fa['cell_false_alarm']:.3%} "
              f"fail, {fa['cell_inconclusive']:.3%} inconclusive, {fa['cell_confirmation_runs']:.1%} confirmation runs; "
              f"failing metrics {fa['failing_metrics']}")
        print(f"  {args.drop:.0%} drop of one cell's output tok/s caught {one['rate']:.1%} of {one['trials']} "
              f"{mark(det_ok)} (>= 95%)")
        print(f"  {args.drop:.0%} drop of a whole config caught {whole['rate_caught']:.1%} (every cell a regression "
              f"{whole['rate']:.1%}, any {whole['rate_any_cell']:.1%}, else by the check against the session's other "
              f"{args.session_configs - 1} configs); of half its cells caught {half['rate_caught']:.1%} (every dropped "
              f"cell {half['rate']:.1%}, any {half['rate_any_cell']:.1%}) ({whole['trials']} trials each)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
