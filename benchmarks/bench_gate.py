#!/usr/bin/env python3
"""How often does the throughput gate cry wolf, and how often does it catch a real drop?

Why: a gate that fails most unchanged sweeps teaches people to ignore it, and one that waves a
10% slowdown through is worse. This benchmark answers both by simulation through the plugin's own
path (``benchmarks/gate_sim.py``): each simulated pytest process runs the ``ddtree_control``
fixture's body (the control's launches at its start; at its end ``relaunch_flagged``, the control's
end launches and any further ones its launch policy asks for), the ``ddtree_service`` fixture's body
and the suite's ``test_throughput`` for every (config, cell), and at the session end the bless flow
(``finish._apply_baseline_updates`` writes the baseline files) or ``finish._judge_configs_against_session``
and ``finish._judge_control``. Real settings, profile, recorder, baseline files and results folder;
faked only where a GPU cannot exist: a launch draws its own speed and a measured repeat is drawn
from a noise model (``measurement.run_repeat``). Each world blesses K = 3 sessions, then judges
today's. Noise shapes (``--shapes``; all by default):

* ``repeat1`` / ``repeat3`` / ``repeat5``: each repeat of a cell is the true value times
  exp(N(0, s)), s = 1/3/5% for output tok/s, 2 s for TTFT p50, s / 3 for the accept length; 2% of
  repeats 15% worse (a GC pause, a noisy neighbour); a day shift exp(N(0, 2%)) per session common
  to all its launches;
* ``restart1`` / ``restart3``: the same plus a per-launch shift: every launch of a config and of
  the control lands exp(N(0, 2%)) faster or slower (KV-cache size, CUDA-graph capture, memory layout);
* ``percell``: per-cell repeat noise by concurrency, c1 1%, c8 3%, c32 5% (two cells of each);
* ``heavy``: 3% repeat noise from Student's t with 3 degrees of freedom (scaled to 3% sd);
* ``outliers``: 3% noise, 3% of repeats 15% slow;
* ``drift``: 3% noise, and the machine drifts 3% (sign per session) from the session's first
  launch to its last.

Every session is the campaign: 18 configs x 6 cells x 3 gated metrics (``--ddtree-repeats`` 3),
and the profile's control (its ``control_launches`` and the further launches of its policy).
Scenarios, each judged as a whole session:

* ``unchanged``: fails when any test fails or is skipped inconclusive, or the session end fails
  (a config against its session, the control, the uniform shift);
* ``one_cell_10``: one cell of one config 10% slower (output tok/s): caught when that cell's output
  tok/s is judged a regression;
* ``whole_config_5`` / ``whole_config_10``: every cell of one config 5% / 10% slower: caught by its
  cells, by the check against its session, or by the uniform shift;
* ``every_config_3`` / ``every_config_5``: every config 3% / 5% slower, the control unchanged:
  caught when the uniform shift fails ("only speculative configs moved");
* ``whole_build_5``: every config and the control 5% slower (a slower build): within one session
  it is a slower day (the control moves with the configs), so "caught" is any failure of the
  session; across sessions the history sees it (``benchmarks/bench_build_changes.py``).

A world's K blessed sessions serve its unchanged session and, in the first ``--trials`` worlds of a
shape, one session of each drop scenario (each scenario's trials are independent worlds).

Usage: python benchmarks/bench_gate.py [--sweeps 1000] [--trials 400] [--shapes ...] [--scenarios ...]
       [--jobs N] [--json F] [--profile-extra 'control_launches: 2']

Each figure is printed with its trial count and a 95% Wilson interval, and the cost: launches
(restarts) a sweep, repeats per config cell (first pass, extra repeats, confirmations) and in
relaunches, control repeats.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gate_sim  # noqa: E402
from gate_sim import Shape  # noqa: E402
from pytest_ddtree.measure.matrix import Cell  # noqa: E402
from pytest_ddtree.finish import CHECK_AGAINST_SESSION, CHECK_UNIFORM_SHIFT  # noqa: E402

CONFIGS = 18
CELL_CONCURRENCY = (1, 8, 32, 1, 8, 32)
CELLS = [Cell(f"c{i}", c, 128, 64, 16, 2) for i, c in enumerate(CELL_CONCURRENCY)]
K_BLESSED = 3


def _flat(s: float) -> tuple[float, ...]:
    return (s,) * len(CELLS)


SHAPES = {
    "repeat1": Shape("repeat1", _flat(0.01)),
    "repeat3": Shape("repeat3", _flat(0.03)),
    "repeat5": Shape("repeat5", _flat(0.05)),
    "restart1": Shape("restart1", _flat(0.01), launch=0.02),
    "restart3": Shape("restart3", _flat(0.03), launch=0.02),
    "percell": Shape("percell", tuple({1: 0.01, 8: 0.03, 32: 0.05}[c] for c in CELL_CONCURRENCY)),
    "heavy": Shape("heavy", _flat(0.03), tails=3.0),
    "outliers": Shape("outliers", _flat(0.03), outlier_rate=0.03),
    "drift": Shape("drift", _flat(0.03), drift=0.03),
}

#: scenario -> (which configs are slower: none / one / all / build (the control too), which cells, the drop)
SCENARIOS = {
    "unchanged": ("none", "none", 0.0),
    "one_cell_10": ("one", "one", 0.10),
    "whole_config_5": ("one", "all", 0.05),
    "whole_config_10": ("one", "all", 0.10),
    "every_config_3": ("all", "all", 0.03),
    "every_config_5": ("all", "all", 0.05),
    "whole_build_5": ("build", "all", 0.05),
}

#: Targets of the Done-when (a scenario's catch rate, or the unchanged sweeps' failure rate).
TARGETS = {"unchanged": 0.02, "one_cell_10": 0.95, "whole_config_10": 0.95, "every_config_5": 0.95}


def _drops(world: gate_sim.World, scenario: str) -> dict[tuple[int, int], float]:
    who, where, drop = SCENARIOS[scenario]
    configs = {"none": [], "one": [0], "all": list(range(len(world.configs))),
               "build": [gate_sim.CONTROL, *range(len(world.configs))]}[who]
    cells = [0] if where == "one" else range(len(world.cells))
    return {(c, cell): drop for c in configs for cell in cells}


@dataclass(frozen=True)
class Costs:
    """The cost model: what a restart and a measured repeat of a cell take on the GPU box of the scenario.

    The default is the seed's: a restart 615 s (Kimi K2.6 on 8 GPUs, FACTS of the campaign), and
    docs/gpu-box.md's cells, about 20 minutes per config at three repeats (1200 s over 6 cells x 3
    repeats: 66.7 s a repeat of a cell); the control's cells run non-speculatively, ``control_slowdown``
    times longer (the speculative configs' speedup over it: 1.5-4.6x on the embedded engine, 2 assumed)."""

    restart_s: float = 615.0
    cell_s: float = 1200.0 / 18
    control_slowdown: float = 2.0


def session_cost(counts: dict[str, int], records: list[dict[str, object]], costs: Costs) -> dict[str, float]:
    """One simulated session's GPU seconds by purpose (records/bill.py's purposes), and the configs' own: their
    launches and their first-pass repeats (what measuring the configs alone would take)."""
    from pytest_ddtree.records.bill import CONTROL, PURPOSES, session_bill

    repeats = session_bill(records).items
    out: dict[str, float] = {}
    for purpose in PURPOSES:
        seconds = counts.get(f"launches {purpose}", 0) * costs.restart_s
        seconds += repeats[purpose].repeats * costs.cell_s * (costs.control_slowdown if purpose == CONTROL else 1.0)
        if seconds:
            out[f"gpu_s {purpose}"] = seconds
    out["gpu_s"] = sum(out.values())
    out["own_s"] = counts.get("launches configs", 0) * costs.restart_s + repeats["configs"].repeats * costs.cell_s
    return out


COSTS = Costs()


def _judged(world: gate_sim.World, scenario: str, index: int) -> dict[str, Any]:
    """Today's session of ``world`` under ``scenario``: whether it failed, whether it caught the drop."""
    world.drops = _drops(world, scenario)
    got = gate_sim.run_session(world, index, bless=False)
    who = SCENARIOS[scenario][0]
    first = world.configs[0].name
    checks = [f.check for f in got.outcome.failures]
    uniform = CHECK_UNIFORM_SHIFT in checks
    failed = bool(got.failed_tests or got.outcome.failures)
    against = any(f.check == CHECK_AGAINST_SESSION and f.message.startswith(first) for f in got.outcome.failures)
    if scenario == "one_cell_10":
        caught = gate_sim.cell_regressed(got, first, world.cells[0].name)
    elif who == "one":
        caught = gate_sim.cell_regressed(got, first) or against or uniform
    elif who == "all":
        caught = uniform
    else:
        caught = failed or bool(got.skipped_tests)
    out: dict[str, Any] = {"trials": 1, "failed": int(failed), "inconclusive": int(bool(got.skipped_tests) and not failed),
                           "caught": int(caught), "caught_any": int(failed or bool(got.skipped_tests)),
                           "uniform_failed": int(uniform), "failing": {}}
    for check in checks:
        out["failing"][check] = out["failing"].get(check, 0) + 1
    if got.failed_tests:
        out["failing"]["test"] = len(got.failed_tests)
    if got.skipped_tests:
        out["failing"]["inconclusive test"] = len(got.skipped_tests)
    for key, n in got.counts.items():
        out[key] = n
    out.update(session_cost(got.counts, got.records, COSTS))
    if failed and scenario == "unchanged":
        out["examples"] = {"; ".join([*got.failed_tests[:2], *(f.message[:300] for f in got.outcome.failures[:2])]): 1}
    return out


def _task(job: tuple[str, int, int, list[str], int, str]) -> tuple[str, dict[str, dict[str, Any]]]:
    """``n`` worlds of one shape: K blessed sessions each, then its judged sessions."""
    shape_name, seed, n, scenarios, configs, extra = job
    rng = random.Random(seed)
    totals: dict[str, list[dict[str, Any]]] = {}
    for _ in range(n):
        world = gate_sim.new_world(SHAPES[shape_name], rng, configs, CELLS, extra)
        try:
            bless: dict[str, Any] = {"trials": 1}
            for k in range(K_BLESSED):
                world.drops = {}
                got = gate_sim.run_session(world, k, bless=True)
                bless["refused"] = bless.get("refused", 0) + len(got.failed_tests)
                for key, count in [*got.counts.items(), *session_cost(got.counts, got.records, COSTS).items()]:
                    bless[key] = bless.get(key, 0) + count
            totals.setdefault("bless", []).append(bless)
            for i, scenario in enumerate(scenarios):
                totals.setdefault(scenario, []).append(_judged(world, scenario, K_BLESSED + i))
        finally:
            gate_sim.drop_world(world)
    return shape_name, {k: _merge(v) for k, v in totals.items()}


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


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson interval of a proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    z = 1.96
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _fig(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k / n:.1%} of {n} [{lo:.1%}, {hi:.1%}]"


def target_mark(target: float | None, caught: int, n: int) -> tuple[bool, str]:
    """Whether a catch rate meets its target, and how the table line says it (``OK (>= 95%)``)."""
    if target is None:
        return True, "info"
    good = caught / n >= target
    return good, f"{'OK' if good else 'MISSED'} (>= {target:.0%})"


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - i) for i in range(0, total, size)]


def bill_text(c: dict[str, Any], sessions: int) -> str:
    """A scenario's mean GPU-hours a session under the cost model, the configs' own, and what each other
    purpose added (the overhead over the configs' own GPU time)."""
    own = c.get("own_s", 0.0) / sessions
    total = c.get("gpu_s", 0.0) / sessions
    parts = [f"{k.split(' ', 1)[1]} {v / sessions / own:+.1%}" for k, v in sorted(c.items())
             if k.startswith("gpu_s ") and k != "gpu_s configs" and own]
    return (f"{total / 3600:.2f} GPU-hours a session, {total / own if own else 0:.2f}x the configs' own "
            f"{own / 3600:.2f} ({', '.join(parts) or 'nothing else'})")


def _print_shape(shape: str, results: dict[str, dict[str, Any]], configs: int) -> bool:
    s = SHAPES[shape]
    print(f"{shape}: repeat noise {'/'.join(f'{x:.0%}' for x in sorted(set(s.noise)))}, day {s.day:.0%}, "
          f"per-launch {s.launch:.0%}, outliers {s.outlier_rate:.0%} x {s.outlier_size:.0%}"
          f"{f', Student-t {s.tails:.0f} dof' if s.tails else ''}{f', drift {s.drift:.0%}' if s.drift else ''}")
    ok = True
    cells = configs * len(CELLS)
    b = results.get("bless")
    if b:
        print(f"  bless: {b.get('launches', 0) / (K_BLESSED * b['trials']):.2f} launches a blessed session, "
              f"{b.get('control_repeats', 0) / (K_BLESSED * b['trials']):.1f} control repeats; tests refused "
              f"{b.get('refused', 0)} in {K_BLESSED * b['trials']} sessions; {bill_text(b, K_BLESSED * b['trials'])}")
    for scenario, c in results.items():
        if scenario == "bless":
            continue
        n = c["trials"]
        cost = (f"{c.get('repeats first pass', 0) / (n * cells):.2f} repeats per config cell + "
                f"{c.get('repeats relaunch', 0) / (n * cells):.2f} in relaunches, "
                f"{c.get('control_repeats', 0) / n:.1f} control repeats, {c.get('launches', 0) / n:.2f} launches a sweep; "
                f"{bill_text(c, n)}")
        if scenario == "unchanged":
            bad = c["failed"] + c["inconclusive"]
            good = bad / n <= TARGETS["unchanged"]
            print(f"  unchanged: sessions failing {_fig(c['failed'], n)}, inconclusive {c['inconclusive'] / n:.1%} "
                  f"{'OK' if good else 'MISSED'} (<= 2% together); failing {c.get('failing') or {}}; cost: {cost}")
            for example in list(c.get("examples") or {})[:2]:
                print("    e.g. " + example.replace("\n", " ")[:400])
        else:
            good, mark = target_mark(TARGETS.get(scenario), c["caught"], n)
            print(f"  {scenario}: caught {_fig(c['caught'], n)} {mark}; any failure {c['caught_any'] / n:.1%}; cost: {cost}")
        ok &= good
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=1000, help="worlds (unchanged sessions) per shape")
    ap.add_argument("--trials", type=int, default=400, help="sessions per drop scenario and shape")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--configs", type=int, default=CONFIGS, help="configs per session (the campaign's 18)")
    ap.add_argument("--profile-extra", default="", help="profile keys added to the simulated profile (YAML lines), "
                    "e.g. 'control_launches: 10'; none: the defaults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=5, help="worlds per task")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: all CPUs)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--restart-s", type=float, default=Costs.restart_s, help="the cost model's restart (seconds)")
    ap.add_argument("--cell-s", type=float, default=Costs.cell_s, help="the cost model's repeat of a config's cell (seconds)")
    ap.add_argument("--control-slowdown", type=float, default=Costs.control_slowdown,
                    help="how many times longer a control cell's repeat takes than a config's")
    args = ap.parse_args()
    global COSTS
    COSTS = Costs(args.restart_s, args.cell_s, args.control_slowdown)
    extra = args.profile_extra.replace("\\n", "\n")
    print(f"gate simulation through the plugin's path: {args.configs} configs x {len(CELLS)} cells, K={K_BLESSED} "
          f"blessed sessions, profile defaults{f' + {extra!r}' if extra else ''}", flush=True)
    jobs = []
    for si, shape in enumerate(args.shapes):
        for ci, start in enumerate(range(0, args.sweeps, args.chunk)):
            n = min(args.chunk, args.sweeps - start)
            scenarios = [s for s in args.scenarios if s == "unchanged" or start < args.trials]
            jobs.append((shape, args.seed * 1_000_003 + si * 10_007 + ci, n, scenarios, args.configs, extra))
    t0 = time.monotonic()
    ok = True
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "shapes": {}}
    with multiprocessing.Pool(max(1, args.jobs)) as pool:
        for shape in args.shapes:  # one shape at a time, printed and written as it is done
            parts: dict[str, list[dict[str, Any]]] = {}
            for _, part in pool.imap_unordered(_task, [j for j in jobs if j[0] == shape]):
                for scenario, counts in part.items():
                    parts.setdefault(scenario, []).append(counts)
            merged = {k: _merge(v) for k, v in parts.items()}
            figures["shapes"][shape] = merged
            print(f"[{time.monotonic() - t0:.0f} s]", end=" ")
            ok &= _print_shape(shape, merged, args.configs)
            sys.stdout.flush()
            if args.json:
                args.json.write_text(json.dumps(figures, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
