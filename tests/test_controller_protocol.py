"""A new controller is one module plus its profile keys (service/protocol.py, service/kinds.py).

The controller of tests/controller_helpers.py lives outside the package and nothing in it knows
its name. Registered, it runs end to end through the unchanged manager (profile validation,
launch, readiness, the applied-config proof, a relaunch on a config switch, stop) and through
the plugin itself: a pytest session whose project plugin registers it runs the health suite on it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service import kinds
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.manager import Clients, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ProfileError, ServiceProfile, parse_profile
from pytest_ddtree.service.protocol import ControllerKind
from tests.controller_helpers import KIND, NAME, alive

REFERENCE = Path(__file__).resolve().parent.parent / "suites" / "services" / "reference.yaml"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def registered() -> Iterator[ControllerKind]:
    kinds.register(KIND)
    try:
        yield KIND
    finally:
        kinds.unregister(NAME)


def _raw(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(REFERENCE.read_text())
    raw.update({"controller": NAME, "pid_file": str(tmp_path / "engine.pid"), **overrides})
    return raw


def test_a_registered_controller_runs_the_reference_engine_end_to_end(tmp_path: Path, registered: ControllerKind) -> None:
    profile: ServiceProfile = parse_profile(_raw(tmp_path))
    assert profile.capabilities is registered.capabilities and profile.controller_keys == tmp_path / "engine.pid"
    manager = ServiceManager(profile, Placement(0, tmp_path / "logs", tmp_path / "locks"), pacing=Pacing(poll_interval=0.1),
                             clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    pids: list[int] = []
    try:
        first = manager.ensure(parse_config_name("bs8_b8_k4"))
        assert first.proof is not None and not first.proof.failures, first.proof
        assert first.server_info["speculative_num_draft_tokens"] == 8
        out = first.client.generate(text="the controller protocol", sampling_params={"max_new_tokens": 8, "temperature": 0.0})
        assert out["meta_info"]["completion_tokens"] == 8, out
        pids.append(int((tmp_path / "engine.pid").read_text()))
        second = manager.ensure(parse_config_name("bs8_b12_k6"))  # a config switch: stop, relaunch
        pids.append(int((tmp_path / "engine.pid").read_text()))
        assert second.server_info["speculative_num_draft_tokens"] == 12
        assert pids[0] != pids[1] and not alive(pids[0])
        assert [launch["controller"] for launch in manager.launches] == [NAME, NAME]
        assert manager.config_launches == 2 and all(launch["outcome"] == "ready" for launch in manager.launches)
        assert first.log_path is not None and first.log_path.parent == tmp_path / "logs"
    finally:
        problems = manager.close()
    assert problems == [] and not alive(pids[-1])


def test_a_registered_controller_owns_its_profile_keys(tmp_path: Path, registered: ControllerKind) -> None:
    with pytest.raises(ProfileError, match="pid_file: the pidfile controller needs the file"):
        parse_profile(_raw(tmp_path, pid_file=""))
    process = {**_raw(tmp_path), "controller": "process"}
    with pytest.raises(ProfileError, match=r"pid_file: pid files belong to controller: pidfile \(this profile's controller is process\)"):
        parse_profile(process)
    with pytest.raises(ValueError, match="registered already"):
        kinds.register(dataclasses.replace(KIND))


def test_an_unregistered_controller_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"controller: must be one of process, systemd, external, command, slurm, got 'pidfile'"):
        parse_profile({key: value for key, value in _raw(tmp_path).items() if key != "pid_file"})


def test_a_pytest_session_runs_the_health_suite_on_a_controller_a_project_plugin_registers(pytester: pytest.Pytester) -> None:
    """The plugin's whole path (session, fixtures, finish, the package's records) on a controller
    nobody in the package knows: a plugin of the project (``-p``) registers it before the profile
    is read, as a project's own controller would be."""
    from tests.suite_helpers import reference_profile, run_suite

    pytester.makepyfile(pidfile_plugin=f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                                       "from pytest_ddtree.service import kinds\nfrom tests.controller_helpers import KIND\n"
                                       "kinds.register(KIND)\n")
    pid_file = pytester.path / "engine.pid"
    profile = reference_profile(pytester.path, controller=NAME, pid_file=str(pid_file))
    result = run_suite(pytester, profile, "-p", "pidfile_plugin", suite="test_health.py", config="bs8_b8_k4", timeout=120)
    out = result.stdout.str()
    assert result.ret == 0, out
    result.assert_outcomes(passed=3)
    assert f"controller {NAME}" in out, out  # the session's header names the profile's controller
    assert not alive(int(pid_file.read_text())), "the session stopped the engine it launched"


def _installed_distribution(site: Path, entry_point: str) -> None:
    """A distribution ``ddtree-pidfile`` as pip would leave it: its ``.dist-info`` (METADATA and
    entry_points.txt) in ``site``, which the session gets on its path (importlib.metadata finds it)."""
    info = site / "ddtree_pidfile-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddtree-pidfile\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[pytest_ddtree.controllers]\n{entry_point}\n")


def test_a_pytest_session_runs_the_health_suite_on_a_controller_an_installed_distribution_declares(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``-p``, no conftest: the distribution's entry point (group ``pytest_ddtree.controllers``)
    is all that makes ``controller: pidfile`` valid."""
    from tests.suite_helpers import reference_profile, run_suite

    _installed_distribution(pytester.path / "site", f"{NAME} = tests.controller_helpers:KIND")
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path / 'site'}:{REPO}")
    pid_file = pytester.path / "engine.pid"
    profile = reference_profile(pytester.path, controller=NAME, pid_file=str(pid_file))
    result = run_suite(pytester, profile, suite="test_health.py", config="bs8_b8_k4", timeout=120)
    out = result.stdout.str()
    assert result.ret == 0, out
    result.assert_outcomes(passed=3)
    assert f"controller {NAME}" in out, out
    assert not alive(int(pid_file.read_text())), "the session stopped the engine it launched"


def test_a_distribution_whose_controller_cannot_be_loaded_is_a_usage_error_naming_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.suite_helpers import reference_profile, run_suite

    _installed_distribution(pytester.path / "site", f"{NAME} = tests.no_such_module:KIND")
    monkeypatch.setenv("PYTHONPATH", f"{pytester.path / 'site'}:{REPO}")
    result = run_suite(pytester, reference_profile(pytester.path), suite="test_health.py", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*controller kind entry point '{NAME} = tests.no_such_module:KIND' of distribution "
                                 "ddtree-pidfile 1.0 (group pytest_ddtree.controllers) could not be loaded: "
                                 "ModuleNotFoundError*pip uninstall ddtree-pidfile*"])


def test_an_entry_point_named_other_than_its_kind_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In process: the registry reads the group at its first question, and keeps the error."""
    _installed_distribution(tmp_path, "k8s = tests.controller_helpers:KIND")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kinds, "_loaded", False)
    monkeypatch.setattr(kinds, "_load_error", None)
    for _ in range(2):  # the second question gets the same answer, not a registry without the kind
        with pytest.raises(kinds.ControllerLoadError, match=r"entry point 'k8s = tests.controller_helpers:KIND' of "
                                                            r"distribution ddtree-pidfile 1.0 .*its kind is named 'pidfile'"):
            kinds.names()
    assert NAME not in kinds._KINDS
