"""Lossless gate: greedy output under speculation equals the non-speculative output.

For every bundled prompt (the coding prompts and ``suites/coding/lossless_prompts.yaml``) the
config under test generates ``pytest_ddtree.gates.lossless.MAX_NEW_TOKENS`` tokens at temperature 0
through ``/generate``; the token ids are compared with a non-speculative reference: a launch with
the profile's ``lossless_args``, measured in this session (``lossless: instance``) or blessed into
``baselines/<hardware>/golden/`` (``lossless: golden``, written by the main process from that launch
under ``--ddtree-update-baselines``, never from the config under test). The reference's own floor
(the same prompts at two batch compositions) decides how much divergence a non-deterministic
service may show; the reference engine and SGLang's deterministic-inference mode must be exact.
A mismatch shows the first diverging token and both continuations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_ddtree.gates import lossless
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.records.shapes import LosslessData
from pytest_ddtree.records.words import RecordKind

if TYPE_CHECKING:  # the fixtures' types (plugin.py hands them out)
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.gates.lossless import Reference
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import RunningService


def test_lossless_gate(
    request: pytest.FixtureRequest,
    ddtree_lossless_source: Reference | None,
    ddtree_config: DDTreeConfig,
    ddtree_service: RunningService,
    ddtree_settings: Settings,
    ddtree_recorder: SessionRecorder,
    ddtree_baselines: BaselineStore,
) -> None:
    if ddtree_settings.measure_only:
        pytest.skip("--ddtree-measure-only: the lossless gate judges the output against a non-speculative reference, "
                    "and a measure-only session judges nothing; gate it in a session without --ddtree-measure-only")
    try:
        prompts = lossless.load_prompts()
    except (lossless.LosslessError, ValueError) as exc:
        pytest.fail(str(exc), pytrace=False)
    got = lossless.collect(ddtree_service.client, prompts)  # while the config under test runs
    exact = lossless.exact_reason(ddtree_service.server_info)
    golden_dir = ddtree_baselines.golden_read_dir()  # the older layout's folder until a bless writes this one
    create = lossless.golden_bless_command(
        ddtree_service.profile, ddtree_baselines.create_command(ddtree_config.name).replace("pytest suites", "pytest suites/test_lossless.py", 1),
        ddtree_service.server_info)

    if ddtree_lossless_source is not None:  # launched before the config's first test (the plugin)
        reference = ddtree_lossless_source
    else:
        try:
            reference = lossless.load_golden_reference(golden_dir, prompts, create)
        except lossless.LosslessError as exc:
            pytest.fail(str(exc), pytrace=False)
        if reference.missing and ddtree_settings.require_baselines:
            pytest.fail("golden transcripts missing or stale (--ddtree-require-baselines):\n" + "\n".join(reference.missing), pytrace=False)
        if not reference.transcripts:
            message = f"no usable golden transcripts in {golden_dir}; create them with: {create}\n" + "\n".join(reference.missing)
            if ddtree_settings.require_baselines:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)

    outcome = lossless.judge(reference, got, exact, lossless.deterministic_hint(ddtree_service.server_info))
    record: LosslessData = {
        "reference": reference.source, "floor": reference.floor.to_json(), "exact": exact,
        "max_new_tokens": lossless.MAX_NEW_TOKENS, **outcome.to_record(),
    }
    ddtree_recorder.record(RecordKind.LOSSLESS, ddtree_config.name, record)
    request.node.add_report_section("call", "ddtree lossless", outcome.message)
    assert outcome.passed, outcome.message
