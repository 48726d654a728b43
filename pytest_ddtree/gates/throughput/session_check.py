"""A config against its session (step 6 of the rule, rule.py): its common change against the other
configs of the same session, and which configs beyond a lenient screen are relaunched."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_ddtree.measure import stats
from pytest_ddtree.gates.throughput.rule import (MEDIAN_VARIANCE, chi2_share_quantile, median_chi2_share,
                                                 t_widened_z, FLAG_FLOOR_SHARE, worse_by)
from pytest_ddtree.gates.throughput.verdicts import Direction, fmt_pct
from pytest_ddtree.records.shapes import JudgedCellData
from pytest_ddtree.records.words import Status, Verdict


#: z of a config's common change against its session's other configs (one launch).
Z_SESSION = 3.5


#: The relaunch screen (``relaunch_candidates``) and the verdict on both launches' mean.
Z_RELAUNCH_SCREEN = 1.5


#: 3.6: at 4.0 (its looks at any of up to MAX_RELAUNCHES relaunches priced in) unchanged restart3
#: sweeps failed it 2 of 1000 times instead of ~7, but a whole config 10% slower was caught only
#: 86.2% of 400 times (bench_gate.py, restart3: the tolerance of two launches' mean reached ~9.6%).
Z_RELAUNCHED = 3.6


#: A flagged config is relaunched at most this often (again while ``_still_open``). The shared part of
#: a relaunched config's error (its baseline's three blessed launches, the others' median) does not
#: shrink with more launches, but the launch part does: under a 2% launch shift (``bench_gate.py``'s
#: ``restart3``), the standard error of the launches' mean is about 2.2% at 2 launches, 1.8% at 4 and
#: 1.6% at 7 (the shared part about 1.3%). Under an unchanged config the
#: futility stop below ends nearly every series after one relaunch, so the extra launches are spent
#: where the config keeps reading slow.
MAX_RELAUNCHES = 6


#: Wald's sequential test on a relaunched config's relaunches alone: no change against a regression
#: of ``REGRESSION_FLOORS`` times the metric's floor (output tok/s: 10% at its 5% floor, the least
#: regression of a whole config the gate must catch). A series stops for futility once the
#: relaunches' log likelihood ratio of that regression over no change falls below ln(FUTILITY_MISS):
#: a regression that real would read so fast with probability at most FUTILITY_MISS.
FUTILITY_MISS = 0.1


#: The regression that test weighs against no change, in the metric's floors (see ``FUTILITY_MISS``).
REGRESSION_FLOORS = 2.0


@dataclass(frozen=True)
class ConfigMove:
    """One config's common change of one metric this session (log units), from its verdicts."""

    config: str
    metric: str
    direction: Direction
    floor: float
    shift: float
    shift_se: float
    blessed: Mapping[str, float]  # blessed session id -> that session's common change
    group: str = ""  # hardware profile / host: configs are compared only within one group


@dataclass(frozen=True)
class SessionFinding:
    config: str
    metric: str
    status: Verdict  # Status.REGRESSION or Status.PASS
    shift: float  # the config's common change (relative, not log)
    others: float  # the median common change of the other configs
    relative: float
    tolerance: float
    compared_with: tuple[str, ...]
    message: str
    relaunched: bool = False  # judged on two launches (the relaunch screen flagged the first)

    @property
    def failed(self) -> bool:
        return self.status == Status.REGRESSION

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def config_moves(records: Sequence[JudgedCellData]) -> list[ConfigMove]:
    """Each config's common change per metric, from its throughput records (``verdict.metrics``).

    Only configs judged with a common change (>= 3 cells with baselines) take part. Records of
    several relaunches of a config (their ``relaunch`` index) give one move each, in that order."""
    found: dict[tuple[str, int, str], ConfigMove] = {}
    for rec in records:
        metrics = ((rec.get("verdict") or {}).get("metrics")) or {}
        config = str(rec.get("config") or "")
        group = f"{rec.get('hardware_profile') or ''}@{rec.get('host') or ''}"
        for key, m in metrics.items():
            shift, shift_se = m.get("config_shift"), m.get("config_shift_se")
            if shift is None or shift_se is None:
                continue
            launch = int(rec.get("relaunch") or 0)
            if (config, launch, key) in found:
                continue
            found[(config, launch, key)] = ConfigMove(
                config, key, m.get("direction", "higher"), float(m.get("tolerance_floor") or 0.0),
                math.log1p(float(shift)), float(shift_se),
                {str(k): float(v) for k, v in (m.get("config_blessed_shifts") or {}).items()}, group)
    return [found[k] for k in sorted(found, key=lambda k: k[1])]


def _median_se(ses: Sequence[float]) -> float:
    """Standard error of the median of values with these standard errors."""
    n = len(ses)
    if n <= 2:
        return math.sqrt(sum(s * s for s in ses)) / n
    return stats.median(ses) * math.sqrt(MEDIAN_VARIANCE / n)


def _wobble(moves: Sequence[ConfigMove]) -> tuple[float, int]:
    """``config_wobble`` and its degrees of freedom."""
    variances = []
    dofs = []
    for c in moves:
        diffs = []
        for sid, value in c.blessed.items():
            others = [o.blessed[sid] for o in moves if o is not c and sid in o.blessed]
            if others:
                diffs.append(value - stats.median(others))
        if len(diffs) >= 2:
            m = sum(diffs) / len(diffs)
            variances.append(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1))
            dofs.append(len(diffs) - 1)
    if not variances:
        return 0.0, 0
    n = len(variances)
    dof = int(stats.median(dofs))
    if n < 6:
        # few configs: the median, over its expected share of the true variance (0.70 at 2 degrees
        # of freedom), so launch-to-launch shifts are not underestimated half the time; its own
        # uncertainty is not priced in (0: a t quantile of 4-10 degrees of freedom would make the
        # check of a session of 2-5 configs blind)
        return math.sqrt(stats.median(variances) / median_chi2_share(dof)), 0
    # the mean of the configs' sample variances without the largest (one odd config), over that
    # trimmed mean's expected share of the true variance: ~1.5x as precise as their median, and the
    # tolerances built on it are only as good as it is
    largest = chi2_share_quantile(dof, (n - 0.375) / (n + 0.25))
    share = (n - largest) / (n - 1)
    return math.sqrt(sum(sorted(variances)[:-1]) / (n - 1) / share), dof * (n - 1)


def config_wobble(moves: Sequence[ConfigMove]) -> float:
    """The config-specific spread between blessed sessions (log): per config, the sample standard
    deviation of its blessed sessions' common change against the others' median in the same
    session; pooled over the configs (three sessions say little about one config)."""
    return _wobble(moves)[0]


def _session_reference(c: ConfigMove, members: Sequence[ConfigMove]) -> tuple[float, float, float, tuple[str, ...]]:
    """The other configs' median common change, its standard error, this config's standard error of
    one launch's change against it (log), and the others' names."""
    others = [o for o in members if o is not c]
    ref = stats.median([o.shift for o in others])
    ref_se = _median_se([o.shift_se for o in others])
    k = max(1, len(c.blessed))
    wobble = config_wobble(members)
    se = math.sqrt(c.shift_se**2 + ref_se**2 + wobble**2 * (1.0 + 1.0 / k))
    return ref, ref_se, se, tuple(o.config for o in others)


def _launches_relative(c: ConfigMove, launches: Sequence[ConfigMove], ref: float, ref_se: float,
                       wobble: float) -> tuple[float, float]:
    """The mean of these launches' changes against the session's others (log) and its standard error."""
    n = len(launches)
    k = max(1, len(c.blessed))
    mean = sum(m.shift for m in launches) / n - ref
    se = math.sqrt(sum(m.shift_se**2 for m in launches) / n**2 + ref_se**2 + wobble**2 * (1.0 / n + 1.0 / k))
    return mean, se


def _by_config(relaunched: Sequence[ConfigMove]) -> dict[tuple[str, str, str], list[ConfigMove]]:
    found: dict[tuple[str, str, str], list[ConfigMove]] = {}
    for m in relaunched:
        found.setdefault((m.group, m.metric, m.config), []).append(m)
    return found


def relaunch_candidates(moves: Sequence[ConfigMove], relaunched: Sequence[ConfigMove] = ()) -> list[str]:
    """Configs to launch (once more): beyond the relaunch screen against the session's other configs.

    A config's common change moves with its launch (KV-cache size, CUDA-graph capture, memory
    layout: about as much as a day), so one launch cannot tell a config 10% slower from an unlucky
    launch without failing too many unchanged sweeps. The screen is lenient (``Z_RELAUNCH_SCREEN``
    standard errors, at least half the floor): a flag costs one more launch of the config, measured
    once on each of its cells (``launches.relaunch_flagged``). ``relaunched``: the relaunches so far
    (``config_moves`` of their records); a config relaunched fewer than ``MAX_RELAUNCHES`` times is a
    candidate again while it is not yet a regression (``judge_session``), the mean of all its launches
    is beyond the screen, and its relaunches alone have not ruled a regression out (``_still_open``)."""
    found: set[str] = set()
    again = _by_config(relaunched)
    groups: dict[tuple[str, str], list[ConfigMove]] = {}
    for move in moves:
        groups.setdefault((move.group, move.metric), []).append(move)
    for (group, key), members in groups.items():
        if len(members) < 2:
            continue
        wobble, dof = _wobble(members)
        for c in members:
            ref, ref_se, se, _ = _session_reference(c, members)
            more = again.get((group, key, c.config), [])
            if not more:
                if _screened(c, c.shift - ref, se):
                    found.add(c.config)
                continue
            if len(more) >= MAX_RELAUNCHES or _relaunch_verdict(c, more, ref, ref_se, se, wobble, dof)[0]:
                continue
            mean, se_mean = _launches_relative(c, [c, *more], ref, ref_se, wobble)
            if _screened(c, mean, se_mean) and _still_open(c, *_launches_relative(c, more, ref, ref_se, wobble)):
                found.add(c.config)
    return sorted(found)


def _still_open(c: ConfigMove, later: float, se_later: float) -> bool:
    """Whether a relaunched config's relaunches alone (their mean against the session's others,
    ``later``, and its standard error, log) still leave a regression open: Wald's futility bound.

    Why the relaunches alone: the first launch was chosen for standing out, so under an unchanged
    config it is biased slow, and a stopping rule that counts it keeps relaunching unchanged configs;
    the relaunches are drawn after the choice and are unbiased. For their mean x ~ N(-d, se^2) the
    log likelihood ratio of a regression d = ``REGRESSION_FLOORS`` x floor over no change is
    d (w - d / 2) / se^2, w the mean's worse-by; it falls below ln(``FUTILITY_MISS``) once
    w < d / 2 + se^2 ln(FUTILITY_MISS) / d. That bound rises with the relaunches (se falls): one noisy
    relaunch stops the series only when it reads clearly near no change, several only when their mean
    is nearer no change than the regression. Under ``bench_gate.py``'s ``restart3`` (one relaunch's
    standard error about 2.9%) the first bound is about 3.1% worse against the others, rising toward
    5% with the relaunches."""
    d = REGRESSION_FLOORS * c.floor
    if d <= 0:
        return worse_by(c.direction, later) > 0
    return worse_by(c.direction, later) > d / 2 + se_later**2 * math.log(FUTILITY_MISS) / d


def _screened(c: ConfigMove, relative: float, se: float) -> bool:
    return (worse_by(c.direction, relative) > max(FLAG_FLOOR_SHARE * c.floor, Z_RELAUNCH_SCREEN * se)
            and worse_by(c.direction, c.shift) > FLAG_FLOOR_SHARE * c.floor)


def _relaunch_verdict(c: ConfigMove, more: Sequence[ConfigMove], ref: float, ref_se: float, se: float,
                      wobble: float, dof: int) -> tuple[bool, float, float, float]:
    """A relaunched config: regressed?, the mean of all its launches against the others, the
    tolerance, and the mean of its relaunches alone (log)."""
    both, se_both = _launches_relative(c, [c, *more], ref, ref_se, wobble)
    tolerance = max(c.floor, t_widened_z(Z_RELAUNCHED, dof) * se_both)
    later, se_later = _launches_relative(c, more, ref, ref_se, wobble)
    regressed = (worse_by(c.direction, both) > tolerance and _screened(c, later, se_later)
                 and worse_by(c.direction, both + ref) > FLAG_FLOOR_SHARE * c.floor)
    return regressed, both, tolerance, later


def launch_wobble(moves: Sequence[ConfigMove]) -> float:
    """One launch's own spread (log): ``config_wobble`` without the others' median's share of it
    (against N others the difference moves by 1 + (pi/2)/N launches' worth; 2 with one other)."""
    return launch_wobble_dof(moves)[0]


def launch_wobble_dof(moves: Sequence[ConfigMove]) -> tuple[float, int]:
    """``launch_wobble`` and the degrees of freedom it was estimated from (0: not priced, see
    ``_wobble``): a test whose standard error rests on it takes a t quantile of them."""
    others = len(moves) - 1
    if others < 1:
        return 0.0, 0
    wobble, dof = _wobble(moves)
    return wobble / math.sqrt(1.0 + (MEDIAN_VARIANCE if others > 2 else 1.0) / others), dof


def judge_session(moves: Sequence[ConfigMove], relaunched: Sequence[ConfigMove] = ()) -> list[SessionFinding]:
    """Each config's common change against the other configs of its session (see above).

    ``relaunched``: the common changes of configs launched again because ``relaunch_candidates``
    flagged them (``config_moves`` of the relaunches' records, in order). Such a config is judged on
    the mean of all its launches (``Z_RELAUNCHED`` standard errors of that mean, at least the floor),
    and its relaunches alone must be beyond the screen too: one slow launch that the relaunch does not
    reproduce is the launch, not the config. A config without a relaunch is judged on its one launch
    by the stricter ``Z_SESSION``."""
    second = _by_config(relaunched)
    groups: dict[tuple[str, str], list[ConfigMove]] = {}
    for move in moves:
        groups.setdefault((move.group, move.metric), []).append(move)
    findings: list[SessionFinding] = []
    for (group, key), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        wobble, dof = _wobble(members)
        for c in sorted(members, key=lambda m: m.config):
            ref, ref_se, se, names = _session_reference(c, members)
            relative = c.shift - ref
            more = second.get((group, key, c.config), [])
            if more:
                regressed, judged, tolerance, later = _relaunch_verdict(c, more, ref, ref_se, se, wobble, dof)
                shown_se = _launches_relative(c, [c, *more], ref, ref_se, wobble)[1]
                launches = (f"; relaunched {len(more)} time(s) (its first launch {fmt_pct(math.expm1(relative))} "
                            f"relative was beyond the screen): the relaunches {fmt_pct(math.expm1(later))}, all "
                            f"{len(more) + 1} launches {fmt_pct(math.expm1(judged))}")
                z = t_widened_z(Z_RELAUNCHED, dof)
            else:
                z = t_widened_z(Z_SESSION, dof)
                tolerance = max(c.floor, z * se)
                regressed = (worse_by(c.direction, relative) > tolerance
                             and worse_by(c.direction, c.shift) > FLAG_FLOOR_SHARE * c.floor)
                launches, judged, shown_se = "", relative, se
            what = (f"{c.config}: {key} moved {fmt_pct(math.expm1(c.shift))} against its baseline (all its cells "
                    f"together) while the session's other {len(names)} config(s) moved "
                    f"{fmt_pct(math.expm1(ref))} (median): {fmt_pct(math.expm1(relative))} relative{launches}")
            made_of = (f"tolerance {tolerance:.1%} = max(floor {c.floor:.1%}, {z:.2g} x standard error {shown_se:.1%}"
                       f"{f' (t, {dof} degrees of freedom)' if dof else ''}; this "
                       f"config's change ±{c.shift_se:.1%}, the others' ±{ref_se:.1%}, config-specific spread "
                       f"between blessed sessions (launches) {wobble:.1%})")
            if regressed:
                message = (f"{what}, beyond the {made_of}: a REGRESSION of this config against the rest of the "
                           "session (a config slower as a whole can pass cell by cell: each cell is judged against "
                           f"the config's own common change). Compared with: "
                           f"{', '.join(names)}. Re-run them together to see it again; if the change is intended, "
                           "re-bless the config with --ddtree-update-baselines")
            else:
                message = f"{what}, within the {made_of}"
            findings.append(SessionFinding(c.config, key, Status.REGRESSION if regressed else Status.PASS, math.expm1(c.shift),
                                           math.expm1(ref), math.expm1(judged), tolerance, names, message,
                                           relaunched=bool(more)))
    return findings
