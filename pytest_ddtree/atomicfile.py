"""The one way pytest-ddtree replaces a file: readers see the old file or the new one, never half.

Results, baselines, golden transcripts, the coding corpus, systemd drop-ins and deployed patches
are all read by another process (a CI job, systemd, the next session) that may run while we
write, and a killed run must not leave a truncated file behind. So every writer goes through
here: write a temp file in the same folder (same file system, so the rename is atomic), fsync
it, rename it over the target, then fsync the folder so the rename itself survives a crash.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) in one rename.

    ``mode`` sets the file's permission bits (e.g. to keep those of the file replaced); without
    it a new file gets the usual ``0o666`` less the umask.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    # pid + thread: two writers of one file (threads, xdist workers) never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        with open(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not every file system lets a folder be opened; the file itself is on disk
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
