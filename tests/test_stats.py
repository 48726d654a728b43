"""Small-sample statistics: percentiles, MAD, bootstrap, Mann-Whitney, interleaving."""

from __future__ import annotations

import math

import pytest

from pytest_ddtree.measure import stats
from pytest_ddtree.records.words import Status


def test_percentile_matches_numpy_linear() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    assert stats.percentile(values, 50) == 35.0
    assert stats.percentile(values, 90) == pytest.approx(46.0)
    assert stats.percentile(values, 99) == pytest.approx(49.6)
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.median([1.0, 2.0, 3.0, 4.0]) == 2.5
    with pytest.raises(ValueError):
        stats.percentile([], 50)


def test_mad_ignores_one_outlier() -> None:
    assert stats.mad([10.0, 11.0, 12.0, 100.0]) == pytest.approx(1.0)
    assert stats.stdev([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)


def test_summary_and_policy_status() -> None:
    policy = stats.RepeatPolicy(min_repeats=3, max_repeats=5, target_rel_ci=0.02, inconclusive_rel_ci=0.10)
    assert policy.status([100.0, 100.5, 99.8]) == Status.VALID
    assert policy.status([100.0, 150.0, 60.0]) == Status.INCONCLUSIVE
    assert policy.status([100.0, 100.0, 100.0], invalid=True) == Status.INVALID
    assert policy.status([]) == Status.INVALID
    s = stats.summarize([100.0, 101.0, 99.0])
    assert s.median == 100.0 and s.mad == 1.0 and s.rel_half_width <= 0.01 + 1e-12
    with pytest.raises(ValueError):
        stats.RepeatPolicy(min_repeats=4, max_repeats=3)


def test_run_interleaved_orders_rounds_and_stops_early() -> None:
    order: list[tuple[str, int]] = []
    noisy = {"a": [100.0, 100.0, 100.0], "b": [100.0, 130.0, 80.0, 90.0, 120.0, 100.0]}

    def measure(cell: str, r: int) -> float:
        order.append((cell, r))
        return noisy[cell][r]

    policy = stats.RepeatPolicy(min_repeats=3, max_repeats=5)
    runs = stats.run_interleaved(["a", "b"], measure, lambda s: s, policy)
    # repeat r of every cell before repeat r+1 of any cell
    assert order[:6] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert ("a", 3) not in order and runs["a"].stopped_early
    assert len(runs["b"].samples) == 5 and not runs["b"].stopped_early


def test_run_interleaved_drops_invalid_cells() -> None:
    calls: list[str] = []

    def measure(cell: str, r: int) -> float | None:
        calls.append(cell)
        return None if cell == "bad" else 1.0

    runs = stats.run_interleaved(["bad", "good"], measure, lambda s: s, stats.RepeatPolicy())
    assert calls.count("bad") == 1 and runs["bad"].invalid
    assert calls.count("good") == 3 and not runs["good"].invalid


def test_spoiled_repeats_are_recorded_and_retaken_not_counted() -> None:
    # (tok/s, spoiled?) per repeat: cell "a" has a burst of load in its 2nd and 3rd repeats
    taken = {"a": [(100.0, False), (60.0, True), (55.0, True), (101.0, False), (99.0, False)],
             "b": [(200.0, False), (201.0, False), (199.0, False)]}
    seen: list[tuple[str, int]] = []

    def measure(cell: str, r: int) -> tuple[float, bool]:
        return taken[cell][r]

    runs = stats.run_interleaved(["a", "b"], measure, lambda s: s[0], stats.RepeatPolicy(min_repeats=3, max_repeats=5),
                                 on_sample=lambda cell, r, s: seen.append((cell, r)),
                                 spoiled=lambda s: "the host fell behind" if s[1] else None)
    a = runs["a"]
    # every repeat recorded as it happened (nothing lost) ...
    assert seen == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("a", 4)]
    assert [s[0] for s in a.samples] == [100.0, 60.0, 55.0, 101.0, 99.0]
    # ... the spoiled ones kept with their reason but not counted: the cell took two more instead
    assert a.spoiled == {1: "the host fell behind", 2: "the host fell behind"}
    assert a.primary == [100.0, 101.0, 99.0] and [s[0] for s in a.counted] == a.primary
    assert not a.short_of_clean and not a.invalid
    assert runs["b"].spoiled == {} and len(runs["b"].samples) == 3 and not runs["b"].short_of_clean


def test_a_cell_spoiled_beyond_its_budget_is_short_of_clean_repeats() -> None:
    calls: list[int] = []

    def measure(cell: str, r: int) -> float:
        calls.append(r)
        return 50.0 if r % 2 else 100.0  # every other repeat measured a loaded machine

    policy = stats.RepeatPolicy(min_repeats=3, max_repeats=5, max_attempts=5)
    run = stats.run_interleaved(["a"], measure, lambda s: s, policy,
                                spoiled=lambda s: "loaded" if s < 80 else None)["a"]
    # the attempts end the cell: 5 repeats taken in all, 3 clean ones counted
    assert calls == [0, 1, 2, 3, 4] and run.primary == [100.0, 100.0, 100.0] and not run.short_of_clean
    run = stats.run_interleaved(["a"], lambda c, r: 50.0 if r else 100.0, lambda s: s, policy,
                                spoiled=lambda s: "loaded" if s < 80 else None)["a"]
    assert len(run.samples) == 5 and run.primary == [100.0] and sorted(run.spoiled) == [1, 2, 3, 4]
    assert run.short_of_clean
    # without a budget of its own a spoiled repeat takes the place of an extra one
    assert stats.RepeatPolicy(min_repeats=3, max_repeats=5).attempts == 5
    with pytest.raises(ValueError):
        stats.RepeatPolicy(min_repeats=3, max_repeats=5, max_attempts=4)


def test_an_invalid_repeat_is_not_retaken_as_spoiled() -> None:
    runs = stats.run_interleaved(["a"], lambda c, r: None, lambda s: s, stats.RepeatPolicy(),
                                 spoiled=lambda s: "never asked")
    assert runs["a"].invalid and runs["a"].spoiled == {} and len(runs["a"].samples) == 1


def test_is_number_accepts_finite_ints_and_floats_only() -> None:
    for good in (0, 3, -2.5, 1e300, 10**400):
        assert stats.is_number(good), good
    for bad in (True, False, None, "1.0", float("nan"), float("inf"), [1.0], {"v": 1}):
        assert not stats.is_number(bad), bad


def test_median_interval_states_its_real_coverage() -> None:
    three = stats.median_interval([3.0, 1.0, 2.0])
    assert (three.low, three.high) == (1.0, 3.0) and three.coverage == pytest.approx(0.75)
    assert three.label == "75% order-statistic interval of the median"
    nine = stats.median_interval([float(v) for v in range(9)])  # [x(2), x(8)] reaches 96%
    assert (nine.low, nine.high) == (1.0, 7.0) and nine.coverage == pytest.approx(0.9609375)


def test_t_quantiles_and_the_log_ratio_interval() -> None:
    assert stats.t_inverse_cdf(0.975, 2) == pytest.approx(4.302653, abs=1e-5)  # scipy.stats.t.ppf
    assert stats.t_inverse_cdf(0.975, 10) == pytest.approx(2.228139, abs=1e-5)
    assert stats.t_inverse_cdf(0.995, 1) == pytest.approx(63.656741, abs=1e-4)
    assert stats.t_inverse_cdf(0.05, 30) == pytest.approx(-1.697261, abs=1e-5)
    interval = stats.log_ratio_interval([100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    assert interval is not None and interval.label == "95% t-interval on log values"
    assert interval.low < 0.9 < interval.high and interval.high < 1.0
    assert stats.log_ratio_interval([100.0], [90.0, 91.0]) is None


def test_scaled_mad_is_robust_and_policy_spread_uses_it() -> None:
    assert stats.scaled_mad([100.0, 101.0, 99.0]) == pytest.approx(1.4826)
    assert stats.scaled_mad([100.0, 101.0, 40.0]) == pytest.approx(1.4826)  # one wild repeat
    policy = stats.RepeatPolicy(inconclusive_rel_ci=0.1)
    assert policy.status([100.0, 101.0, 40.0]) == Status.VALID
    assert policy.status([100.0, 130.0, 75.0]) == Status.INCONCLUSIVE
