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
the config a profile names in ``control:``; measured once per process (per service instance and
host, not per config) on every throughput cell of the session, before the first config.
Profiles that cannot launch one (an external service, a pool of URLs, no ``lossless_args``, or
``control: none``) keep the per-config rule and the summary says so.

Tolerances (log values, as everywhere in the gate): the uniform shift's standard error is how
much the same figure moved between the blessed sessions (the control's and the configs' noise and
launch-to-launch shifts, which the ratio does not cancel; median-unbiased; at least today's noise,
the control's common change's and the median of the configs'), times sqrt(1 + 1/k) for a
baseline of k sessions; the tolerance is
``max(UNIFORM_FLOOR, Z_UNIFORM x that standard error)``. The control moved when its common change
is beyond ``max(floor, Z_CONFIG x day-to-day spread)``, the rule of a config's step 5.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree import gate, stats

#: The control's baseline file (``baselines/<hardware>/control.yaml``) and its records' config name.
CONTROL = "control"
#: Record kinds: one per measured control cell, and one when no control could be measured.
CONTROL_RECORD = "throughput-control"
CONTROL_UNAVAILABLE = "throughput-control-unavailable"
CONTROL_REPEAT = "throughput-control-repeat"
#: The uniform shift fails beyond max(UNIFORM_FLOOR, Z_UNIFORM standard errors) while the control held.
UNIFORM_FLOOR = 0.025
Z_UNIFORM = 2.5
#: Assumed spread of the uniform shift between sessions when fewer than two blessed sessions show it.
UNIFORM_PRIOR_SPREAD = 0.01
_METRIC = "output_throughput"
#: What the control gates: its output tok/s (its TTFT is recorded, not gated: the configs' TTFT
#: gate covers prefill, and a second TTFT gate would only add false alarms).
GATED = (_METRIC,)

KIND_NONE = "nothing moved beyond the noise"
KIND_CONTROL = "control moved"
KIND_SPECULATIVE = "only speculative configs moved"
KIND_BOTH = "control moved, and the speculative configs moved against it"


@dataclass(frozen=True)
class _Move:
    """A common change of output tok/s (log) with its standard error and blessed sessions' values."""

    shift: float
    se: float
    blessed: Mapping[str, float]
    floor: float


def _move_of(records: Sequence[Mapping[str, Any]]) -> _Move | None:
    for rec in records:
        m = ((rec.get("verdict") or {}).get("metrics") or {}).get(_METRIC)
        if isinstance(m, Mapping) and m.get("config_shift") is not None and m.get("config_shift_se") is not None:
            return _Move(math.log1p(float(m["config_shift"])), float(m["config_shift_se"]),
                         {str(k): float(v) for k, v in (m.get("config_blessed_shifts") or {}).items()},
                         float(m.get("tolerance_floor") or 0.05))
    return None


def _median_value(records: Sequence[Mapping[str, Any]], cell: str) -> float | None:
    values = [float(v) for r in records if r.get("cell") == cell
              and stats.is_number(v := (r.get("metrics") or {}).get(_METRIC)) and v > 0]
    return stats.median(values) if values else None


def _change(records: Sequence[Mapping[str, Any]], cell: str) -> float | None:
    for r in records:
        if r.get("cell") == cell:
            m = ((r.get("verdict") or {}).get("metrics") or {}).get(_METRIC)
            if isinstance(m, Mapping) and stats.is_number(m.get("change")):
                return float(m["change"])
    return None


def group_of(rec: Mapping[str, Any]) -> str:
    """Configs are compared with the control of the same hardware profile and host."""
    return f"{rec.get('hardware_profile') or ''}@{rec.get('host') or ''}"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


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
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    kind: str = ""
    failed: bool = False
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
            "uniform_tolerance": self.uniform_tolerance, "kind": self.kind, "failed": self.failed,
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


def _spread(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def judge(records: Sequence[Mapping[str, Any]], configs: Sequence[Mapping[str, Any]], *,
          require_baselines: bool = False, update_mode: bool = False) -> ControlJudgement:
    """The control's verdict, each config's speedup over it and the session's uniform shift.

    ``records``: every record of the session (the control's come as ``CONTROL_RECORD``);
    ``configs``: the configs' throughput records (``report.normalize``)."""
    control = [dict(r) for r in records if r.get("kind") == CONTROL_RECORD]
    if not control:
        reasons = sorted({str(r.get("reason")) for r in records if r.get("kind") == CONTROL_UNAVAILABLE})
        return ControlJudgement(False, "; ".join(reasons) or "no control was measured (no throughput cell ran)")
    out = ControlJudgement(True)
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in control:
        groups.setdefault(group_of(rec), []).append(rec)
    for name, members in sorted(groups.items()):
        out.groups.append(_judge_group(name, members, [dict(c) for c in configs if group_of(c) == name],
                                       require_baselines, update_mode))
    return out


def _judge_group(name: str, control: list[dict[str, Any]], configs: list[dict[str, Any]],
                 require_baselines: bool, update_mode: bool) -> GroupJudgement:
    cells = sorted({str(r.get("cell")) for r in control})
    source = str(control[0].get("control_source") or "non-speculative launch")
    g = GroupJudgement(name, source, len(cells))
    host = name.split("@", 1)[1] or "this host"
    g.lines.append(f"control: {source} on {host}, measured once on {len(cells)} cell(s) "
                   f"({name.split('@', 1)[0] or 'unknown hardware'})")
    # the control's own cells: failures fail the run like a config's
    for rec in control:
        verdict = rec.get("verdict") or {}
        status = str(verdict.get("status") or rec.get("status") or "")
        refusal = rec.get("bless_refused")
        if refusal:
            g.control_failures.append(f"{rec.get('cell')}: not blessed: {refusal}; retry with: {rec.get('retry')}")
        elif status in gate.FAILING or (require_baselines and status in (gate.MISSING, gate.THIN, gate.INCONCLUSIVE)):
            metrics = verdict.get("metrics") or {}
            detail = "; ".join(str(m.get("message")) for m in metrics.values() if isinstance(m, Mapping) and m.get("message"))
            detail = detail or "; ".join(str(x) for x in verdict.get("reasons") or []) or status
            g.control_failures.append(f"{rec.get('cell')}: {status.upper()}: {detail}"
                                      + (" (--ddtree-require-baselines)" if status not in gate.FAILING else ""))
    if update_mode:
        g.kind = "blessed, not judged"
        g.failed = bool(g.control_failures)
        g.lines.extend(["  " + f for f in g.control_failures] or ["  the control's cells were blessed"])
        _speedup_table(g, control, configs)
        return g
    ctl = _move_of(control)
    control_moved = False
    if ctl is not None:
        blessed = list(ctl.blessed.values())
        measured = _spread(blessed) or 0.0
        k = max(1, len(blessed))
        day = max(gate.SPECS[_METRIC].day_shift, measured)
        g.control_tolerance = max(ctl.floor, gate.Z_CONFIG * math.sqrt(day**2 * (1.0 + 1.0 / k) + ctl.se**2))
        half = 1.96 * math.sqrt(day**2 * (1.0 + 1.0 / k) + ctl.se**2)
        g.control_change = math.expm1(ctl.shift)
        g.control_interval = (math.expm1(ctl.shift - half), math.expm1(ctl.shift + half))
        control_moved = abs(ctl.shift) > g.control_tolerance
        g.control_status = "moved" if control_moved else "held"
        g.lines.append(f"  control output tok/s against its baseline: {_pct(g.control_change)} (95% interval "
                       f"{_pct(g.control_interval[0])} .. {_pct(g.control_interval[1])}; tolerance "
                       f"{g.control_tolerance:.1%} = max(floor, {gate.Z_CONFIG} x day-to-day spread {day:.1%}): "
                       f"{'MOVED' if control_moved else 'held'}")
    else:
        g.control_status = "unknown"
        g.lines.append("  control output tok/s: no judged baseline for 3 or more of its cells (create it with "
                       "--ddtree-update-baselines); the uniform shift cannot be stated")
    if g.control_failures:
        g.control_status = "failed"
        g.lines.extend("  control " + f for f in g.control_failures)
    moves: dict[str, _Move] = {}
    for cfg in sorted({str(c.get("config")) for c in configs}):
        move = _move_of([c for c in configs if c.get("config") == cfg])
        if move is not None:
            moves[cfg] = move
    speculative_moved = False
    if ctl is not None and moves:
        speedups = {cfg: m.shift - ctl.shift for cfg, m in moves.items()}
        uniform = stats.median(list(speedups.values()))
        # blessed sessions: each session's median speedup change (the control's and the configs'
        # launches of that session), so the tolerance sees how much the ratio moves between launches
        per_session = []
        for sid, c_value in ctl.blessed.items():
            values = [m.blessed[sid] - c_value for m in moves.values() if sid in m.blessed]
            if values:
                per_session.append(stats.median(values))
        between = _spread(per_session)
        if between is not None:  # median-unbiased: a sample spread of few sessions is mostly below the truth
            between /= math.sqrt(gate.median_chi2_share(len(per_session) - 1))
        k = max(1, len(per_session))
        between_used = between if between is not None and len(per_session) >= 3 else max(
            between or 0.0, UNIFORM_PRIOR_SPREAD)
        # the control's own launch-to-launch shift is not in one session's figures; a config's is, in
        # the spread of each config against the others between blessed sessions (many degrees of
        # freedom): the control's relaunches are taken to move as much
        cfg_moves = [m for m in gate.config_moves(configs) if m.metric == _METRIC and m.group == name]
        if len(cfg_moves) >= 3:
            between_used = max(between_used, gate.config_wobble(cfg_moves))
        config_se = stats.median([m.se for m in moves.values()]) * math.sqrt(
            (math.pi / 2.0 if len(moves) > 2 else 1.0) / len(moves))
        # one session's uniform shift varies by the blessed sessions' spread (their control's and
        # configs' noise and launch shifts), at least by today's noise; the baseline is the mean of k
        se = math.sqrt(max(between_used**2, ctl.se**2 + config_se**2) * (1.0 + 1.0 / k))
        g.uniform_shift = math.expm1(uniform)
        g.uniform_interval = (math.expm1(uniform - 1.96 * se), math.expm1(uniform + 1.96 * se))
        g.uniform_tolerance = max(UNIFORM_FLOOR, Z_UNIFORM * se)
        speculative_moved = abs(uniform) > g.uniform_tolerance
        slower = -uniform > g.uniform_tolerance
        for cfg, value in speedups.items():
            g.configs.setdefault(cfg, {})["speedup_change"] = math.expm1(value)
        g.lines.append(
            f"  uniform shift of the {len(moves)} speculative config(s) over the control (median of their "
            f"speedup changes): {_pct(g.uniform_shift)} (95% interval {_pct(g.uniform_interval[0])} .. "
            f"{_pct(g.uniform_interval[1])}; tolerance {g.uniform_tolerance:.1%} = max({UNIFORM_FLOOR:.1%}, "
            f"{Z_UNIFORM} x standard error; between blessed sessions {between_used:.1%} from {len(per_session)})")
        if not per_session:
            g.lines.append("  not judged: the control and the configs share no blessed session, so the speedup they "
                           "were blessed at is not known; bless them together (one --ddtree-update-baselines run)")
            speculative_moved = slower = False
        if slower and not control_moved and not g.control_failures:
            g.failed = True
            g.lines.append(
                f"  REGRESSION: every speculative config is {_pct(g.uniform_shift)} slower against the "
                "non-speculative control, which held: the speculative path slowed down as a whole (a build, a "
                "kernel, a drafter), not the machine. If intended, re-bless with --ddtree-update-baselines")
    elif not moves:
        g.lines.append("  no speculative config of this host was judged with a common change (3 or more cells "
                       "with baselines): no uniform shift")
    g.kind = (KIND_BOTH if control_moved and speculative_moved else KIND_CONTROL if control_moved
              else KIND_SPECULATIVE if speculative_moved else KIND_NONE)
    if ctl is not None:
        g.lines.append(f"  verdict: {g.kind}")
    g.failed = g.failed or bool(g.control_failures)
    _speedup_table(g, control, configs)
    return g


def _speedup_table(g: GroupJudgement, control: list[dict[str, Any]], configs: list[dict[str, Any]]) -> None:
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
            shown.append(f"{cell} {num / den:.2f}x" + (f" ({_pct(change)})" if change is not None else ""))
        if per_cell:
            g.configs.setdefault(cfg, {})["cells"] = per_cell
            total = g.configs[cfg].get("speedup_change")
            rows.append(f"    {cfg}: " + ", ".join(shown)
                        + (f"; all cells {_pct(total)}" if total is not None else ""))
    if rows:
        g.lines.append("  speedup over the control (config / control output tok/s; change against the blessed speedup):")
        g.lines.extend(rows)


def measure(session: Any, cells: Sequence[Any]) -> str:
    """Measure the control once in this process, on ``cells``, and record it; returns what was done.

    ``session`` is the process's ``DDTreeSession`` (manager, profile, settings, recorder). The
    control is launched in the instance's own slot like any config (the next config restarts);
    its cells are judged against ``control.yaml`` (first pass and confirmation of flagged cells,
    as a config's), or proposed for it under ``--ddtree-update-baselines`` when a bless can trust
    them. Nothing here raises: a control that cannot be launched or measured is recorded with the
    reason (``CONTROL_UNAVAILABLE``) and the session keeps the per-config rule.
    """
    from pytest_ddtree import throughput
    from pytest_ddtree.baselines import BaselineError
    from pytest_ddtree.configs import ConfigError, parse_config_name
    from pytest_ddtree.load import LoadError
    from pytest_ddtree.service.base import ServiceError

    recorder = session.recorder
    profile = session.profile
    settings = session.settings
    choice = getattr(profile, "control", None)
    if not cells:
        return "no throughput cells"
    if choice == "none":
        recorder.record(CONTROL_UNAVAILABLE, None, {"reason": f"profile {profile.name} sets control: none"})
        return "off"
    try:
        if choice:
            service = session.manager.ensure(parse_config_name(choice))
            source = f"config {choice} (the profile's control)"
        else:
            service = session.manager.ensure_reference()
            source = "non-speculative launch (the profile's lossless_args)"
    except (ServiceError, ConfigError) as exc:
        recorder.record(CONTROL_UNAVAILABLE, None, {"reason": str(exc)})
        return "unavailable"
    baselines = session.baselines(service.server_info)
    section: Any = None
    baseline_file: Any = None
    baseline_error: str | None = None
    try:
        baseline_file = baselines.load(CONTROL)
        if not baselines.update_mode:
            section = gate.validate_section((baseline_file or {}).get("metrics"), str(baselines.path_for(CONTROL)))
    except (BaselineError, gate.BaselineFormatError) as exc:
        baseline_error = str(exc)
    try:
        campaign = throughput.measure_config(
            service.client, cells, settings.repeats,
            lambda name, r, result: recorder.record(CONTROL_REPEAT, CONTROL, throughput.sample_record(name, r, result)),
            baseline=section, tokenizer_path=profile.tokenizer_path(), vocab_size=profile.vocab_size,
            dataset=str(settings.dataset) if settings.dataset else None, speculative=bool(choice),
            bless=baselines.update_mode, gated=GATED)
    except LoadError as exc:
        recorder.record(CONTROL_UNAVAILABLE, None, {"reason": f"the control could not be measured: {exc}"})
        return "unavailable"
    for workload in cells:
        ev = throughput.evaluate_cell(CONTROL, workload, campaign, baseline_file, baselines.path_for(CONTROL),
                                      baselines.hardware_profile, baselines.update_mode, baseline_error)
        record = dict(ev.record)
        record["control_source"] = source
        if ev.baseline_problem:
            record["baseline_problem"] = ev.baseline_problem
        if baselines.update_mode:
            refusal = ev.bless_refusal()
            if refusal is None:
                entry = gate.baseline_cell_entry(record["workload"], ev.samples, existing=ev.baseline_cell,
                                                 specs=[gate.SPECS[k] for k in GATED], session=settings.session_stamp)
                recorder.propose_baseline(CONTROL, "metrics", {workload.name: entry})
            else:
                record["bless_refused"] = refusal
                record["retry"] = f"{baselines.create_command(CONTROL).split(' --ddtree-config')[0]} " \
                                  f"--ddtree-workload={workload.name}"
        recorder.record(CONTROL_RECORD, CONTROL, record)
    return "measured"


def cells_of(items: Sequence[Any]) -> list[Any]:
    """The throughput cells (``workload`` parameters) of the collected tests, each once, in order;
    cells skipped for the profile (``max_context``) are left out."""
    cells: list[Any] = []
    seen: set[str] = set()
    for item in items:
        spec = getattr(item, "callspec", None)
        workload = spec.params.get("workload") if spec is not None else None
        name = getattr(workload, "name", None)
        if workload is None or not isinstance(name, str) or name in seen or item.get_closest_marker("skip"):
            continue
        seen.add(name)
        cells.append(workload)
    return cells
