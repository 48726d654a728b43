"""Throughput and acceptance gate: one test per (config, cell).

How a config is measured (docs/gates/throughput.md):

* The first cell test of a config measures *all* of that config's selected cells, with
  repeats interleaved (repeat r of every cell before repeat r+1 of any), each repeat
  recorded the moment it exists; later cell tests of the config read the results. The
  plugin pins a config's tests to one xdist worker, so this happens once per config.
* A cell is repeated at least ``--ddtree-repeats`` times (default 3) and at most
  ``MAX_EXTRA_REPEATS`` more, stopping as soon as the output-throughput interval is tight.
* The config's cells are judged together against ``baselines/<hardware-profile>/<config>.yaml``
  (``pytest_ddtree/gates/throughput/rule.py`` states the rule, ``cells.judge_cell`` there judges each cell); a flagged cell is measured again at once, while
  the service is up, and fails only when that confirmation regresses too. A cell also fails on
  an invalid measurement (errors, wrong token counts) or a gated metric the run did not
  produce. Inconclusive cells (repeats that disagree even after extra repeats, a service that
  could not keep its clock) are skipped with the reason; a cell without a baseline, or with
  one too thin to trust, passes with a ``MissingBaselineWarning`` naming the command that
  creates it. ``--ddtree-require-baselines`` (CI) makes all three failures.
* Before the first config, the session's control (``ddtree_control``: the non-speculative launch,
  measured once per process on every cell; ``pytest_ddtree/gates/throughput/control.py``) is measured; the session end
  judges it, each config's speedup over it and the session's uniform shift.
* ``--ddtree-update-baselines`` proposes the measured samples as this session's part of the
  baseline (the last three blessed sessions are kept); the main process writes them at session
  end (atomic, sorted YAML).
* Every cell is also a pytest-benchmark record: its rounds are the measured repeats'
  durations (replayed through a custom timer), its ``extra_info`` the bench_serving figures,
  so ``--benchmark-json``/``--benchmark-autosave`` carry them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ddtree.report import text as report
from pytest_ddtree.configs import ConfigError, DDTreeConfig
from pytest_ddtree.measure.matrix import Cell
from pytest_ddtree.measure.load import LoadError
from pytest_ddtree.plugin import session_of
from pytest_ddtree.gates.suite_warnings import MissingBaselineWarning, NewMetricWarning
from pytest_ddtree.gates.throughput import cells
from pytest_ddtree.gates.throughput.cells import MeasuredCells
from pytest_ddtree.gates.throughput.cells import judge_cell
from pytest_ddtree.gates.throughput.measurement import (CellDeadlineExceeded, Judging, OnSample, Recording,
                                                        blessed_judging, sample_record)
from pytest_ddtree.records.words import RecordKind, Status

if TYPE_CHECKING:  # the fixtures' types (plugin.py hands them out)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import RunningService


_WARNING_CLASS: dict[str, type[UserWarning]] = {"missing-baseline": MissingBaselineWarning, "new-metric": NewMetricWarning}


_CAMPAIGNS = pytest.StashKey[dict[str, "MeasuredCells"]]()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``cell`` over the matrix's cells (filtered by --ddtree-cell)."""
    if "cell" not in metafunc.fixturenames:
        return
    session = session_of(metafunc.config)
    if session is None:
        return
    try:
        workloads = session.cells
    except ConfigError as exc:  # normally caught at configure time already (exit 4)
        raise pytest.UsageError(str(exc)) from None
    try:
        max_context = session.profile.max_context
    except Exception:  # a broken profile fails in the ddtree_profile fixture with its message
        max_context = None
    params = []
    for w in workloads:
        marks = []
        if max_context is not None and w.context_tokens > max_context:
            marks.append(pytest.mark.skip(
                reason=f"{w.name}: context {w.context_tokens} tokens exceeds the profile's max_context {max_context}"))
        params.append(pytest.param(w, id=w.name, marks=marks))
    metafunc.parametrize("cell", params)


_JUDGING = pytest.StashKey[Judging]()


def _judging(request: pytest.FixtureRequest, baselines: BaselineStore) -> Judging:
    """How much a config's common change moves between launches, and each cell's repeat noise, from
    every blessed config of this hardware profile (read once per process)."""
    stash = request.config.stash
    if _JUDGING not in stash:
        stash[_JUDGING] = blessed_judging(baselines)
    return stash[_JUDGING]


def _campaign(request: pytest.FixtureRequest, service: RunningService, config: DDTreeConfig, recorder: SessionRecorder,
              baselines: BaselineStore) -> MeasuredCells:
    """Measure and judge all of ``config``'s cells once per process (the first cell test
    does it, through the gate's one cell orchestration: ``cells.run_config``)."""
    campaigns = request.config.stash.setdefault(_CAMPAIGNS, {})
    if config.name in campaigns:
        return campaigns[config.name]
    session = session_of(request.config)
    if session is None:
        pytest.fail("the ddtree plugin is not active in this session", pytrace=False)
    collected = cells.collected_cells(request.session.items, request.node.originalname).of(config.name)

    def record(kind: RecordKind) -> OnSample:
        return lambda name, r, result: recorder.record(kind, config.name, sample_record(name, r, result))

    try:
        setup = cells.CellSetup.of(session.profile, session.settings, session.slo)
        campaigns[config.name] = cells.run_config(
            setup, baselines, service, config.name, collected or [request.getfixturevalue("cell")],
            Recording(record(RecordKind.THROUGHPUT_REPEAT), record(RecordKind.THROUGHPUT_CONFIRM_REPEAT)),
            judging=Judging() if baselines.update_mode else _judging(request, baselines), hooks=session.hooks)
    except LoadError as exc:  # the prompts cannot be made (bad source, missing vocab_size, no service), or a deadline
        failure, past_deadline = f"{config.name}: {exc}", isinstance(exc, CellDeadlineExceeded)
    else:
        return campaigns[config.name]
    # Outside the except block: the report shows the message, not a chained traceback.
    if past_deadline:  # wedged or too slow to measure: stop it, the next config starts fresh
        session.manager.abandon(config.name, failure)
    pytest.fail(failure, pytrace=False)


class _ReplayTimer:
    """A pytest-benchmark timer that replays measured durations: 0, d1, 0, d2, ...

    pytest-benchmark times a callable; our measurement already happened (interleaved with
    other cells), so each benchmark round "takes" exactly one measured repeat's duration.
    """

    __name__ = "ddtree_replayed_repeat_duration"

    def __init__(self) -> None:
        self.durations: list[float] = []
        self._calls = 0

    def __call__(self) -> float:
        i, self._calls = self._calls, self._calls + 1
        if i % 2 == 0 or not self.durations:
            return 0.0
        return self.durations[(i // 2) % len(self.durations)]


def _benchmark(request: pytest.FixtureRequest, timer: _ReplayTimer) -> Iterator[Any]:
    """The pytest-benchmark fixture when it is available and not skipped, else nothing."""
    if not request.config.pluginmanager.hasplugin("benchmark"):  # -p no:benchmark
        return iter(())
    request.node.add_marker(pytest.mark.benchmark(timer=timer, group=f"ddtree-{request.node.callspec.id}"))
    try:
        return iter((request.getfixturevalue("benchmark"),))
    except (pytest.FixtureLookupError, pytest.skip.Exception):
        return iter(())  # -p no:benchmark or --benchmark-skip: the gate still runs


def test_throughput(
    request: pytest.FixtureRequest,
    ddtree_control: str,
    ddtree_config: DDTreeConfig,
    ddtree_service: RunningService,
    ddtree_settings: Settings,
    ddtree_recorder: SessionRecorder,
    ddtree_baselines: BaselineStore,
    cell: Cell,
) -> None:
    """Output tok/s, acceptance and TTFT of one cell against its baseline."""
    config = ddtree_config.name
    measured = _campaign(request, ddtree_service, ddtree_config, ddtree_recorder, ddtree_baselines).cells[cell.name]
    status, verdict, record = measured.status, measured.verdict, measured.record
    ddtree_recorder.record(RecordKind.THROUGHPUT, config, record)

    timer = _ReplayTimer()
    timer.durations = measured.durations
    for bench in _benchmark(request, timer):
        bench.extra_info.update({"config": config, "cell": cell.name, "status": verdict.status,
                                 "measurement_status": status, "repeats": measured.repeats, **record["workload"]})
        bench.extra_info.update({k: v for k, v in record["metrics"].items() if k in report.JSON_KEYS})
        bench.pedantic(lambda: None, rounds=max(1, len(measured.durations)), iterations=1)

    session = session_of(request.config)
    outcome = judge_cell(measured, config, cell.name, baselines=ddtree_baselines, recorder=ddtree_recorder,
                         service=ddtree_service, settings=ddtree_settings, hooks=session.hooks if session else None)
    for note in outcome.warnings:
        warnings.warn(_WARNING_CLASS[note.kind](note.message), stacklevel=1)
    if outcome.decision is Status.FAIL:
        pytest.fail(outcome.message, pytrace=False)
    if outcome.decision is Status.SKIP:
        pytest.skip(outcome.message)
    if outcome.message:  # passed on another build than the blessed one: which, and what changed
        request.node.add_report_section("call", "ddtree build", outcome.message)

