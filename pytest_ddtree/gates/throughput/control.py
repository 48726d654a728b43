"""The session's control: a non-speculative launch measured on the throughput cells (no pytest).

Why: the campaign asks what speculation buys, and a machine's day (a slower node, another
driver, a warmer room) moves every launch alike. Measured in the same session on the same host,
the control cancels that day in the ratio config / control, so:

* each config's **speedup over the control** is shown per cell (config tok/s / control tok/s)
  with its change against the blessed speedup;
* the **session's uniform shift** - the median over the configs of their common change of output
  tok/s minus the control's, i.e. how much the speedup of every config moved together - is
  stated with its 95% interval, and a uniform slowdown beyond its tolerance while the control
  held fails the run ("only speculative configs moved": a DDTree build slower everywhere, which
  the per-config rule would take for a slower day);
* the **control's own tok/s** is gated against its baseline (``baselines/<hardware>/control.yaml``,
  the same layout as a config's) like a config's cells, so a whole build that slows down
  everything is seen too ("control moved").

The control is the launch the lossless gate already makes (the profile's ``lossless_args``), or
the config a profile names in ``control:``; measured in each process (per service instance and
host, not per config) on every throughput cell of the session, the profile's ``control_launches``
times (default 2): half before its first config, each a fresh launch, and half after its last where
it measured 3 or more configs (``wants_end_launch``). The launches at each end weigh half, so their
mean sits where the configs' median does and a machine that drifts over the session cancels, and
the control's own launch shift averages over all of them (``_control_launches``); a bless records
how many launches each blessed session pooled, so the baseline's share of it is known too. Profiles
that cannot launch one (an external service, a pool of URLs, no ``lossless_args``, or ``control:
none``) keep the per-config rule and the summary says so.

The uniform shift is estimated twice and the two are weighed by their noise (inverse variance,
their covariance through the configs' median counted): (a) the configs' median speedup change over
the control - the day cancels, the control's own launch shift does not (its variance: the
launch-to-launch spread, pooled from every config's blessed sessions against the others of its
session, times the share of it left in the mean of the control's launches today and in its blessed
sessions); (b) the configs' median change against their baselines - the control's launch does not
enter, the day does (at least the assumed day shift, 2%, or the blessed days' spread). Restart noise
widens (a), a day shift (b); together they are tighter than either. When the control moved beyond
its own tolerance the day was no ordinary one and (a) stands alone. The tolerance is
``max(UNIFORM_FLOOR, Z_UNIFORM x the combined standard error)``, Z_UNIFORM widened to a t quantile of
the launch spread's degrees of freedom (Satterthwaite's, ``uniform_se``). The control moved when its common
change is beyond ``Z_CONFIG`` of its own standard error (day and launch parts, as a config's step 5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT
from pytest_ddtree.gates.throughput import baseline, rule, session_check, verdicts
from pytest_ddtree.measure import stats
from pytest_ddtree.gates.throughput.baseline import CONTROL
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.shapes import ControlJudgedData, JudgedCellData, RawRecord
from pytest_ddtree.records.words import RecordKind, Status


#: The control's baseline file (``baselines/<hardware>/control.yaml``) and its records' config name.
#: Record kinds: one per measured control cell, and one when no control could be measured.
CONTROL_RECORD = RecordKind.THROUGHPUT_CONTROL
CONTROL_UNAVAILABLE = RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE
CONTROL_REPEAT = RecordKind.THROUGHPUT_CONTROL_REPEAT
#: The uniform shift fails beyond max(UNIFORM_FLOOR, Z_UNIFORM standard errors) while the control held
#: (a t quantile of the same tail where its launch spread is estimated: ``uniform_se``). Why 2.6 (one-sided
#: 0.47% a look, <= 0.93% for the launch policy's two; of the sweep's 2% budget): once the standard
#: error counts the control's repeat noise and the launch spread's own uncertainty, 3.0 caught every
#: config 5% slower ~88% of the time (a model of the two looks; 95% was the target); 2.6 with
#: ``launches.CONTINUE_SHARE`` 0.3 caught it 97.2% / 98.8% of 400 (restart3 / restart1,
#: bench_gate.py) and failed 1.1% / 0.4% of 1000 unchanged sweeps; 2.75 failed 0.6% / 0.1% of them
#: but caught it only 93.2% under restart3.
UNIFORM_FLOOR = 0.025
Z_UNIFORM = 2.6
#: Assumed spread of the uniform shift between sessions when fewer than two blessed sessions show it.
UNIFORM_PRIOR_SPREAD = 0.01
_METRIC = OUTPUT_THROUGHPUT
#: What the control gates: its output tok/s (its TTFT is recorded, not gated: the configs' TTFT
#: gate covers prefill, and a second TTFT gate would only add false alarms).
GATED = (_METRIC,)

KIND_NONE = "nothing moved beyond the noise"
KIND_CONTROL = "control moved"
KIND_SPECULATIVE = "only speculative configs moved"
KIND_BOTH = "control moved, and the speculative configs moved against it"

#: Where in its process a launch of the control is measured (``control_at`` of its records).
START = "start"
END = "end"


@dataclass(frozen=True)
class _Move:
    """A common change of output tok/s (log) with its standard error and blessed sessions' values."""

    shift: float
    se: float
    blessed: Mapping[str, float]
    floor: float


def _move_of(records: Sequence[JudgedCellData]) -> _Move | None:
    """The common change of output tok/s of one launch (its records)."""
    for rec in records:
        m = rec["verdict"]["metrics"].get(_METRIC)
        shift, shift_se = (m.get("config_shift"), m.get("config_shift_se")) if m is not None else (None, None)
        if m is not None and shift is not None and shift_se is not None:
            return _Move(math.log1p(float(shift)), float(shift_se),
                         {str(k): float(v) for k, v in (m.get("config_blessed_shifts") or {}).items()},
                         float(m.get("tolerance_floor") or 0.05))
    return None


def launch_of(rec: ControlJudgedData) -> str:
    """Which launch of the control a record belongs to (its process and its number in it): a session
    measures the control ``control_launches`` times per process, at its start and at its end (``measure``)."""
    return f"{rec.get('worker') or ''}#{rec.get('control_launch') or 1}"


def place_of(rec: ControlJudgedData) -> str:
    """``start`` or ``end``: where in its process a launch of the control was measured (records
    without ``control_at``, written before the key existed: launch 2 was the end, launch 1 the start)."""
    at = rec.get("control_at")
    if at in (START, END):
        return str(at)
    return END if rec.get("control_launch") == 2 else START


@dataclass(frozen=True)
class _Launches:
    """The control's launches of one group together: their weighted common change, and the share of
    one launch's own shift that is left in it (1 for one launch, 1 / n for n launches in one place)."""

    move: _Move
    launch_share: float
    count: int


def _control_launches(records: Sequence[ControlJudgedData]) -> _Launches | None:
    """The control's launches of this group together. Within a process its launches at the start and
    those at the end weigh half each, so a machine that drifts over the process cancels whatever the
    number of launches in each place; the processes weigh alike. ``launch_share`` is the sum of the
    squared weights: the variance of one launch's own shift that the weighted mean keeps."""
    launches: dict[str, list[ControlJudgedData]] = {}
    for rec in records:
        launches.setdefault(launch_of(rec), []).append(rec)
    places: dict[str, dict[str, list[_Move]]] = {}
    for key, recs in sorted(launches.items()):
        move = _move_of(recs)
        if move is not None:
            places.setdefault(key.rsplit("#", 1)[0], {}).setdefault(place_of(recs[0]), []).append(move)
    if not places:
        return None
    weighted: list[tuple[float, _Move]] = []
    for by_place in places.values():
        for moves in by_place.values():
            weighted.extend((1.0 / (len(places) * len(by_place) * len(moves)), m) for m in moves)
    first = weighted[0][1]
    move = _Move(sum(w * m.shift for w, m in weighted), math.sqrt(sum((w * m.se) ** 2 for w, m in weighted)),
                 first.blessed, first.floor)
    return _Launches(move, sum(w * w for w, _ in weighted), len(weighted))


def _blessed_share(records: Sequence[ControlJudgedData], blessed: Mapping[str, float]) -> float:
    """The share of one launch's own shift left in the control's baseline: its blessed sessions' mean,
    each session the mean of its launches (``blessed_launches`` of the records, read from control.yaml;
    a session blessed before the count was kept counts as one launch)."""
    counts: dict[str, int] = {}
    for rec in records:
        for sid, n in (rec.get("blessed_launches") or {}).items():
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                counts[str(sid)] = n
    k = max(1, len(blessed))
    return sum(1.0 / counts.get(sid, 1) for sid in blessed) / k**2 if blessed else 1.0


def _median_value(records: Sequence[JudgedCellData], cell: str) -> float | None:
    values = [float(v) for r in records if r.get("cell") == cell
              and stats.is_number(v := (r.get("metrics") or {}).get(_METRIC)) and v > 0]
    return stats.median(values) if values else None


def _change(records: Sequence[JudgedCellData], cell: str) -> float | None:
    for r in records:
        if r.get("cell") == cell:
            m = r["verdict"]["metrics"].get(_METRIC)
            if m is not None and stats.is_number(change := m.get("change")):
                return float(change)
    return None


def group_of(rec: JudgedCellData) -> str:
    """Configs are compared with the control of the same hardware profile and host."""
    return f"{rec.get('hardware_profile') or ''}@{rec.get('host') or ''}"


@dataclass
class GroupJudgement:
    """The control and the uniform shift of one hardware profile and host."""

    group: str
    source: str
    cells: int
    control_change: float | None = None  # relative
    control_interval: tuple[float, float] | None = None
    control_tolerance: float | None = None
    control_status: str = "unknown"  # held / moved / failed / unknown (no baseline)
    control_failures: list[str] = field(default_factory=list)
    uniform_shift: float | None = None  # relative
    uniform_interval: tuple[float, float] | None = None
    uniform_tolerance: float | None = None
    uniform_parts: dict[str, float] = field(default_factory=dict)  # the two estimates and their weight
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    kind: str = ""
    failed: bool = False
    uniform_failure: str = ""  # why the uniform shift fails the session, in one sentence ("" where it does not)
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group, "source": self.source, "cells": self.cells,
            "control_change": self.control_change,
            "control_change_ci": list(self.control_interval) if self.control_interval else None,
            "control_tolerance": self.control_tolerance, "control_status": self.control_status,
            "control_failures": self.control_failures,
            "uniform_shift": self.uniform_shift,
            "uniform_shift_ci": list(self.uniform_interval) if self.uniform_interval else None,
            "uniform_tolerance": self.uniform_tolerance, "uniform_parts": self.uniform_parts or None, "kind": self.kind, "failed": self.failed,
            "configs": self.configs,
        }


@dataclass
class ControlJudgement:
    """Everything the session end says about the control (``judge``)."""

    available: bool
    reason: str = ""  # why there is no control
    groups: list[GroupJudgement] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(g.failed for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {"available": self.available, "reason": self.reason or None,
                "groups": [g.as_dict() for g in self.groups], "failed": self.failed}

    def text(self) -> str:
        if not self.available:
            return (f"no control in this session: {self.reason}. The configs are judged by the per-config rule "
                    "(each against its baseline, and against the session's other configs); a build that slows "
                    "every config alike is seen only beyond about three day-to-day spreads.")
        return "\n\n".join("\n".join(g.lines) for g in self.groups)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def judge(records: Sequence[RawRecord], configs: Sequence[JudgedCellData], *,
          require_baselines: bool = False, update_mode: bool = False, z_uniform: float = Z_UNIFORM,
          interrupted: bool = False) -> ControlJudgement:
    """The control's verdict, each config's speedup over it and the session's uniform shift.

    ``records``: every record of the session (the control's come as ``CONTROL_RECORD``);
    ``configs``: the configs' throughput records (``records.cells.normalize``); ``z_uniform``: the standard
    errors a uniform slowdown must pass (``launches.uniform_z``: more where the launch policy
    looked more than once, so the looks together spend no more than their error budget)."""
    control = records_mod.control_judged(records)
    if not control:
        reasons = sorted({r["reason"] for r in records_mod.control_unavailable(records)})
        if interrupted and not reasons:  # Ctrl-C (or a stop) before the control finished: say that, not "none ran"
            reasons = ["the session was interrupted before the control's measurement finished: no control, so no "
                       "uniform shift; rerun the session whole"]
        return ControlJudgement(False, "; ".join(reasons) or "no control was measured (no throughput cell ran)")
    out = ControlJudgement(True)
    groups: dict[str, list[ControlJudgedData]] = {}
    for rec in control:
        groups.setdefault(group_of(rec), []).append(rec)
    relaunches = records_mod.judged_relaunches(records)
    for name, members in sorted(groups.items()):
        out.groups.append(_judge_group(name, members, [c for c in configs if group_of(c) == name],
                                       require_baselines, update_mode,
                                       [r for r in relaunches if group_of(r) == name], z_uniform))
    return out


def _judge_group(name: str, control: list[ControlJudgedData], configs: list[JudgedCellData],
                 require_baselines: bool, update_mode: bool,
                 relaunches: Sequence[JudgedCellData] = (), z_uniform: float = Z_UNIFORM) -> GroupJudgement:
    cells = sorted({str(r.get("cell")) for r in control})
    source = str(control[0].get("control_source") or "non-speculative launch")
    g = GroupJudgement(name, source, len(cells))
    host = name.split("@", 1)[1] or "this host"
    g.lines.append(f"control: {source} on {host}, {_count(len({launch_of(r) for r in control}), 'launch', 'launches')} "
                   f"on {_count(len(cells), 'cell', 'cells')} (hardware profile {name.split('@', 1)[0] or 'unknown'})")
    _control_cell_failures(g, control, require_baselines)
    if update_mode:
        g.kind = "blessed, not judged"
        g.failed = bool(g.control_failures)
        g.lines.extend(["  " + f for f in g.control_failures] or ["  the control's cells were blessed"])
        _speedup_table(g, control, configs)
        return g
    launches = _control_launches(control)
    ctl = launches.move if launches is not None else None
    n_ctl = launches.count if launches is not None else 0
    # the share of one launch's own shift in the control's change: today's launches and the blessed ones
    share = ((launches.launch_share + _blessed_share(control, launches.move.blessed)) if launches is not None else 2.0)
    moves = _config_moves(configs, relaunches)
    wobble, day, wobble_dof = _spreads(configs, name, ctl)
    control_moved = _judge_control(g, ctl, n_ctl, share, wobble, day)
    if g.control_failures:
        g.control_status = "failed"
        g.lines.extend("  control " + f for f in g.control_failures)
    speculative_moved = False
    if ctl is not None and moves:
        speculative_moved = _judge_uniform_shift(g, ctl, moves, n_ctl, share, _Spreads(wobble, day, wobble_dof),
                                                 control_moved, z_uniform)
    elif not moves:
        g.lines.append("  no speculative config of this host was judged with a common change (3 or more cells "
                       "with baselines): no uniform shift")
    g.kind = (KIND_BOTH if control_moved and speculative_moved else KIND_CONTROL if control_moved
              else KIND_SPECULATIVE if speculative_moved else KIND_NONE)
    if ctl is not None:
        failing = sorted({f.split(":", 1)[0].split(" (", 1)[0] for f in g.control_failures})
        g.lines.append(f"  verdict: the control's own cell(s) {', '.join(failing)} failed, which fails the session "
                       f"(as a whole: {g.kind})" if failing else f"  verdict: {g.kind}")
    g.failed = g.failed or bool(g.control_failures)
    _speedup_table(g, control, configs)
    return g


def _control_cell_failures(g: GroupJudgement, control: list[ControlJudgedData], require_baselines: bool) -> None:
    """The control's own cells: a failure fails the run like a config's."""
    for rec in control:
        verdict = rec.get("verdict") or {}
        status = str(verdict.get("status") or rec.get("status") or "")
        refusal = rec.get("bless_refused")
        launch = (f" (launch {rec.get('control_launch') or 1}, at the {place_of(rec)} of {rec.get('worker') or 'the process'})"
                  if (rec.get("control_launch") or 1) > 1 else "")
        if refusal:
            g.control_failures.append(f"{rec.get('cell')}: not blessed: {refusal}; retry with: {rec.get('retry')}")
        elif status in verdicts.FAILING or (require_baselines and status in (Status.MISSING, Status.THIN, Status.INCONCLUSIVE)):
            metrics = verdict.get("metrics") or {}
            detail = "; ".join(str(m.get("message")) for m in metrics.values() if isinstance(m, Mapping) and m.get("message"))
            detail = detail or "; ".join(str(x) for x in verdict.get("reasons") or []) or status
            g.control_failures.append(f"{rec.get('cell')}{launch}: {status.upper()}: {detail}"
                                      + (" (--ddtree-require-baselines)" if status not in verdicts.FAILING else ""))


def _config_moves(configs: list[JudgedCellData], relaunches: Sequence[JudgedCellData]) -> dict[str, _Move]:
    """Each speculative config's common change; a relaunched config's is the mean of its launches."""
    moves: dict[str, _Move] = {}
    for cfg in sorted({str(c.get("config")) for c in configs}):
        move = _move_of([c for c in configs if c.get("config") == cfg])
        if move is not None:
            # a relaunched config: the mean of all its launches (its first one was the odd one out)
            again = [m for m in session_check.config_moves([r for r in relaunches if r.get("config") == cfg])
                     if m.metric == _METRIC]
            moves[cfg] = move if not again else _Move(
                (move.shift + sum(m.shift for m in again)) / (1 + len(again)), move.se, move.blessed, move.floor)
    return moves


def _spreads(configs: list[JudgedCellData], name: str, ctl: _Move | None) -> tuple[float, float, int]:
    """How much one launch's common change moves between launches, the blessed days' spread, and
    the degrees of freedom of the first (0 where the prior ``UNIFORM_PRIOR_SPREAD`` stands in)."""
    # how much one launch's common change moves between launches (the configs' blessed sessions,
    # each against the others of its session: many degrees of freedom); the control's relaunches
    # are taken to move as much; and how much the blessed days moved (their configs' median)
    cfg_moves = [m for m in session_check.config_moves(configs) if m.metric == _METRIC and m.group == name]
    # the control's blessed sessions against the configs' median count too: its own launch-to-launch
    # spread is what the estimate over the control carries (and a session of two configs has few others)
    pool = cfg_moves + ([session_check.ConfigMove(CONTROL, _METRIC, "higher", ctl.floor, ctl.shift, ctl.se, ctl.blessed, name)]
                        if ctl is not None and ctl.blessed else [])
    measured, dof = session_check.launch_wobble_dof(pool) if len(pool) >= 3 else (0.0, 0)
    wobble = max(measured, UNIFORM_PRIOR_SPREAD)
    prior_day = verdicts.SPECS[_METRIC].day_shift
    day = max(prior_day, baseline.day_spread([m.blessed for m in cfg_moves]) or 0.0)
    return wobble, day, dof if measured >= UNIFORM_PRIOR_SPREAD else 0


def _judge_control(g: GroupJudgement, ctl: _Move | None, n_ctl: int, share: float, wobble: float, day: float) -> bool:
    """The control's output tok/s against its baseline; whether it moved beyond its tolerance.
    ``share``: how much of one launch's own shift (``wobble``, as a variance) its change carries, from
    today's ``n_ctl`` launches and the blessed sessions' (``_control_launches``, ``_blessed_share``)."""
    control_moved = False
    if ctl is not None:
        k = max(1, len(ctl.blessed))
        control_se = math.sqrt(day**2 * (1.0 + 1.0 / k) + wobble**2 * share + ctl.se**2)
        g.control_tolerance = max(ctl.floor, rule.Z_CONFIG * control_se)
        half = 1.96 * control_se
        g.control_change = math.expm1(ctl.shift)
        g.control_interval = (math.expm1(ctl.shift - half), math.expm1(ctl.shift + half))
        control_moved = abs(ctl.shift) > g.control_tolerance
        g.control_status = "moved" if control_moved else "held"
        verdict = "MOVED beyond it" if control_moved else "held"
        g.lines.append(f"  control output tok/s against its baseline: {stats.fmt_pct(g.control_change)} over "
                       f"{_count(n_ctl, 'launch', 'launches')} this session (95% interval {stats.fmt_pct(g.control_interval[0])} "
                       f"to {stats.fmt_pct(g.control_interval[1])}). It counts as moved beyond {g.control_tolerance:.1%}: "
                       f"{rule.Z_CONFIG:g} times its standard error, from a day-to-day spread of {day:.1%} and a "
                       f"launch-to-launch spread of {wobble:.1%}, and never less than the {ctl.floor:.1%} floor. "
                       f"Verdict: {verdict}")
    else:
        g.control_status = "unknown"
        g.lines.append("  control output tok/s: no judged baseline for 3 or more of its cells (create it with "
                       "--ddtree-update-baselines); the uniform shift cannot be stated")
    return control_moved


@dataclass(frozen=True)
class _Spreads:
    """The noise the uniform shift's standard error is built of: one launch's own spread (log), the
    day-to-day spread, and the degrees of freedom the launch spread was estimated from."""

    wobble: float
    day: float
    wobble_dof: int = 0


def uniform_se(ctl_share: float, ctl_se: float, config_se: float, n: int, k: int, spreads: _Spreads,
               control_moved: bool) -> tuple[float, float, int]:
    """The weight of the estimate over the control, the combined standard error (log) and its
    effective degrees of freedom (0: none of it estimated).

    The estimate over the control carries the control's own launch shift (``wobble`` squared times
    ``ctl_share``, the share of one launch's left in today's and the blessed launches' mean) AND
    today's measurement noise of its change (``ctl_se``): the launch spread, read from blessed
    sessions' changes against the others of their session, comes out at the launch shift alone
    (``bench_gate.py`` restart3: 1.9% for a 2% per-launch shift under 3% repeats), so taking the
    larger of the two instead of their sum (as before) read the control's variance ~30% low there
    and failed unchanged sweeps several times the nominal rate. The configs' median (shared by both estimates) likewise
    carries their launch spread and their measurement noise. The launch spread is estimated
    (``launch_wobble_dof``), so the standard error resting on it is known to its degrees of freedom:
    Satterthwaite's, dof x (se^2 / its launch-spread part)^2, for ``rule.t_widened_z``."""
    wobble, day = spreads.wobble, spreads.day
    median_factor = (math.pi / 2.0 if n > 2 else 1.0) / n
    shared_wobble = wobble**2 * (1.0 + 1.0 / k) * median_factor
    shared = shared_wobble + config_se**2 * median_factor
    a_wobble = wobble**2 * ctl_share
    a = a_wobble + ctl_se**2  # the control's own part
    b = day**2 * (1.0 + 1.0 / k)  # the days' part
    if control_moved:
        w, var, borne = 1.0, a + shared, a_wobble + shared_wobble
    else:
        w = b / (a + b)
        var, borne = a * b / (a + b) + shared, w * w * a_wobble + shared_wobble
    dof = int(spreads.wobble_dof * (var / borne) ** 2) if spreads.wobble_dof > 0 and borne > 0 else 0
    return w, math.sqrt(max(1e-12, var)), dof


def _judge_uniform_shift(g: GroupJudgement, ctl: _Move, moves: Mapping[str, _Move], n_ctl: int, share: float,
                         spreads: _Spreads, control_moved: bool, z_uniform: float = Z_UNIFORM) -> bool:
    """The speculative configs' common move, from their speedups over the control and their change
    against the blessed days (weighted by their noise, ``uniform_se``); a uniform slowdown while the
    control held fails the group. Whether the speculative configs moved."""
    wobble, day = spreads.wobble, spreads.day
    speedups = {cfg: m.shift - ctl.shift for cfg, m in moves.items()}
    over_control = stats.median(list(speedups.values()))
    configs_moved = stats.median([m.shift for m in moves.values()])
    # the blessed sessions the control and the configs share (else the blessed speedup is unknown)
    per_session = [sid for sid in ctl.blessed if any(sid in m.blessed for m in moves.values())]
    # inverse-variance weights of the two estimates of the speculative configs' common move
    # (correlated through the configs' median): restart noise makes the control's estimate wide
    # (its own launch), a day shift the blessed days' one; each is tight where the other is not
    # (a control that moved beyond its tolerance says the day was no ordinary one: the control alone)
    w, se, dof = uniform_se(share, ctl.se, stats.median([m.se for m in moves.values()]), len(moves),
                            max(1, len(ctl.blessed)), spreads, control_moved)
    z_uniform = rule.t_widened_z(z_uniform, dof)
    uniform = w * over_control + (1.0 - w) * configs_moved
    g.uniform_shift = math.expm1(uniform)
    g.uniform_interval = (math.expm1(uniform - 1.96 * se), math.expm1(uniform + 1.96 * se))
    g.uniform_tolerance = max(UNIFORM_FLOOR, z_uniform * se)
    g.uniform_parts = {"over_control": math.expm1(over_control), "over_control_weight": w,
                       "against_blessed_days": math.expm1(configs_moved), "control_launches": n_ctl, "control_launch_share": share,
                       "launch_spread": wobble, "day_spread": day, "launch_spread_dof": spreads.wobble_dof,
                       "effective_dof": dof, "z": z_uniform}
    speculative_moved = abs(uniform) > g.uniform_tolerance
    slower = -uniform > g.uniform_tolerance
    for cfg, value in speedups.items():
        g.configs.setdefault(cfg, {})["speedup_change"] = math.expm1(value)
    g.lines.append(
        f"  uniform shift of the {_count(len(moves), 'speculative config', 'speculative configs')}: "
        f"{stats.fmt_pct(g.uniform_shift)} (95% interval {stats.fmt_pct(g.uniform_interval[0])} to {stats.fmt_pct(g.uniform_interval[1])}). "
        f"It counts beyond {g.uniform_tolerance:.1%}: {z_uniform:.3g} times its standard error "
        f"({'a t quantile of ' + str(dof) + ' degrees of freedom, the launch spread being estimated' if dof else 'a normal quantile'}), "
        f"never less than "
        f"{UNIFORM_FLOOR:.1%}. It weighs their median speedup change over the control "
        f"({stats.fmt_pct(math.expm1(over_control))}, weight {w:.0%}) against their median change against the blessed days "
        f"({stats.fmt_pct(math.expm1(configs_moved))}, weight {1 - w:.0%}), each by its noise (launch-to-launch spread "
        f"{wobble:.1%} over the control's {_count(n_ctl, 'launch', 'launches')}; day-to-day spread {day:.1%})")
    if not per_session:
        g.lines.append("  not judged: the control and the configs share no blessed session, so the speedup they "
                       "were blessed at is not known; bless them together (one --ddtree-update-baselines run)")
        speculative_moved = slower = False
    if slower and not control_moved and not g.control_failures:
        g.failed = True
        g.uniform_failure = (
            f"every speculative config is {abs(g.uniform_shift):.1%} slower (uniform shift "
            f"{stats.fmt_pct(g.uniform_shift)}, beyond {g.uniform_tolerance:.1%}) while the non-speculative control "
            "held: the speculative path slowed down as a whole (a build, a "
            "kernel, a drafter), not the machine. If intended, re-bless with --ddtree-update-baselines")
        g.lines.append(f"  REGRESSION: {g.uniform_failure}")
    return speculative_moved


def _speedup_table(g: GroupJudgement, control: list[ControlJudgedData], configs: list[JudgedCellData]) -> None:
    """Each config's speedup over the control per cell, and its change against the blessed speedup."""
    cells = sorted({str(r.get("cell")) for r in control})
    rows = []
    for cfg in sorted({str(c.get("config")) for c in configs}):
        mine = [c for c in configs if c.get("config") == cfg]
        per_cell: dict[str, Any] = {}
        shown = []
        for cell in cells:
            num, den = _median_value(mine, cell), _median_value(control, cell)
            if num is None or den is None:
                continue
            c_change, k_change = _change(mine, cell), _change(control, cell)
            change = (1.0 + c_change) / (1.0 + k_change) - 1.0 if c_change is not None and k_change is not None else None
            per_cell[cell] = {"speedup": num / den, "change": change}
            shown.append(f"{cell} {num / den:.2f}x" + (f" ({stats.fmt_pct(change)})" if change is not None else ""))
        if per_cell:
            g.configs.setdefault(cfg, {})["cells"] = per_cell
            total = g.configs[cfg].get("speedup_change")
            rows.append(f"    {cfg}: " + ", ".join(shown)
                        + (f"; all cells {stats.fmt_pct(total)}" if total is not None else ""))
    if rows:
        g.lines.append("  speedup over the control (config / control output tok/s; change against the blessed speedup):")
        g.lines.extend(rows)
