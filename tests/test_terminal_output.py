"""What a user sees in the terminal of a gate run: reasons where pytest shows them, and progress.

Each test drives the real CLI (a pytester subprocess, or a pty for the live status line) against a
real reference engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.suite_helpers import REPO, reference_profile


def test_an_inconclusive_cell_says_why_in_the_short_summary_and_results_md(pytester: pytest.Pytester) -> None:
    """An inconclusive cell is a skip; its reason (what to do about it) is in pytest's short test
    summary without -rs, and results.md carries the same words."""
    # At 100000 simulated seconds per wall second no host keeps the engine's clock: every repeat is
    # spoiled, so the cell is inconclusive on any machine, at once.
    profile = reference_profile(pytester.path, clock_scale=100000)
    results = pytester.path / "results"
    run = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}", f"--ddtree-service={profile}",
        "--ddtree-workload=c1_short", f"--ddtree-results={results}", "-p", "no:cacheprovider", timeout=180)
    assert run.ret == 0, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["*short test summary info*",
                              "SKIPPED [[]1[]] *test_throughput.py:*: bs8_b8_k4 c1_short: INCONCLUSIVE: only 0 clean repeat(s)*",
                              "*1 skipped in*"])
    md = (results / "results.md").read_text()
    assert "**bs8_b8_k4 c1_short**: inconclusive: only 0 clean repeat(s) of the 3 needed" in md
    assert "rerun on a quieter machine" in md


def test_the_user_choice_of_summary_wins(pytester: pytest.Pytester) -> None:
    """-r chooses what the short summary lists; the plugin adds skip reasons only when it was not chosen."""
    pytester.makepyfile(test_x="import pytest\ndef test_s(ddtree_settings):\n    pytest.skip('because')\n")
    args = (f"--ddtree-matrix={REPO / 'suites' / 'configs.yaml'}", f"--ddtree-service={REPO / 'suites' / 'services' / 'reference.yaml'}",
            "-p", "no:cacheprovider")
    shown = pytester.runpytest_subprocess(*args)
    shown.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_x.py:3: because"])
    chosen = pytester.runpytest_subprocess(*args, "-rf")
    assert "SKIPPED" not in chosen.stdout.str()
