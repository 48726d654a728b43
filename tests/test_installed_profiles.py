"""Profiles and dialects an installed distribution declares (entry point group
``pytest_ddtree.profiles``): ``--ddtree-service NAME`` finds the profile, and the reference engine
the dialect beside it, with no path given anywhere."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_ddtree.service import installed
from pytest_ddtree.options import OptionError
from tests.build_helpers import NEW_DIALECT, NEW_PROFILE, as_refserver, check_ran_as_named
from tests.suite_helpers import REPO, run_suite


def _distribution(site: Path, *entry_points: str) -> Path:
    """A distribution ``ddtree-mybuilds`` as pip would leave it: its package ``mybuilds`` (a folder of
    profiles and a dialects.yaml) and its ``.dist-info`` with the entry points, in ``site``."""
    info = site / "ddtree_mybuilds-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddtree-mybuilds\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pytest_ddtree.profiles]\n" + "\n".join(entry_points) + "\n")
    package = site / "mybuilds"
    package.mkdir()
    (package / "__init__.py").write_text("from pathlib import Path\n\nOTHER = Path(__file__).parent / 'other' / 'plain.yaml'\n")
    return package


def test_a_session_gates_a_build_an_installed_distribution_declares(pytester: pytest.Pytester,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No path, no -p, no --dialects: ``--ddtree-service sglang-mytree`` is the installed folder's
    profile, and the engine it launches finds the folder's dialect ``mytree``."""
    package = _distribution(pytester.path / "site", "mybuilds = mybuilds")
    draft = pytester.path / "draft"
    draft.mkdir()
    (draft / "sglang-mytree.yaml").write_text(NEW_PROFILE)
    engine_profile = as_refserver(draft / "sglang-mytree.yaml", draft)  # no dialects.yaml beside it: no --dialects
    assert "--dialects" not in engine_profile.read_text()
    (package / "sglang-mytree.yaml").write_text(engine_profile.read_text())
    (package / "dialects.yaml").write_text(NEW_DIALECT)
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path / 'site'}:{REPO}")
    result = run_suite(pytester, Path("sglang-mytree"), suite="test_health.py", config="bs8_b4_k4", timeout=300)
    check_ran_as_named(pytester, result, package / "sglang-mytree.yaml", ["bs8_b4_k4"])
    assert "service profile sglang-mytree" in result.stdout.str()
    logs = "\n".join(p.read_text() for p in (pytester.path / "results" / "logs").glob("*.log"))
    assert "starting (dialect mytree)" in logs and "Initialized DDTREE v2 worker. block_size=8, tree_budget=4," in logs


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution on this process's path, the registry read afresh."""
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for module in [m for m in sys.modules if m.split(".")[0] == "mybuilds"]:  # another test's package
        monkeypatch.delitem(sys.modules, module)
    installed.installed.cache_clear()
    yield tmp_path / "site"
    installed.installed.cache_clear()


def test_a_profile_by_name_and_a_folder_of_profiles(site: Path) -> None:
    package = _distribution(site, "mybuilds = mybuilds", "plain-by-name = mybuilds:OTHER")
    (package / "sglang-mytree.yaml").write_text(NEW_PROFILE)
    (package / "dialects.yaml").write_text(NEW_DIALECT)
    (package / "other").mkdir()
    (package / "other" / "plain.yaml").write_text(NEW_PROFILE)
    assert installed.profile_path("sglang-mytree") == package / "sglang-mytree.yaml"
    assert installed.profile_path("plain-by-name") == package / "other" / "plain.yaml"
    assert installed.installed().dialect_files == (package / "dialects.yaml",)
    from pytest_ddtree.refserver.dialects import load
    assert "mytree" in load()  # the engine reads the installed folder's dialects with the shipped ones


def test_a_name_that_is_no_file_and_no_installed_profile_is_a_usage_error(site: Path, tmp_path: Path) -> None:
    from pytest_ddtree.options import installed_service

    package = _distribution(site, "mybuilds = mybuilds")
    (package / "sglang-mytree.yaml").write_text(NEW_PROFILE)
    with pytest.raises(OptionError, match=r"--ddtree-service sglang-mytre: no profile file or installed profile "
                                          r"'sglang-mytre'; did you mean 'sglang-mytree'\?"):
        installed_service("sglang-mytre", tmp_path)
    assert installed_service("sglang-mytree", tmp_path) == package / "sglang-mytree.yaml"
    (tmp_path / "sglang-mytree").write_text("a file of that name wins")
    assert installed_service("sglang-mytree", tmp_path) == tmp_path / "sglang-mytree"


def test_an_entry_point_that_cannot_be_loaded_names_its_distribution(site: Path) -> None:
    _distribution(site, "broken = mybuilds.no_such_module")
    with pytest.raises(installed.InstalledProfileError, match=r"entry point 'broken = mybuilds.no_such_module' of "
                                                              r"distribution ddtree-mybuilds 1.0 .*pip uninstall ddtree-mybuilds"):
        installed.profile_path("anything")
