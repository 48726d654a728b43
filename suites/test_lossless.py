"""Lossless gate: greedy output under speculation equals the non-speculative output.

For every bundled prompt (the coding prompts and ``suites/coding/lossless_prompts.yaml``) the
config under test generates ``pytest_ddtree.lossless.MAX_NEW_TOKENS`` tokens at temperature 0
through ``/generate``; the token ids must equal the reference's. The reference comes from the
profile: ``lossless: instance`` starts a non-speculative instance (``lossless_args``),
``lossless: golden`` reads ``baselines/<hardware>/golden/`` (written by
``--ddtree-update-baselines``). A mismatch shows the first diverging token and both
continuations.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_ddtree import lossless
from pytest_ddtree.configs import DDTreeConfig


def test_lossless_gate(
    request: pytest.FixtureRequest,
    ddtree_config: DDTreeConfig,
    ddtree_service: Any,
    ddtree_profile: Any,
    ddtree_settings: Any,
    ddtree_recorder: Any,
    ddtree_baselines: Any,
) -> None:
    try:
        prompts = lossless.load_prompts()
    except (lossless.LosslessError, ValueError) as exc:
        pytest.fail(str(exc), pytrace=False)
    got = lossless.collect(ddtree_service.client, prompts)
    golden_dir = ddtree_baselines.golden_dir()
    create = ddtree_baselines.create_command(ddtree_config.name).replace("pytest suites", "pytest suites/test_lossless.py", 1)

    if ddtree_profile.lossless == "instance":
        reference_service = request.getfixturevalue("ddtree_reference_service")
        reference = lossless.collect_cached(reference_service.url, reference_service.client, prompts)
        missing: list[str] = []
        source = f"non-speculative instance ({ddtree_profile.lossless_args})"
    else:
        if ddtree_baselines.update_mode:
            written = lossless.write_golden(golden_dir, got)
            ddtree_recorder.record("lossless", ddtree_config.name, {"golden_written": [str(p) for p in written]})
            failed = [f"{t.prompt_id}: {t.error}" for t in got.values() if t.error]
            if failed:
                pytest.fail("golden transcripts not written for: " + "; ".join(failed), pytrace=False)
            return
        try:
            reference, missing = lossless.load_golden(golden_dir, prompts, create)
        except lossless.LosslessError as exc:
            pytest.fail(str(exc), pytrace=False)
        source = f"golden transcripts in {golden_dir}"
        if missing and ddtree_settings.require_baselines:
            pytest.fail("golden transcripts missing or stale (--ddtree-require-baselines):\n" + "\n".join(missing), pytrace=False)
        if not reference:
            message = f"no usable golden transcripts in {golden_dir}; create them with: {create}"
            if ddtree_settings.require_baselines:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)

    outcome = lossless.compare_all(reference, got, missing)
    ddtree_recorder.record("lossless", ddtree_config.name, {"reference": source, "max_new_tokens": lossless.MAX_NEW_TOKENS, **outcome.to_record()})
    request.node.add_report_section("call", "ddtree lossless", f"reference: {source}\n{outcome.message}")
    assert outcome.passed, f"reference: {source}\n{outcome.message}"
