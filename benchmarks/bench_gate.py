#!/usr/bin/env python3
"""How often does the throughput gate cry wolf, and how often does it catch a real drop?

Why: a gate that fails most unchanged sweeps teaches people to ignore it, and one that waves a
10% slowdown through is worse. This benchmark answers both questions by simulation, through the
gate's own functions (``throughput.repeat_policy`` and ``stats.run_interleaved`` for the
repeats, ``gate.baseline_cell_entry`` for blessing, ``gate.measurement_status`` and
``gate.judge_config`` with its confirmation run for the verdicts, ``gate.judge_session`` for a
config against its session, ``control.judge`` for the control and the uniform shift), under
named noise shapes (``--shapes``; all of them by default):

* ``repeat1`` / ``repeat3`` / ``repeat5``: each repeat of a cell is the true value times
  exp(N(0, s)), s = 1/3/5% for output tok/s, 2 s for TTFT p50 (a median over few requests), s / 3
  for the accept length (greedy decoding barely varies); 2% of repeats 15% worse (a GC pause, a
  noisy neighbour); a day-to-day shift exp(N(0, 2%)) per session (the K = 3 blessed ones and
  today's) common to all its launches, 1% for the accept length;
* ``restart1`` / ``restart3``: the same plus a per-launch shift: every launch of a config (and of
  the control) lands exp(N(0, 2%)) faster or slower (KV-cache size, CUDA-graph capture, memory
  layout), held for the launch's first pass and its confirmation run;
* ``percell``: per-cell repeat noise by concurrency, c1 1%, c8 3%, c32 5% (cells: two of each);
* ``heavy``: 3% repeat noise drawn from Student's t with 3 degrees of freedom (scaled to 3% sd);
* ``outliers``: 3% noise, 3% of repeats 15% slow;
* ``drift``: 3% noise, and the machine drifts 3% (sign per session) from the session's first
  launch to its last (the control is measured first, the configs in order).

Every session is the campaign: 18 configs x 6 cells x 3 gated metrics, 3 repeats a cell in the
first pass, flagged cells re-measured with ``throughput.CONFIRM_REPEATS`` fresh ones, and a
non-speculative control measured on the 6 cells (gated on its output tok/s) ``--control-launches``
times (the profile's ``control_launches``, default 2): half at the session's start, half at its end
(``control.launches_at``), each a launch of its own, all of them blessed as the session's with their
number (``--control-once``: one launch, at the start). At the end, the configs
``gate.relaunch_candidates`` flags are launched again (a fresh per-launch shift, all their cells; up
to ``gate.MAX_RELAUNCHES`` times) and ``gate.judge_session`` decides on all their launches
(``--no-relaunch``: the one-launch rule); the relaunches per session are printed (their cost).
Scenarios, each judged as a whole session:

* ``unchanged``: fails when any cell fails or stays inconclusive, a config fails against its
  session, or the control check fails (a control cell, or the uniform shift);
* ``one_cell_10``: one cell of one config 10% slower (output tok/s): caught when that cell is a
  regression;
* ``whole_config_5`` / ``whole_config_10``: every cell of one config 5% / 10% slower: caught by
  its cells, by the check against its session, or by the uniform shift;
* ``every_config_3`` / ``every_config_5``: every config 3% / 5% slower, the control unchanged:
  caught when the uniform shift fails ("only speculative configs moved", the summary's kind), or
  any other failure of the session (counted apart);
* ``whole_build_5``: every config and the control 5% slower (a slower build): within one session
  it is a slower day (the control moves with the configs), so "caught" is any failure of the
  session; across sessions the history sees it (``benchmarks/bench_build_changes.py``).

Where it follows the plugin: the configs' cells are judged with the blessed launch spread and cell
noise (what the suite's ``_campaign`` passes), the control's without them (``control.measure``
passes neither); blessed sessions take the bless's repeat policy (``repeat_policy(bless=True)``)
and a cell ``gate.bless_refusal`` refuses is not blessed. Where it does not: it calls the gate's
functions on simulated repeats instead of the suite's test function and the fixtures' bodies (no
service, recorder or baseline files), so a change to that orchestration is not seen here.

Usage: python benchmarks/bench_gate.py [--sweeps 1000] [--trials 400] [--shapes ...] [--jobs N] [--json F]

The sweeps and trials run in independent chunks of their own seeds over ``--jobs`` processes
(default: every CPU); each figure is printed with its trial count and a 95% Wilson interval.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_ddtree.gates import throughput as gate
from pytest_ddtree.report import text as report
from pytest_ddtree.measure import stats  # noqa: E402
from pytest_ddtree.gates.throughput import control, throughput  # noqa: E402
from pytest_ddtree.records.shapes import ControlJudgedData  # noqa: E402
from pytest_ddtree.service.validated_profile import DEFAULT_CONTROL_LAUNCHES  # noqa: E402

CONFIGS = 18
CELLS = 6
CELL_CONCURRENCY = (1, 8, 32, 1, 8, 32)
WORKLOAD = {"concurrency": 8, "context_tokens": 128, "output_tokens": 64, "requests": 16}
CONTROL = -1  # the control's index among the launches
#: Flagged configs are relaunched once at session end (``gate.relaunch_candidates``); --no-relaunch: not
RELAUNCH = True
#: Launches of the control per session (the profile's ``control_launches``): half at its start, half at its end
CONTROL_LAUNCHES = DEFAULT_CONTROL_LAUNCHES


@dataclass(frozen=True)
class Shape:
    """A noise shape (see the module docstring)."""

    name: str
    noise: tuple[float, ...]  # repeat noise of output tok/s per cell
    day: float = 0.02
    launch: float = 0.0
    outlier_rate: float = 0.02
    outlier_size: float = 0.15
    tails: float = 0.0  # Student-t degrees of freedom (0: normal)
    drift: float = 0.0


def _flat(s: float) -> tuple[float, ...]:
    return (s,) * CELLS


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

#: scenario -> (which configs are slower: "one" / "all", which cells: "one" / "all", the drop)
SCENARIOS = {
    "unchanged": ("none", "none", 0.0),
    "one_cell_10": ("one", "one", 0.10),
    "whole_config_5": ("one", "all", 0.05),
    "whole_config_10": ("one", "all", 0.10),
    "every_config_3": ("all", "all", 0.03),
    "every_config_5": ("all", "all", 0.05),
    "whole_build_5": ("build", "all", 0.05),
}


class Model:
    """True values and the noise of one simulated world (a shape and a random state)."""

    def __init__(self, shape: Shape, rng: random.Random) -> None:
        self.shape, self.rng = shape, rng
        # true values per (config, cell): throughput, TTFT, accept length; the control's below
        self.truth = [[(rng.uniform(80, 1200), rng.uniform(4, 400), rng.uniform(3, 5.5)) for _ in range(CELLS)]
                      for _ in range(CONFIGS)]
        self.control_truth = [(rng.uniform(40, 600), rng.uniform(4, 400)) for _ in range(CELLS)]

    def session(self) -> dict[str, float]:
        """A session's day factor (log) and its drift direction."""
        return {"day": self.rng.gauss(0, self.shape.day), "drift": self.rng.choice((-1.0, 1.0)) * self.shape.drift}

    def launch(self, day: dict[str, float], position: float) -> float:
        """One launch's log speed factor: the day, the launch's own shift, the drift so far."""
        shift = self.rng.gauss(0, self.shape.launch) if self.shape.launch else 0.0
        return day["day"] + shift + day["drift"] * position

    def _noise(self, cell: int) -> float:
        s = self.shape.noise[cell]
        if self.shape.tails:
            df = self.shape.tails
            t = self.rng.gauss(0, 1) / math.sqrt(self.rng.gammavariate(df / 2.0, 2.0) / df)
            return s * t / math.sqrt(df / (df - 2.0))
        return self.rng.gauss(0, s)

    def repeat(self, config: int, cell: int, speed: float, drop: float = 0.0) -> dict[str, float]:
        out = 1.0 - self.shape.outlier_size if self.rng.random() < self.shape.outlier_rate else 1.0
        z = self._noise(cell)
        factor = math.exp(speed) * out * math.exp(z) * (1.0 - drop)
        s = self.shape.noise[cell]
        if config == CONTROL:
            tps, ttft = self.control_truth[cell]
            return {"output_throughput": tps * factor}  # the control gates its output tok/s only
        tps, ttft, acc = self.truth[config][cell]
        return {
            "output_throughput": tps * factor,
            "median_ttft_ms": ttft / math.exp(speed) / out * math.exp(self.rng.gauss(0, 2 * s)),
            report.TOKENS_PER_VERIFY: acc * math.exp(self.rng.gauss(0, s / 3)),
            # with an SLO the cell meets with slack every request is good: goodput moves as the request rate does
            "request_goodput": tps / 64 * factor,
        }


def _samples(runs: list[dict[str, float]]) -> dict[str, list[float]]:
    keys = runs[0].keys() if runs else ()
    return {k: [r[k] for r in runs] for k in keys}


#: Repeats measured per sweep (first passes, extra repeats, confirmations, relaunches; configs and the
#: control apart), counted by ``_measure`` for the figures' cost.
COUNTS: dict[str, int] = {}


def _measure(model: Model, config: int, cells: list[int], speed: float, repeats: int,
             drops: dict[int, float], bless: bool = False,
             policy: stats.RepeatPolicy | None = None) -> dict[int, stats.CellRun[dict[str, float]]]:
    """The suite's interleaved repeats (``measure_config``'s policy: ``repeat_policy(repeats, bless)``,
    same early stop / extra repeats)."""
    policy = policy or throughput.repeat_policy(repeats, bless)
    runs = stats.run_interleaved(
        cells, lambda c, r: model.repeat(config, c, speed, drops.get(c, 0.0)),
        lambda s: s["output_throughput"], policy)
    key = "control_repeats" if config == CONTROL else "config_repeats"
    COUNTS[key] = COUNTS.get(key, 0) + sum(len(run.samples) for run in runs.values())
    return runs


def _launches(configs: int) -> list[tuple[int, float]]:
    """The session's launches in order with their position (0 .. 1): the control first and last
    (its launches there: ``control.launches_at``), the configs between."""
    order = [CONTROL, *range(configs)]
    out = [(c, i / max(1, len(order) - 1)) for i, c in enumerate(order)]
    return out + ([(CONTROL, 1.0)] if control.launches_at(CONTROL_LAUNCHES, control.END) else [])


def bless(model: Model, configs: int) -> dict[int, list[dict[str, Any] | None]]:
    """K blessed sessions through the bless flow's own function: entries[launch][cell]."""
    entries: dict[int, list[dict[str, Any] | None]] = {c: [None] * CELLS for c in [CONTROL, *range(configs)]}
    for s in range(gate.DEFAULT_SESSIONS_KEPT):
        day = model.session()
        pooled: dict[int, dict[str, list[float]]] = {cell: {} for cell in range(CELLS)}
        launches = 0
        for cfg, position in _launches(configs):
            # the control's launches at the start (position 0) and the end (1), all blessed as the session's
            count = control.launches_at(CONTROL_LAUNCHES, control.START if position == 0 else control.END) \
                if cfg == CONTROL else 1
            for _ in range(count):
                # measure_config(bless=True): the bless's repeat policy, and a cell that
                # gate.bless_refusal refuses is not proposed (its earlier entry stays; the control's
                # refused launch is not pooled: control._with_earlier_launches)
                policy = throughput.repeat_policy(3, bless=True)
                runs = _measure(model, cfg, list(range(CELLS)), model.launch(day, position), 3, {}, policy=policy)
                launches += cfg == CONTROL
                for cell, run in runs.items():
                    status, why = gate.measurement_status(policy, run.primary, run.invalid, [])
                    if gate.bless_refusal(status, why, run.primary) is not None:
                        COUNTS["bless_refused"] = COUNTS.get("bless_refused", 0) + 1
                        continue
                    samples = _samples(run.samples)
                    if cfg == CONTROL:
                        for k, v in samples.items():
                            pooled[cell].setdefault(k, []).extend(v)
                        samples = pooled[cell]
                    entries[cfg][cell] = gate.baseline_cell_entry(
                        WORKLOAD, samples, entries[cfg][cell], session=f"s{s}",
                        launches=launches if cfg == CONTROL else None)
    return entries  # a cell refused in every blessed session has no baseline (None): judged as missing


def judge(model: Model, cfg: int, entries: list[dict[str, Any] | None], speed: float,
          drops: dict[int, float], spread: dict[str, float] | None = None,
          noise: dict[str, dict[str, float]] | None = None) -> dict[str, gate.CellVerdict]:
    """One launch of today's session: first pass, confirmation of flagged cells, final verdicts."""
    policy = throughput.repeat_policy(3)
    runs = _measure(model, cfg, list(range(CELLS)), speed, 3, drops)
    inputs = {}
    for cell, run in runs.items():
        status, why = gate.measurement_status(policy, run.primary, run.invalid, [])
        inputs[f"c{cell}"] = gate.CellInput(entries[cell], _samples(run.samples), status, why, WORKLOAD)
    first = gate.judge_config(inputs, launch_spread=spread, cell_noise=noise)
    flagged = [int(name[1:]) for name, v in first.items() if v.flagged]
    if not flagged:
        return first
    # measure_config's confirmation: throughput.confirm_in_stages (6 fresh repeats, 6 more unless cleared)
    key = "control_repeats" if cfg == CONTROL else "config_repeats"

    def measure(name: str, r: int) -> dict[str, float]:
        COUNTS[key] = COUNTS.get(key, 0) + 1
        return model.repeat(cfg, int(name[1:]), speed, drops.get(int(name[1:]), 0.0))

    def judged(runs: Any) -> dict[str, gate.CellVerdict]:
        confirmations = {name: _samples(run.samples) for name, run in runs.items()}
        return gate.judge_config(inputs, confirmations, launch_spread=spread, cell_noise=noise)

    _, verdicts = throughput.confirm_in_stages([f"c{c}" for c in flagged], measure, lambda s: s["output_throughput"],
                                               judged)
    return verdicts


def _record(name: str, cell: str, v: gate.CellVerdict) -> ControlJudgedData:
    m = v.metric("output_throughput")
    median = m.current_median if m is not None else None
    return {"config": name, "cell": cell, "verdict": v.as_dict(), "metrics": {"output_throughput": median},
            "hardware_profile": "sim", "host": ""}


def session(model: Model, configs: int, scenario: str) -> dict[str, Any]:
    """One blessed world and today's session under ``scenario``: what failed and what caught it."""
    who, where, drop = SCENARIOS[scenario]
    COUNTS.clear()
    baseline = bless(model, configs)
    refused = COUNTS.get("bless_refused", 0)
    COUNTS.clear()
    # what the suite passes: the launch-to-launch spread pooled over every config's baseline file
    sections = [{f"c{i}": e for i, e in enumerate(baseline[c]) if e is not None} for c in range(configs)]
    spread = gate.launch_spread(sections)
    noise = gate.cell_noise(sections)
    day = model.session()
    records: list[ControlJudgedData] = []
    out: dict[str, Any] = {"cells": 0, "failed_cells": 0, "inconclusive_cells": 0, "flagged_cells": 0,
                           "failing_metrics": {}}
    dropped_cell_caught = False
    dropped_config_cells = False
    blessed_launches = control.blessed_launches({f"c{i}": e for i, e in enumerate(baseline[CONTROL]) if e is not None})
    control_launch = 0
    for cfg, position in _launches(configs):
        slowed = drop and (who == "build" or (cfg != CONTROL and (who == "all" or cfg == 0)))
        drops = {c: drop for c in (range(CELLS) if where == "all" else [0])} if slowed else {}
        name = control.CONTROL if cfg == CONTROL else f"cfg{cfg}"
        # the control's launches at the process's start (position 0) or end (1), the plugin's measure_launches
        at = (control.START if position == 0 else control.END) if cfg == CONTROL else ""
        for _ in range(control.launches_at(CONTROL_LAUNCHES, at) if cfg == CONTROL else 1):
            # control.measure passes no launch_spread / cell_noise to measure_config; the suite does
            verdicts = judge(model, cfg, baseline[cfg], model.launch(day, position), drops,
                             None if cfg == CONTROL else spread, None if cfg == CONTROL else noise)
            control_launch += cfg == CONTROL
            for cell, v in verdicts.items():
                rec = _record(name, cell, v)
                if cfg == CONTROL:
                    rec.update({"kind": control.CONTROL_RECORD, "control_launch": control_launch, "control_at": at,
                                "blessed_launches": blessed_launches})
                records.append(rec)
                out["cells"] += 1
                out["flagged_cells"] += any(m.first_change is not None for m in v.metrics)
                if v.failed:
                    out["failed_cells"] += 1
                    out.setdefault("example", f"{name}: {v.message()}"[:700])
                    for m in v.metrics:
                        if m.status in gate.FAILING:
                            key = f"{m.metric}{' (control)' if cfg == CONTROL else ''}"
                            out["failing_metrics"][key] = out["failing_metrics"].get(key, 0) + 1
                elif v.status == gate.INCONCLUSIVE:
                    out["inconclusive_cells"] += 1
                if cfg == 0 and (tps := v.metric("output_throughput")) is not None and tps.status == gate.REGRESSION:
                    dropped_config_cells = True
                    dropped_cell_caught |= cell == "c0"
                if cfg == 0 and cell == "c0" and scenario == "one_cell_10":
                    out["dropped_cell"] = f"cfg0: {v.message()}"[:700]
    configs_records = [r for r in records if r.get("kind") != control.CONTROL_RECORD]
    moves = gate.config_moves(configs_records)
    relaunched: list[gate.ConfigMove] = []
    out["relaunches"] = 0
    while RELAUNCH and (names := gate.relaunch_candidates(moves, relaunched)):
        # flagged configs launched once more at the session's end, all their cells, judged on all launches
        for name in names:
            cfg = int(name[3:])
            slowed = drop and (who in ("all", "build") or cfg == 0)
            drops = {c: drop for c in (range(CELLS) if where == "all" else [0])} if slowed else {}
            before = COUNTS.get("config_repeats", 0)
            verdicts = judge(model, cfg, baseline[cfg], model.launch(day, 1.0), drops, spread, noise)
            COUNTS["relaunch_repeats"] = COUNTS.get("relaunch_repeats", 0) + COUNTS["config_repeats"] - before
            COUNTS["config_repeats"] = before
            again: list[ControlJudgedData] = [{**_record(name, cell, v), "kind": control.RELAUNCH_RECORD,
                      "relaunch": 1 + sum(m.config == name for m in relaunched)} for cell, v in verdicts.items()]
            relaunched += gate.config_moves(again)
            records += again
            out["relaunches"] += 1
    findings = [f for f in gate.judge_session(moves, relaunched) if f.failed]
    for f in findings:
        out.setdefault("example", f.message[:700])
        key = f"{f.metric} (config against its session)"
        out["failing_metrics"][key] = out["failing_metrics"].get(key, 0) + 1
    judgement = control.judge(records, configs_records)
    group = judgement.groups[0] if judgement.groups else None
    uniform_failed = bool(group and group.failed and not group.control_failures)
    if uniform_failed:
        out["failing_metrics"]["uniform shift"] = out["failing_metrics"].get("uniform shift", 0) + 1
    any_failure = bool(out["failed_cells"] or findings or (judgement.failed))
    out["failed"] = any_failure
    out["inconclusive"] = bool(out["inconclusive_cells"]) and not any_failure
    out["kind"] = group.kind if group else ""
    out["uniform_failed"] = uniform_failed
    if scenario == "one_cell_10":
        out["caught"] = dropped_cell_caught
    elif who == "one":
        out["caught"] = dropped_config_cells or any(f.config == "cfg0" for f in findings) or uniform_failed
    elif who == "all":
        out["caught"] = uniform_failed
    elif who == "build":  # the control moved with the configs: only a failure of some kind can say so
        out["caught"] = any_failure
    out["caught_any"] = any_failure
    out.update(COUNTS)
    out["bless_refused"] = refused
    out["restarts"] = configs + CONTROL_LAUNCHES + out["relaunches"]
    return out


def _settings(relaunch: bool, control_launches: int, shapes: dict[str, Shape], first_stage: int) -> None:
    """A worker process takes the command line's settings (whatever the start method)."""
    global RELAUNCH, CONTROL_LAUNCHES
    RELAUNCH, CONTROL_LAUNCHES = relaunch, control_launches
    SHAPES.update(shapes)
    throughput.CONFIRM_FIRST_STAGE = first_stage


def _task(job: tuple[str, str, int, int, int]) -> tuple[str, str, dict[str, Any]]:
    shape_name, scenario, seed, n, configs = job
    rng = random.Random(seed)
    totals: dict[str, Any] = {"trials": 0, "failed": 0, "inconclusive": 0, "caught": 0, "caught_any": 0, "relaunches": 0,
                              "config_repeats": 0, "control_repeats": 0, "bless_refused": 0, "restarts": 0,
                              "relaunch_repeats": 0,
                              "uniform_failed": 0, "cells": 0, "failed_cells": 0, "inconclusive_cells": 0,
                              "flagged_cells": 0, "failing_metrics": {}, "kinds": {}}
    for _ in range(n):
        got = session(Model(SHAPES[shape_name], rng), configs, scenario)
        totals["trials"] += 1
        for key in ("failed", "inconclusive", "caught", "caught_any", "uniform_failed", "cells", "failed_cells", "relaunches",
                    "inconclusive_cells", "flagged_cells", "config_repeats", "control_repeats", "bless_refused", "restarts",
                    "relaunch_repeats"):
            totals[key] += int(got.get(key) or 0)
        for key, count in got["failing_metrics"].items():
            totals["failing_metrics"][key] = totals["failing_metrics"].get(key, 0) + count
        totals["kinds"][got["kind"]] = totals["kinds"].get(got["kind"], 0) + 1
        if got.get("example") and scenario == "unchanged":
            totals.setdefault("examples", {})[got["example"]] = 1
        if scenario == "one_cell_10" and not got.get("caught") and got.get("dropped_cell"):
            totals.setdefault("examples", {})[got["dropped_cell"]] = 1
    return shape_name, scenario, totals


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


def _chunks(total: int, size: int) -> list[int]:
    return [min(size, total - i) for i in range(0, total, size)]


#: Targets of the Done-when (a scenario's catch rate, or the unchanged sweeps' failure rate).
TARGETS = {"unchanged": 0.02, "one_cell_10": 0.95, "whole_config_10": 0.95, "every_config_5": 0.95}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweeps", type=int, default=1000, help="simulated unchanged sessions per shape")
    ap.add_argument("--trials", type=int, default=400, help="simulated sessions per drop scenario and shape")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--configs", type=int, default=CONFIGS, help="configs per session (the campaign's 18)")
    ap.add_argument("--launch-shift", type=float, default=None, help="override every shape's per-launch shift")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: all CPUs)")
    ap.add_argument("--examples", type=int, default=2, help="failures of unchanged sessions to print per shape")
    ap.add_argument("--no-relaunch", dest="relaunch", action="store_false",
                    help="no relaunch of flagged configs (a controller that cannot relaunch: the one-launch rule)")
    ap.add_argument("--control-launches", type=int, default=DEFAULT_CONTROL_LAUNCHES,
                    help="launches of the control per session, half at its start and half at its end, in the blessed "
                         "sessions too (the profile's control_launches; default %(default)s)")
    ap.add_argument("--control-once", dest="control_launches", action="store_const", const=1,
                    help="the control measured at the session's start only (--control-launches 1)")
    ap.add_argument("--confirm-first-stage", type=int, default=throughput.CONFIRM_FIRST_STAGE,
                    help="repeats of a confirmation's first stage (throughput.CONFIRM_FIRST_STAGE; default %(default)s)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    global RELAUNCH, CONTROL_LAUNCHES
    RELAUNCH, CONTROL_LAUNCHES = args.relaunch, args.control_launches
    if args.launch_shift is not None:
        for name in list(SHAPES):
            SHAPES[name] = replace(SHAPES[name], launch=args.launch_shift)
    print(f"gate simulation: {args.configs} configs x {CELLS} cells x {len(gate.GATED_METRICS)} metrics + a control "
          f"launched {CONTROL_LAUNCHES} time(s) a session, confirmations in stages of {args.confirm_first_stage} + rest, "
          f"K={gate.DEFAULT_SESSIONS_KEPT} blessed sessions, 3 repeats + {throughput.CONFIRM_REPEATS} confirmation",
          flush=True)
    jobs = []
    for si, shape in enumerate(args.shapes):
        for ki, scenario in enumerate(args.scenarios):
            total = args.sweeps if scenario == "unchanged" else args.trials
            for ci, n in enumerate(_chunks(total, 10)):
                jobs.append((shape, scenario, args.seed * 1_000_003 + si * 10_007 + ki * 1_009 + ci, n, args.configs))
    t0 = time.monotonic()
    parts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with multiprocessing.Pool(max(1, args.jobs), _settings,
                              (RELAUNCH, CONTROL_LAUNCHES, SHAPES, args.confirm_first_stage)) as pool:
        for shape, scenario, part in pool.imap_unordered(_task, jobs):
            parts.setdefault((shape, scenario), []).append(part)
    print(f"{len(jobs)} chunks on {args.jobs} processes in {time.monotonic() - t0:.0f} s")
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "shapes": {}}
    ok = True
    for shape in args.shapes:
        s = SHAPES[shape]
        print(f"{shape}: repeat noise {'/'.join(f'{x:.0%}' for x in sorted(set(s.noise)))}, day {s.day:.0%}, "
              f"per-launch {s.launch:.0%}, outliers {s.outlier_rate:.0%} x {s.outlier_size:.0%}"
              f"{f', Student-t {s.tails:.0f} dof' if s.tails else ''}{f', drift {s.drift:.0%}' if s.drift else ''}")
        figures["shapes"][shape] = {}
        for scenario in args.scenarios:
            c = _merge(parts[(shape, scenario)])
            figures["shapes"][shape][scenario] = c
            n = c["trials"]
            if scenario == "unchanged":
                bad = c["failed"] + c["inconclusive"]
                good = bad / n <= TARGETS["unchanged"]
                ok &= good
                print(f"  cost: {c['config_repeats'] / (n * args.configs * CELLS):.2f} repeats per config cell "
                      f"(first pass, extra, confirmations) + {c['relaunch_repeats'] / (n * args.configs * CELLS):.2f} "
                      f"in relaunches, {c['control_repeats'] / n:.1f} control repeats "
                      f"and {c['restarts'] / n:.2f} restarts a sweep; blessed cells refused {c['bless_refused']}")
                print(f"  unchanged: sessions failing {_fig(c['failed'], n)}, inconclusive {c['inconclusive'] / n:.1%} "
                      f"{'OK' if good else 'MISSED'} (<= 2% together); cells failing {c['failed_cells']} of {c['cells']}, "
                      f"confirmation runs {c['flagged_cells'] / max(1, c['cells']):.1%}, relaunches "
                      f"{c['relaunches'] / n:.2f} a session; failing {c['failing_metrics']}")
                for example in list(c.get("examples") or {})[:args.examples]:
                    print("    e.g. " + example.replace("\n", "\n      "))
            else:
                target = TARGETS.get(scenario)
                good = target is None or c["caught"] / n >= target
                ok &= good
                mark = "info" if target is None else ("OK" if good else "MISSED")
                for example in list(c.get("examples") or {})[:args.examples]:
                    print("    missed: " + example.replace("\n", "\n      "))
                print(f"  {scenario}: caught {_fig(c['caught'], n)} {mark} "
                      f"({c['config_repeats'] / (n * args.configs * CELLS):.2f} + {c['relaunch_repeats'] / (n * args.configs * CELLS):.2f} "
                      "repeats per config cell)"
                      f"{f' (>= {target:.0%})' if target else ''}; any failure of the session {c['caught_any'] / n:.1%}; "
                      f"relaunches {c['relaunches'] / n:.2f} a session; "
                      f"kinds {c['kinds']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
