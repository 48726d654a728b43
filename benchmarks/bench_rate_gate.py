#!/usr/bin/env python3
"""How often does the sustainable-rate gate (and an open-loop cell's goodput) cry wolf, and how
often does it catch a slower config?

Why: the rate gate judges a blessed rate's goodput "with the false-alarm budget of output tok/s"
(``pytest_ddtree/gates/throughput/rate_gate.py``); this measures whether it has it. Goodput at a
fixed rate is not tok/s: below capacity it is the offered rate whatever the speed, and it falls as
requests start missing the SLO, so its noise is how many requests cross the SLO's line on a slower
day. The simulation is ``bench_gate.py``'s, through the plugin's own path (``gate_sim.py``), with
``rate_sim.py`` added: each session also runs the suite's ``test_sustainable_rate`` per config
(a bless searches the rate and the bless flow writes it; a judged session re-probes it), and the
campaign's cells gain open-loop cells (``--open-rates``) whose goodput is gated under the
session's SLO. An open-loop repeat is served by a queueing model (Poisson arrivals, SGLang's
prefill-first continuous batching on the reference engine's ClockModel, every pass scaled by the
launch's speed, the repeat's noise and the scenario's drop) and measured by the product's own code.

Each world blesses K = 3 sessions, then judges an unchanged session and, in its first ``--trials``
worlds, one session of each drop scenario:

* ``unchanged``: the rate gate fails when any config's rate test fails, and is inconclusive when
  one is skipped (the whole sweep's budget: <= 2% together); the same for the open-loop cells'
  goodput (a cell whose goodput is a regression, or the cell inconclusive), and for the session
  as a whole (any test, the session end);
* ``rate_10`` / ``rate_5``: one config 10% / 5% slower on everything (its cells and its rate
  probes): caught when that config's rate test fails (>= 95% for 10%); ``rate_15`` / ``rate_25``
  (asked for by ``--scenarios``): 15% / 25% slower, the size of drop the rate test does catch.

Usage: python benchmarks/bench_rate_gate.py [--worlds 100] [--trials 100] [--shapes restart1 restart3 repeat3]
       [--scenarios ...] [--configs 18] [--open-rates 2 4] [--jobs N] [--json F]
Figures carry their trial counts and 95% Wilson intervals; per-config figures count every
config's rate test (18 a sweep; not independent within a world).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gate_sim  # noqa: E402
import rate_sim  # noqa: E402
from bench_gate import CELLS, CONFIGS, K_BLESSED, SHAPES, _fig, _merge, target_mark  # noqa: E402
from pytest_ddtree.gates.throughput.baseline import RATE_SECTION  # noqa: E402
from pytest_ddtree.metrics import REQUEST_GOODPUT  # noqa: E402
from pytest_ddtree.records.words import RecordKind, Status  # noqa: E402

#: scenario -> the drop of config 0 (every cell and its rate probes)
SCENARIOS = {"unchanged": 0.0, "rate_10": 0.10, "rate_5": 0.05, "rate_15": 0.15, "rate_25": 0.25}
#: the scenarios a run measures unless ``--scenarios`` says otherwise (rate_15 / rate_25: what size of
#: capacity drop the rate test catches)
DEFAULT_SCENARIOS = ["unchanged", "rate_10", "rate_5"]
TARGETS = {"unchanged": 0.02, "rate_10": 0.95}


def _judged(world: rate_sim.RateWorld, scenario: str, index: int, blessed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Today's session under ``scenario``: the rate tests', the goodput cells' and the session's outcome,
    and each config's changes at its blessed rate (``blessed``: the last bless's probe figures there)."""
    drop = SCENARIOS[scenario]
    assert world.queue is not None
    victim = random.Random(f"{world.queue.seed}/{scenario}").randrange(len(world.configs))  # any config, not the cheapest
    world.drops = {(victim, cell): drop for cell in [*range(len(world.cells)), rate_sim.RATE_CELL]} if drop else {}
    got = rate_sim.run_session(world, index, bless=False)
    rate_failed = [t for t in got.failed_tests if t.endswith(f"[{rate_sim.RATE_TEST}]")]
    rate_skipped = [t for t in got.skipped_tests if t.endswith(f"[{rate_sim.RATE_TEST}]")]
    goodput = rate_sim.goodput_status(got)
    bad_goodput = [k for k, v in goodput.items() if v in (Status.REGRESSION, Status.INCONCLUSIVE)]
    unjudged = rate_sim.goodput_unjudged(got)
    first = f"{world.configs[victim].name}[{rate_sim.RATE_TEST}]"
    out: dict[str, Any] = {
        "trials": 1, "rate_tests": len(world.configs), "goodput_cells": len(goodput),
        "rate_failed": int(bool(rate_failed)), "rate_inconclusive": int(bool(rate_skipped) and not rate_failed),
        "rate_failed_configs": len(rate_failed), "rate_skipped_configs": len(rate_skipped),
        "goodput_failed": int(bool(bad_goodput)), "goodput_failed_cells": len(bad_goodput),
        "goodput_unjudged_cells": len(unjudged),
        "unjudged": {f"goodput of {cell} not judged": sum(1 for t in unjudged if t.endswith(f"[{cell}]"))
                     for cell in sorted({t.partition("[")[2].rstrip("]") for t in unjudged})},
        "rate_or_goodput_failed": int(bool(rate_failed or rate_skipped or bad_goodput)),
        "session_failed": int(bool(got.failed_tests or got.skipped_tests or got.outcome.failures)),
        "caught": int(first in rate_failed), "caught_any": int(any(t.startswith(world.configs[victim].name + "[")
                                                                  for t in got.failed_tests)),
        "rate_repeats": got.counts.get("rate repeats", 0), "examples": {}, "failing": _failing(world, got),
        "rate_relaunches": sum(1 for c in world.configs for rec in rate_sim.rate_records(got, c.name)
                               if "first_launch" in (rec.get("gate") or {})),
    }
    if scenario != "unchanged" and first not in rate_failed:
        out["examples"][_why(got, first)] = 1
    for i, config in enumerate(world.configs):
        _add_changes(out, "victim" if drop and i == victim else "unchanged", got, config.name, blessed.get(config.name))
    if scenario == "unchanged":
        for test in rate_failed[:1] + bad_goodput[:1]:
            out["examples"][test + ": " + _why(got, test)] = 1
    return out


def _failing(world: rate_sim.RateWorld, got: gate_sim.SessionResult) -> dict[str, int]:
    """What failed or was inconclusive: the rate tests, each kind of cell by its failing metrics, the session end."""
    open_cells = {w.name for w in world.cells if w.open_loop is not None}
    metrics: dict[str, list[str]] = {}
    for rec in got.records:
        if "verdict" in rec and "cell" in rec and rec.get("kind") == RecordKind.THROUGHPUT:
            verdict: Any = rec["verdict"]
            metrics[f"{rec.get('config')}[{rec.get('cell')}]"] = sorted(
                k for k, m in (verdict.get("metrics") or {}).items() if m.get("status") in (Status.REGRESSION, Status.INCONCLUSIVE))
    out: dict[str, int] = {}
    for outcome, tests in (("failed", got.failed_tests), ("inconclusive", got.skipped_tests)):
        for test in tests:
            cell = test.partition("[")[2].rstrip("]")
            kind = "rate" if cell == rate_sim.RATE_TEST else ("open-loop cell" if cell in open_cells else "closed cell")
            key = f"{kind} {outcome}" + (f" ({', '.join(metrics.get(test) or [])})" if kind != "rate" else "")
            out[key] = out.get(key, 0) + 1
    for failure in got.outcome.failures:
        out[failure.check] = out.get(failure.check, 0) + 1
    return out


def _found_probe(got: gate_sim.SessionResult, config: str) -> dict[str, Any]:
    """The figures of the probe at the rate a bless found (the rate it blessed), if any."""
    for rec in rate_sim.rate_records(got, config):
        for probe in rec.get("probes") or []:
            if probe.get("rate") == rec.get("sustainable_rate"):
                return dict(probe.get("figures") or {})
    return {}


def _add_changes(out: dict[str, Any], who: str, got: gate_sim.SessionResult, config: str,
                 blessed: dict[str, Any] | None) -> None:
    """Log changes at the blessed rate against the last bless's probe there: goodput, and the SLO's own
    p99 latencies (TPOT's and TTFT's, the larger share of its target): sums for their mean and spread."""
    records = rate_sim.rate_records(got, config)
    probes = (records[0].get("probes") or []) if records else []
    if not blessed or not probes:
        return
    now = probes[0].get("figures") or {}
    targets = {"p99_tpot_ms": 50.0, "p99_ttft_ms": 300.0}

    def margin(figures: dict[str, Any]) -> float | None:
        shares = [float(figures[k]) / t for k, t in targets.items() if isinstance(figures.get(k), (int, float))]
        return max(shares) if shares else None

    for name, before, after in (("goodput", blessed.get(REQUEST_GOODPUT), now.get(REQUEST_GOODPUT)),
                                ("slo latency", margin(blessed), margin(now))):
        if isinstance(before, (int, float)) and isinstance(after, (int, float)) and before > 0 and after > 0:
            change = math.log(after / before)
            for key, value in (("n", 1), ("s", change), ("ss", change * change)):
                out[f"{who} {name} {key}"] = out.get(f"{who} {name} {key}", 0) + value


def _spread(c: dict[str, Any], who: str, name: str) -> str:
    n = c.get(f"{who} {name} n", 0)
    if n < 2:
        return "n/a"
    mean = c[f"{who} {name} s"] / n
    sd = math.sqrt(max(0.0, (c[f"{who} {name} ss"] - n * mean * mean) / (n - 1)))
    return f"{math.expm1(mean):+.1%} (sd {sd:.1%}, {n})"


def _why(got: gate_sim.SessionResult, test: str) -> str:
    """The rate gate's message (or the goodput verdict's) of a failing test, one line."""
    config, _, cell = test.partition("[")
    cell = cell.rstrip("]")
    if cell == rate_sim.RATE_TEST:
        for rec in rate_sim.rate_records(got, config):
            gate = rec.get("gate") or {}
            return str(gate.get("message", ""))[:420].replace("\n", " ")
    for rec in got.records:
        if rec.get("config") == config and rec.get("cell") == cell and "verdict" in rec:
            verdict: Any = rec["verdict"]
            m = (verdict.get("metrics") or {}).get(REQUEST_GOODPUT) or {}
            return str(m.get("message") or verdict.get("reasons"))[:420].replace("\n", " ")
    return ""


def _blessed(world: rate_sim.RateWorld) -> dict[str, int]:
    """How many blessed sessions each config's rate entry holds (a new rate starts over)."""
    import yaml

    out: dict[str, int] = {}
    for config in world.configs:
        path = world.root / "baselines" / "sim-h200" / f"{config.name}.yaml"
        data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if path.is_file() else {}
        entry = ((data or {}).get(RATE_SECTION) or {}).get(world.setup.name)
        sessions = len(((entry or {}).get("cell", {}).get("gates", {}).get(REQUEST_GOODPUT) or {}).get("sessions") or [])
        out[f"rate entries of {sessions} session(s)"] = out.get(f"rate entries of {sessions} session(s)", 0) + 1
    return out


def _task(job: tuple[str, int, int, list[str], int, tuple[float, ...], str]) -> dict[str, dict[str, Any]]:
    """``n`` worlds of one shape: K blessed sessions each, then its judged sessions."""
    shape, seed, n, scenarios, configs, rates, slo = job
    rng = random.Random(seed)
    totals: dict[str, list[dict[str, Any]]] = {}
    for _ in range(n):
        world = rate_sim.new_world(SHAPES[shape], rng, configs, CELLS + rate_sim.open_cells(rates), "",
                                   rate_sim.RateSetup(slo=slo))
        try:
            bless: dict[str, Any] = {"trials": 1, "refused": {}}
            for k in range(K_BLESSED):
                world.drops = {}
                got = rate_sim.run_session(world, k, bless=True)
                for test in got.failed_tests:
                    kind = "rate" if test.endswith(f"[{rate_sim.RATE_TEST}]") else "cell"
                    bless["refused"][kind] = bless["refused"].get(kind, 0) + 1
                bless["rate repeats"] = bless.get("rate repeats", 0) + got.counts.get("rate repeats", 0)
            bless["entries"] = _blessed(world)
            found = {c.name: _found_probe(got, c.name) for c in world.configs}
            totals.setdefault("bless", []).append(bless)
            for i, scenario in enumerate(scenarios):
                totals.setdefault(scenario, []).append(_judged(world, scenario, K_BLESSED + i, found))
        finally:
            gate_sim.drop_world(world)
    return {k: _merge(v) for k, v in totals.items()}


def _print(shape: str, results: dict[str, dict[str, Any]]) -> bool:
    ok = True
    b = results.get("bless") or {}
    if b:
        sessions = K_BLESSED * b["trials"]
        print(f"  bless: refused {b.get('refused') or {}} in {sessions} sessions; {b.get('rate repeats', 0) / sessions:.0f} "
              f"rate repeats a session; {b.get('entries')}")
    for scenario, c in results.items():
        if scenario == "bless":
            continue
        n = c["trials"]
        if scenario == "unchanged":
            bad = c["rate_failed"] + c["rate_inconclusive"]
            good = bad / n <= TARGETS["unchanged"]
            configs = c["rate_tests"]
            print(f"  unchanged: rate gate failing or inconclusive {_fig(bad, n)} {'OK' if good else 'MISSED'} (<= 2%) "
                  f"(failing {c['rate_failed']}, inconclusive {c['rate_inconclusive']}); per config "
                  f"{_fig(c['rate_failed_configs'] + c['rate_skipped_configs'], configs)}; goodput cells failing or "
                  f"inconclusive {_fig(c['goodput_failed'], n)} (per judged cell {_fig(c['goodput_failed_cells'], max(1, c['goodput_cells']))}; "
                  f"{c.get('goodput_unjudged_cells', 0)} cells at the SLO's edge recorded, not judged: {c.get('unjudged') or {}}); "
                  f"rate tests and "
                  f"goodput cells together {_fig(c.get('rate_or_goodput_failed', 0), n)}; "
                  f"whole session {_fig(c['session_failed'], n)}; {c['rate_repeats'] / n:.0f} rate repeats a sweep, "
                  f"{c.get('rate_relaunches', 0) / n:.2f} relaunches by the rate tests; "
                  f"failing {c.get('failing') or {}}")
            for example in list(c.get("examples") or {})[:3]:
                print("    e.g. " + example[:500])
            print(f"    at the blessed rate, unchanged configs: goodput {_spread(c, 'unchanged', 'goodput')}, "
                  f"the SLO's p99 latency / target {_spread(c, 'unchanged', 'slo latency')}")
        else:
            good, mark = target_mark(TARGETS.get(scenario), c["caught"], n)
            print(f"  {scenario}: its rate judged failing {_fig(c['caught'], n)} {mark}; "
                  f"any test of the config failing {c['caught_any'] / n:.1%}; "
                  f"{c.get('rate_relaunches', 0) / n:.2f} relaunches by the rate tests a session")
            for example in list(c.get("examples") or {})[:2]:
                print("    missed, e.g. " + example[:500])
            print(f"    at its blessed rate, the slower config: goodput {_spread(c, 'victim', 'goodput')}, "
                  f"the SLO's p99 latency / target {_spread(c, 'victim', 'slo latency')}")
        ok &= good
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, default=100, help="worlds (unchanged sessions) per shape")
    ap.add_argument("--trials", type=int, default=100, help="sessions per drop scenario and shape")
    ap.add_argument("--shapes", nargs="+", default=["restart1", "restart3", "repeat3"], choices=list(SHAPES))
    ap.add_argument("--scenarios", nargs="+", default=DEFAULT_SCENARIOS, choices=list(SCENARIOS))
    ap.add_argument("--configs", type=int, default=CONFIGS)
    ap.add_argument("--open-rates", type=float, nargs="*", default=[2.0, 4.0],
                    help="open-loop throughput cells' rates (req/s); none: closed-loop cells only")
    ap.add_argument("--slo", default=rate_sim.RateSetup().slo, help="the session's SLO (--ddtree-slo's form)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2, help="worlds per task")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    setup = rate_sim.RateSetup(slo=args.slo)
    print(f"rate gate through the plugin's path: {args.configs} configs x {len(CELLS)} closed + {len(args.open_rates)} "
          f"open-loop cells (rates {args.open_rates}), K={K_BLESSED}, SLO {args.slo}, search {setup.plan()}, "
          f"{setup.requests} requests a probe", flush=True)
    t0 = time.monotonic()
    ok = True
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "shapes": {}}
    with Pool(max(1, args.jobs)) as pool:
        for si, shape in enumerate(args.shapes):
            jobs = []
            for ci, start in enumerate(range(0, args.worlds, args.chunk)):
                scenarios = [s for s in args.scenarios if s == "unchanged" or start < args.trials]
                jobs.append((shape, args.seed * 1_000_003 + si * 10_007 + ci, min(args.chunk, args.worlds - start),
                             scenarios, args.configs, tuple(args.open_rates), args.slo))
            parts: dict[str, list[dict[str, Any]]] = {}
            for part in pool.imap_unordered(_task, jobs):
                for scenario, counts in part.items():
                    parts.setdefault(scenario, []).append(counts)
            merged = {k: _merge(v) for k, v in parts.items()}
            figures["shapes"][shape] = merged
            print(f"[{time.monotonic() - t0:.0f} s] {shape}")
            ok &= _print(shape, merged)
            sys.stdout.flush()
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
