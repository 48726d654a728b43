"""The service manager's parameters, grouped by what they are about (instead of fifteen arguments).

``ServiceManager(profile, Placement(...), pacing=..., hooks=..., clients=..., tools=...)``: each
group has the defaults a session uses, so a caller (a test, the session) names only what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from pytest_ddtree.service.base import ProgressFn
from pytest_ddtree.service.client import SGLangClient


class ClientFactory(Protocol):
    def __call__(self, base_url: str, timeout: float, /) -> SGLangClient: ...



def default_gpu_memory() -> int | None:
    from pytest_ddtree.service import gpu

    return gpu.gpu_memory_used_bytes()


def default_gpu_release(baseline: int | None, timeout_s: float, progress: ProgressFn | None) -> bool:
    from pytest_ddtree.service import gpu

    return gpu.wait_for_gpu_memory_release(baseline, timeout_s, progress)


GpuMemoryFn = Callable[[], int | None]
GpuReleaseFn = Callable[[int | None, float, ProgressFn | None], bool]


@dataclass(frozen=True)
class Placement:
    """Which pool instance a manager owns and where its files go.

    ``instance_index``: the pool instance (``pool.instance_for_worker``); ``log_dir``: where
    process logs go (``<results>/logs``), one file per start; ``lock_dir``: where the instance
    lock files live; when given, the instance is locked from ``ensure`` until a switch,
    ``release`` or ``close`` (needed when workers share one)."""

    instance_index: int = 0
    log_dir: Path = Path(".ddtree") / "logs"
    lock_dir: Path | None = None


@dataclass(frozen=True)
class Pacing:
    """How long readiness may take and how often it is polled and reported.

    ``ready_timeout_s`` overrides the profile's (``--ddtree-ready-timeout``)."""

    ready_timeout_s: float | None = None
    poll_interval: float = 0.5
    progress_interval: float = 10.0


@dataclass(frozen=True)
class Hooks:
    """Where the manager tells what happens: progress lines (None: silent) and, once a launch
    is ready, the node it runs on (a slurm job's), so results say which node measured."""

    progress: ProgressFn | None = None
    on_ready: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Clients:
    """How the service's HTTP client is made (None: SGLangClient) and its per-request timeout
    (None: the profile's ``request_timeout_s``)."""

    factory: ClientFactory | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class HostTools:
    """The commands and GPU readers the controllers use (tests put fakes here): systemd's
    ``systemctl``/``journalctl`` and the GPU memory reading and release wait (None: no wait).
    The defaults read this machine's GPUs; on an ssh host its own nvidia-smi stands in."""

    systemctl: tuple[str, ...] = ("systemctl",)
    journalctl: tuple[str, ...] = ("journalctl",)
    gpu_memory: GpuMemoryFn | None = default_gpu_memory
    gpu_release: GpuReleaseFn | None = default_gpu_release
