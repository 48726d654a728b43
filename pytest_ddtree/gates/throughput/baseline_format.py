"""The baseline file's ``metrics`` and ``sustainable_rate`` sections: the entries a bless writes, and
a section read back and checked (a file without a section reads as an empty one: files written
before a section existed keep loading unchanged)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_ddtree.measure import stats
from pytest_ddtree.metrics import REQUEST_GOODPUT
from pytest_ddtree.gates.throughput import slo_edge
from pytest_ddtree.gates.throughput.verdicts import (
    BaselineFormatError,
    DEFAULT_SESSIONS_KEPT,
    GATED_METRICS,
    MetricBaseline,
    MetricSpec,
    RENAMED_GATES,
)


#: The control's name in baselines/ (its baseline file) and in the records (gates/throughput/control.py).
CONTROL = "control"


def _round(x: float) -> float:
    """6 significant digits: reviewable diffs, no float noise in the YAML."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


def baseline_cell_entry(
    workload: Mapping[str, Any],
    samples: Mapping[str, Sequence[float]],
    existing: Mapping[str, Any] | None = None,
    specs: Sequence[MetricSpec] = GATED_METRICS,
    session: str = "session",
    keep: int = DEFAULT_SESSIONS_KEPT,
    launches: int | None = None,
    slo_share: float | None = None,
) -> dict[str, Any]:
    """The ``metrics.<cell>`` entry after blessing this session's samples.

    The session is appended to the sessions already there (an old single-session entry
    counts as one) and only the last ``keep`` are kept; a workload change starts over, since
    the old numbers measured something else. A tolerance already in ``existing`` (edited by a
    reviewer) is kept; metrics without samples (e.g. acceptance of a non-speculative server)
    are left out. ``launches``: how many launches of the service the session's samples pool (the
    control's, ``gates/throughput/control.py``), kept with the session as ``launches`` (and kept for the sessions
    already there), so a judged session knows how much launch-to-launch noise each blessed one averaged.
    ``slo_share``: an open-loop cell's worst ``SLO_LATENCY_SHARE`` this session (``slo_edge.py``), kept
    with its goodput session as ``slo_latency_share`` (and kept for the sessions already there).
    """
    old_gates = (existing or {}).get("gates") or {}
    if existing is not None and dict(existing.get("workload") or {}) != dict(workload):
        old_gates = {k: {"tolerance": v.get("tolerance")} for k, v in old_gates.items() if isinstance(v, Mapping)}
    gates: dict[str, Any] = {}
    for spec in specs:
        values = [float(v) for v in samples.get(spec.key) or [] if v is not None]
        if not values:
            continue
        old = old_gates.get(spec.key) or {}
        tolerance = old.get("tolerance")
        tolerance = spec.tolerance if not stats.is_number(tolerance) else float(tolerance)
        history: list[dict[str, Any]] = []
        share = slo_share if spec.key == REQUEST_GOODPUT else None
        if "direction" in old:
            counts, shares = launch_counts(old), _session_shares(old)
            history = [{"session": sid, "samples": list(v), **({"launches": counts[sid]} if sid in counts else {}),
                        **({slo_edge.SESSION_KEY: shares[sid]} if sid in shares else {})}
                       for sid, v in MetricBaseline.from_entry(spec.key, old).sessions if v and sid != session]
        history.append({"session": session, "samples": [_round(v) for v in values],
                        **({"launches": int(launches)} if launches is not None else {}),
                        **({slo_edge.SESSION_KEY: _round(share)} if share is not None else {})})
        history = history[-keep:]
        pooled = [v for h in history for v in h["samples"]]
        gates[spec.key] = {
            "direction": spec.direction,
            "median": _round(stats.median(pooled)),
            "sessions": history,
            "tolerance": tolerance,
            "unit": spec.unit,
        }
    return {"workload": dict(workload), "gates": gates}


def launch_counts(gate: Mapping[str, Any]) -> dict[str, int]:
    """Session id -> ``launches`` of a gate entry's blessed sessions that say it."""
    sessions = gate.get("sessions")
    return {str(s.get("session", i)): int(s["launches"]) for i, s in enumerate(sessions if isinstance(sessions, list) else [])
            if isinstance(s, Mapping) and isinstance(s.get("launches"), int) and not isinstance(s.get("launches"), bool)}


def _session_shares(gate: Mapping[str, Any]) -> dict[str, float]:
    """Session id -> ``slo_latency_share`` of a gate entry's blessed sessions that kept one."""
    sessions = gate.get("sessions")
    return {str(s.get("session", i)): float(s[slo_edge.SESSION_KEY]) for i, s in enumerate(sessions if isinstance(sessions, list) else [])
            if isinstance(s, Mapping) and stats.is_number(s.get(slo_edge.SESSION_KEY))}


def _renamed_gates(entry: Any, where: str) -> Any:
    """``entry`` with gate keys of RENAMED_GATES under their current names."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("gates"), Mapping):
        return entry
    gates = dict(entry["gates"])
    for old, new in RENAMED_GATES.items():
        if old in gates:
            if new in gates:
                raise BaselineFormatError(f"{where}.gates has both {old!r} (the old name) and {new!r}: "
                                          f"delete the {old!r} entry (it is the same metric)")
            gates[new] = gates.pop(old)
    return {**entry, "gates": gates}


def validate_section(section: Any, where: str) -> dict[str, Any]:
    """Check a loaded ``metrics`` section; raise BaselineFormatError saying what to fix."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise BaselineFormatError(f"{where}: 'metrics' must be a mapping of cell -> entry, got {type(section).__name__}")
    section = {cell: _renamed_gates(entry, f"{where}: metrics.{cell}") for cell, entry in section.items()}
    for cell, entry in section.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("gates", {}), Mapping):
            raise BaselineFormatError(f"{where}: metrics.{cell} must be a mapping with 'workload' and 'gates'")
        for key, gate in (entry.get("gates") or {}).items():
            w = f"{where}: metrics.{cell}.gates.{key}"
            if not isinstance(gate, Mapping):
                raise BaselineFormatError(f"{w} must be a mapping (direction, median, samples, tolerance)")
            if gate.get("direction") not in ("higher", "lower"):
                raise BaselineFormatError(f"{w}.direction must be 'higher' or 'lower', got {gate.get('direction')!r}")
            for num in ("median", "tolerance"):
                if not stats.is_number(gate.get(num)):
                    raise BaselineFormatError(f"{w}.{num} must be a number, got {gate.get(num)!r}")
            if float(gate["tolerance"]) < 0:
                raise BaselineFormatError(f"{w}.tolerance must be >= 0 (a fraction: 0.05 = 5%)")
            samples = gate.get("samples", [])
            if not isinstance(samples, list) or not all(stats.is_number(s) for s in samples):
                raise BaselineFormatError(f"{w}.samples must be a list of numbers")
            sessions = gate.get("sessions", [])
            if not isinstance(sessions, list) or not all(
                    isinstance(s, Mapping) and isinstance(s.get("samples"), list)
                    and all(stats.is_number(v) and v > 0 for v in s["samples"]) for s in sessions):
                raise BaselineFormatError(
                    f"{w}.sessions must be a list of {{session: ID, samples: [positive numbers]}} (oldest first)")
            for i, s in enumerate(sessions):
                n = s.get("launches", 1)
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise BaselineFormatError(
                        f"{w}.sessions[{i}].launches must be a whole number >= 1 (how many launches the session's "
                        f"samples pool), got {n!r}: fix it or leave it out (one launch)")
                if slo_edge.SESSION_KEY in s:
                    try:
                        slo_edge.validate_share(s[slo_edge.SESSION_KEY], f"{w}.sessions[{i}]")
                    except slo_edge.SLOEdgeError as exc:
                        raise BaselineFormatError(str(exc)) from None
    return dict(section)


#: The baseline file's section of blessed sustainable rates: workload -> ``rate_entry``.
RATE_SECTION = "sustainable_rate"


def rate_entry(rate: float, slo: Mapping[str, Any], cell: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sustainable_rate.<workload>`` entry: the rate a bless found, the SLO it was found under
    (``SLO.record()``) and that rate's cell (``baseline_cell_entry`` of its goodput samples), which a
    later session's re-probe of the rate is judged against (``rate_gate.py``). The rate is kept
    exact: it is the re-probed cell's ``request_rate``, which its cell's workload must match."""
    return {"rate": float(rate), "slo": dict(slo), "cell": dict(cell)}


def validate_rate_section(section: Any, where: str) -> dict[str, dict[str, Any]]:
    """Check a loaded ``sustainable_rate`` section; raise BaselineFormatError saying what to fix."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise BaselineFormatError(f"{where}: {RATE_SECTION!r} must be a mapping of workload -> entry, "
                                  f"got {type(section).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for workload, entry in section.items():
        w = f"{where}: {RATE_SECTION}.{workload}"
        if not isinstance(entry, Mapping):
            raise BaselineFormatError(f"{w} must be a mapping with 'rate', 'slo' and 'cell'")
        rate = entry.get("rate")
        if not stats.is_number(rate) or not 0 < float(rate) < math.inf:
            raise BaselineFormatError(f"{w}.rate must be a positive number (requests/s), got {rate!r}")
        slo = entry.get("slo")
        if not isinstance(slo, Mapping) or not isinstance(slo.get("goodput_slos_ms"), Mapping) \
                or not all(stats.is_number(v) for v in slo["goodput_slos_ms"].values()) \
                or not stats.is_number(slo.get("percentile")):
            raise BaselineFormatError(f"{w}.slo must be a mapping with goodput_slos_ms (target -> ms) and percentile")
        if not isinstance(entry.get("cell"), Mapping):
            raise BaselineFormatError(f"{w}.cell must be a mapping with 'workload' and 'gates' (the rate's goodput)")
        cell = validate_section({"cell": entry["cell"]}, w)["cell"]
        out[str(workload)] = {"rate": float(rate), "slo": dict(slo), "cell": dict(cell)}
    return out
