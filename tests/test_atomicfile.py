"""The one atomic writer: whole old file or whole new file, never a temp file left behind."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from pytest_ddtree.atomicfile import write_atomic


def test_replaces_text_and_bytes_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "results.json"
    write_atomic(target, "first\n")
    write_atomic(target, b"second\n")
    assert target.read_bytes() == b"second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_mode_is_applied_and_a_new_file_follows_the_umask(tmp_path: Path) -> None:
    kept = tmp_path / "patched.py"
    write_atomic(kept, "x = 1\n", mode=0o755)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o755
    fresh = tmp_path / "fresh.txt"
    old = os.umask(0o022)
    try:
        write_atomic(fresh, "y\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644


def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "baseline.yaml"
    write_atomic(target, "old\n")
    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline.yaml"]


def test_concurrent_writers_leave_one_complete_version(tmp_path: Path) -> None:
    target = tmp_path / "golden.json"
    versions = [f"{i}\n" * 20_000 for i in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(target, v)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_text() in versions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["golden.json"]
