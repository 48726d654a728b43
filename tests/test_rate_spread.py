"""The rate gate's between-session spread, pooled over every config's blessed sustainable rate (#33).

Why: a rate test's one re-probed cell has three blessed sessions of its own (2 degrees of freedom);
when they happen to agree, its tolerance is the floor, whatever the SLO's edge really moves by.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from pytest_ddtree.baselines import BaselineStore
from pytest_ddtree.gates.throughput import baseline, rule, verdicts
from pytest_ddtree.gates.throughput import rate_gate
from pytest_ddtree.measure.slo import parse_slo
from pytest_ddtree.metrics import REQUEST_GOODPUT
from pytest_ddtree.records.words import Status

SLO = parse_slo("ttft_ms=300,tpot_ms=50,percentile=99")
WORKLOAD = {"request_rate": 10.0, "context_tokens": 128, "output_tokens": 64, "requests": 128}


def _rate_entry(sessions: list[list[float]], slo: Any = SLO) -> dict[str, Any]:
    """A ``sustainable_rate.<workload>`` entry blessed in ``len(sessions)`` sessions, through the bless flow's functions."""
    cell = None
    for i, samples in enumerate(sessions):
        cell = baseline.baseline_cell_entry(WORKLOAD, {REQUEST_GOODPUT: samples}, cell, specs=[verdicts.SPECS[REQUEST_GOODPUT]],
                                        session=f"s{i}")
    assert cell is not None
    return baseline.rate_entry(10.0, slo.record(), cell)


def _sessions(*centres: float) -> list[list[float]]:
    """Sessions of three repeats around each centre (0.2% apart: their noise explains almost none of the spread)."""
    return [[c * 0.998, c, c * 1.002] for c in centres]


def _store(tmp_path: Path, entries: dict[str, dict[str, Any] | str]) -> BaselineStore:
    store = BaselineStore(tmp_path, "sim-h200")
    store.directory.mkdir(parents=True)
    for config, entry in entries.items():
        text = entry if isinstance(entry, str) else yaml.safe_dump({baseline.RATE_SECTION: {"r_search": entry}})
        store.path_for(config).write_text(text)
    return store


def test_the_spread_is_pooled_over_every_configs_blessed_rate_and_hostile_files_are_left_out(tmp_path: Path) -> None:
    wide = {f"c{i}": _rate_entry(_sessions(10.0 * math.exp(-0.04), 10.0, 10.0 * math.exp(0.04))) for i in range(3)}
    store = _store(tmp_path, {
        **wide,
        "agrees": _rate_entry(_sessions(10.0, 10.0, 10.0)),
        "one_session": _rate_entry(_sessions(7.0)),  # no between-session spread of its own: left out
        "other_slo": _rate_entry(_sessions(5.0, 20.0, 10.0), parse_slo("tpot_ms=10,percentile=90")),
        "not_yaml": "sustainable_rate: [unclosed",
        "bad_entry": yaml.safe_dump({baseline.RATE_SECTION: {"r_search": {"rate": -1}}}),
        "control": yaml.safe_dump({baseline.RATE_SECTION: {"r_search": _rate_entry(_sessions(1.0, 100.0, 10.0))}}),
    })
    (pooled,) = rate_gate.pooled_spread(store, SLO).values()
    # three configs 4% apart a session and one that agrees: (3 x 2 x 0.04^2) / (4 x 2) degrees of freedom
    assert pooled.configs == 4 and pooled.dof == 8
    assert math.isclose(pooled.spread, math.sqrt(3 * 2 * 0.04**2 / 8), rel_tol=0.02), pooled


def test_too_few_configs_to_pool_leave_each_rate_test_its_own_spread(tmp_path: Path) -> None:
    entries: dict[str, dict[str, Any] | str] = {f"c{i}": _rate_entry(_sessions(9.6, 10.0, 10.4)) for i in range(2)}
    assert rate_gate.pooled_spread(_store(tmp_path, entries), SLO) == {}
    assert baseline.rate_between_spread([{"r_search": _rate_entry(_sessions(9.6, 10.0, 10.4))}] * 2) == {}
    assert rate_gate.pooled_spread(BaselineStore(tmp_path / "none", "sim-h200"), SLO) == {}


def _judge(entry: dict[str, Any], now: list[float], pooled: baseline.PooledSpread | None) -> verdicts.MetricVerdict:
    """The rate test's goodput judged as ``judge_rate`` judges it (its one cell, the pooled spread), its
    confirmation run (12 fresh repeats) measuring what the first pass did."""
    cells = {"rate": verdicts.CellInput(entry["cell"], {REQUEST_GOODPUT: now}, Status.VALID, (), None)}
    between = None if pooled is None else {REQUEST_GOODPUT: pooled.spread}
    first = rule.judge_config(cells, between_spread=between)["rate"]
    confirmations = {"rate": {REQUEST_GOODPUT: now * 4}} if first.flagged else None
    verdict = rule.judge_config(cells, confirmations, between_spread=between)["rate"].metric(REQUEST_GOODPUT)
    assert verdict is not None
    return verdict


def test_a_rate_whose_own_sessions_agree_gets_the_pools_wider_tolerance_and_still_fails_a_real_drop() -> None:
    entry = _rate_entry(_sessions(10.0, 10.0, 10.0))
    pooled = baseline.PooledSpread(0.04, 18, 36)
    own = _judge(entry, [9.3, 9.31, 9.29], None)
    wide = _judge(entry, [9.3, 9.31, 9.29], pooled)
    # its own sessions agree: the confirmed floor alone (6.25%), and a 7% slower day fails
    assert own.status is Status.REGRESSION and own.tolerance == rule.CONFIRM_FLOOR_SHARE * verdicts.SPECS[REQUEST_GOODPUT].tolerance
    # the edge's pooled spread: about 3 x 4% x sqrt(1 + 1/3) = 13.9%, and the same day passes
    assert wide.status is Status.PASS and math.isclose(wide.tolerance, 3 * 0.04 * math.sqrt(4 / 3), rel_tol=0.03), wide
    dropped = _judge(entry, [7.5, 7.52, 7.48], pooled)  # 25% less goodput: beyond it
    assert dropped.status is Status.REGRESSION and "between sessions 4.0%" in dropped.message, dropped.message
    # an entry whose own sessions disagree more than the pool keeps its own
    spread = _judge(_rate_entry(_sessions(9.0, 10.0, 11.0)), [9.3, 9.31, 9.29], baseline.PooledSpread(0.001, 18, 36))
    assert spread.tolerance > wide.tolerance


def test_the_rate_tests_message_says_which_spread_its_tolerance_holds() -> None:
    entry = _rate_entry(_sessions(10.0, 10.0, 10.0))
    pooled = rate_gate._tolerance(0.139, baseline.PooledSpread(0.04, 18, 36), entry)
    assert pooled == ("tolerance 13.9%, its between-session spread its own or, where wider, 4.0% pooled over 18 configs' "
                      "blessed rates on this hardware")
    own = rate_gate._tolerance(0.05, None, entry)
    assert own == ("tolerance 5.0%, its between-session spread its own 3 blessed session(s)' "
                   "(fewer than 3 configs' rates blessed in 2+ sessions to pool)")
