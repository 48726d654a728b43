"""The warnings the shipped suites raise (a cell without a baseline, a rate search at its limit).

Why here and not in the suite modules: under ``-n`` xdist rebuilds a worker's warning on the
main process by importing the warning class's module by name, and a suite module is not importable
there (its folder is on no path of the main process): a ``MissingBaselineWarning`` of a first sweep
without baselines crashed the main process (``ModuleNotFoundError: No module named
'test_throughput'``) and the session with it.
"""

from __future__ import annotations


class MissingBaselineWarning(UserWarning):
    """A cell was measured but has no baseline to gate against (the message says how to make one)."""


class NewMetricWarning(UserWarning):
    """A gated metric was measured that the cell's baseline does not hold yet."""


class RateBaselineWarning(UserWarning):
    """A config's sustainable rate was searched with no blessed rate to gate (or one blessed under
    another SLO): the message says how to bless it."""


class RateSearchLimitWarning(UserWarning):
    """A config's rate search stopped at its ``rate_search:`` limit (max_rate met, or max_probes
    spent) before it found the rate within its resolution: the rate is a bound, and the message
    says which key to raise."""
