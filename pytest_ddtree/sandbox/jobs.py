"""The public entry points: run one piece of code with its tests, or many in parallel."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from pytest_ddtree.sandbox.calls import TestPlan, parse_tests
from pytest_ddtree.sandbox.execute import execute_in_tier
from pytest_ddtree.sandbox.limits import Limits, cpu_speed_factor, speed_factor
from pytest_ddtree.sandbox.outcome import RunResult, Verdict
from pytest_ddtree.sandbox.tiers import isolation, refusal


@dataclass(frozen=True)
class Job:
    """One unit of work for :func:`run_many`."""

    code: str
    tests: str | TestPlan
    entry_point: str | None = None
    key: str = ""


def run_code(code: str, tests: str | TestPlan, entry_point: str | None = None, limits: Limits | None = None, *, scale: bool = True, key: str = "") -> RunResult:
    """Run ``code`` in a fresh sandbox, make the calls of ``tests`` and judge their results here.

    ``tests`` is a :class:`~pytest_ddtree.sandbox.calls.TestPlan` or step lines for
    :func:`~pytest_ddtree.sandbox.calls.parse_tests`.  ``entry_point``, when given, must be
    something callable the code defines.  Empty code gives ``no_code`` without starting
    anything.  Never raises for anything the code does; raises ``OSError`` only when no
    process can be started at all, and ``StepError`` for malformed step lines.
    """
    base = limits or Limits()
    plan = parse_tests(tests, entry_point) if isinstance(tests, str) else tests
    if entry_point and plan.entry_point is None:
        plan = TestPlan(plan.calls, plan.inputs, entry_point)
    if not code.strip():
        return RunResult(Verdict.NO_CODE, "no code was extracted from the answer", limits=asdict(base), key=key)
    lim = base.scaled(speed_factor(), cpu_speed_factor()) if scale else base
    iso = isolation()
    if hasattr(os, "getuid") and os.getuid() == 0 and not iso.uid_drop:
        return RunResult(Verdict.ERROR, "refused: " + (refusal(iso, True) or "no uid drop"), limits=asdict(base), key=key, tier=iso.tier)
    res = execute_in_tier(iso.tier, code, plan, lim, iso.uid_drop)
    res.key = key
    return res


def default_workers() -> int:
    """Bounded parallelism: min(4, cpus).  Each run is a whole interpreter with rlimits."""
    return max(1, min(4, os.cpu_count() or 1))


def run_many(jobs: Sequence[Job], limits: Limits | None = None, *, max_workers: int | None = None, scale: bool = True) -> list[RunResult]:
    """Run jobs in parallel (bounded by ``max_workers``, default :func:`default_workers`),
    results in the order of ``jobs``."""
    if not jobs:
        return []
    isolation()  # probe once before the threads start
    with ThreadPoolExecutor(max_workers=max_workers or default_workers()) as pool:
        futures = [pool.submit(run_code, j.code, j.tests, j.entry_point, limits, scale=scale, key=j.key) for j in jobs]
        return [f.result() for f in futures]
