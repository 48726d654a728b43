"""Throughput/acceptance gate: the rule, its tolerances and the baseline entry format (no pytest).

The design target (docs/benchmarks.md, "Error budget"): an unchanged service passes a whole
sweep of the campaign matrix (18 configs x 6 cells x 3 gated metrics) at least 98% of the time
under 3% repeat noise plus a 2% day-to-day shift, while a 10% drop of one cell's output tok/s
is caught at least 95% of the time, with 3 repeats a cell in the first pass.
``benchmarks/bench_gate.py`` measures both through the functions below.

The rule, per gated metric of a cell (all arithmetic on log values: the noise is multiplicative):

1. **Change.** median(now) against the median of the baseline's samples, which hold the last
   K blessed sessions (K = 3 by default), so one odd blessing day does not become the truth.
2. **Day shift removed.** A machine that is 2% slower today is slower in every cell. The
   config's common change (with >= 3 cells: the mean of its cells' changes without the one in
   five farthest from their median; the median of 3-4) is that shift; each cell is judged on
   its change *relative to it*. The shift itself is judged once per config (step 5), so a
   uniform regression of the whole config is not hidden by it.
3. **Tolerance from measured noise.** sigma = the cell's own within-session standard deviation of
   the log samples (baseline sessions and today's repeats, robust; between half and three times the
   config's median: high concurrency is noisier than a single request); the spread between the baseline's
   sessions beyond what that noise explains is added (the cell's own day-to-day wobble). The
   tolerance is ``max(floor, Z_CELL * standard error of the change)``; the floor is the
   ``tolerance`` in the YAML (5% output tok/s, 3% accept length, 25% TTFT p50, no absolute ms
   floor) and reviewers may edit it.
4. **Flag, then confirm.** The first pass only *flags* a cell, at a lenient screen
   (``Z_FLAG`` standard errors, at least half the floor: a flag costs only confirmation
   repeats); the suite measures flagged cells again (``CONFIRM_REPEATS`` fresh repeats, same
   service lifetime) and the cell fails only when the confirmation alone is beyond the
   confirmation's tolerance too (vLLM's nightly gate: two consecutive violations):
   ``max(CONFIRM_FLOOR_SHARE x floor, Z_CONFIRM x its standard error)``, the noise in that
   standard error being the confirmation's own spread. Not reproduced = pass, with both
   numbers in the record.
5. **Config-wide moves.** The config's shift is judged against ``max(floor, Z_CONFIG * the
   day-to-day spread)``: how much a config's common change moves between blessed sessions
   (``launch_spread``: its launch-to-launch part from each config against the others of its blessed
   session, pooled over every config of the hardware profile; its day part from the blessed days,
   at least the metric's assumed day shift, 2%). Beyond it every cell of the config is flagged
   (and confirmed).
6. **A config against its session** (``judge_session``, at session end): the config's common
   change against the median of the other configs' in the same session, which share that
   day's machine; a config slower as a whole fails here even when each of its cells passed.
   A launch moves a config as a whole about as much as a day, so where the profile can relaunch
   (``relaunch_flagged``) a config beyond a lenient screen (``relaunch_candidates``) is launched
   once more and judged on both launches.
7. **The session's control** (``pytest_ddtree/gates/throughput/control.py``, at session end): a non-speculative
   launch judged against its own baseline, each config's speedup over it, and the session's
   uniform shift; every config slower against a control that held fails there.

Noise differs by cell (concurrency 32 is noisier than one request): each cell's noise is pooled
over every config blessed on the hardware profile (``cell_noise``), not guessed from its own three
sessions.

A cell is *inconclusive* also when the client kept too few requests in flight
(``concurrency_shortfall``); a bless refuses what it cannot trust (``bless_refusal``).

Each message gives the change, a labelled 95% t-interval of the ratio (log values) and the
tolerance with what it was made of. Statuses besides pass/regression: *improved*
(beyond tolerance the good way; bless it), *inconclusive* (repeats disagree even after more
repeats: reported, fails under --ddtree-require-baselines), *invalid* (errors: never a
verdict), *missing* (no baseline), *thin* (the baseline has fewer samples than the gate needs:
not trusted), *new* (a metric the baseline lacks: reported) and *metric-missing* (a gated
metric the run did not produce: fails).

Baseline section layout (``baselines/<hardware-profile>/<config>.yaml``, ``metrics``)::

    metrics:
      c8_short:
        workload: {concurrency: 8, context_tokens: 128, output_tokens: 64, requests: 16}
        gates:
          output_throughput:
            direction: higher
            median: 512.3              # of all samples (for the reader)
            tolerance: 0.05            # the floor of the tolerance (editable)
            unit: tok/s
            sessions:                  # the last K blessed sessions, oldest first
            - {session: 20261130T064000Z, samples: [511.0, 512.3, 514.2]}

The old single-session layout (``samples: [...]`` beside ``median``) is still read, as one
session; the next bless rewrites it.
"""

from __future__ import annotations

from pytest_ddtree.gates.throughput.verdicts import (
    BaselineFormatError,
    CellInput,
    CellVerdict,
    DEFAULT_SESSIONS_KEPT,
    Direction,
    FAILING,
    GATED_METRICS,
    MIN_BASELINE_SAMPLES,
    MetricBaseline,
    MetricSpec,
    MetricVerdict,
    RENAMED_GATES,
    SPECS,
)
from pytest_ddtree.gates.throughput.noise import (
    median_chi2_share,
    t_widened_z,
)
from pytest_ddtree.gates.throughput.rule import (
    CONFIRM_FLOOR_SHARE,
    FLAG_FLOOR_SHARE,
    MIN_CELLS_FOR_SHIFT,
    Z_CELL,
    Z_CONFIG,
    Z_CONFIRM,
    Z_FLAG,
    compare_cell,
    compare_metric,
    judge_config,
)
from pytest_ddtree.gates.throughput.measurement import (
    BLESS_MAX_HALF_WIDTH,
    MIN_CONCURRENCY_SHARE,
    MIN_ENGINE_BUSY_FRACTION,
    MIN_ENGINE_CLOCK_SHARE,
    WHAT_TO_DO,
    bless_refusal,
    concurrency_shortfall,
    measurement_status,
    repeat_load_problem,
)
from pytest_ddtree.gates.throughput.baseline_format import (
    RATE_SECTION,
    baseline_cell_entry,
    rate_entry,
    validate_rate_section,
    validate_section,
)
from pytest_ddtree.gates.throughput.session_check import (
    ConfigMove,
    MAX_RELAUNCHES,
    SessionFinding,
    Z_RELAUNCHED,
    Z_RELAUNCH_SCREEN,
    Z_SESSION,
    config_moves,
    config_wobble,
    judge_session,
    launch_wobble,
    launch_wobble_dof,
    relaunch_candidates,
)
from pytest_ddtree.gates.throughput.blessed_noise import (
    MIN_POOLED_CONFIGS,
    PooledSpread,
    blessed_config_shifts,
    cell_noise,
    day_spread,
    launch_spread,
    rate_between_spread,
)

__all__ = [
    "BLESS_MAX_HALF_WIDTH",
    "BaselineFormatError",
    "CONFIRM_FLOOR_SHARE",
    "CellInput",
    "CellVerdict",
    "ConfigMove",
    "DEFAULT_SESSIONS_KEPT",
    "Direction",
    "FAILING",
    "FLAG_FLOOR_SHARE",
    "GATED_METRICS",
    "MAX_RELAUNCHES",
    "MIN_BASELINE_SAMPLES",
    "MIN_CELLS_FOR_SHIFT",
    "MIN_CONCURRENCY_SHARE",
    "MIN_ENGINE_BUSY_FRACTION",
    "MIN_ENGINE_CLOCK_SHARE",
    "MetricBaseline",
    "MetricSpec",
    "MetricVerdict",
    "MIN_POOLED_CONFIGS",
    "PooledSpread",
    "RATE_SECTION",
    "RENAMED_GATES",
    "SPECS",
    "SessionFinding",
    "WHAT_TO_DO",
    "Z_CELL",
    "Z_CONFIG",
    "Z_CONFIRM",
    "Z_FLAG",
    "Z_RELAUNCHED",
    "Z_RELAUNCH_SCREEN",
    "Z_SESSION",
    "baseline_cell_entry",
    "bless_refusal",
    "blessed_config_shifts",
    "cell_noise",
    "compare_cell",
    "compare_metric",
    "concurrency_shortfall",
    "config_moves",
    "config_wobble",
    "day_spread",
    "judge_config",
    "judge_session",
    "launch_spread",
    "launch_wobble",
    "launch_wobble_dof",
    "measurement_status",
    "median_chi2_share",
    "relaunch_candidates",
    "rate_between_spread",
    "rate_entry",
    "repeat_load_problem",
    "t_widened_z",
    "validate_rate_section",
    "validate_section",
]
