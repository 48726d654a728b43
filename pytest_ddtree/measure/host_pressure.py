"""How busy this host was while a cell was measured, from the kernel (no pytest import): the CPU
pressure the load generator differences over its measured loop (moved out of load.py, whose length
is bounded, and it reads the host, not the service)."""

from __future__ import annotations


#: Linux's pressure stall information for the CPU (kernel >= 4.20 with PSI): cumulative
#: microseconds in which at least one runnable task on this host waited for a CPU.
CPU_PRESSURE_PATH = "/proc/pressure/cpu"


def cpu_stall_seconds(path: str = CPU_PRESSURE_PATH) -> float | None:
    """Seconds so far in which some task on this host waited for a CPU (the ``some`` line's
    ``total``), or None where the kernel does not report it or the file is not as expected.

    Differenced over a measured loop, it says how busy the host was while the numbers were
    taken, from the kernel rather than from the service: a neighbour that delays every request's
    first token by a few milliseconds leaves the engine's clock and the client's concurrency
    intact, but not this. Read bounded, parsed strictly: a number or None."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["some"]:
            for item in fields[1:]:
                key, _, value = item.partition("=")
                if key == "total" and value.isdigit() and len(value) < 20:
                    return int(value) / 1e6
    return None


def stall_since(before: float | None) -> float | None:
    """CPU stall seconds since ``before`` (a cpu_stall_seconds reading); None without two readings."""
    after = cpu_stall_seconds()
    return after - before if before is not None and after is not None and after >= before else None


