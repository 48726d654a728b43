"""The rate test's relaunch (``rate_gate.Relaunch``): a blessed rate that fails on its launch is
judged again on a fresh one, and fails only where that one fails too.

Why: the blessed rate is the SLO's edge, where one slow launch makes requests queue and goodput
fall past the tolerance; one launch cannot tell that from a slower config (docs/benchmarks.md:
most unchanged sweeps' rate failures ran on launches 4-11% slow). The suite's whole path, both
outcomes, is in tests/test_openloop_suite.py; here the cases it cannot reach with a real launch: a
relaunch that cannot start, and the fresh launch's verdict against the first's, on real engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ddtree.measure.matrix import Cell
from pytest_ddtree.gates.throughput import measurement, rate_gate
from pytest_ddtree.measure import openloop
from pytest_ddtree.measure.slo import parse_slo
from pytest_ddtree.records.words import Status
from pytest_ddtree.service.base import ServiceError
from pytest_ddtree.service.client import SGLangClient
from tests.refserver_helpers import RefServer, config_args

pytestmark = pytest.mark.usefixtures("measurement_turn")  # measures open-loop cells: see tests/machine_share.py

SLO = parse_slo("tpot_ms=6,percentile=90")  # ~2 ms at clock scale 5 and 20 req/s; 8x slower: over 6
TEMPLATE = Cell("r_tiny", 8, 48, 16, 8, 2, "documents", openloop.Arrivals(20.0, "constant"))
RATE = 20.0


def _engine(tmp_path: Path, name: str, *faults: str) -> RefServer:
    return RefServer([*config_args("bs8_b8_k4"), "--clock-scale", "5", *faults], tmp_path, name)


@pytest.mark.slow
def test_a_failure_stands_where_no_fresh_launch_starts_and_a_fresh_launch_that_holds_decides(tmp_path: Path) -> None:
    fast, slow = _engine(tmp_path, "fast"), _engine(tmp_path, "slow", "--fault", "slowdown=8")
    try:
        fast.wait_ready()
        slow.wait_ready()
        driving = measurement.Driving(slo=SLO, accept_bound=7)
        probe, campaign = measurement.probe_rate(SGLangClient(fast.url), TEMPLATE, RATE, 3, driving)
        assert probe.met, probe.reason
        entry, why = rate_gate.bless_entry(RATE, {RATE: campaign}, TEMPLATE, SLO, None, "blessed")
        assert entry is not None, why

        def judge(relaunch: rate_gate.Relaunch) -> rate_gate.RateGateOutcome:
            return rate_gate.judge_rate(slow.url, TEMPLATE, entry, 3, 0.5, driving, config="bs8_b8_k4",
                                        create_command="pytest suites --ddtree-update-baselines", require=False,
                                        relaunch=relaunch)

        def cannot_start() -> SGLangClient:
            raise ServiceError("bs8_b8_k4 exited with code 1 while loading (log tail: CUDA error: out of memory)")

        # 1. the relaunch cannot start: the first launch's failure stands, saying why no fresh one decided
        stood = judge(rate_gate.Relaunch(cannot_start))
        assert stood.decision is Status.FAIL
        assert "under SLO p90 tpot<=6ms no longer holds: goodput" in stood.message
        assert "on a fresh launch" not in stood.message.split("\n")[0]
        assert ("a fresh launch would have decided it, but the relaunch failed: bs8_b8_k4 exited with code 1 while "
                "loading (log tail: CUDA error: out of memory)") in stood.message
        assert len(stood.record["probes"]) == 1 and "first_launch" not in stood.record["gate"]
        assert stood.record["sustainable_rate"] is None and stood.record["missed_rate"] == RATE
        # 2. a fresh launch at full speed: it decides, the rate holds, the first launch's evidence is kept
        held = judge(rate_gate.Relaunch(lambda: SGLangClient(fast.url)))
        assert held.decision is Status.PASS, held.message
        assert held.record["gate"]["status"] == "pass" and held.record["gate"]["first_launch"] == "regression"
        first, fresh = held.record["probes"]
        assert not first["met"] and fresh["met"] and held.record["sustainable_rate"] == RATE
        assert "held on a fresh launch: goodput" in held.message and "its first launch failed: goodput" in held.message
    finally:
        fast.stop()
        slow.stop()
