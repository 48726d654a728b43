"""The adaptive sweep in the plugin (--ddtree-max-restarts, --ddtree-prior): usage errors first.

Every bad use is refused before any service starts, with exit 4 and a message saying what to do:
the sweep is serial (it needs each config's results before it picks the next), so ``-n`` is
refused; the restart limit must be a positive count; a prior folder must exist and hold results.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from suite_helpers import MATRIX, REFERENCE_PROFILE


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    pass\n")
    return pytester.runpytest_subprocess(
        f"--ddtree-matrix={MATRIX}", f"--ddtree-service={REFERENCE_PROFILE}",
        f"--ddtree-results={pytester.path / 'results'}", "--ddtree-config=all", "-p", "no:cacheprovider", *args,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ddtree-max-restarts", "3", "-n", "2"], "*--ddtree-max-restarts runs serially*Run without -n*"),
        (["--ddtree-max-restarts", "0"], "*--ddtree-max-restarts must be at least 1*got 0*"),
        (["--ddtree-max-restarts", "3", "--ddtree-prior", "no/such/dir"], "*--ddtree-prior: no such results folder*no/such/dir*"),
        (["--ddtree-prior", "."], "*--ddtree-prior only informs the adaptive sweep: add --ddtree-max-restarts N*"),
        (["--ddtree-max-restarts", "3", "--ddtree-prior", "."], "*--ddtree-prior *: no results.json in it*"),
    ],
    ids=["xdist", "zero", "missing-prior", "prior-without-limit", "prior-without-results"],
)
def test_bad_adaptive_use_is_a_usage_error_before_anything_starts(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    result = _run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines([message])
    assert not (pytester.path / "results" / "records-main.jsonl").exists()


def test_without_numpy_and_scipy_the_error_names_the_extra(pytester: pytest.Pytester) -> None:
    # The conftest loads before the plugin's configure hook: importing scipy then fails as if
    # the optional extra were not installed.
    pytester.makeconftest("import sys\nsys.modules['scipy'] = None\n")
    result = _run(pytester, "--ddtree-max-restarts", "3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "the adaptive sweep needs numpy and scipy: pip install 'pytest-ddtree[advisor]'" in result.stderr.str()


def test_a_prior_folder_may_be_a_results_root_of_session_folders(tmp_path: Path) -> None:
    from pytest_ddtree.adaptive import PriorError, check_prior_dirs

    (tmp_path / "20260101T000000Z-abc").mkdir()
    with pytest.raises(PriorError, match="no results.json"):
        check_prior_dirs([tmp_path])
    (tmp_path / "20260101T000000Z-abc" / "results.json").write_text("{}")
    check_prior_dirs([tmp_path])
