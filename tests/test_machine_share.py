"""Test runs sharing one machine: registration, liveness, turns (tests/machine_share.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests import machine_share
from tests.polling import wait_until

REPO = Path(__file__).resolve().parent.parent


def _other_run(runs_dir: Path) -> subprocess.Popen[str]:
    """Another test run: registers in runs_dir, says so, and lives until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from tests import machine_share
        machine_share.RUNS_DIR = Path({str(runs_dir)!r})
        machine_share.register_run()
        print("registered", flush=True)
        sys.stdin.read()
    """)
    env = {k: v for k, v in __import__("os").environ.items() if k != machine_share.RUN_ENV}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"
    return proc


def test_a_run_is_live_while_its_process_lives_and_its_file_goes_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_share, "RUNS_DIR", tmp_path)
    assert not machine_share.other_runs_live("me")
    other = _other_run(tmp_path)
    assert machine_share.other_runs_live("me")
    assert other.stdin is not None
    other.stdin.close()
    other.wait(timeout=30)
    assert not machine_share.other_runs_live("me")
    assert not list(tmp_path.glob("run-*.lock"))  # the dead run's registration was cleared


def test_timing_modules_take_turns_only_while_another_run_is_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_share, "RUNS_DIR", tmp_path)
    monkeypatch.setenv(machine_share.RUN_ENV, "me")
    inside = threading.Event()

    def second_module() -> None:
        with machine_share.measurement_turn():
            inside.set()

    # alone on the machine: two turns at once, nobody waits
    with machine_share.measurement_turn():
        worker = threading.Thread(target=second_module)
        worker.start()
        wait_until(inside.is_set, 30, "the second module to enter while the run is alone")
    worker.join(30)
    # another run is live: the second module waits for the first one's turn to end
    other = _other_run(tmp_path)
    inside.clear()
    with machine_share.measurement_turn():
        worker = threading.Thread(target=second_module)
        worker.start()
        worker.join(0.5)  # give it the chance to enter wrongly; it must still be waiting
        assert not inside.is_set()
    wait_until(inside.is_set, 30, "the second module to enter once the turn is free")
    worker.join(30)
    assert other.stdin is not None
    other.stdin.close()
    other.wait(timeout=30)
