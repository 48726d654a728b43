"""NVIDIA GPU facts through NVML (nvidia-ml-py), degrading quietly where there is no GPU.

Three users need the same facts: the restart (wait until the old server's GPU memory is really
released, or the new one OOMs at load), the readiness progress line (memory loaded so far shows a
slow start is alive), and the hardware fingerprint / environment snapshot. None of them may crash
on a laptop or CI box without a GPU, so every entry point here returns "no GPU" instead of raising.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence
from contextlib import contextmanager

_NVML_LOCK = threading.Lock()


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int


@dataclass(frozen=True)
class GpuInventory:
    """What NVML reports; ``gpus`` is empty and ``error`` says why when there is no usable GPU."""

    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)
    error: str | None = None

    @property
    def count(self) -> int:
        return len(self.gpus)

    def summary(self) -> str:
        if not self.gpus:
            return f"no NVIDIA GPU ({self.error})" if self.error else "no NVIDIA GPU"
        names = sorted({g.name for g in self.gpus})
        total = sum(g.memory_total_bytes for g in self.gpus) / 2**30
        return (
            f"{self.count}x {'/'.join(names)} ({total:.0f} GiB), driver {self.driver_version}, "
            f"CUDA driver {self.cuda_driver_version}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "nvml_version": self.nvml_version,
            "count": self.count,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "memory_total_bytes": g.memory_total_bytes,
                    "memory_used_bytes": g.memory_used_bytes,
                }
                for g in self.gpus
            ],
            "error": self.error,
        }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextmanager
def _nvml() -> Iterator[Any]:
    """Init/shutdown NVML around one query; NVML is process-global, so serialize access."""
    import pynvml  # nvidia-ml-py; importable everywhere, fails at nvmlInit without a driver

    with _NVML_LOCK:
        pynvml.nvmlInit()
        try:
            yield pynvml
        finally:
            try:
                pynvml.nvmlShutdown()
            except Exception:  # pragma: no cover - shutdown errors are irrelevant to the caller
                pass


def gpu_inventory() -> GpuInventory:
    """Driver, CUDA driver version and every GPU; never raises."""
    try:
        with _nvml() as nvml:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = nvml.nvmlSystemGetCudaDriverVersion_v2() if hasattr(nvml, "nvmlSystemGetCudaDriverVersion_v2") else nvml.nvmlSystemGetCudaDriverVersion()
            cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
            try:
                nvml_version: str | None = _text(nvml.nvmlSystemGetNVMLVersion())
            except Exception:
                nvml_version = None
            gpus = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                gpus.append(
                    GpuInfo(
                        index=index,
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                        memory_total_bytes=int(memory.total),
                        memory_used_bytes=int(memory.used),
                    )
                )
            return GpuInventory(driver, cuda_text, nvml_version, tuple(gpus), None if gpus else "NVML found no devices")
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return GpuInventory(error=f"{type(exc).__name__}: {exc}".strip())


def gpu_memory_used_bytes() -> int | None:
    """Memory in use summed over all GPUs, or None when NVML sees no GPU."""
    inventory = gpu_inventory()
    if not inventory.gpus:
        return None
    return sum(g.memory_used_bytes for g in inventory.gpus)


def wait_for_gpu_memory_release(
    threshold_bytes: int | None,
    timeout_s: float,
    progress: Callable[[str], None] | None = None,
    poll_interval_s: float = 1.0,
    read_used: Callable[[], int | None] = gpu_memory_used_bytes,
) -> bool:
    """Wait until GPU memory in use, summed over all GPUs, drops to ``threshold_bytes``.

    A stopped server's memory is freed by the driver some seconds after the process is gone;
    starting the next one earlier makes it OOM during weight loading, which reads like a bad
    config. ``threshold_bytes=None`` means "what is left is driver overhead": at most 1 GiB per
    GPU in use. Returns True when released (or when there is no GPU: nothing to wait for),
    False on timeout, so the caller decides whether a dirty GPU is fatal.
    """
    used = read_used()
    if used is None:
        return True
    if threshold_bytes is None:
        count = max(gpu_inventory().count, 1)
        threshold_bytes = count * 2**30
    deadline = time.monotonic() + timeout_s
    start = time.monotonic()
    last_report = start
    while used is not None and used > threshold_bytes:
        now = time.monotonic()
        if now >= deadline:
            if progress:
                progress(f"GPU memory still in use after {timeout_s:.0f}s: {used / 2**30:.1f} GiB (threshold {threshold_bytes / 2**30:.1f} GiB)")
            return False
        if progress and now - last_report >= 10:
            progress(f"waiting for GPU memory release: {used / 2**30:.1f} GiB in use, {now - start:.0f}s elapsed")
            last_report = now
        time.sleep(poll_interval_s)
        used = read_used()
    return True


# -- a host's GPUs through nvidia-smi (remote hosts have no NVML in this process) ---------------
SMI_MEMORY_QUERY = ("nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv")
SMI_INVENTORY_QUERY = ("nvidia-smi", "--query-gpu=index,name,uuid,memory.used,memory.total,driver_version", "--format=csv,noheader,nounits")
_MIB = 2**20


def _mib(text: str) -> int:
    """``"81559 MiB"`` or ``"81559"`` -> bytes."""
    return int(float(text.strip().split()[0]) * _MIB)


def parse_smi_memory(text: str) -> list[tuple[int, int]]:
    """(used, total) bytes per GPU from ``nvidia-smi --query-gpu=memory.used,memory.total --format=csv``."""
    rows = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 2 or not cells[0][:1].isdigit():
            continue  # the header line
        rows.append((_mib(cells[0]), _mib(cells[1])))
    return rows


class _Runs(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None) -> Any: ...


class HostGpus:
    """GPU memory and inventory of a (remote) host via ``nvidia-smi``; "no GPU" instead of errors.

    Memory polling feeds the same release wait and progress line as NVML does locally. A host
    without nvidia-smi (exit 127) or without GPUs has None, like a laptop here. ssh failures are
    not swallowed: a dead host must fail its config, not look like a host without GPUs.
    """

    def __init__(self, host: _Runs) -> None:
        self.host = host

    def memory(self) -> list[tuple[int, int]] | None:
        result = self.host.run(list(SMI_MEMORY_QUERY))
        if result.returncode != 0:
            return None
        rows = parse_smi_memory(result.stdout)
        return rows or None

    def memory_used_bytes(self) -> int | None:
        rows = self.memory()
        return None if rows is None else sum(used for used, _ in rows)

    def wait_release(self, threshold_bytes: int | None, timeout_s: float, progress: Callable[[str], None] | None) -> bool:
        """:func:`wait_for_gpu_memory_release` on the host; ``None``: driver overhead (1 GiB a GPU)."""
        rows = self.memory()
        if rows is None:
            return True
        if threshold_bytes is None:
            threshold_bytes = len(rows) * 2**30
        return wait_for_gpu_memory_release(threshold_bytes, timeout_s, progress, read_used=self.memory_used_bytes)

    def inventory(self) -> GpuInventory:
        result = self.host.run(list(SMI_INVENTORY_QUERY))
        if result.returncode != 0:
            return GpuInventory(error=f"nvidia-smi on {self.host.name}: exit {result.returncode}")
        gpus = []
        driver = None
        for line in result.stdout.strip().splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 6 or not cells[0].isdigit():
                continue
            driver = cells[5]
            gpus.append(GpuInfo(int(cells[0]), cells[1], cells[2], _mib(cells[4]), _mib(cells[3])))
        return GpuInventory(driver, None, None, tuple(gpus), None if gpus else f"nvidia-smi on {self.host.name} lists no GPU")
