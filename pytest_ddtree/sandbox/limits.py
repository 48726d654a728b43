"""Resource limits of one run, and the speed factor that scales their seconds to this machine."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run.  ``wall_s`` and ``cpu_s`` are *base* seconds: they are
    multiplied by :func:`speed_factor` unless ``run_code(..., scale=False)``."""

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

    def scaled(self, factor: float) -> Limits:
        return replace(self, wall_s=self.wall_s * factor, cpu_s=self.cpu_s * factor)


#: Seconds the calibration loop takes on the machine the default limits were tuned on.
_REFERENCE_CALIBRATION_S = 0.008
_speed_lock = threading.Lock()
_speed_cache: float | None = None


def _calibration_loop() -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        acc = 0
        for i in range(100_000):
            acc = (acc + i * i) % 1_000_003
        best = min(best, time.perf_counter() - t0)
    return best


def speed_factor() -> float:
    """How much slower this machine is than the reference one (>= 1.0, <= 20.0).

    Timed once per process and cached: a slow or loaded machine gets proportionally longer
    time limits, so a correct but slow-ish solution does not flip to ``timeout``.  It never
    shrinks limits below the base.  ``DDTREE_SANDBOX_SPEED_FACTOR`` overrides it.
    """
    global _speed_cache
    with _speed_lock:
        if _speed_cache is None:
            env = os.environ.get("DDTREE_SANDBOX_SPEED_FACTOR")
            if env:
                _speed_cache = max(0.05, float(env))
            else:
                _speed_cache = min(20.0, max(1.0, _calibration_loop() / _REFERENCE_CALIBRATION_S))
        return _speed_cache
