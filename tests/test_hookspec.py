"""The ``pytest_ddtree_*`` hooks a project implements (pytest_ddtree/hookspec.py), through pytester."""

from __future__ import annotations

import pytest

from tests.suite_helpers import reference_profile, run_suite


def test_a_conftest_names_the_hardware_profile_and_the_baselines_are_filed_under_it(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "def pytest_ddtree_hardware_profile(config, fingerprint):\n"
        "    assert fingerprint.name == 'refserver', fingerprint  # what the harness would have used\n"
        "    assert fingerprint.build['engine_version'].startswith('refserver')\n"
        "    return 'rack 7/' + config.getoption('ddtree_config')[0]  # made safe as a folder name\n"
    )
    pytester.makepyfile(test_named="def test_store(ddtree_baselines):\n"
                                   "    assert ddtree_baselines.hardware_profile == 'rack-7-bs8_b8_k4'\n")
    result = run_suite(pytester, reference_profile(pytester.path))
    result.assert_outcomes(passed=1)


def test_an_implementation_with_an_argument_the_hook_lacks_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("def pytest_ddtree_hardware_profile(config, fingerprint, rack):\n    return None\n")
    pytester.makepyfile(test_named="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*pytest_ddtree_hardware_profile*rack*"])
