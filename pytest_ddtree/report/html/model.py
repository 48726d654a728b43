"""What the HTML report shows, as plain data, from a results payload (no pytest, no HTML).

Why a separate view model: the same payload (``results.json``, or the live records of a running
session) is read by the page, by ``ddtree-report --against`` and by the tests, and every other
helper changes that payload while we build this (prompt sources, multi-session baselines,
confirmation runs, predicted rows). So every section is read defensively: a section or key that
is not there renders as "not measured", never as an exception, and unknown extra keys are
ignored.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.metrics import MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT
from pytest_ddtree.report import text as report
from pytest_ddtree.configs import config_in_nodeid, config_or_none, name_sort_key
from pytest_ddtree.records.words import GateStatus, RecordKind, Status
from pytest_ddtree.measure.stats import fmt_pct as fmt_pct, is_number as is_number  # the one number check and percent, re-exported for charts and the template

#: The gates of one config, in the order a reader asks about them.
GATES = ("health", "applied", "coding", "lossless", "throughput")

#: Which suite file proves which gate (a failed test is attributed by its file).
_GATE_OF_TEST = {"test_health": "health", "test_coding": "coding", "test_lossless": "lossless", "test_throughput": "throughput"}

#: Cell metrics shown in the sweep table: (key in results.json, header, digits).
CELL_COLUMNS: tuple[tuple[str, str, int], ...] = (
    (OUTPUT_THROUGHPUT, "out tok/s", 1),
    (PER_REQUEST_OUTPUT_THROUGHPUT, "tok/s per request", 1),
    (report.TOKENS_PER_VERIFY, "tokens per verify", 2),
    (MEDIAN_TTFT_MS, "TTFT p50 ms", 1),
    ("median_itl_ms", "ITL p50 ms", 2),
    ("median_e2e_latency_ms", "E2E p50 ms", 1),
)


def fmt(value: Any, digits: int = 1) -> str:
    """The one number format of the page (tables and tests use it alike)."""
    return f"{float(value):.{digits}f}" if is_number(value) else "-"


def fmt_time(epoch: Any) -> str:
    if not is_number(epoch):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(epoch)))


@dataclass
class GateResult:
    status: GateStatus
    summary: str = ""
    messages: list[str] = field(default_factory=list)


@dataclass
class CellRow:
    """One throughput cell as the page shows it (numbers straight from the payload)."""

    config: str
    cell: str
    concurrency: int | None
    context_tokens: int | None
    status: str
    measurement_status: str
    values: dict[str, Any]
    change: dict[str, Any]
    samples: dict[str, list[float]]
    baseline: dict[str, Any]  # metric -> {median, samples, tolerance, direction}
    messages: list[str]
    predicted: bool = False
    #: the status as the sweep table words it: which gated metric moved which way (report.status_text)
    status_text: str = ""
    #: share of verifies that accepted at least d drafts, d = 1, 2, ... (the server's histograms)
    acceptance_by_depth: list[float] = field(default_factory=list)
    #: each gated metric's own verdict (the cell's status is its worst metric's)
    metric_status: dict[str, str] = field(default_factory=dict)


def _shares(value: Any, limit: int = 1024) -> list[float]:
    """A list of shares in [0, 1] (anything else, or a longer list, gives none)."""
    items = _as_list(value)
    if len(items) > limit or not all(is_number(v) and 0.0 <= float(v) <= 1.0 for v in items):
        return []
    return [float(v) for v in items]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _as_dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _floats(values: Any) -> list[float]:
    """Numbers from a flat list, or from a list of per-session lists (multi-session baselines)."""
    out: list[float] = []
    for v in _as_list(values):
        if is_number(v):
            out.append(float(v))
        elif isinstance(v, Mapping):
            out.extend(_floats(v.get("samples")))
        elif isinstance(v, (list, tuple)):
            out.extend(_floats(v))
    return out


_CELL_NAME = re.compile(r"^c(?P<c>\d+)_")


def _int(value: Any) -> int | None:
    return int(value) if is_number(value) else None


def cells(payload: Mapping[str, Any]) -> list[CellRow]:
    out: list[CellRow] = []
    for raw in _as_list(payload.get("throughput")):
        if not isinstance(raw, Mapping) or "cell" not in raw:
            continue
        workload = _as_dict(raw.get("workload"))
        # bench_serving's "concurrency" is the measured one; the workload's limit is max_concurrency.
        conc = _int(workload.get("concurrency")) or _int(raw.get("max_concurrency"))
        if conc is None and (m := _CELL_NAME.match(str(raw["cell"]))):
            conc = int(m.group("c"))
        verdict = _as_dict(raw.get("verdict"))
        metric_verdicts = _as_dict(verdict.get("metrics"))
        baseline: dict[str, Any] = {}
        for key, entry in _as_dict(raw.get("baseline")).items():
            if isinstance(entry, Mapping):
                baseline[key] = {"median": entry.get("median"), "samples": _floats(entry.get("samples") or entry.get("sessions")),
                                 "tolerance": entry.get("tolerance"), "direction": entry.get("direction")}
        for key, mv in metric_verdicts.items():  # older results: only the verdict knows the baseline
            if isinstance(mv, Mapping) and key not in baseline and is_number(mv.get("baseline_median")):
                baseline[key] = {"median": mv.get("baseline_median"), "samples": [], "tolerance": mv.get("tolerance"),
                                 "direction": mv.get("direction")}
        messages = [str(m) for m in _as_list(verdict.get("reasons"))]
        messages += [str(mv["message"]) for mv in metric_verdicts.values() if isinstance(mv, Mapping) and mv.get("message")]
        messages += [str(p) for p in _as_list(raw.get("problems")) if str(p) not in messages]
        messages += [f"repeat {s.get('repeat')} retaken, not counted: {s.get('reason')}"
                     for s in _as_list(raw.get("spoiled_repeats")) if isinstance(s, Mapping)]
        changed = [str(c) for c in _as_list(_as_dict(raw.get("build")).get("changed"))]
        if changed:  # judged on another build than the one blessed (service/build.py)
            messages.append("build changed since the bless: " + "; ".join(changed))
        out.append(CellRow(
            config=str(raw.get("config")),
            cell=str(raw["cell"]),
            concurrency=conc,
            context_tokens=_int(raw.get("context_tokens")) or _int(workload.get("context_tokens")),
            status=str(raw.get("status") or Status.NOT_MEASURED),
            measurement_status=str(raw.get("measurement_status") or ""),
            values={key: report.tokens_per_verify(raw) if key == report.TOKENS_PER_VERIFY else raw.get(key)
                    for key, _, _ in CELL_COLUMNS},
            change=_as_dict(raw.get("change_vs_baseline")),
            samples={k: _floats(v) for k, v in _as_dict(raw.get("samples")).items()},
            baseline=baseline,
            messages=messages,
            predicted=bool(raw.get("predicted")) or raw.get("status") == Status.PREDICTED,
            acceptance_by_depth=_shares(raw.get("acceptance_by_depth")),
            status_text=report.status_text(raw) if raw.get("status") else str(Status.NOT_MEASURED),
            metric_status={str(k): str(mv["status"]) for k, mv in metric_verdicts.items()
                           if isinstance(mv, Mapping) and isinstance(mv.get("status"), str)},
        ))
    out.sort(key=lambda c: (name_sort_key(c.config), c.context_tokens or 0, c.concurrency or 0, c.cell))
    return out


def launch_entry(record: Mapping[str, object]) -> Mapping[str, object]:
    """The service manager's launch record inside a ``launch`` record (read key by key)."""
    launch = record.get("launch")
    return launch if isinstance(launch, Mapping) else {}


def records(payload: Mapping[str, Any], kind: RecordKind) -> list[dict[str, object]]:
    return [dict(r) for r in _as_list(payload.get("records")) if isinstance(r, Mapping) and r.get("kind") == kind]


def config_of_nodeid(nodeid: str, known: Iterable[str]) -> str | None:
    """The config a test ran for (configs.config_in_nodeid), if it is one of ``known``."""
    name = config_in_nodeid(nodeid)
    return name if name is not None and name in set(known) else None


def _gate_of_nodeid(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    return _GATE_OF_TEST.get(stem, "other")


def config_names(payload: Mapping[str, Any], planned: Sequence[str] = ()) -> list[str]:
    names: list[str] = list(planned)
    for c in _as_list(payload.get("throughput")):
        if isinstance(c, Mapping) and c.get("config") is not None:
            names.append(str(c["config"]))
    for r in _as_list(payload.get("records")):
        if isinstance(r, Mapping) and r.get("config") is not None and r.get("kind") != RecordKind.LAUNCH:
            names.append(str(r["config"]))
    for r in records(payload, RecordKind.LAUNCH):
        name = str(r.get("config"))
        if config_or_none(name):  # not the lossless reference instance
            names.append(name)
    unique = list(dict.fromkeys(names))
    return sorted(unique, key=name_sort_key)


def _evidence_summary(evidence: Any) -> str:
    """``block_size proven by behaviour, budget reported, ...`` from a launch's applied evidence."""
    fields = _as_dict(_as_dict(evidence).get("fields"))
    return ", ".join(f"{name} {_as_dict(ev).get('status')}" for name, ev in fields.items() if _as_dict(ev).get("status"))


def gates(payload: Mapping[str, Any], planned: Sequence[str] = ()) -> dict[str, dict[str, GateResult]]:
    """Each config's five gates: pass / fail / inconclusive / invalid / not measured / pending."""
    names = config_names(payload, planned)
    out: dict[str, dict[str, GateResult]] = {n: {g: GateResult(Status.NOT_MEASURED) for g in GATES} for n in names}
    _gate_health(payload, out)
    _gate_applied(payload, out)
    _no_effect_notes(payload, out)
    _gate_coding(payload, out)
    _gate_lossless(payload, out)
    _gate_throughput(payload, out)
    _failed_tests(payload, out)
    for row in out.values():
        # Launch records come at session end; a gate that measured anything ran on a service whose
        # /server_info already matched the config (the service fixture fails the tests otherwise).
        if row["applied"].status == Status.NOT_MEASURED and any(row[g].status != Status.NOT_MEASURED for g in GATES):
            row["applied"] = GateResult(Status.PASS, "/server_info matched (launch timings at session end)")
    started = {n for n, row in out.items() if any(g.status != Status.NOT_MEASURED for g in row.values())}
    for name in planned:
        if name not in started:
            out[name] = {g: GateResult(Status.PENDING) for g in GATES}
    return out


def _gate_health(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """The short generation's verdict."""
    for r in records(payload, RecordKind.HEALTH):
        if (row := out.get(str(r.get("config")))) is not None:
            row["health"] = (GateResult(Status.PASS, f"answered ({r.get('completion_tokens')} tokens)") if r.get("passed", True)
                             else GateResult(Status.FAIL, "; ".join(str(p) for p in _as_list(r.get("problems")))
                                                        or "short generation failed"))


def _gate_applied(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """Each launch's outcome: ready with /server_info matching (and its evidence), or why not."""
    for r in records(payload, RecordKind.LAUNCH):
        launch = launch_entry(r) or r  # a file's launch entry (records.LaunchEntry): read key by key
        if (row := out.get(str(r.get("config")))) is None:
            continue
        outcome = str(launch.get("outcome", ""))
        evidence = _evidence_summary(launch.get("applied_evidence"))
        if outcome == "ready":
            if row["applied"].status != Status.FAIL:
                row["applied"] = GateResult(Status.PASS, f"ready after {fmt(launch.get('ready_s'))} s; /server_info matches"
                                            + (f"; {evidence}" if evidence else ""))
        elif outcome:
            failures = [str(f) for f in _as_list(_as_dict(launch.get("applied_evidence")).get("failures"))]
            row["applied"] = GateResult(Status.FAIL, outcome, [outcome, *failures])


def _no_effect_notes(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """A field that showed no effect on this build is said on the applied gate."""
    for finding in _as_list(payload.get("no_effect")):
        if not isinstance(finding, Mapping):
            continue
        for name in _as_list(finding.get("configs")):
            if (row := out.get(str(name))) is not None and (message := str(finding.get("message", ""))):
                field_name = str(finding.get("field"))
                row["applied"].summary = (row["applied"].summary + "; " if row["applied"].summary else "") + \
                    f"{field_name} shows no effect on this build"
                if message not in row["applied"].messages:
                    row["applied"].messages.append(message)


def _gate_coding(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """Passed problems, and what flipped against the baseline or fell below the floor."""
    for r in records(payload, RecordKind.CODING):
        if (row := out.get(str(r.get("config")))) is None:
            continue
        gate = _as_dict(r.get("gate"))
        flips = [str(p) for p in _as_list(gate.get("regressions"))]
        summary = f"{r.get('passed')}/{r.get('total')} passed ({r.get('set', 'default')})"
        if gate.get("passed", r.get("passed") == r.get("total")):
            row["coding"] = GateResult(Status.PASS, summary)
        else:
            why = [f"flipped to failing against the baseline: {', '.join(flips)}"] if flips else []
            if gate.get("floor") is not None and not flips:
                why.append(f"below the floor of {gate.get('floor')}")
            row["coding"] = GateResult(Status.FAIL, summary, why)


def _gate_lossless(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """Identical transcripts, or where each diverged."""
    for r in records(payload, RecordKind.LOSSLESS):
        if (row := out.get(str(r.get("config")))) is None:
            continue
        diverged = _as_list(r.get("diverged"))
        compared = r.get("compared")
        summary = f"{(compared if isinstance(compared, int) else 0) - len(diverged)}/{compared} identical"
        if r.get("passed"):
            row["lossless"] = GateResult(Status.PASS, summary)
        else:
            row["lossless"] = GateResult(Status.FAIL, summary, [f"{d.get('prompt_id')}: first divergence at {d.get('unit')} "
                                                         f"{d.get('position')}" for d in diverged if isinstance(d, Mapping)])


def _gate_throughput(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """The worst of the measured cells' statuses (predicted cells do not count)."""
    by_config: dict[str, list[CellRow]] = defaultdict(list)
    for c in cells(payload):
        if not c.predicted:
            by_config[c.config].append(c)
    for name, measured in by_config.items():
        if name not in out:
            continue
        statuses = {c.status for c in measured}
        severity: dict[str, int] = {Status.INVALID: 0, Status.REGRESSION: 1, Status.INCONCLUSIVE: 2, Status.MISSING: 3}
        bad = sorted((c for c in measured if c.status in severity), key=lambda c: severity[c.status])
        messages = [f"{c.cell}: {c.status}" + (f": {'; '.join(c.messages)}" if c.messages else "") for c in bad]
        counts = Counter(c.status for c in measured)
        summary = f"{len(measured)} cells: " + ", ".join(f"{n} {status}" for status, n in counts.most_common())
        status: GateStatus
        if Status.INVALID in statuses:
            status = Status.INVALID
        elif Status.REGRESSION in statuses:
            status = Status.FAIL
        elif Status.INCONCLUSIVE in statuses or Status.MISSING in statuses:
            status = Status.INCONCLUSIVE
        elif statuses == {Status.MEASURED}:  # --ddtree-measure-only: numbers, no verdict
            status = Status.MEASURED
        else:
            status = Status.PASS
        out[name]["throughput"] = GateResult(status, summary, messages)


def _failed_tests(payload: Mapping[str, Any], out: dict[str, dict[str, GateResult]]) -> None:
    """A failed test fails its config's gate (a failed service fixture: the applied gate)."""
    for failed in _as_list(payload.get("failed_tests")):
        if not isinstance(failed, Mapping):
            continue
        nodeid = str(failed.get("nodeid", ""))
        failed_config = config_of_nodeid(nodeid, out)
        if failed_config is None:
            continue
        gate_name = _gate_of_nodeid(nodeid)
        reason = f"{nodeid.rsplit('::', 1)[-1]} failed ({failed.get('when', 'call')}): {failed.get('reason', '')}"
        if failed.get("when") == "setup" and out[failed_config]["applied"].status != Status.PASS:
            gate_name = "applied"  # the service fixture failed: the config never ran
        elif gate_name == "other":
            gate_name = "health"
        result = out[failed_config][gate_name]
        if result.status in (Status.PASS, Status.NOT_MEASURED, Status.PENDING):
            result.status = Status.FAIL
        if reason not in result.messages:
            result.messages.append(reason)


def overall(gate_rows: Mapping[str, Mapping[str, GateResult]], *, measure_only: bool = False, running: bool = False) -> str:
    """The page's one word: the worst gate's status; a ``--ddtree-measure-only`` session (or one whose
    cells say ``measured``) passes nothing, so where nothing failed it is ``measuring`` while it runs
    (its applied and coding gates pass before a cell is measured) and ``measured`` once it ends."""
    statuses = {g.status for row in gate_rows.values() for g in row.values()}
    for status in (Status.FAIL, Status.INVALID, Status.INCONCLUSIVE):
        if status in statuses:
            return status
    if measure_only or Status.MEASURED in statuses:
        if running:
            return Status.MEASURING
        return Status.MEASURED if statuses & {Status.MEASURED, Status.PASS} else Status.NOT_MEASURED
    return Status.PASS if Status.PASS in statuses else Status.NOT_MEASURED


@dataclass
class CodingGrid:
    problems: list[str]
    configs: list[str]
    verdicts: dict[tuple[str, str], dict[str, object]]  # (problem, config) -> its record (records.ProblemRecord) as the file had it
    flips: set[tuple[str, str]]
    fixed: set[tuple[str, str]]


def coding_grid(payload: Mapping[str, Any]) -> CodingGrid:
    problems: list[str] = []
    configs: list[str] = []
    verdicts: dict[tuple[str, str], dict[str, object]] = {}
    flips: set[tuple[str, str]] = set()
    fixed: set[tuple[str, str]] = set()
    for r in records(payload, RecordKind.CODING):
        config = str(r.get("config"))
        configs.append(config)
        for p in _as_list(r.get("problems")):
            if isinstance(p, Mapping) and p.get("id") is not None:
                pid = str(p["id"])
                problems.append(pid)
                verdicts[(pid, config)] = dict(p)
        gate = _as_dict(r.get("gate"))
        flips |= {(str(p), config) for p in _as_list(gate.get("regressions"))}
        fixed |= {(str(p), config) for p in _as_list(gate.get("new_passes"))}
    return CodingGrid(list(dict.fromkeys(problems)), sorted(dict.fromkeys(configs), key=name_sort_key), verdicts, flips, fixed)


def divergences(payload: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for r in records(payload, RecordKind.LOSSLESS):
        for d in _as_list(r.get("diverged")):
            if isinstance(d, Mapping):
                out.append((str(r.get("config")), dict(d)))
    return out


@dataclass
class TimelineRow:
    config: str
    worker: str
    started_at: float | None
    ready_s: float | None
    gap_s: float | None  # since the previous config's last result on this worker: stop + GPU release
    first_result: float | None
    last_result: float | None
    outcome: str


def timeline(payload: Mapping[str, Any]) -> list[TimelineRow]:
    """When each config started, how long it took to be ready, which worker ran it.

    Launch records arrive at session end; while a session runs, a config's first result stands
    in for its start.
    """
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in _as_list(payload.get("records")) + _as_list(payload.get("throughput_repeats")):
        if isinstance(r, Mapping) and r.get("kind") != RecordKind.LAUNCH and is_number(r.get("time")):
            # a record of no config (the lossless reference, the control) belongs to the launch of its kind
            name = r.get("config") if r.get("config") is not None else r.get("kind")
            times[(str(name), str(r.get("worker", "main")))].append(float(r["time"]))
    rows: dict[tuple[str, str], TimelineRow] = {}
    for r in records(payload, RecordKind.LAUNCH):
        launch = launch_entry(r) or r
        name = str(launch.get("config", r.get("config")))
        key = (name, str(r.get("worker", "main")))
        if key in rows and rows[key].started_at is not None:
            continue
        started = launch.get("started_at")
        rows[key] = TimelineRow(name, key[1], float(started) if is_number(started) else None,
                                float(ready) if is_number(ready := launch.get("ready_s")) else None,
                                None, None, None, str(launch.get("outcome", "")))
    for key, ts in times.items():
        row = rows.setdefault(key, TimelineRow(key[0], key[1], None, None, None, None, None, "running"))
        row.first_result, row.last_result = min(ts), max(ts)
    ordered = sorted(rows.values(), key=lambda r: (r.worker, r.started_at or r.first_result or 0.0))
    last_end: dict[str, float] = {}
    for row in ordered:
        start = row.started_at
        if start is not None and row.worker in last_end and config_or_none(row.config):
            row.gap_s = max(0.0, start - last_end[row.worker])
        if row.last_result is not None and config_or_none(row.config):
            last_end[row.worker] = row.last_result
    return sorted(ordered, key=lambda r: r.started_at or r.first_result or 0.0)


@dataclass
class Comparison:
    config: str
    cell: str
    metric: str
    this_median: float | None
    other_median: float | None
    change: float | None
    status: str
    message: str


def compare_sessions(payload: Mapping[str, Any], other: Mapping[str, Any]) -> list[Comparison]:
    """Each cell of this session against the same cell of ``other``, judged by the gate itself.

    The other session's samples stand where a baseline's would; tolerance and direction come
    from this session's baseline entry when it has one, else from the gate's defaults, and the
    figures are :func:`rule.judge_metric_alone`'s, so the page and the gate never disagree.
    """
    from pytest_ddtree.gates.throughput import rule, verdicts as verdicts_mod

    theirs = {(c.config, c.cell): c for c in cells(other)}
    out: list[Comparison] = []
    for mine in cells(payload):
        base = theirs.get((mine.config, mine.cell))
        for key, spec in ((s.key, s) for s in verdicts_mod.GATED_METRICS):
            current = mine.samples.get(key) or []
            previous = base.samples.get(key) if base else []
            if not current and not previous:
                continue
            if base is None or not previous or not current:
                out.append(Comparison(mine.config, mine.cell, key, _median(current), _median(previous or []), None,
                                      Status.NEW if base is None or not previous else Status.MISSING,
                                      "only in this session" if current else "only in the other session"))
                continue
            entry = {"direction": spec.direction, "tolerance": spec.tolerance, "unit": spec.unit,
                     **{k: v for k, v in mine.baseline.get(key, {}).items() if k in ("direction", "tolerance") and v is not None},
                     "median": _median(previous), "samples": previous}
            verdict = rule.judge_metric_alone(key, entry, current)
            out.append(Comparison(mine.config, mine.cell, key, verdict.current_median, verdict.baseline_median,
                                  verdict.change, verdict.status, verdict.message))
    mine_keys = {(c.config, c.cell) for c in cells(payload)}
    for c in cells(other):
        if (c.config, c.cell) not in mine_keys:
            out.append(Comparison(c.config, c.cell, OUTPUT_THROUGHPUT, None, _median(c.samples.get(OUTPUT_THROUGHPUT) or []),
                                  None, Status.MISSING, "only in the other session"))
    return out


def _median(values: Sequence[float]) -> float | None:
    from pytest_ddtree.measure import stats

    return stats.median(list(values)) if values else None
