"""Service lifecycle against the real reference engine (``python -m pytest_ddtree.refserver``).

The same properties as tests/test_service.py (which uses a stand-in server), proven on the engine
the suites actually run: its fault modes are the ones the issue names.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.base import AppliedConfigMismatch, ServiceDiedError, ServiceStartError
from pytest_ddtree.service.manager import Clients, Hooks, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ServiceProfile
from tests.polling import wait_until
from tests.refserver_helpers import BS8_B8_K4, managers, ref_profile  # noqa: F401 (fixtures)

BS8_B4_K4 = parse_config_name("bs8_b4_k4_wnone")


def manager(profile: ServiceProfile, tmp_path: Path, made: list[ServiceManager], lines: list[str] | None = None,
            ready_timeout_s: float | None = None) -> ServiceManager:
    m = ServiceManager(
        profile, Placement(0, tmp_path / "logs", tmp_path / "locks"),
        pacing=Pacing(ready_timeout_s, poll_interval=0.1, progress_interval=0.5),
        hooks=Hooks(lines.append if lines is not None else None),
        clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)),
    )
    made.append(m)
    return m


def test_refserver_crash_on_start_ends_the_wait(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--fault crash-on-start"), tmp_path, managers)
    with pytest.raises(ServiceStartError) as info:
        m.ensure(BS8_B8_K4)
    # the exit ended the wait, not the readiness deadline (whose error says "not ready after")
    assert "exited while starting" in str(info.value) and "not ready after" not in str(info.value), str(info.value)
    assert info.value.exit_code not in (None, 0)
    assert "crash-on-start" in info.value.log_tail or "Traceback" in info.value.log_tail


def test_refserver_slow_start_past_deadline(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--load-seconds 30"), tmp_path, managers, ready_timeout_s=2)
    with pytest.raises(ServiceStartError, match="not ready after 2 s") as info:
        m.ensure(BS8_B8_K4)
    assert info.value.log_tail.strip() and "<" not in info.value.log_tail[:1]


def test_refserver_3s_load_tolerated(tmp_path: Path, managers: list[ServiceManager]) -> None:
    lines: list[str] = []
    m = manager(ref_profile("--load-seconds 3"), tmp_path, managers, lines)
    svc = m.ensure(BS8_B8_K4)
    assert svc.server_info["speculative_eagle_topk"] == 4
    assert any("elapsed, last: connection refused" in line for line in lines), lines  # it waited out the load


def test_refserver_ignore_config_topk(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--fault ignore-config=topk"), tmp_path, managers)
    with pytest.raises(AppliedConfigMismatch) as info:
        m.ensure(BS8_B8_K4)
    assert [(d.key, d.expected, d.actual) for d in info.value.diffs] == [("speculative_eagle_topk", 4, 1)]


def test_refserver_exit_after_n_then_next_config(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--fault exit-after=1", copy_probe=False), tmp_path, managers)  # it counts requests
    svc = m.ensure(BS8_B8_K4)
    svc.client.generate("def add(a, b):", sampling_params={"max_new_tokens": 4, "temperature": 0})

    def died() -> ServiceDiedError | None:
        try:
            m.ensure(BS8_B8_K4)
        except ServiceDiedError as err:
            return err
        return None

    err = wait_until(died, 5, "the service to exit after 1 request", interval=0.1)
    assert err.exit_code not in (None, 0) and "exit-after" in str(err)
    with pytest.raises(ServiceDiedError):
        m.ensure(BS8_B8_K4)
    svc2 = m.ensure(BS8_B4_K4)
    assert svc2.server_info["speculative_num_draft_tokens"] == 4


def test_refserver_reference_launch_takes_the_slot(tmp_path: Path, managers: list[ServiceManager]) -> None:
    """The non-speculative reference runs in the instance's own slot: lock and GPU wait like any
    launch, the config stopped first and restarted after it."""
    m = manager(ref_profile(), tmp_path, managers)
    m.ensure(BS8_B8_K4)
    ref = m.ensure_reference()
    assert ref.config is None and ref.server_info["speculative_algorithm"] is None  # as SGLang reports a plain server
    assert m.ensure_reference() is ref  # kept while it runs
    first = m.launches[0]["pid"]
    assert first is not None and not _alive(first)  # never two copies of the model at once
    again = m.ensure(BS8_B8_K4)
    second = m.launches[1]["pid"]
    assert again.server_info["speculative_eagle_topk"] == 4 and second is not None and not _alive(second)
    assert [r["config"] for r in m.launches] == ["bs8_b8_k4", "lossless-reference", "bs8_b8_k4"]
    assert "--speculative" not in (m.launches[1]["command"] or "")  # the command without config_args


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_reference_sessions_on_one_machine_do_not_take_turns(pytester: pytest.Pytester) -> None:
    """The embedded engine shares nothing between sessions (``instance_lock: false``): a session
    runs while another holds the instance lock. A copy of the profile without the key takes it."""
    from pytest_ddtree.service.pool import InstanceLock
    from tests.suite_helpers import reference_profile, run_suite

    locks = pytester.path / ".ddtree" / "locks"
    other_session = InstanceLock(locks, "reference-0")
    other_session.acquire(timeout_s=5)
    try:
        shipped = reference_profile(pytester.path, filename="reference.yaml")
        run_suite(pytester, shipped, "--rootdir", str(pytester.path), suite="test_health.py").assert_outcomes(passed=3)
    finally:
        other_session.release()
    locking = reference_profile(pytester.path, filename="locking.yaml", instance_lock=True, name="locking")
    assert not (locks / "locking-0.lock").exists()
    run_suite(pytester, locking, "--rootdir", str(pytester.path), suite="test_health.py").assert_outcomes(passed=3)
    assert (locks / "locking-0.lock").exists()
