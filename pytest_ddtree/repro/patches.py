"""Patched-file discovery: a profile's ``patches`` section turned into a :class:`PatchSet`.

Why this module exists: the campaign's most valuable artefact was the set of engine files
that had been edited in place inside an installed SGLang.  A wheel install's
``*.dist-info/RECORD`` holds the sha256 of every installed file, so the edited files can be
found without guessing; a pristine copy (a wheel, a directory or a git checkout's HEAD)
gives their original text for the diffs.  The diffs live in :mod:`.diffs`, the patch set and the
installed distribution's records in :mod:`.patchset`, editable and from-source installs in
:mod:`.sourcetree`; their names are re-exported here.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence

from pytest_ddtree.repro.diffs import DiffError, apply_unified_diff, reverse_unified_diff, unified_diff
from pytest_ddtree.repro.patchset import (
    PatchedFile,
    PatchError,
    PatchSet,
    Pristine,
    check_target_path,
    distribution_patch_set,
    find_dist_info,
    flatten_target,
    ignored_record_path,
    iter_diff_targets,
    normalize_dist_name,
    read_metadata,
    read_record,
    sha256_bytes,
    sha256_file,
)
from pytest_ddtree.repro.sourcetree import collect_source_install, legacy_egg_info

__all__ = [
    "PatchError",
    "PatchedFile",
    "PatchSet",
    "DiffError",
    "sha256_bytes",
    "sha256_file",
    "normalize_dist_name",
    "find_dist_info",
    "read_metadata",
    "read_record",
    "unified_diff",
    "apply_unified_diff",
    "reverse_unified_diff",
    "flatten_target",
    "collect_patches",
    "check_target_path",
    "iter_diff_targets",
]


def _resolve(base: Path | None, value: Any, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise PatchError(f"patches: {what} must be a non-empty path string, got {value!r}")
    p = Path(value).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    return p


_LOCATE = "import importlib.metadata as m, sys; print(m.distribution(sys.argv[1]).locate_file(''))"


def _site_packages_of(distribution: str, python: str | None = None) -> Path:
    if python is not None and python != sys.executable:  # the service's interpreter, asked directly
        try:
            proc = subprocess.run([python, "-c", _LOCATE, distribution], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise PatchError(f"cannot run the service's interpreter {python} to find {distribution!r}: {exc}") from None
        if proc.returncode != 0:
            raise PatchError(
                f"distribution {distribution!r} is not installed for the service's interpreter {python}; set "
                "`python:` in the profile to the interpreter the service runs, or `site_packages:` in its patches section"
            )
        return Path(proc.stdout.strip()).resolve()
    import importlib.metadata as md

    try:
        dist = md.distribution(distribution)
    except md.PackageNotFoundError:
        raise PatchError(
            f"distribution {distribution!r} is not installed in this Python; set `site_packages:` in the "
            "profile's patches section to the service's install"
        ) from None
    return Path(str(dist.locate_file(""))).resolve()


def _top_level_dirs(record: Mapping[str, str | None]) -> list[str]:
    tops = set()
    for path in record:
        parts = PurePosixPath(path).parts
        if len(parts) > 1 and parts[0] != ".." and not parts[0].endswith((".dist-info", ".data")):
            tops.add(parts[0])
    return sorted(tops)


def collect_patches(spec: Mapping[str, Any] | None, base_dir: Path | None = None, python: str | None = None) -> PatchSet:
    """Turn a profile's ``patches`` section into a PatchSet.

    ``{distribution: NAME, pristine: PATH, [site_packages: PATH], [pristine_prefix: STR]}``:
    files of the installed NAME whose sha256 differs from its RECORD are "modified", files
    under its top-level package directories missing from RECORD are "added".
    ``{files: [{patched, pristine, target}], [distribution: NAME], [site_packages: PATH]}``:
    an explicit list.  Relative paths are resolved against ``base_dir`` (the profile's folder).
    ``python`` is the service's interpreter, where an installed NAME is looked up.
    """
    if not spec:
        return PatchSet(mode="none")
    dist_name = _checked_distribution(spec)
    site: Path | None = None
    if spec.get("site_packages") is not None:
        site = _resolve(base_dir, spec["site_packages"], "site_packages")
    elif dist_name:
        site = _site_packages_of(dist_name, python)

    installed = _InstalledRecord(None, None, {}, None)
    if dist_name and site is not None:
        installed = _installed_record(site, dist_name)
    version = installed.version
    if version is None and isinstance(spec.get("version"), str):
        version = spec["version"]
    if "files" in spec:
        return _collect_files(spec["files"], base_dir, dist_name, version, installed.record_text)
    if not dist_name or site is None or installed.dist_info is None:
        raise PatchError("patches: give either `distribution:` (with `pristine:`) or a `files:` list")
    prefix = spec.get("pristine_prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise PatchError(f"patches: pristine_prefix must be a string, got {prefix!r}")
    # editable and from-source installs (PEP 610/660)
    given = _resolve(base_dir, spec["pristine"], "pristine") if "pristine" in spec else None
    from_source = collect_source_install(site, installed.dist_info, dist_name, version, installed.record, given, prefix)
    if from_source is not None:
        return from_source
    if "pristine" not in spec:
        raise PatchError(
            f"patches: `pristine:` is required with distribution {dist_name!r}: a wheel, a directory or a git "
            "checkout of the unmodified version, so the package can hold diffs (an editable or from-source "
            "install of a git checkout needs none: its HEAD is the pristine)"
        )
    pristine = Pristine(_resolve(base_dir, spec["pristine"], "pristine"), prefix)
    warnings: list[str] = []
    try:
        files = _modified_files(site, dist_name, version, installed.record, pristine, warnings)
        files += _added_files(site, installed.record)
    finally:
        pristine.close()
    return distribution_patch_set(dist_name, version, installed.record_text, pristine.kind, pristine.path.name, files, warnings)


def _checked_distribution(spec: Mapping[str, Any]) -> str | None:
    """The section's keys are known and its ``distribution`` (if any) is a name."""
    if not isinstance(spec, Mapping):
        raise PatchError(f"patches: expected a mapping, got {type(spec).__name__}")
    unknown = set(spec) - {"distribution", "pristine", "site_packages", "pristine_prefix", "files", "version"}
    if unknown:
        raise PatchError(
            f"patches: unknown key(s) {sorted(unknown)}; allowed: distribution, pristine, site_packages, "
            "pristine_prefix, files"
        )
    dist_name = spec.get("distribution")
    if dist_name is not None and not isinstance(dist_name, str):
        raise PatchError(f"patches: distribution must be a name, got {dist_name!r}")
    return dist_name


@dataclass(frozen=True)
class _InstalledRecord:
    """What the installed distribution says of itself: its metadata dir, version and RECORD."""

    dist_info: Path | None
    version: str | None
    record: dict[str, str | None]
    record_text: str | None


def _installed_record(site: Path, dist_name: str) -> _InstalledRecord:
    try:
        dist_info = find_dist_info(site, dist_name)
    except PatchError:
        # ``setup.py develop``: an .egg-link and an .egg-info
        found = legacy_egg_info(site, dist_name)
        if found is None:
            raise
        dist_info = found
    meta_file = dist_info / "METADATA" if (dist_info / "METADATA").is_file() else dist_info / "PKG-INFO"
    _n, version = read_metadata(meta_file)
    record: dict[str, str | None] = {}
    record_text: str | None = None
    if (dist_info / "RECORD").is_file():
        record = read_record(dist_info)
        record_text = (dist_info / "RECORD").read_text(encoding="utf-8")
    return _InstalledRecord(dist_info, version, record, record_text)


def _modified_files(
    site: Path, dist_name: str, version: str | None, record: Mapping[str, str | None], pristine: Pristine, warnings: list[str],
) -> list[PatchedFile]:
    """Installed files whose sha256 differs from RECORD, each with its pristine original."""
    files: list[PatchedFile] = []
    for path, digest in sorted(record.items()):
        if ignored_record_path(path) or digest is None:
            continue
        installed = site / path
        if not installed.is_file():
            warnings.append(f"{path}: listed in RECORD but missing from {dist_name} (deleted files are not packaged)")
            continue
        data = installed.read_bytes()
        if sha256_bytes(data) == digest:
            continue
        orig = pristine.read(path)
        if orig is None:
            raise PatchError(f"{path} is modified but the pristine {pristine.kind} {pristine.path} has no such file")
        if sha256_bytes(orig) != digest:
            raise PatchError(
                f"{path}: the pristine copy in {pristine.path} does not match {dist_name} {version}'s RECORD hash; "
                "is the pristine the same version as the install?"
            )
        files.append(PatchedFile(path, data, orig, "modified"))
    return files


def _added_files(site: Path, record: Mapping[str, str | None]) -> list[PatchedFile]:
    """Files under the distribution's top-level package dirs that RECORD does not list."""
    files: list[PatchedFile] = []
    for top in _top_level_dirs(record):
        root = site / top
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(site).as_posix()
            if p.is_file() and not p.is_symlink() and rel not in record and not ignored_record_path(rel):
                files.append(PatchedFile(rel, p.read_bytes(), None, "added"))
    return files


def _collect_files(
    items: Any, base_dir: Path | None, dist_name: str | None, version: str | None, record_text: str | None
) -> PatchSet:
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or not items:
        raise PatchError("patches: `files:` must be a non-empty list of {patched, pristine, target}")
    files: list[PatchedFile] = []
    seen: set[str] = set()
    for n, item in enumerate(items, 1):
        if not isinstance(item, Mapping) or "patched" not in item or "target" not in item:
            raise PatchError(f"patches: files[{n}] must have `patched`, `target` and (unless new) `pristine`")
        target = item["target"]
        why = check_target_path(target) if isinstance(target, str) else f"{target!r} is not a string"
        if why:
            raise PatchError(f"patches: files[{n}].target: {why}")
        if target in seen:
            raise PatchError(f"patches: files[{n}].target {target!r} is listed twice")
        seen.add(target)
        patched = _resolve(base_dir, item["patched"], f"files[{n}].patched")
        if not patched.is_file():
            raise PatchError(f"patches: files[{n}].patched {patched} does not exist or is not a file")
        orig: bytes | None = None
        if item.get("pristine") is not None:
            pristine = _resolve(base_dir, item["pristine"], f"files[{n}].pristine")
            if not pristine.is_file():
                raise PatchError(f"patches: files[{n}].pristine {pristine} does not exist or is not a file")
            orig = pristine.read_bytes()
        files.append(PatchedFile(target, patched.read_bytes(), orig, "added" if orig is None else "modified"))
    return PatchSet(
        mode="files",
        distribution=dist_name,
        version=version,
        record_text=record_text,
        pristine_kind="files",
        pristine_name=None,
        files=tuple(sorted(files, key=lambda f: f.target)),
    )
