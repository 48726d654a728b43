"""Deploy a package's patched files into an install: the Python twin of deploy_patches.sh.

Why both: the bash script must work on a bare machine with only the package, and the CLI
(``ddtree-repro deploy``) must work where bash or coreutils differ (and is easier to test
and to call from Python).  Both read the same data (patches/DISTRIBUTION, patches/deploy.tsv,
patches/full/) and follow the same rules: refuse before changing anything when the version
differs or a target is neither pristine nor patched; back up originals once; copy; check
the hash; leave already-patched files alone so a second run is a no-op.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.repro import layout
from pytest_ddtree.repro.patchset import (
    PatchError,
    check_new_file_target,
    check_target_path,
    find_dist_info,
    read_metadata,
    read_regular,
    record_tops,
    sha256_bytes,
    sha256_file,
)

__all__ = ["DeployReport", "deploy_package"]


@dataclass
class DeployReport:
    """``refused`` lists why nothing was changed; ``actions`` what was (or would be) done."""

    ok: bool
    actions: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def format(self) -> str:
        lines = list(self.actions)
        lines += [f"REFUSED: {r}" for r in self.refused]
        return "\n".join(lines)


def _read_dist(pkg: Path) -> tuple[str, str]:
    kv = dict(
        line.split("=", 1)
        for line in read_regular(pkg, layout.PATCHES_DIST).decode("utf-8").splitlines()
        if "=" in line
    )
    return kv.get("name", ""), kv.get("version", "")


def deploy_package(
    package: Path, site_packages: Path, dry_run: bool = False, backup_dir: Path | None = None
) -> DeployReport:
    """Copy patches/full/* into ``site_packages`` after the checks; see the module docstring."""
    pkg, site = Path(package), Path(site_packages)
    rep = DeployReport(ok=False)
    from pytest_ddtree.repro.verify import check_manifest

    broken = check_manifest(pkg)
    if broken:  # every file deploy reads must be the one packaged (and a regular file inside the package)
        rep.refused += [f"{layout.MANIFEST}: {problem}" for problem in broken]
        return rep
    try:
        name, version = _read_dist(pkg)
        rows = [
            (line.split("\t") + ["", ""])[:3]
            for line in read_regular(pkg, layout.PATCHES_TSV).decode("utf-8").splitlines()
            if line and not line.startswith("#")
        ]
    except (OSError, PatchError, UnicodeDecodeError) as exc:
        rep.refused.append(f"{pkg} is not a complete reproduction package: {exc}")
        return rep
    if not site.is_dir():
        rep.refused.append(f"{site} is not a directory")
        return rep
    if name and not _installed_version_matches(site, name, version, rep):
        return rep
    tops = record_tops(find_dist_info(site, name)) if name else set()
    todo = _files_to_patch(pkg, site, rows, rep, tops)
    if rep.refused:
        return rep
    backup = backup_dir or site / ".ddtree-backup"
    if not _copy_patched(pkg, site, todo, backup, dry_run, rep):
        return rep
    if not todo:
        rep.actions.append("nothing to do: every file is already patched")
    elif dry_run:
        rep.actions.append("dry run: nothing changed")
    else:
        rep.actions.append(f"done: {len(todo)} file(s) patched; originals in {backup}")
    rep.ok = True
    return rep


def _installed_version_matches(site: Path, name: str, version: str, rep: DeployReport) -> bool:
    """The distribution the patches are for is installed in ``site`` at their version."""
    try:
        _n, found = read_metadata(find_dist_info(site, name) / "METADATA")
    except PatchError as exc:
        rep.refused.append(str(exc))
        return False
    if found != version:
        rep.refused.append(
            f"{name} {found} is installed in {site} but the patches are for {name} {version}; "
            f"install {name}=={version} first"
        )
        return False
    rep.actions.append(f"ok: {name} {found} in {site}")
    return True


def _files_to_patch(pkg: Path, site: Path, rows: list[list[str]], rep: DeployReport, tops: set[str]) -> list[tuple[str, str]]:
    """(target, patched sha256) of each file to copy: its full copy is intact and the installed
    file is the pristine (or absent for a new one, inside the distribution's own folders
    ``tops``); every other case is refused in ``rep``."""
    todo: list[tuple[str, str]] = []
    for target, pristine, patched in rows:
        why = check_target_path(target) or (check_new_file_target(target, tops) if pristine == "-" else None)
        if why:
            rep.refused.append(f"deploy.tsv: {why}")
            continue
        try:
            full_ok = sha256_bytes(read_regular(pkg, f"{layout.PATCHES_FULL}/{target}")) == patched
        except PatchError as exc:
            rep.refused.append(f"{exc} (package corrupted?)")
            continue
        if not full_ok:
            rep.refused.append(f"patches/full/{target} does not match its recorded sha256 (package corrupted?)")
            continue
        dest = site / target
        if not dest.parent.resolve().is_relative_to(site.resolve()) or dest.is_symlink():
            rep.refused.append(f"{target}: its folder or the file in {site} is a link out of site-packages")
            continue
        if dest.is_file():
            current = sha256_file(dest)
            if current == patched:
                rep.actions.append(f"already patched: {target}")
                continue
            if pristine == "-":
                rep.refused.append(f"{target} exists in {site} but the package says it is a new file; it differs from the patched copy")
            elif current != pristine:
                rep.refused.append(f"{target} in {site} is neither the pristine nor the patched version (sha256 {current})")
            else:
                todo.append((target, patched))
        elif pristine != "-":
            rep.refused.append(f"{target} is missing from {site}; the recorded layout expects it")
        elif not dest.parent.is_dir():
            rep.refused.append(f"directory {dest.parent} is missing from {site}")
        else:
            todo.append((target, patched))
    return todo


def _copy_patched(pkg: Path, site: Path, todo: list[tuple[str, str]], backup: Path, dry_run: bool, rep: DeployReport) -> bool:
    """Back up each original once, write the patched copy atomically, check its sha256."""
    for target, patched in todo:
        dest = site / target
        if dry_run:
            rep.actions.append(f"would patch: {target}")
            continue
        if dest.is_file() and not (backup / target).exists():
            (backup / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dest, backup / target)
        mode = dest.stat().st_mode & 0o7777 if dest.exists() else None
        write_atomic(dest, read_regular(pkg, f"{layout.PATCHES_FULL}/{target}"), mode)
        if sha256_file(dest) != patched:
            rep.refused.append(f"{dest} does not have the expected sha256 after copying")
            return False
        rep.actions.append(f"patched: {target}")
    return True
