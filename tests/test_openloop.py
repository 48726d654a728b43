"""Open-loop cells: the arrival schedule, the cap, the cell's deadline, the workload keys, and the
reference engine queueing under open-loop load as its own cost model says."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates.throughput import baseline, rule, verdicts
from pytest_ddtree.measure import load, openloop
from pytest_ddtree.report import text as report
from pytest_ddtree.measure import slo as slo_mod
from pytest_ddtree.metrics import SLO_LATENCY_SHARE
from pytest_ddtree.configs import ConfigError
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.records.words import Status
from tests.load_standin import StandInConfig, standin_server


def test_arrival_schedules_follow_bench_serving() -> None:
    constant = openloop.Arrivals(4.0, "constant").offsets(5, seed=1)
    assert constant == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])  # the first at once, then 1 / rate
    poisson = openloop.Arrivals(10.0).offsets(4001, seed=7)
    gaps = [b - a for a, b in zip(poisson, poisson[1:])]
    assert poisson[0] == 0.0 and statistics.mean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(0.1, rel=0.08)  # exponential: sd == mean
    bursty = openloop.Arrivals(10.0, "gamma", burstiness=0.25).offsets(4001, seed=7)
    bgaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.mean(bgaps) == pytest.approx(0.1, rel=0.1)  # same rate ...
    assert statistics.pstdev(bgaps) == pytest.approx(0.2, rel=0.15)  # ... burstier: sd = mean / sqrt(shape)
    assert openloop.Arrivals(10.0).offsets(20, seed=3) == openloop.Arrivals(10.0).offsets(20, seed=3)  # repeats alike


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"request_rate": 0}, "positive finite"),
    ({"request_rate": float("inf")}, "closed-loop"),
    ({"request_rate": 2, "arrival": "bursty"}, "poisson, constant, gamma"),
    ({"request_rate": 2, "burstiness": 0.5}, "needs arrival: gamma"),
    ({"request_rate": 2, "max_concurrency": 0}, "max_concurrency"),
])
def test_bad_arrivals_say_what_is_wrong(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(openloop.ArrivalError, match=message):
        openloop.Arrivals(**kwargs)  # type: ignore[arg-type]


def test_matrix_reads_open_loop_workloads(tmp_path: Path) -> None:
    path = tmp_path / "configs.yaml"
    path.write_text("default: bs8_b8_k4\ncells:\n"
                    "  - {name: r4, request_rate: 4, context_tokens: 128, requests: 12}\n"
                    "  - {name: r8c2, request_rate: 8, arrival: gamma, burstiness: 0.5, max_concurrency: 2, context_tokens: 64}\n"
                    "  - {name: c2, concurrency: 2, context_tokens: 64}\n")
    r4, r8c2, c2 = load_matrix(path).cells
    assert r4.open_loop == openloop.Arrivals(4.0) and r4.concurrency == 12 and r4.warmup_requests == 8
    assert r8c2.open_loop == openloop.Arrivals(8.0, "gamma", 0.5, 2) and r8c2.concurrency == 2
    assert c2.open_loop is None
    assert load.workload_dict(c2) == {"concurrency": 2, "context_tokens": 64, "output_tokens": 128, "requests": 4,
                                      "prompts": "documents"}  # a closed-loop cell's (and its baseline's) keys unchanged
    assert load.workload_dict(r8c2)["request_rate"] == 8.0 and load.workload_dict(r4)["max_concurrency"] is None
    for bad, message in (("{request_rate: 4, concurrency: 2, context_tokens: 64}", "drop concurrency"),
                         ("{max_concurrency: 2, context_tokens: 64}", "add request_rate"),
                         ("{request_rate: fast, context_tokens: 64}", "open-loop cell")):
        path.write_text(f"cells:\n  - {bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_matrix(path)


def test_open_loop_sends_on_schedule_whatever_the_service_does() -> None:
    # each request streams for ~1.5 s; eight arrive within 0.2 s: a closed loop of 1 would hold one
    # at a time, the open loop sends every one at its time and all are in flight together
    cell = load.Cell("r40", concurrency=8, context_tokens=16, output_tokens=16, requests=8, warmup_requests=0,
                     open_loop=openloop.Arrivals(40.0, "constant"))
    with standin_server(StandInConfig(tokens_per_chunk=3, step_s=0.3)) as (url, cfg):
        res = load.run_cell(url, cell)
    assert res.valid, res.problems()
    assert cfg.max_active == 8
    starts = [r.start for r in res.requests]
    assert starts == sorted(starts)  # in schedule order
    m = res.metrics()
    assert m["request_rate"] == 40.0 and m["max_concurrency"] is None and m["completed"] == 8
    assert m["ddtree_loaded_concurrency"] is None  # a closed loop's figure: meaningless here
    assert isinstance(m["ddtree_max_send_lag_ms"], float) and isinstance(m["ddtree_late_requests"], int)
    assert m["request_throughput"] == pytest.approx(8 / float(m["duration"] or 0))
    assert verdicts.repeat_load_problem(m) is None  # an idle engine between arrivals is not a starved client
    args = report.bench_serving_arguments({"workload": res.workload})  # type: ignore[typeddict-item]
    assert args["request_rate"] == 40.0 and args["max_concurrency"] is None  # bench_serving's, for results.json


def test_max_concurrency_holds_requests_in_the_client_and_records_the_wait() -> None:
    cell = load.Cell("r40c2", concurrency=2, context_tokens=16, output_tokens=7, requests=6, warmup_requests=0,
                     open_loop=openloop.Arrivals(40.0, "constant", max_concurrency=2))
    with standin_server(StandInConfig(tokens_per_chunk=3, step_s=0.05)) as (url, cfg):
        res = load.run_cell(url, cell)
    assert res.valid, res.problems()
    assert cfg.max_active <= 2 and res.metrics()["max_concurrency"] == 2
    for r in res.requests:  # when a request was sent, at most one other was in flight
        assert sum(1 for o in res.requests if o is not r and o.start < r.start < o.end) <= 1
    # requests arrive every 25 ms and each takes two 50 ms steps: the later ones waited for a slot
    late = res.metrics()["ddtree_late_requests"]
    assert isinstance(late, int) and late >= 2


def test_the_cells_deadline_cuts_what_is_still_streaming() -> None:
    cell = load.Cell("r20", concurrency=3, context_tokens=16, output_tokens=16, requests=3, warmup_requests=0,
                     open_loop=openloop.Arrivals(20.0, "constant", deadline_s=0.4))
    with standin_server(StandInConfig(tokens_per_chunk=1, step_s=0.5)) as (url, _):
        res = load.run_cell(url, cell)
    assert not res.valid and res.failed == 3
    assert any("deadline" in n for n in res.notes)
    assert all(r.error for r in res.requests)


# --------------------------------------------------------------------------------------
# The reference engine under open-loop load, against its own cost model

#: Simulated seconds per wall second: rates and latencies below are simulated ones, / or * this.
SCALE = 2.0
CONTEXT, OUTPUT = 128, 32


def model_tpot_s(rate: float, accept: float, budget: int, block_size: int) -> float:
    """The engine's steady-state TPOT (simulated s) at ``rate`` simulated requests/s, from its ClockModel.

    Prefill has priority (engine.py ``_loop``, as SGLang's scheduler): each arrival costs one prefill
    pass P of the decode time; the n requests decoding share passes of D(n) = decode_fixed + c n,
    each giving every request ``accept`` tokens. In steady state n = rate x (OUTPUT - 1) x TPOT
    (Little's law over the decode phase) and TPOT = D(n) / (accept (1 - rate P)), so
    TPOT = decode_fixed / (accept (1 - rate P) - c rate (OUTPUT - 1)). It holds while the arrivals
    are further apart than a decode and a prefill pass (no two prefills batched), which the rates
    below keep."""
    from pytest_ddtree.refserver.clock import ClockModel

    m = ClockModel()
    ctx = CONTEXT + OUTPUT / 2  # the mean context of a decoding request
    c = m.per_verify_token * (budget + 1) + m.per_draft_token * block_size + (m.per_context_token + m.per_draft_context_token) * ctx
    prefill = m.prefill_fixed + m.prefill_per_token * CONTEXT
    denominator = accept * (1 - rate * prefill) - c * rate * (OUTPUT - 1)
    return m.decode_fixed / denominator if denominator > 0 else float("inf")  # past it: the engine's capacity


def model_sustainable_rate(tpot_s: float, accept: float, budget: int, block_size: int) -> float:
    """The simulated rate at which :func:`model_tpot_s` reaches ``tpot_s`` (solved for the rate)."""
    lo, hi = 0.0, 100.0
    for _ in range(60):  # bisect the monotone model: no algebra to get wrong twice
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model_tpot_s(mid, accept, budget, block_size) <= tpot_s else (lo, mid)
    return lo


def simulated_tpots_s(rate: float, steps: Sequence[int], budget: int, block_size: int) -> list[float]:
    """Each request's TPOT (simulated s) when requests with these verify steps (in arrival order)
    arrive every ``1 / rate`` simulated s, from the engine's ClockModel and SGLang's scheduling rule.

    Why a simulation, not the steady-state formula :func:`model_tpot_s`: that formula is a mean-field
    average and misjudged the p50 the SLO reads by a bisection step near the SLO (#33): it counts the
    first token (the prefill's) as a verify's, so it has each request take 3% fewer decode passes; it
    charges every request the average share of prefill passes, while under constant arrivals the
    prefills falling into a request's decode phase are a whole number fixed by the phase (and one
    arriving during its last pass does not delay it); and it predicts the mean TPOT where the SLO
    reads the median of requests whose step counts are integers. The rule (scheduler.py
    ``get_next_batch_to_run``, as engine.py ``_loop``): whatever has arrived is prefilled first, in
    one pass (its first token at the pass's end); else one decode pass over everything running, each
    request one verify; a request ends with its last verify; an idle engine waits for the next arrival."""
    from pytest_ddtree.refserver.clock import ClockModel

    m = ClockModel()
    per_request = m.per_verify_token * (budget + 1) + m.per_draft_token * block_size
    arrivals = [i / rate for i in range(len(steps))]
    left = list(steps)
    first: dict[int, float] = {}
    finished: dict[int, float] = {}
    running: list[int] = []
    t, nxt = 0.0, 0
    while len(finished) < len(steps):
        arrived = [i for i in range(nxt, len(steps)) if arrivals[i] <= t + 1e-12]
        if arrived:
            t += m.prefill_fixed + m.prefill_per_token * CONTEXT * len(arrived)
            nxt += len(arrived)
            for i in arrived:
                first[i] = t
            running += arrived
        elif running:
            ctx = sum(CONTEXT + 1 + (steps[i] - left[i]) * (OUTPUT - 1) / steps[i] for i in running)
            t += m.decode_fixed + per_request * len(running) + (m.per_context_token + m.per_draft_context_token) * ctx
            for i in running:
                left[i] -= 1
                if not left[i]:
                    finished[i] = t
            running = [i for i in running if left[i]]
        else:
            t = arrivals[nxt]
    return [(finished[i] - first[i]) / (OUTPUT - 1) for i in range(len(steps))]


def simulated_sustainable_rate(tpot_s: float, steps: Sequence[int], budget: int, block_size: int) -> float:
    """The highest simulated rate whose simulated p50 TPOT meets ``tpot_s`` (bisected: it rises with the rate)."""
    lo, hi = 0.1, 100.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.median(simulated_tpots_s(mid, steps, budget, block_size)) <= tpot_s else (lo, mid)
    return lo


def _open_cell(rate_sim: float, requests: int = 30) -> load.Cell:
    return load.Cell(f"r{rate_sim:g}", concurrency=requests, context_tokens=CONTEXT, output_tokens=OUTPUT, requests=requests,
                     warmup_requests=2, open_loop=openloop.Arrivals(rate_sim * SCALE, "constant"))


def test_the_engine_queues_under_open_loop_load_as_its_cost_model_says(tmp_path: Path) -> None:
    from tests.refserver_helpers import RefServer, config_args

    server = RefServer([*config_args("bs8_b4_k4"), "--clock-scale", str(SCALE)], tmp_path).wait_ready()
    try:
        measured = {}
        for rate in (3.0, 8.0):
            res = load.run_cell(server.url, _open_cell(rate, 24), speculative=True)
            assert res.valid, res.problems()
            m = res.metrics()
            accept, tpot = float(m["ddtree_tokens_per_verify"] or 0), float(m["median_tpot_ms"] or 0) * SCALE / 1000
            measured[rate] = tpot
            assert tpot == pytest.approx(model_tpot_s(rate, accept, 4, 8), rel=0.10), (rate, accept)
            assert m["request_rate"] == rate * SCALE
        assert measured[8.0] > measured[3.0] * 1.1  # the batch, and so each step, grows with the rate
    finally:
        server.stop()


@pytest.mark.slow
def test_a_two_config_sweep_finds_each_configs_sustainable_rate_within_one_step_of_the_engines_model(tmp_path: Path) -> None:
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.gates.throughput import measurement
    from tests.refserver_helpers import config_args, start_many

    tpot_slo_s = 0.015  # simulated: a bigger tree sustains more here (its first steps are fewer) ...
    slo = slo_mod.parse_slo(f"tpot_ms={tpot_slo_s * 1000 / SCALE:g},percentile=50")
    plan = slo_mod.SearchPlan(min_rate=2.0 * SCALE, max_rate=32.0 * SCALE, resolution=0.10, max_probes=9)
    configs = {"bs8_b4_k4": (4, 8), "bs8_b16_k4": (16, 8)}
    servers = start_many({n: [*config_args(n), "--clock-scale", str(SCALE)] for n in configs}, tmp_path)
    found: dict[str, tuple[float, float]] = {}
    try:
        for name, (budget, block) in configs.items():
            with SGLangClient(servers[name].url) as client:
                search = measurement.sustainable_rate(client, _open_cell(1.0), plan, 1, measurement.Driving(slo=slo))
                # the verifies each probe's request took: greedy, so the same at every rate (the probes
                # share their template's prompts); the model schedules them at any rate
                steps_run = load.run_cell(client, measurement.rate_cell(_open_cell(1.0), 4.0 * SCALE), speculative=True)
            steps = [r.spec_verify_ct or 0 for r in sorted(steps_run.requests, key=lambda r: r.index)]
            assert search.sustainable is not None and search.step is not None, search.probes
            model = simulated_sustainable_rate(tpot_slo_s, steps, budget, block) * SCALE
            # within one bisection step at the search's resolution (10% of the rate)
            assert abs(search.sustainable - model) <= plan.resolution * model, (name, model, search.probes)
            assert search.step <= plan.resolution * search.sustainable
            assert len(search.probes) <= plan.max_probes
            found[name] = (search.sustainable, model)
    finally:
        for s in servers.values():
            s.stop()
    # ... and the model says so too: the sweep ranks the configs as the model does
    assert (found["bs8_b16_k4"][0] > found["bs8_b4_k4"][0]) == (found["bs8_b16_k4"][1] > found["bs8_b4_k4"][1])


def test_a_rate_searchs_probes_send_their_templates_prompts_at_every_rate() -> None:
    """bench_serving's one ``--seed`` across a ``--request-rate`` sweep: a probe's acceptance, and so its
    TPOT, must move with its rate only (#33: per-rate prompts moved acceptance 4%, a bisection step)."""
    from pytest_ddtree.gates.throughput import measurement

    template = _open_cell(1.0)
    probes = [measurement.rate_cell(template, rate) for rate in (4.0, 9.5)]
    assert [p.name for p in probes] == ["r1@4", "r1@9.5"]
    assert {load.seed_name(p) for p in probes} == {"r1"} and load.seed_name(template) == "r1"
    assert load.seed_name(load.Cell("c1", 1, 8, 8, 1)) == "c1"  # any other cell: its own name


def test_an_slo_is_parsed_once_and_goodput_counts_as_bench_serving_does(tmp_path: Path) -> None:
    slo = slo_mod.parse_slo("ttft_ms=100, tpot_ms=20,percentile=p95")
    assert slo.as_dict() == {"ttft": 100.0, "tpot": 20.0} and slo.percentile == 95 and slo.label == "p95 ttft<=100ms tpot<=20ms"
    for bad, message in (("ttft=100", "valid: ttft_ms, tpot_ms, e2e_ms"), ("percentile=90", "at least one"),
                         ("tpot_ms=-1", "positive"), ("e2e_ms", "KEY=VALUE"), ("ttft_ms=1,percentile=101", "within")):
        with pytest.raises(slo_mod.SLOError, match=message):
            slo_mod.parse_slo(bad)

    def request(ttft: float, e2e: float, tokens: int, ok: bool = True) -> load.RequestResult:
        return load.RequestResult(index=0, expected_prompt_tokens=1, expected_output_tokens=tokens, ok=ok,
                                  completion_tokens=tokens, start=0.0, end=e2e, ttft_s=ttft)

    # TPOT (e2e - ttft) / (tokens - 1): 19 ms, 30 ms, 0 for one token (bench_serving's); a failed one counts as sent
    reqs = [request(0.05, 0.05 + 0.019 * 10, 11), request(0.05, 0.05 + 0.03 * 10, 11), request(0.2, 0.2, 1),
            request(0.01, 0.1, 11, ok=False)]
    figures = slo_mod.goodput(reqs, slo, duration_s=2.0)
    # the SLO's p95 over its target, the largest of the targets, of the requests that succeeded: TTFT's
    # 50, 50, 200 ms -> 185 ms of 100 (TPOT's 0, 19, 30 -> 28.9 ms of 20)
    assert figures.pop(SLO_LATENCY_SHARE) == pytest.approx(1.85)
    assert figures == {"request_goodput": 0.5, "slo_attainment": 0.25, "slo_attainment_ttft": 0.5,
                       "slo_attainment_tpot": 0.5}
    # at most 1 where the requests meet the SLO: the first one's TPOT 19 ms of 20
    assert slo_mod.goodput(reqs[:1], slo, 1.0)[SLO_LATENCY_SHARE] == pytest.approx(0.95)
    assert slo_mod.goodput(reqs[3:], slo, 1.0)[SLO_LATENCY_SHARE] is None  # no request succeeded
    assert "1 of 4 requests failed" in (slo_mod.slo_miss(reqs, slo) or "")
    assert "p95 tpot" in (slo_mod.slo_miss(reqs[:2], slo) or "") and slo_mod.slo_miss(reqs[:1], slo) is None
    path = tmp_path / "configs.yaml"
    path.write_text("slo: {e2e_ms: 900}\ncells: []\n")
    assert load_matrix(path).slo == slo_mod.SLO((("e2el", 900.0),))
    path.write_text("slo: {e2e: 900}\ncells: []\n")
    with pytest.raises(ConfigError, match="unknown SLO key"):
        load_matrix(path)


def test_the_rate_search_is_bounded_and_brackets_the_rate() -> None:
    plan = slo_mod.SearchPlan(min_rate=1.0, max_rate=64.0, resolution=0.1, max_probes=12)
    asked: list[float] = []

    def measure(rate: float) -> slo_mod.RateProbe:
        asked.append(rate)
        return slo_mod.RateProbe(rate, rate <= 11.3)

    search = slo_mod.search_rate(measure, plan)
    assert asked[:5] == [1, 2, 4, 8, 16]  # doubling probes, then bisection
    assert search.sustainable is not None and search.missed is not None and search.step is not None
    assert search.sustainable <= 11.3 < search.missed and search.step <= 0.1 * search.sustainable
    assert len(asked) <= plan.max_probes
    assert slo_mod.search_rate(lambda r: slo_mod.RateProbe(r, False), plan).sustainable is None  # not even min_rate
    everything = slo_mod.search_rate(lambda r: slo_mod.RateProbe(r, True), plan)
    assert everything.sustainable == 64.0 and everything.missed is None
    assert search.limit is None and search.bounded() is None and search.record("w", slo_mod.parse_slo("tpot_ms=5"))[
        "search_limit"] is None


def test_a_rate_search_stopped_by_its_limits_says_its_rate_is_a_bound() -> None:
    """A search whose every probe met up to max_rate, or whose max_probes ran out first, found no
    limit: reporting its last rate as the config's would send a deployer to a limit nobody measured."""
    def capacity(limit: float) -> Callable[[float], slo_mod.RateProbe]:
        return lambda rate: slo_mod.RateProbe(rate, rate <= limit)

    ceiling = slo_mod.search_rate(capacity(100.0), slo_mod.SearchPlan(min_rate=1.0, max_rate=64.0))
    assert (ceiling.sustainable, ceiling.missed, ceiling.limit) == (64.0, None, slo_mod.LIMIT_MAX_RATE)
    assert ceiling.bounded() == ("at least 64 req/s (every probe met the SLO up to rate_search.max_rate: raise it to "
                                 "find the limit)")
    short = slo_mod.search_rate(capacity(100.0), slo_mod.SearchPlan(min_rate=1.0, max_rate=64.0, max_probes=3))
    assert [p.rate for p in short.probes] == [1, 2, 4] and (short.missed, short.limit) == (None, slo_mod.LIMIT_MAX_PROBES)
    assert short.bounded() == "at least 4 req/s (rate_search.max_probes ran out before a rate missed the SLO: raise it)"
    wide = slo_mod.search_rate(capacity(5.0), slo_mod.SearchPlan(min_rate=1.0, max_rate=64.0, max_probes=5))
    assert [p.rate for p in wide.probes] == [1, 2, 4, 8, 6] and (wide.sustainable, wide.missed) == (4.0, 6.0)
    assert wide.limit == slo_mod.LIMIT_MAX_PROBES and (wide.bounded() or "").startswith("4 req/s, below 6 (")
    # a search that reached its resolution on its last probe was not stopped by the limit
    exact = slo_mod.search_rate(capacity(5.0), slo_mod.SearchPlan(min_rate=1.0, max_rate=64.0, resolution=0.2, max_probes=6))
    assert exact.step is not None and exact.step <= 0.2 * (exact.sustainable or 0) and exact.limit is None
    none = slo_mod.search_rate(capacity(0.5), slo_mod.SearchPlan(min_rate=1.0, max_rate=64.0))
    assert none.sustainable is None and none.bounded() is None  # not even min_rate: no bound to state
    assert ceiling.record("w", slo_mod.parse_slo("tpot_ms=5"))["search_limit"] == "max_rate"


def test_sampled_cells_run_on_the_engine_and_top_p_keeps_the_nucleus(tmp_path: Path) -> None:
    from tests.refserver_helpers import RefServer, config_args

    path = tmp_path / "configs.yaml"
    path.write_text("cells:\n  - {name: c2_t1, concurrency: 2, context_tokens: 64, requests: 4, temperature: 1.0, top_p: 0.9}\n")
    (sampled_cell,) = load_matrix(path).cells
    assert sampled_cell.sampling == (("temperature", 1.0), ("top_p", 0.9))
    assert load.workload_dict(sampled_cell)["sampling"] == {"temperature": 1.0, "top_p": 0.9}  # its baseline is its own
    path.write_text("cells:\n  - {name: bad, concurrency: 1, context_tokens: 64, top_p: 0}\n")
    with pytest.raises(ConfigError, match="top_p 0 is out of range"):
        load_matrix(path)

    def cell(*sampling: tuple[str, float]) -> load.Cell:
        # random token ids: the engine's target backs off to short contexts with several continuations, where
        # sampling can choose (on corpus text its longest match has one continuation, sampled or not)
        return load.Cell("c2_s", concurrency=2, context_tokens=64, output_tokens=48, requests=4, warmup_requests=0,
                         prompts="random", sampling=tuple(sampling))

    from pytest_ddtree.service.client import SGLangClient

    server = RefServer([*config_args("bs8_b8_k4"), "--clock-scale", "20"], tmp_path).wait_ready()
    try:
        with SGLangClient(server.url) as client:
            maker = load.prompt_maker(client, vocab_size=1000)
            greedy, nucleus_of_one, sampled = (
                load.run_cell(client, cell(*sampling), prompts=maker, speculative=True)
                for sampling in ((), (("temperature", 1.0), ("top_p", 1e-6)), (("temperature", 1.0),)))
            refused = server.post("/generate", json={"text": "x", "sampling_params": {"top_p": 1.5}})
    finally:
        server.stop()
    for res in (greedy, nucleus_of_one, sampled):
        assert res.valid, res.problems()
    # a nucleus of one token is the greedy token: the same tree accepts the same drafts ...
    assert nucleus_of_one.accept_histogram() == greedy.accept_histogram()
    # ... and sampling the whole distribution moves what the drafter's tree gets accepted
    assert sampled.accept_histogram() != greedy.accept_histogram()
    assert refused.status_code == 400 and "top_p must be in (0, 1]" in refused.text  # SGLang's message


def test_long_context_cells_run_on_the_engine(tmp_path: Path) -> None:
    """32k, 64k and 128k prompts (the draft window's range) are sent, counted and decoded at their exact length
    (a profile's max_context skips longer cells with the reason: tests/test_throughput_suite.py's c1_huge)."""
    from tests.refserver_helpers import RefServer, config_args

    server = RefServer([*config_args("bs8_b8_k4_w2048"), "--clock-scale", "20", "--context-length", "140000"],
                       tmp_path).wait_ready()
    try:
        for tokens in (32768, 65536, 131072):
            res = load.run_cell(server.url, load.Cell(f"c1_{tokens // 1024}k", 1, tokens, 16, 1, 0), speculative=True)
            assert res.valid, res.problems()
            assert res.requests[0].prompt_tokens == tokens and res.metrics()["total_input_tokens"] == tokens
            # the bundled documents are shorter than these: the note says the text repeats inside a prompt
            assert any("repeats inside a prompt" in n for n in res.notes), res.notes
    finally:
        server.stop()


def test_the_frontier_and_the_speedup_chart_draw_what_the_records_say() -> None:
    from pytest_ddtree.report import frontier
    from pytest_ddtree.report.html import charts, model

    points = [(100.0, 50.0, "a"), (300.0, 20.0, "b"), (200.0, 40.0, "c"), (150.0, 30.0, "d"), (300.0, 10.0, "e")]
    assert [p[2] for p in frontier.pareto_front(points)] == ["a", "c", "b"]  # d is beaten by c, e by b

    def cell(config: str, name: str, tps: float, per_request: float, accept: float) -> model.CellRow:
        return model.CellRow(config, name, 1, 128, "pass", "valid", {"output_throughput": tps,
                          "ddtree_median_request_output_throughput": per_request, "ddtree_tokens_per_verify": accept},
                          {}, {}, {}, [])

    cells = [cell("bs8_b4_k4", "c1", 100, 100, 3.0), cell("bs8_b4_k4", "c8", 600, 75, 3.0),
             cell("bs8_b16_k4", "c1", 130, 130, 5.0), cell("bs8_b16_k4", "c8", 500, 62, 5.0),
             cell("bs8_b8_k4", "c1", 120, 120, 4.2), cell("bs8_b8_k4", "c8", 560, 70, 4.2)]
    (panel,) = charts.pareto_panels(cells)
    front = next(t for t in panel["figure"]["data"] if t["name"] == "Pareto frontier")
    # b16 wins one request, b4 many; b8 is beaten on both at each load (by b16 at c1, by b4 at c8)
    assert front["text"] == ["bs8_b16_k4 c1", "bs8_b4_k4 c8"]
    control = {"groups": [{"configs": {"bs8_b4_k4": {"cells": {"c1": {"speedup": 1.8}, "c8": {"speedup": 2.2}}},
                                       "bs8_b8_k4": {"cells": {"c1": {"speedup": 2.4}, "c8": {"speedup": 2.6}}},
                                       "bs8_b16_k4": {"cells": {"c1": {"speedup": 2.1}, "c8": {"speedup": 2.0}}}}}]}
    figure = charts.speedup_figure(cells, control)
    assert figure is not None
    (line,) = figure["data"]
    assert line["text"] == ["b4", "b8", "b16"] and line["y"] == [3.0, 4.2, 5.0]  # acceptance rises with the budget ...
    assert line["x"] == [2.2, 2.6, 2.1]  # ... the speedup peaks at b8 (the median of two cells: the upper one)
    assert charts.speedup_figure(cells, None) is None


def test_a_labelled_datasets_acceptance_is_reported_per_category(tmp_path: Path) -> None:
    import json

    from pytest_ddtree.measure import prompts
    from pytest_ddtree.gates.throughput import measurement
    from tests.refserver_helpers import RefServer, config_args

    code = prompts.units_of("coding")
    chat = prompts.units_of("chat")
    items = [{"category": "coding", "conversations": [{"from": "human", "value": c}, {"from": "gpt", "value": "ok"}]}
             for c in code[:3]]
    items += [{"category": "chat", "conversations": [{"from": "human", "value": c}, {"from": "gpt", "value": "ok"}]}
              for c in chat[:3]]
    items.append({"conversations": [{"from": "human", "value": "unlabelled"}, {"from": "gpt", "value": "ok"}]})
    dataset = tmp_path / "labelled.json"
    dataset.write_text(json.dumps(items))
    assert prompts.categories_of(str(dataset)) == ("coding",) * 3 + ("chat",) * 3 + (None,)
    assert prompts.categories_of("coding") == ()  # a bundled source is one category: the cell's own figure
    cell = load.Cell("c2_lab", concurrency=2, context_tokens=32, output_tokens=24, requests=7, warmup_requests=0,
                     prompts=str(dataset))
    server = RefServer([*config_args("bs8_b8_k4"), "--clock-scale", "20"], tmp_path).wait_ready()
    try:
        campaign = measurement.measure_config(server.url, [cell], 3)
    finally:
        server.stop()
    from pytest_ddtree.gates.throughput import cells as cells_mod

    evaluation = cells_mod.judged_cell("bs8_b8_k4", cell, campaign,
                                     cells_mod.CellBaseline("bs8_b8_k4", tmp_path / "none.yaml", "refserver", {}))
    by_category = evaluation.record["acceptance_by_category"]
    assert sorted(by_category) == ["chat", "coding"]  # the unlabelled request counts in the cell, in no category
    counts = [s.category_counts() for s in campaign.runs["c2_lab"].samples if s.valid]
    for category, value in by_category.items():  # pooled over the repeats: tokens over verify steps
        assert value == pytest.approx(sum(c[category][0] for c in counts) / sum(c[category][1] for c in counts))
        assert 1 <= value <= 8


def test_the_control_is_not_measured_on_open_loop_cells() -> None:
    from types import SimpleNamespace

    from pytest_ddtree.gates.throughput import launches

    closed = load.Cell("c2", 2, 48, 16, 4)
    open_cell = load.Cell("r4", 8, 48, 16, 8, open_loop=openloop.Arrivals(4.0))
    items = [SimpleNamespace(callspec=SimpleNamespace(params={"workload": w}), get_closest_marker=lambda name: None)
             for w in (closed, open_cell)]
    assert launches.cells_of(items) == [closed]  # its tok/s there is the offered rate's: a speedup of ~1x


def test_goodput_is_judged_only_where_the_session_has_an_slo() -> None:
    from pytest_ddtree.gates.throughput import measurement

    workload = {"concurrency": 2, "context_tokens": 48, "output_tokens": 16, "requests": 4, "prompts": "coding via /tokenize"}
    blessed = {"output_throughput": [100.0, 101.0, 99.0], "request_goodput": [6.0, 6.1, 5.9]}
    entry: dict[str, object] = {}
    for session in ("s1", "s2", "s3"):
        entry = baseline.baseline_cell_entry(workload, blessed, existing=entry or None, session=session)
    today = {"output_throughput": [100.5, 99.5, 100.2]}  # a session without an SLO counts no goodput
    missing = rule.judge_cell_alone("c2", entry, today, workload=workload)
    assert missing.status == Status.METRIC_MISSING  # judged as blessed: goodput gated, not produced
    judged = measurement.judged_baseline(entry, None)
    assert judged is not None and "request_goodput" not in judged["gates"] and "output_throughput" in judged["gates"]
    assert rule.judge_cell_alone("c2", judged, today, workload=workload).status == Status.PASS
    slo = slo_mod.parse_slo("tpot_ms=50")
    assert measurement.judged_baseline(entry, slo) == entry  # with an SLO: goodput is judged like tok/s


def test_an_open_loop_cells_output_throughput_is_recorded_not_judged() -> None:
    """While the service keeps up, an open-loop cell's tok/s is the offered rate's whatever the speed:
    judged against the config's common change (its closed-loop cells' speed), it was flagged whenever
    the launch moved (#33: 19 open-loop cells failed in 20 unchanged simulated sweeps, bench_rate_gate)."""
    from pytest_ddtree.gates.throughput import measurement
    from pytest_ddtree.metrics import MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT, REQUEST_GOODPUT, TOKENS_PER_VERIFY

    open_cell = load.Cell("r4", 8, 48, 16, 8, open_loop=openloop.Arrivals(4.0))
    closed = [load.Cell(f"c{c}", c, 48, 16, 4) for c in (1, 2, 4)]
    assert measurement.cell_gated(closed[0], None) is None and measurement.cell_gated(closed[0], (OUTPUT_THROUGHPUT,)) == (OUTPUT_THROUGHPUT,)
    gated = measurement.cell_gated(open_cell, None)
    assert gated is not None and OUTPUT_THROUGHPUT not in gated
    assert {REQUEST_GOODPUT, MEDIAN_TTFT_MS, TOKENS_PER_VERIFY} <= set(gated)
    assert measurement.cell_gated(open_cell, (REQUEST_GOODPUT,)) == (REQUEST_GOODPUT,)  # the rate gate's re-probe

    def entry(tok_s: float, ttft: float, extra: dict[str, list[float]] | None = None) -> dict[str, object]:
        blessed: dict[str, object] = {}
        for i, session in enumerate(("s1", "s2", "s3")):
            samples = {OUTPUT_THROUGHPUT: [tok_s * (1 + 0.004 * (j - 1 + i % 2)) for j in range(3)],
                       MEDIAN_TTFT_MS: [ttft, ttft * 1.01, ttft * 0.99], **(extra or {})}
            blessed = baseline.baseline_cell_entry({"concurrency": 1}, samples, existing=blessed or None, session=session)
        return blessed

    slo = slo_mod.parse_slo("tpot_ms=50")
    goodput = {REQUEST_GOODPUT: [3.9, 3.92, 3.88]}
    bases = {c.name: entry(100.0 * c.concurrency, 20.0) for c in closed}
    bases[open_cell.name] = entry(64.0, 30.0, goodput)
    judged = measurement.judged_baseline(bases[open_cell.name], slo, open_cell)
    assert judged is not None and OUTPUT_THROUGHPUT not in judged["gates"] and REQUEST_GOODPUT in judged["gates"]
    assert measurement.judged_baseline(bases["c1"], slo, closed[0]) == bases["c1"]
    # today's launch is 8% faster: the closed-loop cells' tok/s rise with it, the open-loop cell's stays the rate's
    today = {c.name: {OUTPUT_THROUGHPUT: [108.0 * c.concurrency] * 3, MEDIAN_TTFT_MS: [20.0 / 1.08] * 3} for c in closed}
    today[open_cell.name] = {OUTPUT_THROUGHPUT: [64.0] * 3, MEDIAN_TTFT_MS: [30.0 / 1.08] * 3, **goodput}

    def inputs(open_judged: bool) -> dict[str, verdicts.CellInput]:
        out = {c.name: verdicts.CellInput(bases[c.name], today[c.name], Status.VALID, ()) for c in closed}
        base = bases[open_cell.name] if not open_judged else measurement.judged_baseline(bases[open_cell.name], slo, open_cell)
        now = today[open_cell.name] if not open_judged else {k: v for k, v in today[open_cell.name].items() if k in (gated or ())}
        out[open_cell.name] = verdicts.CellInput(base, now, Status.VALID, ())
        return out

    before = rule.judge_config(inputs(open_judged=False))[open_cell.name]  # as it was judged: flagged
    assert before.status == Status.FLAGGED and before.metric(OUTPUT_THROUGHPUT) is not None
    after = rule.judge_config(inputs(open_judged=True))[open_cell.name]
    assert after.status == Status.PASS and after.metric(OUTPUT_THROUGHPUT) is None and after.metric(REQUEST_GOODPUT) is not None


def test_a_reprobed_rate_that_held_its_goodput_but_missed_the_slo_says_both() -> None:
    """The blessed rate is the highest that met the SLO, so a launch a little slower misses the SLO
    there while its goodput (what is gated) holds: the deployment answer must not read 'still holds'."""
    from pytest_ddtree.records.words import RecordKind
    from pytest_ddtree.report import frontier

    def record(reason: str | None) -> dict[str, object]:
        return {"kind": RecordKind.SUSTAINABLE_RATE, "config": "bs8_b8_k4", "workload": "r8_short",
                "slo": {"label": "p99 tpot<=50ms", "goodput_slos_ms": {"tpot": 50.0}, "percentile": 99.0},
                "sustainable_rate": 8.0, "probes": [{"rate": 8.0, "met": reason is None, "reason": reason, "figures": {}}],
                "gate": {"blessed_rate": 8.0, "status": "pass", "message": "..."}}

    missed = frontier.deployment([], [record("p99 tpot 57.1 ms > 50 ms")])["sentences"]
    assert missed == ["bs8_b8_k4: its blessed sustainable rate 8 req/s under SLO p99 tpot<=50ms on r8_short, re-probed, "
                      "held its goodput but missed the SLO on this probe (p99 tpot 57.1 ms > 50 ms)."]
    held = frontier.deployment([], [record(None)])["sentences"]
    assert held == ["bs8_b8_k4: its blessed sustainable rate 8 req/s under SLO p99 tpot<=50ms on r8_short, re-probed, "
                    "still holds."]
    # decided on a fresh launch (the first launch failed, rate_gate.Relaunch): its probe is the last, and it says so
    relaunched = record(None)
    relaunched["probes"] = [{"rate": 8.0, "met": False, "reason": "p99 tpot 71.0 ms > 50 ms", "figures": {}},
                            {"rate": 8.0, "met": True, "reason": None, "figures": {}}]
    relaunched["gate"] = {"blessed_rate": 8.0, "status": "pass", "message": "...", "first_launch": "regression"}
    assert frontier.deployment([], [relaunched])["sentences"] == [
        "bs8_b8_k4: its blessed sustainable rate 8 req/s under SLO p99 tpot<=50ms on r8_short, re-probed, still holds "
        "on a fresh launch (its first launch: regression)."]
    relaunched["gate"] = {"blessed_rate": 8.0, "status": "regression", "message": "...", "first_launch": "regression"}
    assert frontier.deployment([], [relaunched])["sentences"][0].endswith(
        "re-probed, no longer holds on a fresh launch (its first launch: regression).")


def test_the_deployment_answer_says_a_searched_rate_is_a_bound_where_the_search_stopped_at_its_limit() -> None:
    from pytest_ddtree.records.words import RecordKind
    from pytest_ddtree.report import frontier

    def record(config: str, rate: float | None, missed: float | None, limit: object) -> dict[str, object]:
        out: dict[str, object] = {
            "kind": RecordKind.SUSTAINABLE_RATE, "config": config, "workload": "r4_short", "sustainable_rate": rate,
            "missed_rate": missed, "slo": {"label": "p99 tpot<=20ms", "goodput_slos_ms": {"tpot": 20.0}, "percentile": 99.0}}
        if limit is not None:
            out["search_limit"] = limit
        return out

    (sentence,) = frontier.deployment([], [record("bs8_b4_k4", 64.0, None, "max_rate"), record("bs8_b8_k4", 11.0, 12.0, None),
                                           record("bs8_b16_k4", 4.0, 8.0, "max_probes"), record("bs8_b2_k4", None, 1.0, None),
                                           record("old", 9.0, 10.0, 7)])["sentences"]  # 7: a hand-edited record
    assert sentence == ("Sustainable request rate under SLO p99 tpot<=20ms on r4_short: bs8_b4_k4 at least 64 req/s (every "
                        "probe met the SLO up to rate_search.max_rate: raise it to find the limit), bs8_b8_k4 11 req/s, "
                        "old 9 req/s, bs8_b16_k4 4 req/s, below 8 (rate_search.max_probes ran out before the two were "
                        "within the search's resolution: raise it), bs8_b2_k4 none (the highest rate that met it, within "
                        "the search's resolution of the first that missed, unless said).")
    (bounds_only,) = frontier.deployment([], [record("bs8_b4_k4", 64.0, None, "max_rate")])["sentences"]
    assert bounds_only.endswith("bs8_b4_k4 at least 64 req/s (every probe met the SLO up to rate_search.max_rate: raise "
                                "it to find the limit).")  # nothing was bracketed: no word of a resolution


def test_at_an_offered_rate_the_deployment_answer_picks_the_most_headroom_not_the_last_finish() -> None:
    """Below their capacity every config serves an open-loop cell's offered rate, so its goodput is the
    schedule's and differs by the last request's finish alone (on the engine: 16.90 against 16.77 req/s
    at 16 req/s while the other config's p99 TPOT and TTFT were lower): the answer there is the config
    with the most headroom. At a closed-loop cell goodput is what a fixed number of users gets."""
    from pytest_ddtree.report import frontier

    slo = {"label": "p99 ttft<=300ms tpot<=20ms", "goodput_slos_ms": {"ttft": 300.0, "tpot": 20.0}, "percentile": 99.0}

    def cell(config: str, name: str, workload: dict[str, Any], goodput: float, ttft: float, tpot: float) -> Any:
        return {"config": config, "cell": name, "workload": {"context_tokens": 128, **workload}, "slo": slo,
                "measurement_status": "valid", "metrics": {"request_goodput": goodput, "output_throughput": goodput * 64,
                                                           "p99_ttft_ms": ttft, "p99_tpot_ms": tpot}}

    offered = {"request_rate": 16.0}
    records = [cell("bs8_b16_k4", "r16", offered, 16.90, 8.7, 1.70), cell("bs8_b4_k4", "r16", offered, 16.77, 8.0, 1.56),
               cell("bs8_b2_k4", "r16", offered, 16.95, 290.0, 25.0),  # misses the TPOT target: not a candidate
               cell("bs8_b16_k4", "c32", {"concurrency": 32}, 114.6, 25.1, 5.3),
               cell("bs8_b4_k4", "c32", {"concurrency": 32}, 151.3, 35.8, 3.8)]
    answers = {e["cell"]: e for e in frontier.at_load(records)}
    assert answers["r16"]["deploy"] == "bs8_b4_k4" and answers["r16"]["chosen_by"] == "headroom"
    assert answers["r16"]["meeting"] == ["bs8_b16_k4", "bs8_b4_k4"]
    assert answers["r16"][SLO_LATENCY_SHARE] == pytest.approx(1.56 / 20)  # TPOT is the nearer target
    assert answers["c32"]["deploy"] == "bs8_b4_k4" and answers["c32"]["chosen_by"] == "request_goodput"
    sentences = frontier.deployment(records, [])["sentences"]
    assert ("For SLO p99 ttft<=300ms tpot<=20ms at load r16 (16 req/s, context 128): deploy bs8_b4_k4 (the most "
            "headroom: its latency at 8% of the SLO's target; goodput 16.77 req/s, 1073.3 output tok/s; 2 of 3 configs "
            "meet it).") in sentences
    assert any(s.startswith("For SLO p99 ttft<=300ms tpot<=20ms at load c32 (concurrency 32, context 128): deploy "
                            "bs8_b4_k4 (goodput 151.30 req/s") for s in sentences), sentences


def test_a_bless_keeps_the_blessed_rate_while_the_session_sustains_it() -> None:
    """A search's answer moves by a bisection step on noise alone; a bless at a new rate starts its
    entry over, so the entry's tolerance would never see a day: the kept rate gathers the sessions."""
    from pytest_ddtree.gates.throughput.rate_gate import bless_rate

    slo = slo_mod.parse_slo("tpot_ms=50")
    blessed = {"rate": 8.0, "slo": slo.record()}

    def found(rate: float | None) -> slo_mod.RateSearch:
        return slo_mod.RateSearch(rate, None, [], 0.1)

    assert bless_rate(found(9.5), blessed, slo) == 8.0  # sustained more: the blessed rate is kept
    assert bless_rate(found(8.0), blessed, slo) == 8.0
    assert bless_rate(found(7.0), blessed, slo) == 7.0  # sustained less: down to what it sustained
    assert bless_rate(found(9.5), None, slo) == 9.5  # nothing blessed yet
    assert bless_rate(found(9.5), {"rate": 8.0, "slo": slo_mod.parse_slo("tpot_ms=60").record()}, slo) == 9.5  # another SLO
    assert bless_rate(found(None), blessed, slo) is None
