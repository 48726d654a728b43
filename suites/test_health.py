"""Health gate: the service answers, runs the asked config, and serves a short generation.

These run first for every config (they are cheap) and make a broken restart obvious before the
expensive gates spend minutes measuring the wrong thing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.records.shapes import HealthData
from pytest_ddtree.service.readiness import verify_applied
from pytest_ddtree.records.words import RecordKind

if TYPE_CHECKING:  # the fixtures' types (plugin.py hands them out)
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import RunningService
    from pytest_ddtree.service.profile import ServiceProfile


def test_service_answers_health(ddtree_service: RunningService, ddtree_profile: ServiceProfile) -> None:
    status = ddtree_service.client.health(ddtree_profile.health_path)
    assert status == 200, f"{ddtree_profile.health_path} answered {status} after the service was ready"


def test_service_reports_the_asked_config(ddtree_service: RunningService, ddtree_config: DDTreeConfig, ddtree_profile: ServiceProfile) -> None:
    """Re-read /server_info now: the applied check of start-up (the same one, readiness.verify_applied:
    "no window" may read null, 0 or -1) must still hold mid-session."""
    verify_applied(ddtree_config.name, ddtree_profile.expected_applied(ddtree_config), ddtree_service.client.server_info())


def test_short_generation(ddtree_client: SGLangClient, ddtree_config: DDTreeConfig, ddtree_recorder: SessionRecorder) -> None:
    result = ddtree_client.generate(
        text="def fibonacci(n):",
        sampling_params={"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
    )
    meta = result.get("meta_info", {})
    problems = []
    if meta.get("completion_tokens") != 16:
        problems.append(f"asked for 16 tokens with ignore_eos, got meta_info {meta}")
    if not result.get("text"):
        problems.append("the service returned an empty completion")
    # Recorded with its outcome, before failing: the correctness table must not say "ok" here.
    health: HealthData = {
        "completion_tokens": meta.get("completion_tokens"), "text": result.get("text", "")[:200],
        "status": "failed" if problems else "ok", "passed": not problems, "problems": problems}
    ddtree_recorder.record(RecordKind.HEALTH, ddtree_config.name, health)
    assert not problems, "; ".join(problems)
