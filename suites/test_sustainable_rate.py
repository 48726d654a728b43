"""The sustainable rate: per config, the highest request rate that meets the session's latency SLO.

Collected with the throughput suite's fixtures; runs where the matrix has a ``rate_search:`` key
(the workload to search, its lowest and highest rate) and the session an SLO (``--ddtree-slo``,
or an ``slo:`` key in the matrix or the profile), and skips saying which is missing otherwise
(docs/gates/throughput.md).

Gated like a cell: ``--ddtree-update-baselines`` searches and proposes the rate found (with its SLO
and goodput samples) for the config's baseline file; a later session re-probes that one rate and
fails the config when its goodput there fell beyond the gate's tolerance
(``pytest_ddtree/gates/throughput/rate_gate.py``). Without a blessed rate, or under another SLO, it searches
and warns (``--ddtree-require-baselines``: fails).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ddtree.gates.throughput import baseline, verdicts
from pytest_ddtree.baselines import BaselineError
from pytest_ddtree.service.plain import is_plain
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.gates.throughput.rate_gate import (Relaunch, bless_entry, bless_rate, judge_rate, pooled_spread,
                                                      rebless_note, same_slo, unjudged)
from pytest_ddtree.gates.throughput.cells import CellSetup, driving_for
from pytest_ddtree.gates.throughput.launches import relaunch_recording
from pytest_ddtree.gates.throughput.measurement import (Campaign, CellDeadlineExceeded, Recording, probe_rate,
                                                        sample_record, sustainable_rate)
from pytest_ddtree.measure.load import CellResult, LoadError
from pytest_ddtree.gates.suite_warnings import RateBaselineWarning, RateSearchLimitWarning
from pytest_ddtree.plugin import session_of
from pytest_ddtree.records.bill import RELAUNCHES, launching_for
from pytest_ddtree.records.words import RecordKind, Status

if TYPE_CHECKING:  # the fixtures' types (plugin.py hands them out)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.measure.slo import SLO
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.service.manager import RunningService, ServiceManager
    from pytest_ddtree.service.profile import ServiceProfile


def _blessed(baselines: BaselineStore, config: str, workload: str) -> dict[str, Any] | None:
    """The config's blessed ``sustainable_rate.<workload>`` entry (None: none), checked."""
    data = baselines.load(config)
    section = baseline.validate_rate_section((data or {}).get(baseline.RATE_SECTION), str(baselines.path_for(config)))
    return section.get(workload)


_POOLED = pytest.StashKey[dict[str, baseline.PooledSpread]]()


def _pooled(request: pytest.FixtureRequest, baselines: BaselineStore, slo: SLO) -> dict[str, baseline.PooledSpread]:
    """The blessed rates' between-session spread over every config of this hardware profile under
    the session's SLO (read once per process: every config's file, as the cells' ``_judging``)."""
    stash = request.config.stash
    if _POOLED not in stash:
        stash[_POOLED] = pooled_spread(baselines, slo)
    return stash[_POOLED]


def test_sustainable_rate(
    request: pytest.FixtureRequest,
    ddtree_config: DDTreeConfig,
    ddtree_service: RunningService,
    ddtree_settings: Settings,
    ddtree_recorder: SessionRecorder,
    ddtree_baselines: BaselineStore,
) -> None:
    """The highest request rate this config sustains under the session's SLO (the matrix's ``rate_search:``).

    Each probed rate is an open-loop cell of the search's workload with the usual repeats; the
    search doubles the rate until one misses the SLO, then bisects (docs/gates/throughput.md). With a
    rate blessed under this SLO, that rate alone is re-probed and its goodput judged instead."""
    session = session_of(request.config)
    search = session.matrix.rate_search if session is not None else None
    slo = session.slo if session is not None else None
    if search is None:
        pytest.skip("no rate_search: in the matrix (workload, min_rate, max_rate): no sustainable rate is searched")
    if slo is None:
        pytest.skip("no SLO to sustain: give --ddtree-slo ttft_ms=..,tpot_ms=.. or an slo: key in the matrix or profile")
    workload, plan = search
    max_context = ddtree_service.profile.max_context
    if max_context is not None and workload.context_tokens > max_context:
        pytest.skip(f"{workload.name}: context {workload.context_tokens} tokens exceeds the profile's max_context {max_context}")
    config = ddtree_config.name
    problem: str | None = None
    try:
        # a bless searches afresh, and so does --ddtree-measure-only (the rate is a number, judged by nothing)
        skip_blessed = ddtree_baselines.update_mode or ddtree_settings.measure_only
        blessed = None if skip_blessed else _blessed(ddtree_baselines, config, workload.name)
    except (BaselineError, verdicts.BaselineFormatError) as exc:
        blessed, problem = None, f"{config}: {exc}"
    if problem is not None:
        pytest.fail(problem, pytrace=False)

    def on_sample(name: str, r: int, res: CellResult) -> None:
        ddtree_recorder.record(RecordKind.THROUGHPUT_REPEAT, config, sample_record(name, r, res))

    assert session is not None  # the plugin is active: the fixtures above exist
    driving = driving_for(CellSetup.of(session.profile, ddtree_settings, slo), accept_bound=ddtree_service.accept_bound(), slo=slo,
                          speculative=not is_plain(ddtree_config))
    if blessed is not None and same_slo(blessed["slo"], slo):
        failure: str | None = None
        try:
            outcome = judge_rate(
                ddtree_service.client, workload, blessed, ddtree_settings.repeats, plan.resolution, driving, config=config,
                create_command=ddtree_baselines.create_command(config), require=ddtree_settings.require_baselines,
                recording=Recording(on_sample, lambda name, r, res: ddtree_recorder.record(
                    RecordKind.THROUGHPUT_CONFIRM_REPEAT, config, sample_record(name, r, res))),
                pooled=_pooled(request, ddtree_baselines, slo).get(workload.name),
                relaunch=_relaunch(session.profile, session.manager, ddtree_config, ddtree_recorder))
        except LoadError as exc:
            failure = f"{config}: {exc}"
            if isinstance(exc, CellDeadlineExceeded) and session is not None:
                session.manager.abandon(config, failure)
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        ddtree_recorder.record(RecordKind.SUSTAINABLE_RATE, config, outcome.record)
        if outcome.decision is Status.FAIL:
            pytest.fail(outcome.message, pytrace=False)
        if outcome.decision is Status.SKIP:
            pytest.skip(outcome.message.replace("\n", " "))
        return
    campaigns: dict[float, Campaign] = {}
    try:
        result = sustainable_rate(ddtree_service.client, workload, plan, ddtree_settings.repeats, driving,
                                  Recording(on_sample), campaigns if ddtree_baselines.update_mode else None)
    except LoadError as exc:
        pytest.fail(f"{config}: {exc}", pytrace=False)
    record = result.record(workload.name, slo)
    if blessed is not None:  # blessed under another SLO: its goodput counted other requests as good
        record["gate"] = rebless_note(blessed, slo)
    ddtree_recorder.record(RecordKind.SUSTAINABLE_RATE, config, record)
    bound = result.bounded()
    if bound is not None:  # a ceiling reported as the config's limit would mislead the deployment answer
        kept = ("; a bless keeps it as a rate the config sustains, and its re-probe checks only that"
                if ddtree_baselines.update_mode else "")
        warnings.warn(RateSearchLimitWarning(f"{config}: its sustainable rate on {workload.name} under SLO {slo.label} is "
                                             f"{bound}{kept}"), stacklevel=1)
    if result.sustainable is None:
        first = result.probes[0] if result.probes else None
        pytest.fail(f"{config} does not meet {slo.label} even at {plan.min_rate:g} req/s"
                    + (f": {first.reason}" if first is not None and first.reason else ""), pytrace=False)
    if ddtree_baselines.update_mode:
        existing = _blessed_for_bless(ddtree_baselines, config, workload.name)
        rate = bless_rate(result, existing, slo)
        if rate is not None and rate not in campaigns:  # the blessed rate, kept: measured once more for its samples
            try:
                campaigns[rate] = probe_rate(ddtree_service.client, workload, rate, ddtree_settings.repeats, driving,
                                             Recording(on_sample))[1]
            except LoadError as exc:
                pytest.fail(f"{config}: {exc}", pytrace=False)
        entry, why = bless_entry(rate, campaigns, workload, slo, existing, ddtree_settings.session_stamp)
        if entry is None:
            pytest.fail(f"{config}: sustainable rate not blessed: {why}", pytrace=False)
        ddtree_recorder.propose_baseline(config, baseline.RATE_SECTION, {workload.name: entry})
        return
    decision, why = unjudged(config, workload.name, blessed, slo, str(ddtree_baselines.path_for(config)),
                             ddtree_baselines.create_command(config), ddtree_settings.require_baselines)
    if decision is Status.FAIL:
        pytest.fail(why, pytrace=False)
    warnings.warn(RateBaselineWarning(why), stacklevel=1)


def _relaunch(profile: ServiceProfile, manager: ServiceManager, config: DDTreeConfig, recorder: SessionRecorder) -> Relaunch | None:
    """A fresh launch of ``config`` for a blessed rate that failed on its first (None where the profile
    cannot relaunch, ``relaunch_flagged: false``); its repeats recorded as a relaunch's (``relaunch: 1``),
    its confirmation repeats as confirmation repeats of that relaunch (their indices start at 0 again)."""
    if not profile.relaunch_flagged:
        return None

    def launch() -> SGLangClient:
        manager.release()  # a fresh launch, not the one still running
        with launching_for(manager, RELAUNCHES):
            return manager.ensure(config).client

    return Relaunch(launch, relaunch_recording(recorder, config.name, 1))


def _blessed_for_bless(baselines: BaselineStore, config: str, workload: str) -> dict[str, Any] | None:
    """The entry a bless adds its session to (an unreadable one is started over: the bless rewrites it)."""
    try:
        return _blessed(baselines, config, workload)
    except (BaselineError, verdicts.BaselineFormatError):
        return None
