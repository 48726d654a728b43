"""The control's launch policy: further launches of the control only while the uniform shift is
inconclusive (a sequential test, its error budget spent honestly); no pytest.

Why: every config 5% slower while the control held (a DDTree build slower on its speculative path)
is seen only by the uniform shift, the configs' common move over the control. Each launch of a GPU
server lands a little faster or slower (~2% sd: KV-cache size, CUDA-graph capture), and the
control's launch shift is carried by every config's speedup over it; with two launches (one at
each end) the uniform shift's tolerance is ~4.5% and a 5% slowdown is caught about two times in
three. Ten launches every session would catch it (~98%) at eight more restarts a sweep. Most
sessions do not need them: an unchanged one sits near zero, a clearly slower one fails at once. So
at the end of a judged process (after its flagged configs' relaunches and the control's end
launches) the policy looks at the uniform shift: when it is a slowdown beyond ``CONTINUE_SHARE`` of
its tolerance but not beyond it, ``CONTROL_STEP`` more launches of the control are measured (at the
process's end, in its end group) and it looks again, up to the profile's ``control_max_launches``.

Why the default starts with two launches at the start: the launches at each end weigh half (a
machine that drifts over the session cancels), so the start's launches keep 1 / (4 x n_start) of
one launch's shift however many are added at the end; with one start launch no number of further
launches reaches the 95% (bench_gate.py measured 88% / 82% at 1 + 9); with two, 11 launches do.

The error budget: a look is a test. The first look is today's rule (``control.Z_UNIFORM``
standard errors, one-sided alpha = Phi(-2.6), widened to a t quantile where the launch spread is
estimated); a process that took further launches is judged at
every later look (and at the session end) at ``uniform_z``'s stricter z, alpha / (J - 1) each for
the J - 1 later looks its profile allows, so the whole sequence fails an unchanged session at most
2 alpha (a union bound: 0.93%, of the sweep's 2% budget), whatever the looks' dependence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING

from pytest_ddtree.gates.throughput import control
from pytest_ddtree.records.shapes import RawRecord

if TYPE_CHECKING:
    from pytest_ddtree.measure.load import WorkloadLike
    from pytest_ddtree.service.validated_profile import ServiceProfile
    from pytest_ddtree.session import DDTreeSession

#: Launches of the control added at each further look (the default profile's 3 -> 11: one further look).
CONTROL_STEP = 8
#: A look continues while the uniform shift is a slowdown beyond this share of its tolerance (and not beyond it):
#: 0.3, since a 5% slowdown read below half its (honest) first-look tolerance ~4% of the time and was let go.
CONTINUE_SHARE = 0.3


def planned_looks(profile: ServiceProfile) -> list[int]:
    """The control's launch counts at which the policy looks: its ``control_launches``, then
    ``CONTROL_STEP`` more at a time up to ``control_max_launches``."""
    looks = [profile.control_launches]
    while looks[-1] < profile.control_max_launches:
        looks.append(min(profile.control_max_launches, looks[-1] + CONTROL_STEP))
    return looks


def uniform_z(profile: ServiceProfile, launches: int) -> float:
    """The z a uniform slowdown must pass after ``launches`` launches of the control in a process:
    ``control.Z_UNIFORM`` at the first look, and at the later ones the z of alpha / (J - 1), alpha
    the first look's one-sided error and J - 1 the later looks the profile allows."""
    later = len(planned_looks(profile)) - 1
    if launches <= profile.control_launches or later < 1:
        return control.Z_UNIFORM
    alpha = NormalDist().cdf(-control.Z_UNIFORM)
    return NormalDist().inv_cdf(1.0 - alpha / later)


def launches_of(records: Sequence[RawRecord]) -> int:
    """The most launches of the control any process of ``records`` measured."""
    per_process: dict[str, set[object]] = {}
    for rec in records:
        if rec.get("kind") == control.CONTROL_RECORD:
            per_process.setdefault(str(rec.get("worker") or ""), set()).add(rec.get("control_launch") or 1)
    return max((len(v) for v in per_process.values()), default=0)


def inconclusive(judgement: control.ControlJudgement) -> bool:
    """Whether a look should continue: a group's uniform shift is a slowdown beyond
    ``CONTINUE_SHARE`` of its tolerance, not beyond it, and nothing failed the group already."""
    for g in judgement.groups:
        if g.failed or g.uniform_shift is None or g.uniform_tolerance is None:
            continue
        slower = -math.log1p(g.uniform_shift)
        if CONTINUE_SHARE * g.uniform_tolerance < slower <= g.uniform_tolerance:
            return True
    return False


def further_launches(session: DDTreeSession, cells: Sequence[WorkloadLike]) -> int:
    """At the end of a judged process: more launches of the control while its uniform shift is
    inconclusive (the module docstring), up to the profile's ``control_max_launches``; returns how
    many were measured. Nothing here raises: a launch that fails is recorded (``control.measure``)
    and the looks stop."""
    from pytest_ddtree.records.cells import normalize

    profile, recorder = session.profile, session.recorder
    if session.settings.update_baselines or not cells:
        return 0
    added = 0
    while True:
        records = list(recorder.records)
        launches = launches_of(records)
        if launches >= profile.control_max_launches:
            return added
        judgement = control.judge(records, normalize(records), z_uniform=uniform_z(profile, launches))
        if not inconclusive(judgement):
            return added
        step = min(CONTROL_STEP, profile.control_max_launches - launches)
        if control.measure_launches(session, cells, control.END, count=step) != "measured":
            return added
        now = launches_of(recorder.records)
        if now <= launches:
            return added
        added += now - launches
