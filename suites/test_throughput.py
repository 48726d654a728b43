"""Throughput and acceptance gate: one test per (config, workload cell).

How a config is measured (see DESIGN.md "Measurements and gates"):

* The first cell test of a config measures *all* of that config's selected cells, with
  repeats interleaved (repeat r of every cell before repeat r+1 of any), each repeat
  recorded the moment it exists; later cell tests of the config read the results. The
  plugin pins a config's tests to one xdist worker, so this happens once per config.
* A cell is repeated at least ``--ddtree-repeats`` times (default 3) and at most
  ``MAX_EXTRA_REPEATS`` more, stopping as soon as the output-throughput interval is tight.
* Each cell is compared with ``baselines/<hardware-profile>/<config>.yaml``: it fails only
  on a regression beyond tolerance with statistical support, or on an invalid measurement
  (errors, wrong token counts), and the message says which. Inconclusive cells are skipped
  with the reason; a cell without a baseline passes with a ``MissingBaselineWarning`` that
  names the command creating it (``--ddtree-require-baselines`` makes it a failure).
* ``--ddtree-update-baselines`` proposes the measured samples as the new baseline; the
  controller writes them at session end (atomic, sorted YAML).
* Every cell is also a pytest-benchmark record: its rounds are the measured repeats'
  durations (replayed through a custom timer), its ``extra_info`` the bench_serving figures,
  so ``--benchmark-json``/``--benchmark-autosave`` carry them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_ddtree import gate, load, report, stats
from pytest_ddtree.baselines import BaselineError
from pytest_ddtree.configs import DDTreeConfig, Workload
from pytest_ddtree.fingerprint import local_fingerprint

#: Repeats beyond --ddtree-repeats that a cell may get when its interval is not yet tight.
MAX_EXTRA_REPEATS = 2
#: Stop repeating once the 95% CI of output tok/s is within +-3% of the median ...
TARGET_REL_CI = 0.03
#: ... and call the cell inconclusive when it ends wider than +-10%.
INCONCLUSIVE_REL_CI = 0.10
#: Per-request timeout of the load generator.
REQUEST_TIMEOUT_S = 600.0



class MissingBaselineWarning(UserWarning):
    """A cell was measured but has no baseline to gate against (the message says how to make one)."""


_CAMPAIGNS = pytest.StashKey[dict[str, "Campaign"]]()


def _session(config: pytest.Config) -> Any:
    from pytest_ddtree.plugin import SESSION_KEY

    return config.stash.get(SESSION_KEY, None)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``workload`` over the matrix's cells (filtered by --ddtree-workload)."""
    if "workload" not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    if session is None:
        return
    workloads: list[Workload] = list(session.matrix.workloads)
    patterns = session.settings.workloads
    if patterns:
        chosen = [w for w in workloads if any(fnmatch.fnmatchcase(w.name, p) for p in patterns)]
        if not chosen:
            names = ", ".join(w.name for w in workloads)
            raise pytest.UsageError(f"--ddtree-workload {', '.join(patterns)} matches no workload; valid: {names}")
        workloads = chosen
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
    metafunc.parametrize("workload", params)


@dataclass
class Campaign:
    """All measured cells of one config in this process."""

    runs: dict[str, stats.CellRun[load.CellResult]]
    policy: stats.RepeatPolicy


def _cells_of_config(request: pytest.FixtureRequest, config: DDTreeConfig) -> list[Workload]:
    """The cells of ``config`` that this session will run (collected, selected, not skipped)."""
    cells: list[Workload] = []
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if spec is None or getattr(item, "originalname", None) != request.node.originalname:
            continue
        cfg, w = spec.params.get("ddtree_config"), spec.params.get("workload")
        if cfg == config and isinstance(w, Workload) and w not in cells and not item.get_closest_marker("skip"):
            cells.append(w)
    return cells or [request.getfixturevalue("workload")]


def _campaign(request: pytest.FixtureRequest, service: Any, config: DDTreeConfig, recorder: Any,
              repeats: int) -> Campaign:
    campaigns = request.config.stash.setdefault(_CAMPAIGNS, {})
    if config.name in campaigns:
        return campaigns[config.name]
    cells = _cells_of_config(request, config)
    policy = stats.RepeatPolicy(min_repeats=repeats, max_repeats=repeats + MAX_EXTRA_REPEATS,
                                target_rel_ci=TARGET_REL_CI, inconclusive_rel_ci=INCONCLUSIVE_REL_CI)
    vocab = load.vocab_size_of(load.Endpoint(service.url))
    by_name = {w.name: w for w in cells}

    def measure(name: str, r: int) -> load.CellResult:
        return load.run_cell(service.url, by_name[name], vocab_size=vocab, timeout_s=REQUEST_TIMEOUT_S)

    def primary(result: load.CellResult) -> float | None:
        value = result.metrics()["output_throughput"]
        return float(value) if result.valid and isinstance(value, (int, float)) else None

    def on_sample(name: str, r: int, result: load.CellResult) -> None:
        recorder.record("throughput-repeat", config.name, {
            "cell": name, "repeat": r, "workload": result.workload, "metrics": result.metrics(),
            "problems": result.problems()[:20], "notes": result.notes,
        })

    runs = stats.run_interleaved(list(by_name), measure, primary, policy, on_sample)
    campaigns[config.name] = Campaign(runs=runs, policy=policy)
    return campaigns[config.name]


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
    ddtree_config: DDTreeConfig,
    ddtree_service: Any,
    ddtree_settings: Any,
    ddtree_recorder: Any,
    ddtree_baselines: Any,
    workload: Workload,
) -> None:
    """Output tok/s, acceptance and TTFT of one cell against its baseline."""
    config = ddtree_config.name
    campaign = _campaign(request, ddtree_service, ddtree_config, ddtree_recorder, ddtree_settings.repeats)
    run = campaign.runs[workload.name]
    valid = [s for s in run.samples if s.valid]
    repeats = [s.metrics() for s in valid]
    problems = [p for s in run.samples for p in s.problems()]
    notes = sorted({n for s in run.samples for n in s.notes})
    status, why = gate.measurement_status(campaign.policy, run.primary, run.invalid, repeats, problems)
    samples = {
        spec.key: [float(v) for m in repeats if isinstance(v := m.get(spec.key), (int, float))]
        for spec in gate.GATED_METRICS
    }
    workload_info = load.workload_dict(workload)

    section: dict[str, Any] = {}
    baseline_problem: str | None = None
    try:
        data = ddtree_baselines.load(config)
        if data is not None:
            section = gate.validate_section(data.get("metrics"), str(ddtree_baselines.path_for(config)))
    except (BaselineError, gate.BaselineFormatError) as exc:
        baseline_problem = str(exc)
    cell_base = section.get(workload.name)
    verdict = gate.compare_cell(workload.name, cell_base, samples, status=status, problems=why,
                                workload=workload_info)
    if ddtree_baselines.update_mode and status == stats.VALID:
        verdict = dataclasses.replace(verdict, status="updated")  # the table shows what was blessed
    record = report.throughput_record(
        config=config, cell=workload.name, workload=workload_info, repeats=repeats, samples=samples,
        measurement_status=status, verdict=verdict.as_dict(), problems=problems[:20], notes=notes,
        hardware_profile=ddtree_baselines.hardware_profile,
    )
    ddtree_recorder.record("throughput", config, record)

    timer = _ReplayTimer()
    timer.durations = [s.duration_s for s in valid]
    for bench in _benchmark(request, timer):
        bench.extra_info.update({"config": config, "cell": workload.name, "status": verdict.status,
                                 "measurement_status": status, "repeats": len(repeats), **workload_info})
        bench.extra_info.update({k: v for k, v in record["metrics"].items() if k in report.JSON_KEYS})
        bench.pedantic(lambda: None, rounds=max(1, len(valid)), iterations=1)

    if baseline_problem is not None:
        pytest.fail(f"{config} {workload.name}: {baseline_problem}", pytrace=False)
    if status == stats.INVALID:
        pytest.fail(verdict.message(config), pytrace=False)
    if ddtree_baselines.update_mode:
        if status != stats.VALID:
            pytest.fail(f"{config} {workload.name}: not blessing an inconclusive measurement (repeats disagree: "
                        f"{run.primary}); rerun with more --ddtree-repeats on a quieter machine", pytrace=False)
        fp = local_fingerprint(ddtree_service.profile, ddtree_service.server_info)
        entry = gate.baseline_cell_entry(workload_info, samples, existing=cell_base)
        ddtree_recorder.propose_baseline(config, "metrics", {workload.name: entry})
        ddtree_recorder.propose_baseline(config, "fingerprint", fp.as_dict())
        return
    if verdict.status == gate.MISSING:
        reasons = "; ".join(verdict.reasons)
        msg = (f"{config} {workload.name}: {reasons} in {ddtree_baselines.path_for(config)}; "
               f"create it with: {ddtree_baselines.create_command(config)}")
        if ddtree_settings.require_baselines:
            pytest.fail(msg + " (--ddtree-require-baselines)", pytrace=False)
        # A warning, not a skip: the measurement is real and must reach --benchmark-json
        # (pytest-benchmark drops skipped tests); CI turns this into a failure with
        # --ddtree-require-baselines.
        warnings.warn(MissingBaselineWarning(msg), stacklevel=1)
    if verdict.status == gate.REGRESSION:
        pytest.fail(verdict.message(config), pytrace=False)
    if verdict.status == gate.INCONCLUSIVE:
        pytest.skip(verdict.message(config).replace("\n", " "))
