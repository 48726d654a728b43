"""A simulated service under the plugin's own gate path, for ``bench_gate.py``.

Why: the gate's published error budget must be the shipped gate's. So a simulated session here runs
what a pytest session runs, in its order: the ``ddtree_control`` fixture's body (the control's
launches at the process's start, and at its end ``relaunch_flagged``, the end launches and the
further launches its launch policy asks for), the suite's ``test_throughput`` for every (config,
cell) with the ``ddtree_service`` fixture's body before each config, and at the session end
``finish._apply_baseline_updates`` (a bless: the baseline YAML files written by the bless flow) or
``finish._judge_configs_against_session`` and ``finish._judge_control``. Real settings, profile,
recorder, baseline store and results folder; the one thing faked is what needs a GPU: a launch
(``SimManager``: each launch of a config or the control draws its own speed) and a measured repeat
(``measurement.run_repeat`` answers a ``SimResult`` from the noise model instead of sending requests).
A sibling simulation adds to a session through ``Extras`` (``rate_sim.py``: open-loop cells served by a
queueing model, and the suite's ``test_sustainable_rate`` before each config's cells).
"""

from __future__ import annotations

import math
import os
import pickle
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from pytest_ddtree.metrics import MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT
from pytest_ddtree import baselines as baselines_mod
from pytest_ddtree import finish, plugin, yamlfile
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.measure.matrix import Cell
from pytest_ddtree.gates.throughput import measurement
from pytest_ddtree.measure import load
from pytest_ddtree.options import Settings, session_stamp
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.sessionfolder import claim_results_dir
from pytest_ddtree.records.words import RecordKind, Status
from pytest_ddtree.report import text as report
from pytest_ddtree.service.manager import RunningService
from pytest_ddtree.session import DDTreeSession

CONTROL = -1  # the control's index in the model


@dataclass(frozen=True)
class Shape:
    """A noise shape (bench_gate.py's docstring names them)."""

    name: str
    noise: tuple[float, ...]  # repeat noise of output tok/s per cell
    day: float = 0.02
    launch: float = 0.0
    outlier_rate: float = 0.02
    outlier_size: float = 0.15
    tails: float = 0.0  # Student-t degrees of freedom (0: normal)
    drift: float = 0.0


class Model:
    """True values and the noise of one simulated world (a shape and a random state)."""

    def __init__(self, shape: Shape, rng: random.Random, configs: int, cells: int) -> None:
        self.shape, self.rng = shape, rng
        self.truth = [[(rng.uniform(80, 1200), rng.uniform(4, 400), rng.uniform(3, 5.5)) for _ in range(cells)]
                      for _ in range(configs)]
        self.control_truth = [(rng.uniform(40, 600), rng.uniform(4, 400)) for _ in range(cells)]

    def day(self) -> dict[str, float]:
        """A session's day factor (log) and its drift direction."""
        return {"day": self.rng.gauss(0, self.shape.day), "drift": self.rng.choice((-1.0, 1.0)) * self.shape.drift}

    def launch_speed(self, day: dict[str, float], position: float) -> float:
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

    def repeat(self, config: int, cell: int, speed: float, drop: float) -> dict[str, float]:
        """One repeat's gated figures (the control's responses carry no verify counts)."""
        out = 1.0 - self.shape.outlier_size if self.rng.random() < self.shape.outlier_rate else 1.0
        factor = math.exp(speed) * out * math.exp(self._noise(cell)) * (1.0 - drop)
        s = self.shape.noise[cell]
        if config == CONTROL:
            tps, ttft = self.control_truth[cell]
            return {OUTPUT_THROUGHPUT: tps * factor, MEDIAN_TTFT_MS: ttft / math.exp(speed) / out}
        tps, ttft, acc = self.truth[config][cell]
        return {OUTPUT_THROUGHPUT: tps * factor,
                MEDIAN_TTFT_MS: ttft / math.exp(speed) / out * math.exp(self.rng.gauss(0, 2 * s)),
                report.TOKENS_PER_VERIFY: acc * math.exp(self.rng.gauss(0, s / 3))}


class SimResult(load.CellResult):
    """A measured repeat of the simulated service: the model's figures, no requests behind them."""

    figures: dict[str, float]

    def metrics(self) -> dict[str, float | int | None]:
        return {"completed": self.workload["requests"], **self.figures}

    def problems(self) -> list[str]:
        return []


@dataclass
class SimClient:
    """The client of one simulated launch: what ``run_repeat`` needs to draw its repeats."""

    world: World
    config: int
    speed: float
    base_url: str = "http://sim"
    timeout: float = 60.0

    def close(self) -> None:
        return None


@dataclass
class World:
    """One blessed world: the model, today's day, what a session slows, and the counts of its cost."""

    model: Model
    configs: list[DDTreeConfig]
    cells: list[Cell]
    root: Path
    day: dict[str, float] = field(default_factory=dict)
    drops: dict[tuple[int, int], float] = field(default_factory=dict)  # (config or CONTROL, cell) -> drop
    counts: dict[str, int] = field(default_factory=dict)
    launches: int = 0  # launches of this session so far (its position for the drift)
    phase: str = "first pass"

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n


def sim_run_repeat(client: Any, workload: load.CellLike, cell_timeout_s: float, **kwargs: Any) -> load.CellResult:
    """``measurement.run_repeat`` of the simulated service: one repeat from the model."""
    sim = cast(SimClient, client)
    world = sim.world
    cell = next(i for i, w in enumerate(world.cells) if w.name == workload.name)
    figures = world.model.repeat(sim.config, cell, sim.speed, world.drops.get((sim.config, cell), 0.0))
    world.count("control_repeats" if sim.config == CONTROL else f"repeats {world.phase}")
    result = SimResult(cell=workload.name, workload=load.workload_dict(workload, "simulated"), requests=[],
                       duration_s=1.0, speculative=sim.config != CONTROL, prompt_source="simulated",
                       server_info={"version": "sim"})
    result.figures = figures
    return result


class SimManager:
    """The service manager's face to the gate (``ensure``, ``ensure_reference``, ``release``,
    ``abandon``): every launch is a fresh speed draw of the model; a running config is kept."""

    def __init__(self, world: World, session: DDTreeSession, expected_launches: int) -> None:
        self.world, self.session, self.expected = world, session, max(1, expected_launches)
        self.current: tuple[str, RunningService] | None = None
        self.purpose: str | None = None  # records.bill.launching_for sets it (the simulation has no launch records)

    def _launch(self, key: str, config: DDTreeConfig | None, index: int) -> RunningService:
        if self.current is not None and self.current[0] == key:
            return self.current[1]
        world = self.world
        speed = world.model.launch_speed(world.day, world.launches / self.expected)
        world.launches += 1
        world.count("launches")
        world.count(f"launches {self.purpose or ('control' if index == CONTROL else 'configs')}")
        client = SimClient(world, index, speed)
        service = RunningService(url="http://sim", client=cast(Any, client), server_info={"version": "0.5.23"},
                                 config=config, profile=self.session.profile, launch_command=None, instance=0)
        self.current = (key, service)
        return service

    def ensure(self, config: DDTreeConfig) -> RunningService:
        return self._launch(config.name, config, self.world.configs.index(config))

    def ensure_for_tests(self, config: DDTreeConfig) -> RunningService:
        return self.ensure(config)  # a simulated launch never fails: no Refusal

    def ensure_reference(self) -> RunningService:
        return self._launch("control", None, CONTROL)

    def release(self) -> None:
        self.current = None

    def abandon(self, config_name: str, reason: str) -> None:
        self.current = None

    def snapshot_runner(self) -> None:
        """No remote host: the hardware profile is the profile's ``hardware_profile``."""
        return None


PROFILE = """name: sim
controller: process
command: "{{python}} -m pytest_ddtree.refserver --port {{port}} {{config_args}}"
url: "http://127.0.0.1:{{port}}"
port: auto
hardware_profile: sim-h200
lossless_args: "--speculative-algorithm NONE"
config_args:
  block_size: "--speculative-dflash-block-size {{value}}"
  budget: "--speculative-num-draft-tokens {{value}}"
  topk: "--speculative-eagle-topk {{value}}"
applied:
  speculative_dflash_block_size: block_size
  speculative_num_draft_tokens: budget
  speculative_eagle_topk: topk
{extra}"""


def new_world(shape: Shape, rng: random.Random, configs: int, cells: list[Cell], profile_extra: str) -> World:
    """A world of its own folder (baselines, profile, results), its model and its configs."""
    root = Path(tempfile.mkdtemp(prefix="ddtree-sim-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    (root / "profile.yaml").write_text(PROFILE.format(extra=profile_extra))
    names = [DDTreeConfig(block_size=8, budget=4 + i, topk=4) for i in range(configs)]
    return World(Model(shape, rng, configs, len(cells)), names, cells, root)


def drop_world(world: World) -> None:
    shutil.rmtree(world.root, ignore_errors=True)


def _settings(world: World, index: int, bless: bool, repeats: int) -> Settings:
    stamp = session_stamp(datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(days=index))
    return Settings(rootdir=world.root, configs=(), service=world.root / "profile.yaml", service_is_default=False,
                    matrix=Path(__file__).resolve().parent.parent / "suites" / "configs.yaml", baselines=world.root / "baselines", update_baselines=bless,
                    require_baselines=False, results=world.root / f"results-{index}", package=None, package_name=None,
                    package_force=False, coding_set="", coding_limit=None, coding_max_tokens=0, sandbox="",
                    ready_timeout=None, repeats=repeats, cells=(), session_stamp=stamp,
                    session_id=f"{stamp}-sim{index}")


def _request(stash: pytest.Stash, items: list[Any], workload: Cell | None = None) -> Any:
    """What the suite's function and the control's fixture read of pytest's request."""
    node = SimpleNamespace(originalname="test_throughput", user_properties=[], add_marker=lambda m: None,
                           add_report_section=lambda *a: None)
    return SimpleNamespace(config=SimpleNamespace(stash=stash, pluginmanager=SimpleNamespace(hasplugin=lambda n: False)),
                           session=SimpleNamespace(items=items, shouldstop=False, shouldfail=False), node=node,
                           getfixturevalue=lambda name: workload)


def _items(world: World) -> list[Any]:
    return [SimpleNamespace(callspec=SimpleNamespace(params={"ddtree_config": c, "cell": w}),
                            originalname="test_throughput", get_closest_marker=lambda name: None)
            for c in world.configs for w in world.cells]


def _body(fixture: Any) -> Any:
    """A fixture's own function (pytest 8.4+: ``_get_wrapped_function``; earlier: ``__pytest_wrapped__``)."""
    if hasattr(fixture, "_get_wrapped_function"):
        return fixture._get_wrapped_function()
    wrapped = getattr(fixture, "__pytest_wrapped__", None)
    return wrapped.obj if wrapped is not None else fixture


_CONTROL_BODY = _body(plugin.ddtree_control)
_SERVICE_BODY = _body(plugin.ddtree_service)


def suite_function(module_name: str, function: str) -> Any:
    """A function of a suite's module (``suites/<module_name>.py``), loaded as pytest would import it."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "suites" / f"{module_name}.py"
    spec = importlib.util.spec_from_file_location(f"ddtree_suite_{module_name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


TEST_THROUGHPUT = suite_function("test_throughput", "test_throughput")


@dataclass
class SessionResult:
    """What one simulated session did: its records, its failed and skipped tests, the session end."""

    records: list[dict[str, object]]
    failed_tests: list[str]
    skipped_tests: list[str]
    outcome: finish.FinishOutcome
    counts: dict[str, int]


_PARSED: dict[str, bytes] = {}


def _read_yaml_once(path: Path) -> tuple[Any, str]:
    """``yamlfile.read_yaml`` with each distinct text parsed once (by libyaml) and handed out as a
    fresh copy: the simulated campaign reads ~160 baseline files a session, which the pure-Python
    parser makes 95% of its time. Same text, same document: the gate sees what it would."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return yamlfile.read_yaml(path)  # the error as the plugin words it
    if text not in _PARSED:
        if len(_PARSED) > 256:
            _PARSED.clear()
        _PARSED[text] = pickle.dumps(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    return pickle.loads(_PARSED[text]), text


def install(run_repeat: Callable[..., load.CellResult] = sim_run_repeat) -> None:
    """The fakes where a GPU would be: the measured repeat and the prompts (no service to tokenize)."""
    measurement.run_repeat = run_repeat
    load.prompt_maker = lambda client, **kw: None  # type: ignore[assignment]
    setattr(baselines_mod, "read_yaml", _read_yaml_once)
    # the simulation's files live in memory and die with it: no fsync (gVisor makes each one costly)
    os.fsync = lambda fd: None


#: A config's tests that pytest runs before its throughput cells (``Extras.before_cells``): they get the
#: world, the config, its running service, the session and pytest's request, and append the names of
#: their failed and skipped tests to the two lists.
BeforeCells = Callable[[World, DDTreeConfig, RunningService, DDTreeSession, Any, list[str], list[str]], None]


@dataclass(frozen=True)
class Extras:
    """What a sibling simulation adds to a session (``rate_sim.py``: open-loop cells and the
    sustainable-rate test); the defaults are the plain throughput session."""

    run_repeat: Callable[..., load.CellResult] = sim_run_repeat  # the measured repeat's fake
    settings: Callable[[World, Settings], Settings] | None = None  # e.g. an SLO, another matrix
    #: the config's tests before its cells (pytest orders a config's tests by file: test_sustainable_rate.py
    #: before test_throughput.py), run on its service before the control fixture's first use
    before_cells: BeforeCells | None = None


def run_session(world: World, index: int, bless: bool, repeats: int = 3, extras: Extras = Extras()) -> SessionResult:
    """One pytest process of the campaign through the plugin's path (the module docstring)."""
    install(extras.run_repeat)
    world.counts, world.launches, world.day, world.phase = {}, 0, world.model.day(), "first pass"
    settings = _settings(world, index, bless, repeats)
    session = DDTreeSession(settings if extras.settings is None else extras.settings(world, settings))
    claim_results_dir(session.settings.results, session.settings.session_id)
    session.started = True
    session._manager = cast(Any, SimManager(world, session, len(world.configs) + 2))
    stash = pytest.Stash()
    stash[plugin.SESSION_KEY] = session
    items = _items(world)
    failed: list[str] = []
    skipped: list[str] = []
    control: Iterator[str] = _CONTROL_BODY(_request(stash, items), session)
    done: str | None = None if extras.before_cells is not None else next(control)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for config in world.configs:
            request = _request(stash, items)
            if extras.before_cells is not None:
                extras.before_cells(world, config, _SERVICE_BODY(config, session, request), session, request, failed,
                                    skipped)
            if done is None:  # the control fixture's start, at the first test that asks for it
                done = next(control)
            service = _SERVICE_BODY(config, session, request)
            for workload in world.cells:
                request = _request(stash, items, workload)
                try:
                    TEST_THROUGHPUT(request, done, config, service, session.settings, session.recorder,
                                    session.baselines(service.server_info), workload)
                except pytest.fail.Exception:
                    failed.append(f"{config.name}[{workload.name}]")
                except pytest.skip.Exception:
                    skipped.append(f"{config.name}[{workload.name}]")
        world.phase = "relaunch"
        next(control, None)
    records = session.collected_records()
    outcome = finish.FinishOutcome()
    if bless:
        finish._apply_baseline_updates(session.settings, session.collected_updates(), outcome)
    else:
        finish._judge_configs_against_session(records, outcome)
        finish._judge_control(session.settings, session.profile, records, outcome)
    return SessionResult(records, failed, skipped, outcome, dict(world.counts))


def cell_regressed(result: SessionResult, config: str, cell: str | None = None) -> bool:
    """Whether a cell of ``config`` (``cell``, or any) has its output tok/s judged a regression."""
    for rec in records_mod.throughput_records(result.records, RecordKind.THROUGHPUT):
        if rec.get("config") == config and (cell is None or rec.get("cell") == cell):
            m: Any = (rec.get("verdict") or {}).get("metrics", {}).get(OUTPUT_THROUGHPUT) or {}
            if m.get("status") == Status.REGRESSION:
                return True
    return False
