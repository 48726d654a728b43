"""Resource limits of one run, and the speed factor that scales their seconds to this machine."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.  ``wall_s`` and ``cpu_s`` are *base* seconds: they are
    multiplied by :func:`speed_factor` (CPU seconds by :func:`cpu_speed_factor`) unless ``run_code(..., scale=False)``."""

    wall_s: float = 10.0
    cpu_s: float = 5.0
    memory_bytes: int = 512 * 1024 * 1024
    file_size_bytes: int = 16 * 1024 * 1024
    open_files: int = 64
    processes: int = 8
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    output_kill_bytes: int = 4 * 1024 * 1024  # total read before the run is killed as a flood
    tmp_size: str = "32m"  # size of each private tmpfs (work dir, /tmp; namespace tiers)
    result_bytes: int = 16 * 1024 * 1024  # results larger than this end the run as an error

    def scaled(self, factor: float, cpu_factor: float | None = None) -> Limits:
        """Wall seconds by ``factor``, CPU seconds by ``cpu_factor`` (``factor`` when not given)."""
        return replace(self, wall_s=self.wall_s * factor, cpu_s=self.cpu_s * (factor if cpu_factor is None else cpu_factor))


#: Seconds the calibration loop takes on the machine the default limits were tuned on.
_REFERENCE_CALIBRATION_S = 0.008
_speed_lock = threading.Lock()
_speed_cache: tuple[float, float] | None = None


def _calibration_loop() -> tuple[float, float]:
    """The loop's best wall seconds and best CPU seconds (this thread's) over three tries."""
    best_wall = best_cpu = float("inf")
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.thread_time()
        acc = 0
        for i in range(100_000):
            acc = (acc + i * i) % 1_000_003
        best_wall = min(best_wall, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.thread_time() - c0)
    return best_wall, best_cpu


def _factors() -> tuple[float, float]:
    global _speed_cache
    with _speed_lock:
        if _speed_cache is None:
            env = os.environ.get("DDTREE_SANDBOX_SPEED_FACTOR")
            if env:
                forced = max(0.05, float(env))
                _speed_cache = (forced, forced)
            else:
                wall, cpu = _calibration_loop()
                _speed_cache = (_bounded(wall / _REFERENCE_CALIBRATION_S), _bounded(cpu / _REFERENCE_CALIBRATION_S))
        return _speed_cache


def _bounded(factor: float) -> float:
    return min(20.0, max(1.0, factor))


def speed_factor() -> float:
    """How much slower this machine runs a loop than the reference one, by the clock (>= 1.0, <= 20.0).

    Timed once per process and cached: a slow or loaded machine gets proportionally longer
    wall-clock limits, so a correct but slow-ish solution does not flip to ``timeout``.  It never
    shrinks limits below the base.  ``DDTREE_SANDBOX_SPEED_FACTOR`` overrides it (and
    :func:`cpu_speed_factor`).
    """
    return _factors()[0]


def cpu_speed_factor() -> float:
    """The same loop's CPU seconds against the reference machine's (>= 1.0, <= 20.0): what the CPU
    limit scales by.  Other processes on the machine stretch the clock, not a run's CPU seconds, so a
    loaded machine must not hand a quadratic answer the CPU time a slow clock reading would give it
    (a linear scan meant to time out then passes its test)."""
    return _factors()[1]
