"""The shipped CPU calibration probe: ``python -m pytest_ddtree.measure.calibration`` (no pytest import).

A profile's ``calibration_command`` measures the machine's day, not the build under test
(``service/calibration.py`` runs it and reads its answer). This one is a fixed single-thread
workload (SHA-256 over a fixed buffer, a sort of fixed pseudo-random keys), the median of several
timed rounds, printed as one JSON line of figures, higher = faster. The GPU probe is
``suites/services/calibrate_gpu.py``. Run it with an interpreter of its own (a pinned venv), not
the build's: a probe that moves with the build cancels the very step the history looks for.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from typing import Sequence

# -- the shipped CPU probe -----------------------------------------------------------------------------

#: The fixed work of one round: what a figure is a rate of (change it and the history's calibration
#: level starts over: name a new figure).
HASH_BLOCK_BYTES = 1 << 20
HASH_BLOCKS = 48
SORT_KEYS = 200_000
ROUNDS = 5


def _hash_round(block: bytes) -> float:
    begin = time.perf_counter()
    digest = b""
    for _ in range(HASH_BLOCKS):
        digest = hashlib.sha256(block + digest).digest()
    return time.perf_counter() - begin


def _sort_round(keys: Sequence[float]) -> float:
    begin = time.perf_counter()
    sorted(keys)
    return time.perf_counter() - begin


def cpu_probe(rounds: int = ROUNDS) -> dict[str, float]:
    """The CPU figures: MiB/s of SHA-256 and keys/s of a sort, each the median of ``rounds``
    timed rounds of a fixed workload on one thread (the median: one round that the host's
    scheduler interrupted is not the day)."""
    block = bytes(random.Random(7).getrandbits(8) for _ in range(4096)) * (HASH_BLOCK_BYTES // 4096)
    rng = random.Random(11)
    keys = [rng.random() for _ in range(SORT_KEYS)]
    _hash_round(block)  # one untimed round each: the first pays for caches and the allocator
    _sort_round(keys)
    hash_s = statistics.median(_hash_round(block) for _ in range(rounds))
    sort_s = statistics.median(_sort_round(keys) for _ in range(rounds))
    return {"cpu_sha256_mib_per_s": HASH_BLOCKS * HASH_BLOCK_BYTES / (1 << 20) / hash_s,
            "cpu_sort_keys_per_s": SORT_KEYS / sort_s}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_ddtree.measure.calibration", description=(
        "The calibration probe for a service profile's calibration_command: a fixed single-thread CPU "
        "workload; prints one JSON line of figures (higher = faster)."))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed rounds, the median kept (default {ROUNDS})")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 101:
        parser.error("--rounds must be 1 to 101")
    print(json.dumps(cpu_probe(args.rounds), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
