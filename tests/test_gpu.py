"""The NVML paths on a real NVIDIA GPU (marked ``gpu``; skipped where NVML sees none).

Run on a GPU machine with ``pytest tests -m gpu -s``: the tests print what NVML reported, so the
run doubles as a record of the hardware. Memory is held by a real child process (PyTorch or CuPy)
so the release wait is measured against a real driver freeing real memory.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_ddtree.service import gpu
from pytest_ddtree.service.base import Launch
from pytest_ddtree.service.process import ProcessController
from pytest_ddtree.service.readiness import wait_ready

INVENTORY = gpu.gpu_inventory()
needs_gpu = pytest.mark.skipif(not INVENTORY.gpus, reason=f"no NVIDIA GPU: {INVENTORY.error}")

HOLD_MEMORY = textwrap.dedent(
    """
    import sys, time
    size = int(sys.argv[1])
    try:
        import torch
        block = torch.empty(size, dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
    except ImportError:
        import cupy
        block = cupy.ones(size, dtype=cupy.uint8)
        cupy.cuda.Device().synchronize()
    print("holding", flush=True)
    time.sleep(600)
    """
)


def _gpu_array_library() -> str | None:
    for name in ("torch", "cupy"):
        if subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode == 0:
            return name
    return None


def test_inventory_without_gpu_never_raises() -> None:
    inventory = gpu.gpu_inventory()
    assert inventory.summary()
    if not inventory.gpus:
        assert inventory.error and "no NVIDIA GPU" in inventory.summary()
        assert gpu.gpu_memory_used_bytes() is None
        assert gpu.wait_for_gpu_memory_release(None, timeout_s=0.1) is True


@pytest.mark.gpu
@needs_gpu
def test_inventory_reads_the_real_gpu() -> None:
    inventory = gpu.gpu_inventory()
    print("\nNVML inventory:", inventory.summary())
    for info in inventory.gpus:
        print(f"  GPU {info.index}: {info.name} {info.uuid} total {info.memory_total_bytes / 2**30:.1f} GiB used {info.memory_used_bytes / 2**30:.2f} GiB")
    assert inventory.count >= 1
    assert inventory.driver_version and inventory.cuda_driver_version
    assert all(g.memory_total_bytes > 8 * 2**30 for g in inventory.gpus)
    assert gpu.gpu_memory_used_bytes() is not None


@pytest.mark.gpu
@needs_gpu
def test_memory_release_wait_sees_a_real_process_free_its_memory(tmp_path: Path) -> None:
    library = _gpu_array_library()
    if library is None:
        pytest.skip("neither torch nor cupy to allocate GPU memory with")
    before = gpu.gpu_memory_used_bytes()
    assert before is not None
    size = 4 * 2**30
    holder = subprocess.Popen([sys.executable, "-c", HOLD_MEMORY, str(size)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        held = gpu.gpu_memory_used_bytes()
        assert held is not None and held >= before + size, f"NVML did not see the allocation: before {before}, now {held}"
        lines: list[str] = []
        released = gpu.wait_for_gpu_memory_release(before + 2**30, timeout_s=2, progress=lines.append, poll_interval_s=0.2)
        assert released is False and lines and "GPU memory still in use" in lines[-1]
        holder.terminate()
        t0 = time.monotonic()
        released = gpu.wait_for_gpu_memory_release(before + 2**30, timeout_s=60, progress=lines.append, poll_interval_s=0.2)
        print(f"\nGPU memory: before {before / 2**30:.2f} GiB, held {held / 2**30:.2f} GiB, released in {time.monotonic() - t0:.2f} s")
        assert released is True
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.gpu
@needs_gpu
def test_readiness_progress_shows_gpu_memory(tmp_path: Path) -> None:
    """A slow start prints progress lines with the GPU memory in use (what a 10-minute load shows)."""
    controller = ProcessController(tmp_path, stop_timeout_s=5)
    from pytest_ddtree.service.client import SGLangClient
    from pytest_ddtree.service.pool import free_port

    port = free_port()
    command = f"{sys.executable} -m pytest_ddtree.refserver --port {port} --load-seconds 3"
    controller.start(Launch(name="slow", command=command, port=port, url=f"http://127.0.0.1:{port}", env={}, log_path=tmp_path / "slow.log"))
    lines: list[str] = []
    try:
        wait_ready(SGLangClient(f"http://127.0.0.1:{port}", timeout=5), controller, "/health_generate", 60, lines.append, 0.2, progress_interval=1.0)
    finally:
        controller.stop()
    print("\n" + "\n".join(lines))
    assert any("GPU memory in use" in line and "GiB" in line for line in lines), lines
