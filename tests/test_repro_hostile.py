"""Hostile reproduction packages: verify and deploy read only regular files inside the package,
bounded, and deploy writes nothing outside the patched distribution's own folders.

Each package is a real one (written by the package writer from a fake install), then altered the
way someone handing it over could: a FIFO or a link where a file was, a parse bomb, a huge sparse
file, a full copy behind a link out of the package, a target that adds a ``.pth`` or overwrites the
deploy's own backups. ``ddtree-repro`` runs as a user runs it (a subprocess); each ends with a
clear problem, no traceback, and the install untouched.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from pytest_ddtree.repro import write_package
from pytest_ddtree.repro.verify import write_manifest
from tests.repro_helpers import dist_spec, fast_env, file_tree, make_request, repro_cli, snap_cache, world  # noqa: F401 (fixtures)


@pytest.fixture
def package(world: dict[str, Path], fast_env: None) -> Path:
    assert write_package(make_request(world["tmp"], world["out"], dist_spec(world))).ok
    return world["out"] / "pkg"


def _verify(pkg: Path) -> str:
    proc = repro_cli("verify", str(pkg), "--no-env")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "MemoryError" not in out, out
    return out


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 5)) if os.geteuid() == 0 else os.mkfifo(p),  # /dev/zero's
     "not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "a symbolic link"),
    (lambda p: p.write_text("x = " + "-" * 200_000 + "1\n"), "operators in a row: not parsed"),
    (lambda p: p.write_text("x = " + "(" * 5_000 + ")" * 5_000 + "\n"), "nested deeper than 100 brackets"),
])
def test_verify_reads_no_fifo_no_link_and_parses_bounded(package: Path, make: object, words: str) -> None:
    target = package / "configs" / "x.py"
    make(target)  # type: ignore[operator]
    assert words in _verify(package)


@pytest.mark.parametrize("rel", ["deploy_patches.sh", "patches/RECORD", "env/environment.json"])
def test_verify_follows_no_link_the_package_itself_reads(package: Path, rel: str) -> None:
    """The files verify reads beyond the .py (the scripts it checks with bash -n, the RECORD,
    the recorded environment) replaced by a link to /dev/zero: a problem, never a read."""
    (package / rel).unlink()
    os.symlink("/dev/zero", package / rel)
    assert f"{rel}: a symbolic link" in _verify(package)


def test_verify_does_not_read_a_huge_sparse_file(package: Path) -> None:
    with open(package / "configs" / "big.py", "wb") as fh:
        fh.truncate(2 << 30)  # 2 GiB, sparse: costs no disk
    out = _verify(package)
    assert "configs/big.py: 2,147,483,648 bytes, over the" in out


def _deploy(pkg: Path, site: Path) -> str:
    before = file_tree(site)
    proc = repro_cli("deploy", str(pkg), "--site-packages", str(site))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "REFUSED" in out and "Traceback" not in out, out
    assert file_tree(site) == before  # nothing written
    return out


def _bash_deploy_refuses(pkg: Path, site: Path, words: str) -> None:
    before = file_tree(site)
    proc = subprocess.run(["bash", str(pkg / "deploy_patches.sh"), str(site)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "REFUSED" in proc.stderr and words in proc.stderr, proc.stdout + proc.stderr
    assert file_tree(site) == before


def test_deploy_checks_the_manifest_first(package: Path, world: dict[str, Path]) -> None:
    full = next((package / "patches" / "full").rglob("*.py"))
    full.write_text(full.read_text() + "# changed after packaging\n")
    assert "MANIFEST.sha256" in _deploy(package, world["pristine"])
    _bash_deploy_refuses(package, world["pristine"], "MANIFEST.sha256 does not match the package")


def test_the_bash_deploy_refuses_a_file_added_after_packaging(package: Path, world: dict[str, Path]) -> None:
    (package / "patches" / "full" / "extra.txt").write_text("not packaged\n")
    _bash_deploy_refuses(package, world["pristine"], "patches/full/extra.txt: present but not listed in MANIFEST.sha256")
    assert "patches/full/extra.txt: present but not listed" in _deploy(package, world["pristine"])


def test_deploy_follows_no_link_out_of_the_package(package: Path, world: dict[str, Path], tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    os.rename(package / "patches" / "full", outside)
    os.symlink(outside, package / "patches" / "full")
    write_manifest(package)  # even with a manifest made to match
    out = _deploy(package, world["pristine"])
    assert "patches/full: a symbolic link" in out or "patches/full is a symbolic link" in out, out
    _bash_deploy_refuses(package, world["pristine"], "patches/full: not a regular file (a link")


@pytest.mark.parametrize(("target", "words"), [
    ("evil.pth", "a new file outside the patched distribution's own folders"),
    ("sitecustomize.py", "a new file outside the patched distribution's own folders"),
    (".ddtree-backup/sglang/srt/speculative/dflash_info.py", "hidden folder"),
])
def test_deploy_adds_no_file_outside_the_distributions_folders(package: Path, world: dict[str, Path], target: str,
                                                                words: str) -> None:
    """A forged row with its full copy and a regenerated manifest: only the target check stands."""
    import hashlib

    data = b"import os; os.system('echo pwned')\n"
    full = package / "patches" / "full" / target
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(data)
    with open(package / "patches" / "deploy.tsv", "a") as fh:
        fh.write(f"{target}\t-\t{hashlib.sha256(data).hexdigest()}\n")
    write_manifest(package)
    assert words in _deploy(package, world["pristine"])
    _bash_deploy_refuses(package, world["pristine"], words.split(" (")[0])  # the same rule, the same words
    assert not (world["pristine"] / target).exists()
