"""The adaptive-sweep advisor on synthetic truths: fit, intervals, choice, recommendations.

The truth is tests/advisor_helpers.py's closed-form cost surface plus seeded noise; the full-matrix
figures live in benchmarks/bench_advisor.py.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

pytest.importorskip("scipy")

from pytest_ddtree.adaptive.advisor import Measurement, Planner, Prediction, fit  # noqa: E402
from tests.advisor_helpers import CELLS, CONFIGS, truth  # noqa: E402


def sweep(planner: Planner, noise: float = 0.01, seed: int = 1, **kw: bool) -> None:
    rng = random.Random(seed)
    while (name := planner.next_config()) is not None:
        cfg = planner.by_name[name]
        for w in CELLS:
            planner.record(Measurement(name, w.name, truth(cfg, w, **kw) * (1 + rng.gauss(0, noise))))


def test_fit_recovers_a_surface_of_its_own_family_with_intervals_covering_the_truth() -> None:
    measured = [c for c in CONFIGS if c.topk == 4 and c.block_size == 8 and "wnone" not in c.name]
    ms = [Measurement(c.name, w.name, truth(c, w)) for c in measured for w in CELLS]
    model = fit({c.name: c for c in CONFIGS}, {w.name: w for w in CELLS}, ms)
    preds = model.predict(CONFIGS, CELLS)
    for c in CONFIGS:
        for w in CELLS:
            p = preds[(c.name, w.name)]
            assert p.low <= p.tok_s <= p.high
            assert abs(p.tok_s / truth(c, w) - 1) < 0.08, (c.name, w.name)
    # an unmeasured shape (block size 16) is less certain than a measured one
    rel = {n: preds[(n, "c1_short")].high / preds[(n, "c1_short")].low for n in ("bs16_b16_k4", "bs8_b8_k4")}
    assert rel["bs16_b16_k4"] > rel["bs8_b8_k4"]


def test_planner_starts_at_the_corners_and_stays_within_the_restart_limit() -> None:
    planner = Planner(CONFIGS, CELLS, max_restarts=4, default="bs8_b8_k4")
    sweep(planner)
    assert planner.order[:2] == ["bs8_b4_k4", "bs8_b16_k4"]
    assert planner.restarts_spent <= 4
    assert f"{planner.restarts_spent} restarts spent of 10 for a full sweep" in planner.summary()


def test_window_twins_are_never_a_restart_and_recommendations_are_measured_configs() -> None:
    planner = Planner(CONFIGS, CELLS, max_restarts=9, default="bs8_b8_k4")
    sweep(planner)
    shapes = [planner.by_name[n].shape for n in planner.order]
    assert len(shapes) == len(set(shapes))
    recs = planner.recommendations()
    assert {r.cell for r in recs} == {w.name for w in CELLS}
    for r in recs:
        assert r.config in planner.order
        best = max(truth(c, planner.cell_by_name[r.cell]) for c in CONFIGS)
        assert truth(planner.by_name[r.config], planner.cell_by_name[r.cell]) >= 0.97 * best, r
    # predicted rows are exactly the unmeasured configs
    assert {n for n, _ in planner.predictions()} == {c.name for c in CONFIGS} - set(planner.order)


def test_a_cost_shape_outside_the_family_still_yields_near_best_measured_picks() -> None:
    planner = Planner(CONFIGS, CELLS, max_restarts=8, default="bs8_b8_k4")
    sweep(planner, falling_topk6=True)
    for r in planner.recommendations():
        best = max(truth(c, planner.cell_by_name[r.cell], True) for c in CONFIGS)
        assert truth(planner.by_name[r.config], planner.cell_by_name[r.cell], True) >= 0.95 * best, r


def test_a_prior_fit_narrows_the_intervals_of_a_short_session() -> None:
    names = {c.name: c for c in CONFIGS}
    cells = {w.name: w for w in CELLS}
    rich = [Measurement(c.name, w.name, truth(c, w)) for c in CONFIGS for w in CELLS]
    prior = fit(names, cells, rich)
    few = [Measurement(n, w.name, truth(names[n], w)) for n in ("bs8_b4_k4", "bs8_b16_k4") for w in CELLS]
    alone = fit(names, cells, few).predict([names["bs8_b12_k6"]], CELLS)
    helped = fit(names, cells, few, prior=prior).predict([names["bs8_b12_k6"]], CELLS)

    def width(ps: Mapping[tuple[str, str], Prediction]) -> float:
        return sum(p.high / p.low for p in ps.values())

    assert width(helped) < width(alone)


def test_bad_limits_and_empty_fits_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="max_restarts must be at least 1"):
        Planner(CONFIGS, CELLS, max_restarts=0)
    with pytest.raises(ValueError, match="at least one measured cell"):
        fit({c.name: c for c in CONFIGS}, {w.name: w for w in CELLS}, [])


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from pytest_ddtree.adaptive.advisor import AdvisorUnavailable

    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(AdvisorUnavailable, match=r"pytest-ddtree\[advisor\]"):
        fit({c.name: c for c in CONFIGS}, {w.name: w for w in CELLS}, [Measurement("bs8_b4_k4", "c1_short", 1.0)])
