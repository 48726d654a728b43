"""A throwaway PostgreSQL server for the history tests: Debian's ``postgresql`` package
(``/usr/lib/postgresql/<version>/bin``, installed by ``.ci/run``), a cluster in a temporary
folder, listening on a free loopback port only, stopped and removed afterwards.

PostgreSQL refuses to run as root, so under root the cluster belongs to the ``postgres`` user
the Debian package creates (``runuser``). Where no server can start, the caller skips with the
reason this returns; it never passes without one.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]) if Path(p).parts[4].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yield a postgresql:// URL of a fresh server; raise RuntimeError with the reason if none can start."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server: /usr/lib/postgresql/*/bin/initdb is missing (apt-get install postgresql; .ci/run does)")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="ddtree-pg-"))
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            raise RuntimeError("running as root and runuser is missing: PostgreSQL refuses to run as root")
        try:
            shutil.chown(folder, user="postgres", group="postgres")
        except (LookupError, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"running as root and no 'postgres' user to run the server as: {exc}") from None
        as_user = ["runuser", "-u", "postgres", "--"]
    data, log = folder / "data", folder / "server.log"
    port = _free_port()
    started = False
    try:
        init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "ddtree", "-E", "UTF8"],
                              capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        start = subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"],
                               capture_output=True, text=True, timeout=90)
        if start.returncode != 0:
            tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {start.stderr.strip()[-300:]} {tail}")
        started = True
        yield f"postgresql://ddtree@127.0.0.1:{port}/postgres"
    finally:
        if started:
            subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                           capture_output=True, text=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A server's URL for a test module (import this fixture by name); skipped, saying why, without one."""
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra; the test extra installs it) is not installed")
    try:
        with postgres_server() as url:
            yield url
    except RuntimeError as exc:
        pytest.skip(f"no PostgreSQL server for the history tests: {exc}")
