"""How test runs that share one machine keep each other out of their measurements.

Timing-sensitive tests measure an engine that stands for an accelerator, and a real service does
not share its accelerator with the next test run on the box. Two answers, both here:

* **priority**: those tests (and the engines and nested sessions they start, which inherit it)
  run at a moderately raised CPU priority (``RAISED_NICE``), so the rest of the suite yields
  more of the CPU to the measurement, without being starved. Needs
  CAP_SYS_NICE (root in CI); elsewhere nothing changes.
* **turns**: every test run registers itself (a file under ``RUNS_DIR`` it holds an ``flock``
  on for its lifetime, so a crashed run leaves nothing live); while another run is live, the
  timing-sensitive modules of all runs take turns on one machine-wide lock. A run alone on the
  box (CI) never waits, so its wall time is unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

RUNS_DIR = Path(tempfile.gettempdir()) / "pytest-ddtree-test-runs"
RUN_ENV = "DDTREE_TEST_RUN_ID"
#: nice value of timing-sensitive tests; 0 is the default, -20 the highest. Each step is about
#: 1.25x the CPU weight: -5 gives a measuring thread 3x the weight of another test's. At -10 (9x)
#: the measuring module of one run starved the other run's tests that wait on a deadline (a SIGINT
#: test's 10 s, a fleet sweep's 180 s): two runs side by side failed those instead.
RAISED_NICE = -5

_registration: IO[str] | None = None


def register_run() -> str:
    """Mark this test run live (the main process; xdist workers inherit the id)."""
    global _registration
    run_id = os.environ.get(RUN_ENV) or f"{os.getpid()}"
    os.environ[RUN_ENV] = run_id
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    if _registration is None:
        _registration = open(RUNS_DIR / f"run-{run_id}.lock", "w")
        fcntl.flock(_registration, fcntl.LOCK_EX)
    return run_id


def other_runs_live(own: str | None) -> bool:
    """Is another test run holding its registration? Stale files (their run died) are removed."""
    live = False
    for path in RUNS_DIR.glob("run-*.lock"):
        if path.name == f"run-{own}.lock":
            continue
        try:
            with open(path) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    live = True
                    continue
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            continue
    return live


@contextlib.contextmanager
def measurement_turn() -> Iterator[None]:
    """Take the machine's measurement turn when another run is live, and raise CPU priority."""
    with contextlib.ExitStack() as stack:
        if other_runs_live(os.environ.get(RUN_ENV)):
            RUNS_DIR.mkdir(parents=True, exist_ok=True)
            turn = stack.enter_context(open(RUNS_DIR / "measurement-turn.lock", "w"))
            fcntl.flock(turn, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        try:
            before = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, 0, RAISED_NICE)
            stack.callback(os.setpriority, os.PRIO_PROCESS, 0, before)
        except OSError:
            pass  # no CAP_SYS_NICE: the default priority
        yield
