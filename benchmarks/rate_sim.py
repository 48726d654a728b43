"""Open-loop cells and the sustainable-rate test in ``gate_sim.py``'s simulated sessions, for
``bench_rate_gate.py``.

Why a queueing model, not a drawn goodput number: goodput at a fixed offered rate is flat below
capacity (every request good: the offered rate) and falls as requests start missing the SLO, so
its noise is how many requests cross the SLO's line on a slower day; a number drawn with some
spread would only return the spread it was given. So an open-loop repeat here is served: each
request arrives on the cell's own schedule (``openloop.Arrivals.offsets`` from the seed
``load.run_cell`` uses: bench_serving's Poisson gaps, the same every repeat and, for a rate
search's probes, the template's gaps scaled by the rate), and an engine plays SGLang's scheduling
rule on the reference engine's ``ClockModel`` (as ``tests/test_openloop.py``'s
``simulated_tpots_s`` does): whatever has arrived is prefilled first, in one pass (its first token
at the pass's end); else one decode pass over every running request, each taking one verify, its
time growing with the batch; a request ends with its last verify. Each request's verifies come
from its own acceptance (fixed per config and request index: greedy decoding of the same prompts),
and every pass is scaled by the launch's speed (the day, the launch's own shift, the drift:
``gate_sim.Model.launch_speed``), the repeat's noise and outliers (the shape's), the config's own
speed and the scenario's drop. The repeat is a ``load.CellResult`` of ``RequestResult``s (its figures computed once) with
the session's SLO, so goodput, SLO attainment, the probes' SLO check and every other figure are
the product's own (``CellResult.metrics`` -> ``slo.goodput``; ``measurement.rate_probe``).

Each session runs ``suites/test_sustainable_rate.py``'s test function per config before its cells
(pytest's order: by config, then by file), with the matrix's ``rate_search:`` and the session's
SLO (``--ddtree-slo``): a bless searches and proposes the rate (the bless flow writes it), a
judged session re-probes the blessed rate (``rate_gate.judge_rate``). Open-loop throughput cells
(``open_cells``) are gated like any cell, their goodput with them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

import gate_sim
from gate_sim import Shape
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.measure.matrix import Cell
from pytest_ddtree.measure import load, openloop
from pytest_ddtree.measure import slo as slo_mod
from pytest_ddtree.measure.prompts import stable_seed
from pytest_ddtree.metrics import REQUEST_GOODPUT
from pytest_ddtree.options import Settings
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.words import RecordKind, Status
from pytest_ddtree.refserver.clock import ClockModel
from pytest_ddtree.service.manager import RunningService
from pytest_ddtree.session import DDTreeSession

#: The drop key of a config's rate probes: ``world.drops[(config, RATE_CELL)]``.
RATE_CELL = -2
#: The rate test's name in a session's failed and skipped tests: ``<config>[rate]``.
RATE_TEST = "rate"
#: The sd of a request's log acceptance around its config's (prompts differ in how well they draft).
REQUEST_ACCEPT_SD = 0.3

TEST_SUSTAINABLE_RATE = gate_sim.suite_function("test_sustainable_rate", "test_sustainable_rate")


@dataclass(frozen=True)
class RateSetup:
    """The rate search a world's matrix asks for and the session's SLO (``--ddtree-slo``)."""

    slo: str = "ttft_ms=300,tpot_ms=50,percentile=99"
    requests: int = 128
    context_tokens: int = 128
    output_tokens: int = 64
    min_rate: float = 1.0
    max_rate: float = 64.0
    resolution: float = 0.10
    max_probes: int = 12
    name: str = "r_search"

    def template(self) -> dict[str, Any]:
        """The search workload as the matrix writes it."""
        return {"name": self.name, "request_rate": self.min_rate, "arrival": "poisson",
                "context_tokens": self.context_tokens, "output_tokens": self.output_tokens,
                "requests": self.requests, "warmup_requests": 0}

    def plan(self) -> dict[str, Any]:
        return {"workload": self.name, "min_rate": self.min_rate, "max_rate": self.max_rate,
                "resolution": self.resolution, "max_probes": self.max_probes}


def open_cells(rates: tuple[float, ...], requests: int = 64) -> list[Cell]:
    """Open-loop throughput cells (Poisson at each rate, 128-token prompts, 64-token outputs)."""
    return [Cell(f"r{rate:g}", requests, 128, 64, requests, 0, "documents", openloop.Arrivals(rate))
            for rate in rates]


@dataclass
class QueueModel:
    """Each config's own engine: its pass-time multiplier, its acceptance and its tree's cost."""

    configs: list[DDTreeConfig]
    seed: int
    slowness: list[float]
    accept: list[float]
    clock: ClockModel = field(default_factory=ClockModel)
    _steps: dict[tuple[int, str], list[int]] = field(default_factory=dict)

    @classmethod
    def draw(cls, rng: random.Random, configs: list[DDTreeConfig]) -> QueueModel:
        return cls(configs, rng.getrandbits(62), [math.exp(rng.uniform(math.log(0.8), math.log(1.25))) for _ in configs],
                   [rng.uniform(3.0, 5.5) for _ in configs])

    def steps(self, config: int, seed_name: str, requests: int, output_tokens: int) -> list[int]:
        """Each request's verifies (its prompts are the template's: the same at every rate and repeat)."""
        key = (config, seed_name)
        if key not in self._steps:
            rng = random.Random(f"{self.seed}/{config}/{seed_name}")
            block = self.configs[config].block_size or 8  # gate_sim's configs all set it
            accepts = [min(float(block), max(1.2, self.accept[config] * math.exp(rng.gauss(0, REQUEST_ACCEPT_SD))))
                       for _ in range(requests)]
            self._steps[key] = [max(1, math.ceil((output_tokens - 1) / a)) for a in accepts]
        return self._steps[key][:requests]

    def per_request_s(self, config: int, context: float) -> float:
        """A decode pass's cost per running request (its tree, its draft block, its context)."""
        c, m = self.configs[config], self.clock
        return (m.per_verify_token * ((c.budget or 0) + 1) + m.per_draft_token * (c.block_size or 8)
                + (m.per_context_token + m.per_draft_context_token) * context)


def serve(offsets: list[float], steps: list[int], context: int, output: int, per_request_s: float, clock: ClockModel,
          slow: float) -> tuple[list[float], list[float]]:
    """Each request's first-token and end times (s) under SGLang's rule (the module docstring), every
    pass ``slow`` times the ClockModel's.

    Every decode pass takes one verify of every running request, so a request prefilled before pass
    ``k`` ends with pass ``k + steps``: it is filed under that pass once, and a pass touches only the
    requests it ends (the clock adds the same pass times in the same order as a loop over every
    running request per pass would: ``tests/test_rate_gate_sim.py`` compares the two)."""
    n = len(offsets)
    prefill_fixed, prefill_each = clock.prefill_fixed * slow, clock.prefill_per_token * context * slow
    decode_fixed, decode_each = clock.decode_fixed * slow, per_request_s * slow
    first, end = [0.0] * n, [0.0] * n
    ending: dict[int, list[int]] = {}  # decode pass -> the requests it ends
    t, nxt, passes, running = 0.0, 0, 0, 0
    while nxt < n or running:
        if nxt < n and offsets[nxt] <= t:
            j = nxt + 1
            while j < n and offsets[j] <= t:
                j += 1
            t += prefill_fixed + prefill_each * (j - nxt)
            for i in range(nxt, j):
                first[i] = t
                ending.setdefault(passes + max(1, steps[i]), []).append(i)
            running += j - nxt
            nxt = j
        elif running:
            t += decode_fixed + decode_each * running
            passes += 1
            for i in ending.pop(passes, ()):
                end[i] = t
                running -= 1
        else:
            t = offsets[nxt]
    return first, end


@dataclass
class RateWorld(gate_sim.World):
    """A gate_sim world with its engines' queueing model and its rate search (``RateSetup``)."""

    queue: QueueModel | None = None
    setup: RateSetup = RateSetup()


def new_world(shape: Shape, rng: random.Random, configs: int, cells: list[Cell], profile_extra: str,
              setup: RateSetup) -> RateWorld:
    """``gate_sim.new_world`` with a queueing model and a matrix that has the rate search."""
    base = gate_sim.new_world(shape, rng, configs, cells, profile_extra)
    world = RateWorld(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                      queue=QueueModel.draw(rng, base.configs), setup=setup)
    matrix = yaml.safe_load((Path(__file__).resolve().parent.parent / "suites" / "configs.yaml").read_text())
    matrix["cells"] = [*matrix.get("cells", []), setup.template()]
    matrix["rate_search"] = setup.plan()
    (world.root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    return world


def _repeat_log_noise(shape: Shape, rng: random.Random, s: float) -> float:
    """One repeat's log speed noise of sd ``s`` (Student-t under ``heavy``), as ``gate_sim.Model``'s."""
    if shape.tails:
        df = shape.tails
        t = rng.gauss(0, 1) / math.sqrt(rng.gammavariate(df / 2.0, 2.0) / df)
        return s * t / math.sqrt(df / (df - 2.0))
    return rng.gauss(0, s)


def open_loop_repeat(world: RateWorld, sim: gate_sim.SimClient, workload: load.CellLike,
                     slo: slo_mod.SLO | None) -> load.CellResult:
    """One repeat of an open-loop cell (or a rate probe) on the simulated engine (the module docstring)."""
    assert world.queue is not None and workload.open_loop is not None
    model, queue, config = world.model, world.queue, sim.config
    cell = next((i for i, w in enumerate(world.cells) if w.name == workload.name), RATE_CELL)
    shape = model.shape
    out = 1.0 - shape.outlier_size if model.rng.random() < shape.outlier_rate else 1.0
    noise = _repeat_log_noise(shape, model.rng, sorted(shape.noise)[len(shape.noise) // 2])
    factor = math.exp(sim.speed + noise) * out * (1.0 - world.drops.get((config, cell), 0.0))
    n, ctx, output = workload.requests, workload.context_tokens, workload.output_tokens
    offsets = workload.open_loop.offsets(n, stable_seed(load.seed_name(workload), 0, "arrivals"))
    steps = queue.steps(config, load.seed_name(workload), n, output)
    first, end = serve(offsets, steps, ctx, output, queue.per_request_s(config, ctx + output / 2), queue.clock,
                       queue.slowness[config] / factor)
    requests = [load.RequestResult(index=i, expected_prompt_tokens=ctx, expected_output_tokens=output,
                                   sent_prompt_tokens=ctx, ok=True, prompt_tokens=ctx, completion_tokens=output,
                                   spec_verify_ct=steps[i], start=offsets[i], end=end[i], ttft_s=first[i] - offsets[i])
                for i in range(n)]
    world.count("rate repeats" if cell == RATE_CELL else f"repeats {world.phase}")
    return ServedResult(cell=workload.name, workload=load.workload_dict(workload, "simulated"), requests=requests,
                           duration_s=max(end) if end else 0.0, speculative=True, prompt_source="simulated",
                           server_info={"version": "sim"}, send_lag_s=[0.0] * n, slo=slo)


class ServedResult(load.CellResult):
    """A served repeat: ``load.CellResult``'s own figures and problems, each computed once (the gate
    asks a repeat for them some seven times, and an open-loop repeat's 128 requests made that the
    simulation's cost); nothing changes a repeat once it is measured."""

    _metrics: dict[str, float | int | None] | None = None
    _problems: list[str] | None = None

    def metrics(self) -> dict[str, float | int | None]:
        if self._metrics is None:
            self._metrics = super().metrics()
        return dict(self._metrics)

    def problems(self) -> list[str]:
        if self._problems is None:
            self._problems = super().problems()
        return list(self._problems)


def run_repeat(client: Any, workload: load.CellLike, cell_timeout_s: float, **kwargs: Any) -> load.CellResult:
    """``measurement.run_repeat`` of the simulated service: an open-loop cell served by the queueing
    model, a closed-loop one drawn by ``gate_sim``'s noise model."""
    if workload.open_loop is None:
        return gate_sim.sim_run_repeat(client, workload, cell_timeout_s, **kwargs)
    sim = cast(gate_sim.SimClient, client)
    return open_loop_repeat(cast(RateWorld, sim.world), sim, workload, kwargs.get("slo"))


def _settings(world: gate_sim.World, settings: Settings) -> Settings:
    """The session's SLO (``--ddtree-slo``) and the world's matrix (with its ``rate_search:``)."""
    setup = cast(RateWorld, world).setup
    return dataclasses.replace(settings, matrix=world.root / "matrix.yaml", slo=slo_mod.parse_slo(setup.slo))


def _rate_test(world: gate_sim.World, config: DDTreeConfig, service: RunningService, session: DDTreeSession,
               request: Any, failed: list[str], skipped: list[str]) -> None:
    """The suite's ``test_sustainable_rate`` of ``config``, as pytest calls it with its fixtures."""
    name = f"{config.name}[{RATE_TEST}]"
    try:
        TEST_SUSTAINABLE_RATE(request, config, service, session.settings, session.recorder,
                              session.baselines(service.server_info))
    except pytest.fail.Exception:
        failed.append(name)
    except pytest.skip.Exception:
        skipped.append(name)


EXTRAS = gate_sim.Extras(run_repeat=run_repeat, settings=_settings, before_cells=_rate_test)


def run_session(world: RateWorld, index: int, bless: bool, repeats: int = 3) -> gate_sim.SessionResult:
    """One simulated pytest process with the rate test and the open-loop cells (``gate_sim.run_session``)."""
    return gate_sim.run_session(world, index, bless, repeats, EXTRAS)


def rate_records(result: gate_sim.SessionResult, config: str) -> list[dict[str, Any]]:
    """The config's sustainable-rate records of the session."""
    return [r for r in result.records if r.get("kind") == RecordKind.SUSTAINABLE_RATE and r.get("config") == config]


def goodput_status(result: gate_sim.SessionResult, config: str | None = None) -> dict[str, str]:
    """Each open-loop cell's goodput verdict (``<config>[<cell>]`` -> status) of the session."""
    out: dict[str, str] = {}
    for rec in records_mod.throughput_records(result.records, RecordKind.THROUGHPUT):
        if config is not None and rec.get("config") != config:
            continue
        verdict: Any = rec.get("verdict") or {}
        m = (verdict.get("metrics") or {}).get(REQUEST_GOODPUT)
        if m is not None:
            status = verdict.get("status") if verdict.get("status") == Status.INCONCLUSIVE else m.get("status")
            out[f"{rec.get('config')}[{rec.get('cell')}]"] = str(status)
    return out


def goodput_unjudged(result: gate_sim.SessionResult) -> list[str]:
    """The open-loop cells (``<config>[<cell>]``) whose goodput was recorded, not judged (at the SLO's edge)."""
    return [f"{rec.get('config')}[{rec.get('cell')}]" for rec in records_mod.throughput_records(result.records, RecordKind.THROUGHPUT)
            if REQUEST_GOODPUT in (rec.get("not_judged") or {})]
