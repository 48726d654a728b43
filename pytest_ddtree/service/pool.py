"""Which service instance an xdist worker uses, and the lock that shares one instance.

Each worker gets its own instance (``gwN`` -> instance ``N mod pool size``) so two workers never
restart each other's service. When there are more workers than instances, the workers that
share an instance take turns through an ``fcntl.flock`` on a file in ``lock_dir``: held from the
first ``ensure(config)`` until the manager switches config, releases or closes. flock is
released by the kernel when the holder dies, so a crashed worker cannot wedge the others.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

from pytest_ddtree.service.base import ProgressFn
from pytest_ddtree.service.validated_profile import ServiceProfile


def worker_index(worker_id: str | None) -> int:
    """``gw3`` -> 3; the controller / no xdist (``None``, ``master``) -> 0."""
    if not worker_id:
        return 0
    match = re.fullmatch(r"gw(\d+)", worker_id)
    return int(match.group(1)) if match else 0


def instance_for_worker(worker_id: str | None, pool_size: int) -> int:
    """The instance index a worker uses: worker number modulo the pool size."""
    return worker_index(worker_id) % max(1, pool_size)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, picked at random *below* the kernel's ephemeral range.

    Why not bind to port 0: the kernel then hands out a port from the ephemeral range, the
    same range every outgoing connection (hundreds per throughput cell) takes its source port
    from, and the same port another process asking the same way may get next; between our
    check and the server's bind, either can take it ("Address already in use"). Below the
    ephemeral range only other listeners compete, and a random pick makes two concurrent
    callers unlikely to agree. The manager still retries a start that lost the race.
    """
    low, _ = _ephemeral_range()
    start = max(1024, low - 12000)
    rng = random.SystemRandom()
    for _ in range(64):
        port = rng.randrange(start, low) if low > start else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class InstanceSlot:
    """Where one instance lives: its port (None for a fixed URL) and its URL."""

    index: int
    port: int | None
    url: str


def resolve_instance(profile: ServiceProfile, index: int) -> InstanceSlot:
    """The port and URL of instance ``index`` of the profile's pool.

    ``pool: [urls]`` -> that URL (its port, if any, is what a process launch listens on);
    ``port: auto`` -> a fresh free port; a fixed port P -> P + index, so a pool of N instances
    on one host uses N consecutive ports (a pool of hosts: P on each host).
    """
    if isinstance(profile.pool, tuple):
        url = profile.pool[index % len(profile.pool)].rstrip("/")
        return InstanceSlot(index, urlparse(url).port, url)
    if profile.port == "auto":
        port = free_port()
    elif profile.fleet.hosts:
        port = int(profile.port)  # one instance per host: each listens on the profile's (or its entry's) port
    else:
        port = int(profile.port) + index
    return InstanceSlot(index, port, profile.render_url(port))


class InstanceLock:
    """A cross-process exclusive lock on one pool instance (``fcntl.flock``)."""

    def __init__(self, lock_dir: Path, name: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        self.path = Path(lock_dir) / f"{safe}.lock"
        self._fh: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self, progress: ProgressFn | None = None, poll_s: float = 0.2, timeout_s: float | None = None) -> None:
        """Block until we hold the lock; say once who we are waiting for."""
        if self._fh is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        start = time.monotonic()
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if progress is not None and not told:
                        fh.seek(0)
                        holder = fh.read().strip() or "another worker"
                        progress(f"waiting for the shared service instance lock {self.path} (held by {holder})")
                        told = True
                    if timeout_s is not None and time.monotonic() - start > timeout_s:
                        raise TimeoutError(f"could not lock {self.path} within {timeout_s:.0f} s") from None
                    time.sleep(poll_s)
        except BaseException:
            fh.close()
            raise
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} worker {os.environ.get('PYTEST_XDIST_WORKER', '-')}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        fh, self._fh = self._fh, None
        if fh is None:
            return
        try:
            fh.seek(0)
            fh.truncate()
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        finally:
            fh.close()
