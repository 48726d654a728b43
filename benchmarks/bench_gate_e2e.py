#!/usr/bin/env python3
"""The throughput gate end to end: independent sessions of real reference engines.

Why: the simulation (``bench_gate.py``) checks the rule under a model of the noise; this checks
it against the noise a real engine and this machine produce. Every session launches fresh
engines (one per config, a new ``--seed`` each, ``--fault clock-jitter``) and draws a day-to-day
shift shared by all its configs (``--fault slowdown=exp(N(0, d))``). Three blessed sessions make
the baseline through the bless flow's function (``gate.baseline_cell_entry``); then
``--unchanged`` sessions are judged by the suite's own ``throughput.measure_config`` (first pass,
confirmation of flagged cells, verdicts) and count as failed when any cell fails or stays
inconclusive (both fail CI), and ``--slowed`` sessions run the first config 10% slower
(``slowdown`` x 1.1) and count as caught when one of its cells is a regression.

Expensive on a shared 2-core box: keep it small and run it once, in the background.

Usage: python benchmarks/bench_gate_e2e.py [--unchanged 20] [--slowed 20] [--day-shift 0.02] [--jitter 0.2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_harness import refserver  # noqa: E402
from pytest_ddtree import gate, load, throughput  # noqa: E402

CONFIGS = {"bs8_b4_k4": (8, 4, 4), "bs8_b8_k4": (8, 8, 4)}
CELLS = [load.Cell("c1_tiny", 1, 48, 32, 2, 1), load.Cell("c4_tiny", 4, 48, 32, 8, 4),
         load.Cell("c8_small", 8, 128, 32, 16, 8)]


def session(args: argparse.Namespace, rng: random.Random, slow_first: bool,
            baselines: dict[str, dict[str, Any]] | None) -> dict[str, throughput.Campaign]:
    """One independent session: fresh engines for every config, one day shift for all of them."""
    day = math.exp(rng.gauss(0.0, args.day_shift))
    out = {}
    for i, (name, (bs, budget, topk)) in enumerate(CONFIGS.items()):
        factor = day * (1.1 if slow_first and i == 0 else 1.0)
        engine = ["--clock-scale", str(args.clock_scale), "--seed", str(rng.randrange(1 << 30)),
                  "--fault", f"clock-jitter={args.jitter}", "--fault", f"slowdown={factor:.6f}",
                  "--speculative-dflash-block-size", str(bs), "--speculative-num-draft-tokens", str(budget),
                  "--speculative-eagle-topk", str(topk)]
        with refserver(*engine) as url:
            out[name] = throughput.measure_config(url, CELLS, 3, baseline=None if baselines is None else baselines[name])
    return out


def bless(args: argparse.Namespace, rng: random.Random) -> dict[str, dict[str, Any]]:
    section: dict[str, dict[str, Any]] = {name: {} for name in CONFIGS}
    for s in range(gate.DEFAULT_SESSIONS_KEPT):
        for name, campaign in session(args, rng, False, None).items():
            for cell in CELLS:
                inp = throughput.cell_input(campaign, cell, None)
                if inp.status != "valid":
                    raise SystemExit(f"bless session {s}: {name} {cell.name} is {inp.status}: {inp.problems}")
                section[name][cell.name] = gate.baseline_cell_entry(
                    load.workload_dict(cell), inp.current, section[name].get(cell.name), session=f"bless{s}")
    return section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unchanged", type=int, default=20)
    ap.add_argument("--slowed", type=int, default=20)
    ap.add_argument("--day-shift", type=float, default=0.02)
    ap.add_argument("--jitter", type=float, default=0.2)
    ap.add_argument("--clock-scale", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    baselines = bless(args, rng)
    print(f"e2e gate: {len(CONFIGS)} configs x {len(CELLS)} cells, 3 blessed sessions, clock-jitter {args.jitter}, "
          f"day shift {args.day_shift:.0%} ({time.monotonic() - t0:.0f} s to bless)", flush=True)
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "unchanged": [], "slowed": []}
    for kind, n, slow in (("unchanged", args.unchanged, False), ("slowed", args.slowed, True)):
        for i in range(n):
            verdicts = {name: c.verdicts for name, c in session(args, rng, slow, baselines).items()}
            bad = sorted(f"{name} {cell}: {v.status}" for name, vs in verdicts.items() for cell, v in vs.items()
                         if v.failed or v.status == gate.INCONCLUSIVE)
            caught = any(v.status == gate.REGRESSION for v in verdicts[next(iter(CONFIGS))].values())
            figures[kind].append({"bad": bad, "caught": caught})
            print(f"  {kind} session {i + 1}/{n}: {'caught' if caught else 'not caught' if slow else 'ok'}"
                  f"{'; ' + ', '.join(bad) if bad else ''}", flush=True)
    failed = sum(1 for s in figures["unchanged"] if s["bad"])
    caught = sum(1 for s in figures["slowed"] if s["caught"])
    print(f"unchanged sessions failing: {failed} of {args.unchanged} (target 0); "
          f"10% slowdown of one config caught: {caught} of {args.slowed} (target >= 95%); "
          f"{time.monotonic() - t0:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if failed == 0 and caught >= math.ceil(0.95 * args.slowed) else 1


if __name__ == "__main__":
    sys.exit(main())
