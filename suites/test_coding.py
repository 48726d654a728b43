"""Coding-correctness gate: the config under test must still solve what its baseline solved.

Each problem of the selected set (``--ddtree-coding-set``, ``--ddtree-coding-limit``) is asked
through the service's chat API at temperature 0, the code is extracted from the answer and run
with the problem's tests in the sandbox (``pytest_ddtree.sandbox``). The per-problem verdicts
are compared with ``coding: {<set>: [passed ids]}`` of the config's baseline file; without a
baseline the profile's floor ``coding_min_pass`` applies (default: every problem). The logic
lives in ``pytest_ddtree.gates.coding``; this file only wires fixtures to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_ddtree.gates import coding, coding_problems
from pytest_ddtree import sandbox
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.records.shapes import CodingData
from pytest_ddtree.records.words import RecordKind

if TYPE_CHECKING:  # the fixtures' types (plugin.py hands them out)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.profile import ServiceProfile


def test_coding_gate(
    request: pytest.FixtureRequest,
    ddtree_config: DDTreeConfig,
    ddtree_client: SGLangClient,
    ddtree_profile: ServiceProfile,
    ddtree_settings: Settings,
    ddtree_recorder: SessionRecorder,
    ddtree_baselines: BaselineStore,
) -> None:
    set_name = ddtree_settings.coding_set
    try:
        problems = coding_problems.select_problems(set_name, ddtree_settings.coding_limit)
    except (coding_problems.CodingSetUnavailable, coding_problems.ProblemError) as exc:
        pytest.fail(str(exc), pytrace=False)
    if not problems:
        pytest.fail(f"coding set {set_name!r} has no problems (limit {ddtree_settings.coding_limit})", pytrace=False)

    iso = sandbox.isolation()
    refused = sandbox.refusal(iso, allow_plain=ddtree_settings.sandbox == "plain")
    if refused:  # fail closed: no generated code runs under a weaker sandbox without opt-in
        request.node.add_report_section("call", "ddtree coding", f"sandbox: {iso.describe()}\nREFUSED: {refused}")
        pytest.fail(f"coding gate not run: {refused}", pytrace=False)

    results = coding.solve(ddtree_client, problems, max_tokens=ddtree_settings.coding_max_tokens)
    verdicts = {r.id: r.verdict for r in results}

    # --ddtree-measure-only reads no baseline: the pass count is a number like the others
    section = None if ddtree_settings.measure_only else ddtree_baselines.section(ddtree_config.name, "coding")
    baseline_ids = None
    if isinstance(section, dict) and isinstance(section.get(set_name), list):
        baseline_ids = [str(x) for x in section[set_name]]
    gate = coding.compare(baseline_ids, verdicts, 0 if ddtree_settings.measure_only else ddtree_profile.coding_min_pass)

    table = coding.render_table(results, baseline_ids)
    header = f"coding set {set_name} on {ddtree_config.name} (sandbox: {iso.describe()})"
    request.node.add_report_section("call", "ddtree coding", f"{header}\n{table}\n{gate.message}")
    outcome: CodingData = {
        "set": set_name,
        "limit": ddtree_settings.coding_limit,
        "max_tokens": ddtree_settings.coding_max_tokens,
        "passed": gate.pass_count,
        "total": gate.total,
        "gate": {"passed": gate.passed, "mode": gate.mode, "floor": gate.floor,
                 "regressions": list(gate.regressions), "new_passes": list(gate.new_passes)},
        "sandbox": iso.describe(),
        "speed_factor": sandbox.speed_factor(),
        "problems": [r.to_record() for r in results],
    }
    ddtree_recorder.record(RecordKind.CODING, ddtree_config.name, outcome)

    if ddtree_baselines.update_mode:
        run_ids = set(verdicts)
        kept = [pid for pid in (baseline_ids or []) if pid not in run_ids]  # outside --ddtree-coding-limit
        passed_now = [pid for pid, v in verdicts.items() if v is sandbox.Verdict.PASSED]
        floor = ddtree_profile.coding_min_pass
        need = len(verdicts) if floor is None else min(floor, len(verdicts))
        if len(passed_now) < need:  # an empty or broken list would otherwise pass forever
            what = "every problem (coding_min_pass: null)" if floor is None else f"coding_min_pass {floor}"
            pytest.fail(f"not blessing coding set {set_name!r} of {ddtree_config.name}: {len(passed_now)}/{len(verdicts)} "
                        f"passed, below the profile's floor of {need} ({what}); fix the service or lower the floor in "
                        f"the profile, then bless again\n\n{coding.failure_details(results, gate.regressions)}\n{table}",
                        pytrace=False)
        ddtree_recorder.propose_baseline(ddtree_config.name, "coding", {set_name: sorted({*kept, *passed_now})})
        return

    if baseline_ids is None and ddtree_settings.require_baselines:
        pytest.fail(
            f"no coding baseline for set {set_name!r} in {ddtree_baselines.path_for(ddtree_config.name)}; "
            f"create it with: {ddtree_baselines.create_command(ddtree_config.name)}",
            pytrace=False,
        )
    if not gate.passed:
        hint = "" if baseline_ids is not None else f"\n(no baseline yet; once the answers are right, create it with: {ddtree_baselines.create_command(ddtree_config.name)})"
        pytest.fail(f"{gate.message}{hint}\n\n{coding.failure_details(results, gate.regressions)}\n{table}", pytrace=False)
