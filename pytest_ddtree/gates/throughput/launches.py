"""The launches a process adds beside its configs' own (no pytest): the control's (``start``,
``measure_launches``: each a fresh launch measured on the session's cells; the end launches of
``wants_end_launch``) and a flagged config's relaunch (``relaunch_flagged``), both judged at the
session end on every launch.

**The control's launch policy**: further launches of the control only while the uniform shift is
inconclusive (a sequential test, its error budget spent honestly).

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

import dataclasses
import math
from collections.abc import Sequence, Mapping, Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from pytest_ddtree.gates.throughput.baseline import baseline_cell_entry, CONTROL, launch_counts
from pytest_ddtree.gates.throughput import control, session_check, verdicts
from pytest_ddtree.gates.throughput.cells import (CellSetup, JudgedCell, CellPlan, collected_cells, driving_for,
                                                  judged_build, read_baseline, run_cells)
from pytest_ddtree.gates.throughput.control import CONTROL_RECORD, CONTROL_REPEAT, CONTROL_UNAVAILABLE, GATED, START
from pytest_ddtree.metrics import OUTPUT_THROUGHPUT
from pytest_ddtree.records.shapes import RawRecord, ControlCellData, RelaunchCellData, RelaunchFailureData
from pytest_ddtree.records import bill, shapes as records_mod
from pytest_ddtree.records.words import RecordKind
from pytest_ddtree.baselines import BaselineError
from pytest_ddtree.gates.throughput.measurement import Judging, Recording, blessed_judging, sample_record
from pytest_ddtree.measure import load
from pytest_ddtree.records.cells import normalize

if TYPE_CHECKING:
    from pytest_ddtree.measure.load import CellLike
    from pytest_ddtree.service.validated_profile import ServiceProfile
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import ServiceManager
    from pytest_ddtree.configs import DDTreeConfig


@dataclass(frozen=True)
class Launcher:
    """What a process's added launches use: the service manager that launches them, the recorder that
    records them, how their cells are run (``CellSetup``: the profile, the options, the SLO), the
    baseline store of a launched service (``baselines``: its ``/server_info`` -> the store) and how many
    processes share the session's configs (``workers``). The plugin's ``ddtree_control`` fixture makes it."""

    manager: ServiceManager
    recorder: SessionRecorder
    setup: CellSetup
    baselines: Callable[[Mapping[str, object]], BaselineStore]
    workers: int = 1


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


def further_launches(launcher: Launcher, cells: Sequence[CellLike]) -> int:
    """At the end of a judged process: more launches of the control while its uniform shift is
    inconclusive (the module docstring), up to the profile's ``control_max_launches``; returns how
    many were measured. Nothing here raises: a launch that fails is recorded (``launches.measure``)
    and the looks stop."""
    profile, recorder = launcher.setup.profile, launcher.recorder
    if launcher.setup.bless or not cells:
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
        if measure_launches(launcher, cells, control.END, count=step) != "measured":
            return added
        now = launches_of(recorder.records)
        if now <= launches:
            return added
        added += now - launches


def launches_at(profile_launches: int, at: str) -> int:
    """How many of a process's ``profile_launches`` launches of the control are measured at ``at``:
    half at its start (the odd one there) and half at its end, so their weighted mean sits where
    the configs' median does and a drift over the process cancels (``_control_launches``)."""
    return (profile_launches + 1) // 2 if at == START else profile_launches // 2


def measure_launches(launcher: Launcher, cells: Sequence[CellLike], at: str = START, count: int | None = None) -> str:
    """The control's launches of this process at ``at`` (``launches_at`` of the profile's
    ``control_launches``, a bless's ``bless_control_launches``; ``count`` launches where given: the
    launch policy's further ones), each a fresh launch measured on every cell (``measure``); returns
    ``measured`` when the process has a launch of the control measured, else what its first did
    (``unavailable``, ``off``, ``no throughput cells``). Each launch
    after the first costs one more restart of the service and the control's cells.

    Why more than one: each launch of a server lands a little faster or slower (KV-cache size,
    CUDA-graph capture, memory layout: ~2% (sd) on GPU servers), and the control's launch shift is
    carried whole by every config's speedup over it; the mean of n launches (and of n per blessed
    session) carries 1 / n of it, which is what lets the uniform shift see every config 5% slower."""
    earlier = {r.get("control_launch") for r in launcher.recorder.records
               if r.get("kind") in (CONTROL_RECORD, CONTROL_REPEAT)}
    first = 1 + max((int(n) for n in earlier if isinstance(n, int)), default=0)
    if count is None:  # a bless: its own number of launches (each later session compares with their mean)
        launches = launcher.setup.profile.bless_control_launches if launcher.setup.bless else launcher.setup.profile.control_launches
        count = launches_at(launches, at)
    done = "off"
    for launch in range(first, first + count):
        outcome = measure(launcher, cells, launch, at)
        if outcome != "measured":  # recorded with the reason; the launches measured so far stand
            return "measured" if launch > 1 else outcome
        done = outcome
    return done


def measure(launcher: Launcher, cells: Sequence[CellLike], launch: int = 1, at: str = START) -> str:
    """Measure one launch of the control in this process, on ``cells``, and record it; returns what
    was done.

    ``launch`` counts the process's launches of the control (1: its first, before its first config),
    ``at`` says whether it belongs to the process's start or its end (``measure_launches``): the
    launches at each end weigh half, so a machine that drifts over the session does not read as the
    configs moving against the control, and the control's own launch-to-launch shift averages over
    its launches. Every launch after the process's first is a fresh one (the service is released
    first). A bless blesses every launch's samples as the session's, with their number (the latest
    launch's proposal replaces the earlier ones, pooled), so the baseline holds what a judged session
    compares with it and says how many launches each blessed session averaged.

    ``launcher`` holds what the launch uses (the manager, the recorder, the profile and options). The
    control is launched in the instance's own slot like any config (the next config restarts);
    its cells are judged against ``control.yaml`` (first pass and confirmation of flagged cells,
    as a config's), or proposed for it under ``--ddtree-update-baselines`` when a bless can trust
    them. Nothing here raises: a control that cannot be launched or measured is recorded with the
    reason (``CONTROL_UNAVAILABLE``) and the session keeps the per-config rule.
    """
    from pytest_ddtree.configs import ConfigError, parse_config_name
    from pytest_ddtree.measure.load import CellResult as LoadResult
    from pytest_ddtree.measure.load import LoadError
    from pytest_ddtree.service.base import ServiceError

    recorder = launcher.recorder
    profile = launcher.setup.profile
    choice = profile.control
    if not cells:
        return "no throughput cells"
    if choice == "none":
        recorder.record(CONTROL_UNAVAILABLE, None, {"reason": f"profile {profile.name} sets control: none"})
        return "off"
    try:
        if launch > 1:
            launcher.manager.release()  # a fresh launch of the control, not the one still running
        with bill.launching_for(launcher.manager, bill.CONTROL):
            if choice:
                service = launcher.manager.ensure(parse_config_name(choice))
                source = f"config {choice} (the profile's control)"
            else:
                service = launcher.manager.ensure_reference()
                source = "non-speculative launch (the profile's lossless_args)"
    except (ServiceError, ConfigError) as exc:
        recorder.record(CONTROL_UNAVAILABLE, None, {"reason": str(exc)})
        return "unavailable"
    store = launcher.baselines(service.server_info)
    baseline = read_baseline(store, CONTROL, judged_build(store, service))
    driving = driving_for(launcher.setup, speculative=bool(choice), label=f"control (launch {launch})")
    plan = CellPlan(CONTROL, tuple(cells), launcher.setup.repeats, driving, Judging(gated=GATED),
                              bless=store.update_mode)
    blessed = blessed_launches(None if store.update_mode else baseline.section)

    def on_sample(name: str, r: int, result: LoadResult) -> None:
        recorder.record(CONTROL_REPEAT, CONTROL, {**sample_record(name, r, result), "control_launch": launch,
                                                  "control_at": at})

    try:
        run_cells(service.client, plan, baseline, Recording(on_sample),
                            lambda ev: _record_cell(launcher, store, ev, source, launch, at, blessed))
    except LoadError as exc:
        recorder.record(CONTROL_UNAVAILABLE, None, {"reason": f"the control could not be measured: {exc}"})
        return "unavailable"
    return "measured"


def blessed_launches(section: Mapping[str, Any] | None) -> dict[str, int]:
    """How many launches of the control each blessed session averaged (session id -> count), from
    control.yaml's ``metrics`` section (its output tok/s sessions' ``launches``; a session blessed
    before the count was kept is left out and counts as one)."""
    counts: dict[str, int] = {}
    for entry in (section or {}).values():
        gates = entry.get("gates") if isinstance(entry, Mapping) else None
        gated = gates.get(OUTPUT_THROUGHPUT) if isinstance(gates, Mapping) else None
        if isinstance(gated, Mapping):
            counts.update({sid: n for sid, n in launch_counts(gated).items() if n >= 1})
    return counts


def _record_cell(launcher: Launcher, baselines: BaselineStore, ev: JudgedCell, source: str, launch: int,
                 at: str, blessed: Mapping[str, int]) -> None:
    """Record one control cell; under a bless, propose it for ``control.yaml`` (with the process's
    earlier launches' samples pooled in, and their number) or say why it cannot be trusted (the
    cell's bless decision, ``ev.bless``)."""
    recorder = launcher.recorder
    cell = ev.record["cell"]
    # mypy asks the cell's record for the control's optional keys too (set below where they apply)
    record: ControlCellData = {**ev.record, "control_source": source, "control_launch": launch,  # type: ignore[typeddict-item]
                               "control_at": at}
    if blessed:
        record["blessed_launches"] = dict(blessed)
    if ev.baseline_problem:
        record["baseline_problem"] = ev.baseline_problem
    if ev.bless is not None and ev.bless.blessed:
        samples, launches = _with_earlier_launches(recorder.records, cell, ev.samples)
        entry = baseline_cell_entry(record["workload"], samples, existing=ev.baseline_cell,
                                         specs=[verdicts.SPECS[k] for k in GATED], session=launcher.setup.session_stamp,
                                         launches=launches)
        recorder.propose_baseline(CONTROL, "metrics", {cell: entry})
        if baselines.fingerprint is not None:  # the setup it was blessed on (the engine's clock scale too), as a config's
            recorder.propose_baseline(CONTROL, "fingerprint", baselines.fingerprint.as_dict())
    elif ev.bless is not None:
        record["bless_refused"] = str(ev.bless.refusal)
        record["retry"] = f"{baselines.create_command(CONTROL).split(' --ddtree-config')[0]} " \
                          f"--ddtree-cell={cell}"
    recorder.record(CONTROL_RECORD, CONTROL, record)


def _with_earlier_launches(records: Sequence[RawRecord], cell: str,
                           samples: Mapping[str, Sequence[float]]) -> tuple[dict[str, list[float]], int]:
    """``samples`` with this process's earlier control launches' samples of ``cell`` before them, and
    how many launches they are together (the refused ones left out)."""
    pooled: dict[str, list[float]] = {}
    launches = 1
    for rec in records_mod.control_records(records, cell):
        if not rec.get("bless_refused"):
            launches += 1
            for key, earlier in rec["samples"].items():
                pooled.setdefault(key, []).extend(earlier)
    for key, values in samples.items():
        pooled.setdefault(key, []).extend(float(v) for v in values)
    return pooled, launches


def wants_end_launch(records: Sequence[RawRecord]) -> bool:
    """Whether this process's control is measured at its end too (``records``: the process's own):
    after ``bill.END_LAUNCH_MIN_CONFIGS`` configs or more, where the session is long enough to drift and
    the control's launch shift is shared by enough configs to be worth more launches; a process of
    one or two configs keeps its launches at its start, beside them."""
    configs = {r.get("config") for r in records if r.get("kind") == RecordKind.THROUGHPUT}
    return len(configs) >= bill.END_LAUNCH_MIN_CONFIGS


def start(launcher: Launcher, items: Sequence[Any]) -> tuple[str, list[CellLike]]:
    """The control at this process's start: its launches there on the profile's ``control_cells``
    first cells (``measure_launches``), or none where the process will measure fewer configs than the
    profile's ``control_min_configs`` (recorded with the reason: the session keeps the per-config rule).
    Returns what was done and the cells the control measures (its end launches take the same)."""
    cells = cells_of(items)[:launcher.setup.profile.control_cells]
    configs = {p.get("ddtree_config") for i in items if isinstance(p := getattr(getattr(i, "callspec", None), "params", None), dict)}
    configs.discard(None)
    ours, least = -(-len(configs) // launcher.workers), launcher.setup.profile.control_min_configs
    if cells and launcher.setup.measure_only:
        launcher.recorder.record(CONTROL_UNAVAILABLE, None, {"reason": "--ddtree-measure-only: nothing is judged, so no "
                                                             "control is launched (it only serves the gate's speedup)"})
        return "off", cells
    if cells and 0 < ours < least:
        reason = (f"this process measures {ours} config{'' if ours == 1 else 's'}, fewer than the profile's "
                  f"control_min_configs ({least}): a uniform shift needs several configs' median, and the control's "
                  "launch and non-speculative cells would cost more than the configs (set control_min_configs: 1 to "
                  "measure it anyway)")
        launcher.recorder.record(CONTROL_UNAVAILABLE, None, {"reason": reason})
        return "off", cells
    return measure_launches(launcher, cells, START), cells


def cells_of(items: Sequence[Any]) -> list[CellLike]:
    """The throughput cells of the collected tests (``cells.collected_cells``), each once, in order;
    cells skipped for the profile (``max_context``) are left out, and so are open-loop cells: below
    the service's capacity their output tok/s is the offered rate's whatever the launch, so a
    speedup over the control there reads ~1x and would only dilute the uniform shift."""
    return [w for w in collected_cells(items).all() if getattr(w, "open_loop", None) is None]


def relaunch_recording(recorder: SessionRecorder, config: str, index: int) -> Recording:
    """Where relaunch ``index`` of ``config`` records its repeats: the first pass's as relaunch repeats,
    a flagged cell's confirmation repeats as confirmation repeats, each with its ``relaunch`` (a
    confirmation's indices start at 0 again, so one kind for both would give two repeats one index)."""

    def record(kind: RecordKind) -> Callable[[str, int, load.CellResult], None]:
        return lambda cell, r, result: recorder.record(kind, config, {**sample_record(cell, r, result), "relaunch": index})

    return Recording(record(RecordKind.THROUGHPUT_RELAUNCH_REPEAT), record(RecordKind.THROUGHPUT_CONFIRM_REPEAT))


#: Repeats of each cell in a relaunch (at most ``--ddtree-repeats``). The relaunch is judged on the
#: config's common change over its cells, whose error a launch's own shift dominates (about 2% on a
#: GPU server against 3% / sqrt(6 cells) = 1.2% of one repeat each): ``bench_gate.py`` under
#: ``restart3`` caught a whole config 10% slower 93.5-94.5% of 400 times at one repeat a cell and
#: 94.0-95.5% at three (the same worlds, two relaunch rules: within their noise), and a relaunch
#: costs 615 s + 6 repeats on the seed's GPU box instead of 615 s + 18.
RELAUNCH_REPEATS = 1


def end_of_process(launcher: Launcher, items: Sequence[Any], done: str, cells: Sequence[CellLike]) -> None:
    """A process's launches at its end, after its last config (``done`` and ``cells``: what
    :func:`start` returned): the configs the session check flags relaunched
    (:func:`relaunch_flagged`), the other half of the control's launches after several configs
    (:func:`wants_end_launch`), and further ones while the uniform shift is inconclusive
    (:func:`further_launches`)."""
    relaunch_flagged(launcher, items)
    if done == "measured" and wants_end_launch(launcher.recorder.records):
        measure_launches(launcher, cells, control.END)
    if done == "measured":
        further_launches(launcher, cells)


def relaunch_flagged(launcher: Launcher, items: Sequence[Any]) -> list[str]:
    """At the end of a process: launch each config that ``session_check.relaunch_candidates`` flags once more,
    measure all its cells again (``RELAUNCH_REPEATS`` each, no confirmation run: see ``Judging.confirm``)
    and record them (``THROUGHPUT_RELAUNCH``), so the session end judges it on both launches
    (``session_check.judge_session``). Returns the relaunched configs.

    Why: a launch of a GPU server moves a config's speed as a whole (KV-cache size, CUDA-graph
    capture, memory layout) about as much as a day does, so one launch cannot tell a config that is
    10% slower from an unlucky launch without failing too many unchanged sweeps; a second launch has a
    shift of its own. ``launcher`` holds what the relaunch uses, ``items`` the collected tests
    (their ``ddtree_config`` and ``cell`` parameters, ``collected_cells``). The screen compares the
    configs measured in this process (the plugin keeps a config's tests on one worker). Nothing here
    raises: a relaunch that fails is recorded with the reason, and the config keeps its one-launch verdict.
    """
    if not launcher.setup.profile.relaunch_flagged or launcher.setup.bless:
        return []
    recorder = launcher.recorder
    moves = session_check.config_moves(normalize(recorder.records))
    collected = collected_cells(items)
    done: list[str] = []
    failed: set[str] = set()
    while True:
        relaunched = session_check.config_moves(records_mod.throughput_records(recorder.records, RecordKind.THROUGHPUT_RELAUNCH))
        flagged = [n for n in session_check.relaunch_candidates(moves, relaunched) if n in collected.configs and n not in failed]
        if not flagged:
            return done
        for name in flagged:
            index = 1 + len({r.get("relaunch") for r in recorder.records
                             if r.get("kind") == RecordKind.THROUGHPUT_RELAUNCH and r.get("config") == name})
            if _relaunch(launcher, collected.configs[name], collected.of(name), index):
                done.append(name)
            else:
                failed.add(name)


def _relaunch(launcher: Launcher, config: DDTreeConfig, cells: Sequence[load.CellLike], index: int) -> bool:
    """Relaunch ``index`` of a flagged config, all its cells measured once and recorded; False when
    it failed (recorded with the reason)."""
    from pytest_ddtree.configs import ConfigError
    from pytest_ddtree.service.base import ServiceError

    name, recorder = config.name, launcher.recorder

    def on_cell(ev: JudgedCell) -> None:
        recorded: RelaunchCellData = {**ev.record, "relaunch": index}
        recorder.record(RecordKind.THROUGHPUT_RELAUNCH, name, recorded)

    try:
        launcher.manager.release()  # a fresh launch, not the one still running
        with bill.launching_for(launcher.manager, bill.RELAUNCHES):
            service = launcher.manager.ensure(config)
        store = launcher.baselines(service.server_info)
        baseline = read_baseline(store, name, judged_build(store, service))
        if baseline.problem is not None:
            raise BaselineError(baseline.problem)
        # as the first launch was measured, less its SLO (the relaunch judges the common change of output tok/s)
        driving = driving_for(launcher.setup, accept_bound=service.accept_bound(),
                              label=f"{name} relaunch {index} (its session check flagged it)")
        judging = dataclasses.replace(blessed_judging(store), confirm=False)
        plan = CellPlan(name, tuple(cells), min(RELAUNCH_REPEATS, launcher.setup.repeats), driving, judging)
        run_cells(service.client, plan, baseline, relaunch_recording(recorder, name, index), on_cell)
    except (ServiceError, ConfigError, BaselineError, verdicts.BaselineFormatError, load.LoadError) as exc:
        failure: RelaunchFailureData = {"error": f"the relaunch of {name} failed: {exc}", "relaunch": index}
        recorder.record(RecordKind.THROUGHPUT_RELAUNCH, name, failure)
        return False
    return True
