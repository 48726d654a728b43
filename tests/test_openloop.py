"""Open-loop cells: the arrival schedule, the cap, the cell's deadline, the workload keys, and the
reference engine queueing under open-loop load as its own cost model says."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from pytest_ddtree import gate, load, openloop, report
from pytest_ddtree.configs import ConfigError, load_matrix
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
    path.write_text("default: bs8_b8_k4\nworkloads:\n"
                    "  - {name: r4, request_rate: 4, context_tokens: 128, requests: 12}\n"
                    "  - {name: r8c2, request_rate: 8, arrival: gamma, burstiness: 0.5, max_concurrency: 2, context_tokens: 64}\n"
                    "  - {name: c2, concurrency: 2, context_tokens: 64}\n")
    r4, r8c2, c2 = load_matrix(path).workloads
    assert r4.open_loop == openloop.Arrivals(4.0) and r4.concurrency == 12 and r4.warmup_requests == 8
    assert r8c2.open_loop == openloop.Arrivals(8.0, "gamma", 0.5, 2) and r8c2.concurrency == 2
    assert c2.open_loop is None
    assert load.workload_dict(c2) == {"concurrency": 2, "context_tokens": 64, "output_tokens": 128, "requests": 4,
                                      "prompts": "documents"}  # a closed-loop cell's (and its baseline's) keys unchanged
    assert load.workload_dict(r8c2)["request_rate"] == 8.0 and load.workload_dict(r4)["max_concurrency"] is None
    for bad, message in (("{request_rate: 4, concurrency: 2, context_tokens: 64}", "drop concurrency"),
                         ("{max_concurrency: 2, context_tokens: 64}", "add request_rate"),
                         ("{request_rate: fast, context_tokens: 64}", "open-loop workload")):
        path.write_text(f"workloads:\n  - {bad}\n")
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
    assert gate.repeat_load_problem(m) is None  # an idle engine between arrivals is not a starved client
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
    assert res.metrics()["ddtree_late_requests"] >= 2


def test_the_cells_deadline_cuts_what_is_still_streaming() -> None:
    cell = load.Cell("r20", concurrency=3, context_tokens=16, output_tokens=16, requests=3, warmup_requests=0,
                     open_loop=openloop.Arrivals(20.0, "constant", deadline_s=0.4))
    with standin_server(StandInConfig(tokens_per_chunk=1, step_s=0.5)) as (url, _):
        res = load.run_cell(url, cell)
    assert not res.valid and res.failed == 3
    assert any("deadline" in n for n in res.notes)
    assert all(r.error for r in res.requests)
