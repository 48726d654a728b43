"""The adaptive sweep of a session (``--ddtree-max-restarts N``): what the plugin's loop asks.

Why a module of its own: the plugin's run loop only needs three answers (which config next,
what the measured one showed, what to report), while the bookkeeping behind them (reading the
session's throughput records back into the planner, fitting the prior sessions of the same
hardware profile, turning predictions into report rows) is plain Python and testable without
pytest. The model and the choice rule are in :mod:`pytest_ddtree.adaptive.advisor`.

Reporting needs no numpy: the session's ``adaptive-sweep`` record already holds the predicted
rows, so ``results.json``, the sweep table and a later re-render read them from the records.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT, tokens_per_verify
from pytest_ddtree.measure.stats import is_number
from pytest_ddtree.records.shapes import AdaptivePickData, AdaptiveSweepData, PredictedRowData, RawRecord, WorkloadData
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.words import RecordKind, Status

if TYPE_CHECKING:
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.measure.matrix import Cell
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import ServiceManager


XDIST_ERROR = (
    "--ddtree-max-restarts runs serially: each next config is chosen from the results of the "
    "configs measured before it, so xdist workers (-n) cannot run configs side by side. Run "
    "without -n (or -n 0), or drop --ddtree-max-restarts to sweep every config in parallel."
)


class PriorError(ValueError):
    """A --ddtree-prior folder holds no usable results (a usage error)."""


def check_available() -> None:
    """Raise :class:`pytest_ddtree.adaptive.advisor.AdvisorUnavailable` when numpy/scipy are missing."""
    from pytest_ddtree.adaptive.advisor import _np_scipy

    _np_scipy()


def _results_files(directory: Path) -> list[Path]:
    """A session folder's results.json, or those of the session folders under a results root."""
    own = directory / "results.json"
    if own.is_file():
        return [own]
    return sorted(directory.glob("*/results.json"))


def check_prior_dirs(directories: Sequence[Path]) -> None:
    """Every prior folder must hold at least one session's results.json (else a usage error)."""
    for directory in directories:
        if not _results_files(directory):
            raise PriorError(f"--ddtree-prior {directory}: no results.json in it or in its session folders "
                             "(give the --ddtree-results folder of a finished session)")


@dataclass(frozen=True)
class PriorRows:
    """Measured throughput cells of earlier sessions, split by hardware profile."""

    rows: list[Mapping[str, object]]  # results.json's throughput entries, read key by key
    ignored: dict[str, int]  # other hardware profile -> number of cells left out


def read_prior_rows(directories: Sequence[Path], hardware_profile: str | None) -> PriorRows:
    """The measured (never predicted) valid cells of earlier sessions on ``hardware_profile``."""
    rows: list[Mapping[str, object]] = []
    ignored: dict[str, int] = {}
    for directory in directories:
        for path in _results_files(directory):
            try:
                payload = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise PriorError(f"--ddtree-prior {path}: not readable JSON ({exc})") from None
            cells = payload.get("throughput") if isinstance(payload, dict) else None
            if not isinstance(cells, list) or not all(isinstance(row, dict) for row in cells):
                raise PriorError(f"--ddtree-prior {path}: not a pytest-ddtree results.json (its 'throughput' is not a "
                                 "list of cells); give the --ddtree-results folder of a finished session")
            for row in cells:
                if row.get("measurement_status") == Status.INVALID or not row.get(OUTPUT_THROUGHPUT):
                    continue
                profile = row.get("hardware_profile")
                if hardware_profile is not None and profile != hardware_profile:
                    ignored[str(profile)] = ignored.get(str(profile), 0) + 1
                    continue
                rows.append(row)
    return PriorRows(rows, ignored)


def _measurements(rows: Iterable[Mapping[str, object]]) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """Config points, cell points and measurements of throughput rows (records or results.json,
    read key by key: a row without a numeric workload is left out); a throughput or acceptance that
    is not a finite number (NaN in an earlier session's file) stays out of the fit (stats.is_number,
    the one number check)."""
    from pytest_ddtree.adaptive.advisor import CellPoint, ConfigPoint, Measurement
    from pytest_ddtree.configs import config_or_none

    configs: dict[str, ConfigPoint] = {}
    cells: dict[str, CellPoint] = {}
    out: list[Measurement] = []
    for row in rows:
        given = row.get("metrics")
        metrics: Mapping[str, object] = given if isinstance(given, Mapping) else row
        tok_s, workload = metrics.get(OUTPUT_THROUGHPUT), row.get("workload")
        parsed = config_or_none(str(row.get("config")))
        numbers = {k: v for k, v in workload.items() if isinstance(v, int) and not isinstance(v, bool)} \
            if isinstance(workload, Mapping) else {}
        if parsed is None or not is_number(tok_s) or tok_s <= 0 or not {"concurrency", "context_tokens"} <= set(numbers):
            continue
        configs[parsed.name] = ConfigPoint.of(parsed)
        cell = CellPoint(str(row.get("cell")), numbers["concurrency"], numbers["context_tokens"], numbers.get("output_tokens", 0))
        cells[cell.name] = cell
        accept = tokens_per_verify(metrics)
        out.append(Measurement(parsed.name, cell.name, float(tok_s),
                               float(accept) if is_number(accept) and accept > 0 else None))
    return configs, cells, out


@dataclass
class AdaptiveSweep:
    """One session's adaptive sweep: a Planner fed from the session's own throughput records."""

    configs: Sequence[Any]  # DDTreeConfig, in run order
    workloads: Sequence[Any]  # Cell: the cells this session measures
    max_restarts: int
    default: str | None = None
    priors: Sequence[Path] = ()
    progress: Callable[[str], None] = print
    tried: list[str] = field(default_factory=list)
    prior_note: str | None = None
    _prior_done: bool = False

    def __post_init__(self) -> None:
        from pytest_ddtree.adaptive.advisor import CellPoint, ConfigPoint, Planner

        self.planner = Planner([ConfigPoint.of(c) for c in self.configs], [CellPoint.of(w) for w in self.workloads],
                               self.max_restarts, default=self.default)

    def next_config(self) -> str | None:
        """The next config to measure (its restart is the manager's), or None to stop."""
        name = self.planner.next_config()
        if name is not None:
            self.tried.append(name)
        return name

    def record_config(self, name: str, records: Iterable[RawRecord], hardware_profile: str | None) -> int:
        """Feed the planner the valid throughput cells of ``name``; returns how many there were.

        A config that measured nothing (a failed start) is marked failed, so it is neither
        chosen again nor recommended; its restart still counts.
        """
        rows = [r for r in records_mod.throughput_records(records)
                if r["config"] == name and r["measurement_status"] != Status.INVALID]
        _, _, measurements = _measurements(rows)
        for m in measurements:
            self.planner.record(m)
        if not measurements:
            self.planner.fail(name)
        if not self._prior_done and hardware_profile is not None:
            self._apply_priors(hardware_profile)
        return len(measurements)

    def _apply_priors(self, hardware_profile: str) -> None:
        """Fit the earlier sessions of this hardware profile once; it becomes the planner's prior."""
        self._prior_done = True
        if not self.priors:
            return
        from pytest_ddtree.adaptive.advisor import fit

        prior = read_prior_rows(self.priors, hardware_profile)
        for other, count in sorted(prior.ignored.items()):
            self.progress(f"adaptive sweep: ignored {count} prior cells measured on hardware profile {other} "
                          f"(this session measures on {hardware_profile})")
        configs, cells, measurements = _measurements(prior.rows)
        if not measurements:
            self.prior_note = f"no prior cells on hardware profile {hardware_profile}: fitted from this session only"
            self.progress(f"adaptive sweep: {self.prior_note}")
            return
        self.planner.prior = fit(configs, cells, measurements)
        self.planner.invalidate()
        self.prior_note = (f"prior: {len(measurements)} cells of {len(configs)} configs from "
                           f"{len(self.priors)} earlier results folder(s) on {hardware_profile}")
        self.progress(f"adaptive sweep: {self.prior_note}")

    def outcome(self, launches: int, workloads: Mapping[str, WorkloadData]) -> AdaptiveSweepData:
        """The ``adaptive-sweep`` record: restarts as the service manager counted its launches,
        the predicted rows (with intervals) and the per-cell picks (always measured configs)."""
        predicted: list[PredictedRowData] = []
        recommendations: list[AdaptivePickData] = []
        error = None
        try:
            self._report(predicted, recommendations, workloads)
        except Exception as exc:  # noqa: BLE001 - a failed fit must not lose the measured results
            error = f"the advisor could not predict: {type(exc).__name__}: {exc}"
        outcome: AdaptiveSweepData = {
            "restarts": launches,
            "full_sweep_restarts": len(self.configs),
            "max_restarts": self.max_restarts,
            "measured": list(self.planner.order),
            "failed": list(self.planner.failed),
            "not_measured": self.not_measured(),
            "predicted": predicted,
            "recommendations": recommendations,
            "prior": self.prior_note,
        }
        if error:
            outcome["error"] = error
        return outcome

    def not_measured(self) -> list[str]:
        """The configs the sweep never restarted for (their cells are predicted)."""
        return [c.name for c in self.configs if c.name not in self.tried]

    def _report(self, predicted: list[PredictedRowData], recommendations: list[AdaptivePickData],
                workloads: Mapping[str, WorkloadData]) -> None:
        if self.planner.order:
            for (config, cell), p in sorted(self.planner.predictions().items()):
                row: PredictedRowData = {
                    "config": config, "cell": cell, "status": Status.PREDICTED, "predicted": True,
                    OUTPUT_THROUGHPUT: round(p.tok_s, 3),
                    "output_throughput_interval": [round(p.low, 3), round(p.high, 3)],
                }
                if cell in workloads:
                    row["workload"] = workloads[cell]
                predicted.append(row)
            for rec in self.planner.recommendations():
                pick: AdaptivePickData = {
                    "cell": rec.cell, "config": rec.config, OUTPUT_THROUGHPUT: round(rec.tok_s, 3),
                    "challenger": rec.challenger,
                    "challenger_high": round(rec.challenger_high, 3) if rec.challenger_high is not None else None,
                }
                if rec.challenger_tok_s is not None:
                    pick["challenger_output_throughput"] = round(rec.challenger_tok_s, 3)
                if rec.measured_best is not None and rec.measured_best_tok_s is not None:
                    pick["measured_best"] = rec.measured_best
                    pick["measured_best_output_throughput"] = round(rec.measured_best_tok_s, 3)
                recommendations.append(pick)


# -- reporting (no numpy) ------------------------------------------------------------------
def predicted_table_rows(outcome: AdaptiveSweepData, width: int, ctx: Callable[[Any], str] = str) -> list[list[str]]:
    """Rows for the sweep table beside the measured ones: ``predicted`` with the interval
    (``ctx`` formats the context length as the measured rows do)."""
    rows = []
    for p in outcome["predicted"]:
        w = p.get("workload")
        low, high = (p["output_throughput_interval"] + [0.0, 0.0])[:2]
        tps = f"{p[OUTPUT_THROUGHPUT]:.1f} [{low:.0f}-{high:.0f}]"
        row = [p["config"], p["cell"], str(w["concurrency"]) if w else "-", ctx(w["context_tokens"] if w else None),
               w["prompts"] if w else "-", tps]
        rows.append(row + ["-"] * (width - len(row) - 1) + [Status.PREDICTED])  # the status column is the last
    return rows


def summary_lines(outcome: AdaptiveSweepData) -> list[str]:
    """The recommendations' adaptive part: restarts spent vs a full sweep, per-cell picks."""
    from pytest_ddtree.adaptive.advisor import PICK_TIE

    lines = [
        f"adaptive sweep: {outcome['restarts']} restarts spent (service launches) of "
        f"{outcome['full_sweep_restarts']} a full sweep would take (limit {outcome['max_restarts']}); "
        f"measured: {', '.join(outcome['measured']) or 'none'}",
    ]
    if outcome.get("error"):
        lines.append(f"adaptive sweep: {outcome.get('error')}")
    if outcome["failed"]:
        lines.append(f"adaptive sweep: failed to measure (restart spent): {', '.join(outcome['failed'])}")
    if outcome["prior"]:
        lines.append(f"adaptive sweep: {outcome['prior']}")
    for rec in outcome["recommendations"]:
        line = f"{rec['cell']}: {rec['config']} ({rec[OUTPUT_THROUGHPUT]:.1f} tok/s measured"
        if "measured_best" in rec:  # a near tie the fit broke: the table shows a higher figure, say whose and why
            line += (f"; {rec['measured_best']} measured {rec.get('measured_best_output_throughput', 0.0):.1f}, within "
                     f"{PICK_TIE:.0%} of it, and the fit over every cell prefers {rec['config']}")
        line += ")"
        if rec["challenger"]:
            high = rec["challenger_high"]
            predicted = rec.get("challenger_output_throughput")  # what it was chosen by: the highest prediction
            line += (f"; {rec['challenger']} (not measured" + (f", predicted {predicted:.1f}" if predicted is not None else "")
                     + f") may reach {high if high is None else f'{high:.1f}'}: measure it or run the full sweep to be sure")
        lines.append(line)
    if outcome["predicted"]:
        lines.append("rows marked predicted are the model's estimates with a 95% interval: never gated, never baselines")
    return lines


ItemT = TypeVar("ItemT")


@dataclass(frozen=True)
class SweepRun(Generic[ItemT]):
    """What the sweep runs, and how: the tests of no config, each config's tests, and pytest's
    loop body (``run(items, next_item)``) and deselection, which the plugin hands in."""

    plain: list[ItemT]
    by_config: Mapping[str, list[ItemT]]
    run: Callable[[list[ItemT], ItemT | None], None]
    deselect: Callable[[list[ItemT]], None]


@dataclass(frozen=True)
class SweepPlan:
    """What the sweep reads of its session: the selected configs (in run order), the cells it measures
    (the selected workloads within the profile's context), ``--ddtree-max-restarts``, the build's
    default config, ``--ddtree-prior`` folders, and where its progress lines go."""

    configs: Sequence[DDTreeConfig]
    cells: Sequence[Cell]
    limit: int
    default: str
    priors: Sequence[Path]
    progress: Callable[[str], None]


def run_sweep(plan: SweepPlan, items: SweepRun[ItemT], manager: ServiceManager, recorder: SessionRecorder) -> None:
    """Run the configs one at a time, each chosen by the advisor from the ones measured before.

    The tests of no config run first; the configs never chosen are deselected, and their
    throughput cells are predicted. The sweep's outcome is recorded (``adaptive-sweep``): the
    restarts it spent are ``manager``'s launches of a config.
    """
    from pytest_ddtree.measure.load import workload_dict

    sweep = AdaptiveSweep([c for c in plan.configs if c.name in items.by_config], plan.cells, plan.limit,
                          default=plan.default, priors=plan.priors, progress=plan.progress)

    def first_untried() -> ItemT | None:
        return next((tests[0] for name, tests in items.by_config.items() if name not in sweep.tried), None)

    items.run(items.plain, first_untried())
    error = _measure_chosen(plan, sweep, items, first_untried, recorder)
    skipped = [item for name, tests in items.by_config.items() if name not in sweep.tried for item in tests]
    if skipped:
        plan.progress(f"adaptive sweep: {len(skipped)} tests deselected, their configs not measured (their throughput "
                      f"cells are predicted instead): {', '.join(sweep.not_measured())}")
        items.deselect(skipped)
    outcome = sweep.outcome(manager.config_launches, {w.name: workload_dict(w) for w in plan.cells})
    if error is not None:
        outcome["error"] = error
    recorder.record(RecordKind.ADAPTIVE_SWEEP, None, outcome)


def _measure_chosen(plan: SweepPlan, sweep: AdaptiveSweep, items: SweepRun[ItemT],
                    first_untried: Callable[[], ItemT | None], recorder: SessionRecorder) -> str | None:
    """Measure the advisor's choices until it has none (or the restarts are spent); why it
    stopped early, if it failed."""
    last = None
    while True:
        try:  # the advisor's fit may fail (a degenerate prior, say): that ends the sweep, results stay
            if last is not None:
                got = sweep.record_config(last, recorder.records, recorder.hardware_profile)
                plan.progress(f"adaptive sweep: {last} measured {got} cell(s)")
            name = sweep.next_config()
        except Exception as exc:  # noqa: BLE001 - said in the summary, not an internal error
            error = f"adaptive sweep stopped: the advisor failed: {type(exc).__name__}: {exc}"
            plan.progress(error)
            return error
        if name is None:
            return None
        plan.progress(f"adaptive sweep: measuring {name} (restart {len(sweep.tried)} of at most {plan.limit})")
        items.run(list(items.by_config[name]), first_untried())
        last = name
