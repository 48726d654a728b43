#!/usr/bin/env python3
"""The throughput gate end to end: independent sessions of real reference engines.

Why: the simulation (``bench_gate.py``) checks the rule under a model of the noise; this checks
it against the noise a real engine and this machine produce. Every session launches fresh
engines (one per config, ``--fault clock-jitter``; the same ``--seed``, i.e. the same drafter
behaviour, unless ``--engine-seed per-launch``) and draws a day-to-day
shift shared by all its configs (``--fault slowdown=exp(N(0, d))``). Three blessed sessions make
the baseline through the bless flow's function (``baseline.baseline_cell_entry``); then
``--unchanged`` sessions are judged by the suite's own ``measurement.measure_config`` (first pass,
confirmation of flagged cells, verdicts) and count as failed when any cell fails or stays
inconclusive (both fail CI), and ``--slowed`` sessions run the first config 10% slower
(``slowdown`` x 1.1) and count as caught when one of its cells is a regression.

Every session also launches the control first (a non-speculative engine: no speculative flag, as
SGLang's plain launch, blessed and judged like a config, as the plugin's ``launches.measure`` does), in judged
sessions once more after the last config, and judges it with ``control.judge`` (the uniform shift of
the configs over the control); ``--no-control`` leaves it out. Configs that
``session_check.relaunch_candidates`` flags are relaunched (fresh engines, their own launch shift) and judged
on all their launches (``--no-relaunch``: one launch each). ``--launch-shift S`` gives every launch (the control's, the blessed sessions' too) its own
speed factor exp(N(0, S)), what a relaunched GPU server shows; ``--slow-all 0.05`` makes the slowed
sessions slow every config by 5% and not the control (caught by the uniform shift).

Sessions are independent (each its own seed, engines and day shift), so they run in parallel:
``--jobs`` worker processes, each pinned with its engines to its own ``--cpus-per-job`` CPUs
(so two sessions never share a core and slow each other's clock). Expensive on a shared 2-core
box: keep it small there (``--unchanged 1 --slowed 1 --jobs 1``) and run it once, in the background.

Usage: python benchmarks/bench_gate_e2e.py [--unchanged 20] [--slowed 20] [--day-shift 0.02] [--jitter 0.2]
       [--launch-shift 0.02] [--slow-all 0.05] [--no-control] [--jobs N]
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
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_harness import refserver  # noqa: E402
from pytest_ddtree.metrics import OUTPUT_THROUGHPUT
from pytest_ddtree.gates.throughput import baseline as baseline_mod, session_check, verdicts as verdicts_mod
from pytest_ddtree.measure import load  # noqa: E402
from pytest_ddtree.gates.throughput import baseline as baseline_mod, control, measurement  # noqa: E402
from pytest_ddtree.records.shapes import ControlJudgedData  # noqa: E402
from pytest_ddtree.records.words import RecordKind, Status  # noqa: E402

CONFIGS = {"bs8_b4_k4": (8, 4, 4), "bs8_b8_k4": (8, 8, 4)}
#: The control's second launch of a judged session, after the last config (a drift over the session cancels)
CONTROL_AT_END = "control#2"
CELLS = [load.Cell("c1_tiny", 1, 48, 32, 2, 1), load.Cell("c4_tiny", 4, 48, 32, 8, 4),
         load.Cell("c8_small", 8, 128, 32, 16, 8)]


def _flags(name: str) -> tuple[list[str], bool]:
    """The engine flags of a launch and whether it is speculative."""
    if name == baseline_mod.CONTROL:
        return [], False  # no speculative flag: the plain launch, as SGLang takes it
    bs, budget, topk = CONFIGS[name]
    return ["--speculative-dflash-block-size", str(bs), "--speculative-num-draft-tokens", str(budget),
            "--speculative-eagle-topk", str(topk)], True


def session(args: argparse.Namespace, rng: random.Random, slow_first: bool,
            baselines: dict[str, dict[str, Any]] | None, slow_all: float = 0.0,
            names: list[str] | None = None, day: float | None = None) -> dict[str, measurement.Campaign]:
    """One independent session: the control's launch first, then fresh engines for every config, and
    (judged sessions) the control once more at the end; one day shift for all of them and, with
    ``--launch-shift``, a speed shift of each launch's own. ``names``/``day``: relaunch these configs
    (a session's end: its day)."""
    day = math.exp(rng.gauss(0.0, args.day_shift)) if day is None else day
    out = {}
    if names is None:
        names = [*([baseline_mod.CONTROL] if args.control else []), *CONFIGS]
        if args.control and baselines is not None:
            names.append(CONTROL_AT_END)
    first = next(iter(CONFIGS))
    spread = None
    if baselines is not None:
        spread = baseline_mod.launch_spread([baselines[n] for n in CONFIGS])
    for name in names:
        flags, speculative = _flags(baseline_mod.CONTROL if name == CONTROL_AT_END else name)
        launch = math.exp(rng.gauss(0.0, args.launch_shift)) if args.launch_shift else 1.0
        slower = 1.1 if slow_first and name == first else 1.0
        if slow_all and speculative:
            slower = 1.0 / (1.0 - slow_all)
        factor = day * launch * slower
        seed = rng.randrange(1 << 30) if args.engine_seed == "per-launch" else int(args.engine_seed)
        engine = ["--clock-scale", str(args.clock_scale), "--seed", str(seed),
                  "--fault", f"clock-jitter={args.jitter}", "--fault", f"slowdown={factor:.6f}", *flags]
        for attempt in range(3):  # a free port taken by a parallel session in between: try another
            try:
                with refserver(*engine) as url:
                    out[name] = measurement.measure_config(
                        url, CELLS, 3, measurement.Driving(speculative=speculative),
                        baseline=None if baselines is None else baselines[
                            baseline_mod.CONTROL if name == CONTROL_AT_END else name],
                        judging=measurement.Judging(gated=None if speculative else control.GATED, launch_spread=spread))
                break
            except RuntimeError:
                if attempt == 2:
                    raise
    return out


def _pin(cpu_sets: Any) -> None:
    """Pool initializer: this worker (and the engines it starts) runs on its own CPUs."""
    cpus = cpu_sets.get()
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _bless_session(job: tuple[argparse.Namespace, int]) -> dict[str, dict[str, dict[str, Any]]]:
    """One bless session: per config and cell, the measured workload (with the prompts as
    measured, as the suite's bless flow stores it) and the gated samples."""
    args, seed = job
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, campaign in session(args, random.Random(seed), False, None).items():
        if name == baseline_mod.CONTROL and not args.control:
            continue
        out[name] = {}
        for cell in CELLS:
            inp = measurement.cell_input(campaign, cell, None)
            if inp.status != Status.VALID:
                raise RuntimeError(f"bless session (seed {seed}): {name} {cell.name} is {inp.status}: {inp.problems}")
            out[name][cell.name] = {"workload": dict(inp.workload or {}),
                                    "samples": {k: list(v) for k, v in inp.current.items()}}
    return out


def _record(name: str, cell: str, v: verdicts_mod.CellVerdict) -> ControlJudgedData:
    """A cell's record as the suite writes it (the control's with its kind and launch)."""
    m = v.metric(OUTPUT_THROUGHPUT)
    rec: ControlJudgedData = {"config": baseline_mod.CONTROL if name == CONTROL_AT_END else name, "cell": cell, "verdict": v.as_dict(),
           "hardware_profile": "refserver", "metrics": {OUTPUT_THROUGHPUT: m.current_median if m else None}}
    if name in (baseline_mod.CONTROL, CONTROL_AT_END):
        rec.update({"kind": control.CONTROL_RECORD, "control_launch": 2 if name == CONTROL_AT_END else 1})
    return rec


def _judged_session(job: tuple[argparse.Namespace, int, bool, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    args, seed, slow, baselines = job
    slow_all = args.slow_all if slow else 0.0
    rng = random.Random(seed)
    day = math.exp(rng.gauss(0.0, args.day_shift))
    campaigns = session(args, rng, slow and not slow_all, baselines, slow_all, day=day)
    verdicts = {name: c.verdicts for name, c in campaigns.items()}
    # the session-end checks of the plugin (finish.py): each config against the others of the
    # session (flagged ones relaunched), and the control (its own cells, the uniform shift)
    records = [_record(name, cell, v) for name, vs in verdicts.items() for cell, v in vs.items()]
    configs = [r for r in records if r.get("kind") != control.CONTROL_RECORD]
    moves = session_check.config_moves(configs)
    flagged: list[str] = []
    relaunched: list[session_check.ConfigMove] = []
    while args.relaunch and (names := session_check.relaunch_candidates(moves, relaunched)):
        again = session(args, rng, slow and not slow_all, baselines, slow_all, names=names, day=day)
        new: list[ControlJudgedData] = [{**_record(name, cell, v), "kind": RecordKind.THROUGHPUT_RELAUNCH,
                                         "relaunch": 1 + flagged.count(name)}
               for name, c in again.items() for cell, v in c.verdicts.items()]
        relaunched += session_check.config_moves(new)
        records += new
        flagged += names
    findings = [f for f in session_check.judge_session(moves, relaunched) if f.failed]
    judged = control.judge(records, configs, require_baselines=True) if args.control else None
    group = judged.groups[0] if judged and judged.groups else None
    # everything that fails a CI run (--ddtree-require-baselines): missing / thin baselines too
    bad = sorted(f"{name} {cell}: {v.status}" for name, vs in verdicts.items() for cell, v in vs.items()
                 if v.failed or v.status in (Status.INCONCLUSIVE, Status.MISSING, Status.THIN))
    bad += [f"{f.config} {f.metric} against the session: {f.relative:+.1%} (tolerance {f.tolerance:.1%})"
            for f in findings]
    by_uniform = bool(group and group.failed and not group.control_failures)
    if by_uniform and group is not None:
        bad.append(f"uniform shift {group.uniform_shift:+.1%} (tolerance {group.uniform_tolerance:.1%}), control held")
    first = next(iter(CONFIGS))
    by_cells = any(v.status == Status.REGRESSION for name, vs in verdicts.items() if slow_all or name == first
                   for v in vs.values())
    by_session = any(f.config == first for f in findings) and not slow_all
    caught = by_cells or by_session or by_uniform
    # each launch's common change of output tok/s against its baseline (what a slowdown moves)
    shifts = {name: next((m.shift for v in vs.values() if (m := v.metric(OUTPUT_THROUGHPUT)) and m.shift is not None),
                         None) for name, vs in verdicts.items()}
    return {"bad": bad, "caught": caught, "relaunched": flagged,
            "caught_by": [w for w, yes in (("cells", by_cells), ("session", by_session), ("uniform", by_uniform)) if yes],
            "shifts": shifts, "kind": group.kind if group else None,
            "uniform_shift": group.uniform_shift if group else None,
            "control_change": group.control_change if group else None}


def bless(args: argparse.Namespace, pool: Any) -> dict[str, dict[str, Any]]:
    """K blessed sessions (in parallel), appended oldest first through the bless flow's function."""
    names = [*([baseline_mod.CONTROL] if args.control else []), *CONFIGS]
    section: dict[str, dict[str, Any]] = {name: {} for name in names}
    blessed = pool.map(_bless_session, [(args, args.seed * 1000 + s) for s in range(verdicts_mod.DEFAULT_SESSIONS_KEPT)])
    for s, measured in enumerate(blessed):
        for name in names:
            for cell in CELLS:
                got = measured[name][cell.name]
                section[name][cell.name] = baseline_mod.baseline_cell_entry(
                    got["workload"], got["samples"], section[name].get(cell.name), session=f"bless{s}")
    return section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unchanged", type=int, default=20)
    ap.add_argument("--slowed", type=int, default=20)
    ap.add_argument("--day-shift", type=float, default=0.02)
    ap.add_argument("--jitter", type=float, default=0.2)
    ap.add_argument("--clock-scale", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="sessions in parallel (default: one per --cpus-per-job CPUs)")
    ap.add_argument("--cpus-per-job", type=int, default=2, help="CPUs pinned to each parallel session")
    ap.add_argument("--engine-seed", default="0",
                    help="the engines' --seed (drafter noise: which drafts it accepts): one number for every "
                         "launch (default: the same weights under greedy decoding accept the same drafts), or "
                         "'per-launch' (a new drafter behaviour each launch: acceptance, and with it tok/s, "
                         "moves by several %% per cell between launches)")
    ap.add_argument("--launch-shift", type=float, default=0.0,
                    help="sd of each launch's own speed shift (--fault slowdown), also the control's and the "
                         "blessed sessions' launches: what a relaunched GPU server shows")
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="no control launch per session (the per-config rule alone)")
    ap.add_argument("--slow-all", type=float, default=0.0,
                    help="slowed sessions slow every config by this share (0.05 = 5%%) and not the control, "
                         "instead of the first config by 10%%")
    ap.add_argument("--no-relaunch", dest="relaunch", action="store_false",
                    help="no relaunch of the configs the session-end check flags (the one-launch rule)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.monotonic()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    ctx = multiprocessing.get_context("spawn")  # no threads or sockets inherited from this process
    cpu_sets = ctx.Queue()
    for j in range(args.jobs):
        chunk = set(cpus[j * args.cpus_per_job:(j + 1) * args.cpus_per_job])
        cpu_sets.put(chunk if len(chunk) == args.cpus_per_job else None)
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "unchanged": [], "slowed": []}
    with ctx.Pool(args.jobs, initializer=_pin, initargs=(cpu_sets,), maxtasksperchild=None) as pool:
        baselines = bless(args, pool)
        print(f"e2e gate: {len(CONFIGS)} configs x {len(CELLS)} cells{' + a control' if args.control else ''}, "
              f"3 blessed sessions, clock-jitter {args.jitter}, day shift {args.day_shift:.0%}, per-launch shift "
              f"{args.launch_shift:.0%}, engine seed {args.engine_seed}, {args.jobs} sessions in parallel "
              f"({time.monotonic() - t0:.0f} s to bless)", flush=True)
        jobs = [(kind, i, (args, args.seed * 1000 + 100 + 1000 * slow + i, slow, baselines))
                for kind, n, slow in (("unchanged", args.unchanged, False), ("slowed", args.slowed, True))
                for i in range(n)]
        jobs.sort(key=lambda job: job[1])  # unchanged and slowed sessions alternate
        # printed as they finish (in order), so a run cut short still shows what it measured
        for (kind, i, (_, _, slow, _)), result in zip(jobs, pool.imap(_judged_session, [job for _, _, job in jobs])):
            figures[kind].append(result)
            n = args.slowed if slow else args.unchanged
            verdict = (f"caught ({' and '.join(result['caught_by'])})" if result["caught"] else "not caught") if slow \
                else ("FAILED" if result["bad"] else "ok")
            extra = ""
            if result["uniform_shift"] is not None:
                extra = f"; uniform shift {result['uniform_shift']:+.1%} ({result['kind']})"
            if result["control_change"] is not None:
                extra += f", control {result['control_change']:+.1%}"
            if result["relaunched"]:
                extra += f"; relaunched {', '.join(result['relaunched'])}"
            print(f"  {kind} session {i + 1}/{n}: {verdict}"
                  f"{'; ' + ', '.join(result['bad']) if result['bad'] else ''}; output tok/s common change "
                  + ", ".join(f"{k} {v:+.1%}" for k, v in result["shifts"].items() if v is not None) + extra, flush=True)
    failed = sum(1 for s in figures["unchanged"] if s["bad"])
    caught = sum(1 for s in figures["slowed"] if s["caught"])
    print(f"unchanged sessions failing: {failed} of {args.unchanged} (target 0); "
          f"{f'{args.slow_all:.0%} slowdown of every config' if args.slow_all else '10% slowdown of one config'} "
          f"caught: {caught} of {args.slowed} (target >= 95%); "
          f"{time.monotonic() - t0:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if failed == 0 and caught >= math.ceil(0.95 * args.slowed) else 1


if __name__ == "__main__":
    sys.exit(main())
