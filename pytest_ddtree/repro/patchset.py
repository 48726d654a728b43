"""What a package records about patched files, and the installed distribution they are read from.

A wheel install's ``*.dist-info/RECORD`` holds the sha256 of every installed file, so the
edited files can be found without guessing; a pristine copy (a wheel, a directory or a git
checkout's HEAD) gives their original text (:class:`Pristine`).
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

from .diffs import unified_diff


class PatchError(Exception):
    """The profile's ``patches`` section cannot be turned into patch files (message says why)."""


def sha256_bytes(data: bytes) -> str:
    """Hex sha256: the one hash format used everywhere in a package (sha256sum compatible)."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks so large raw-sample files do not load at once."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def normalize_dist_name(name: str) -> str:
    """PEP 503 normalisation, so ``SGLang``, ``sglang`` and ``sg_lang`` dist-info dirs match."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_target_path(target: str) -> str | None:
    """Return why ``target`` is not a safe site-packages-relative POSIX path, or None.

    Deploy writes ``SITE/<target>``; an absolute path, ``..`` or characters that break the
    tab-separated deploy data or ``sha256sum`` manifests would let a package write outside
    the install or corrupt its own checks.
    """
    if not target or target.startswith("/") or "\\" in target:
        return f"{target!r} must be a relative POSIX path inside site-packages"
    if any(c in target for c in "\t\n\r"):
        return f"{target!r} contains a tab or newline"
    parts = PurePosixPath(target).parts
    if any(p in ("", ".", "..") for p in parts) or str(PurePosixPath(*parts)) != target:
        return f"{target!r} must be normalized (no '.', '..' or empty components)"
    return None


def find_dist_info(site_packages: Path, distribution: str) -> Path:
    """Locate the single ``*.dist-info`` of ``distribution`` under ``site_packages``.

    Raises PatchError when there is none or more than one (a broken install with two
    versions side by side is exactly when a deploy must not guess).
    """
    want = normalize_dist_name(distribution)
    found: list[Path] = []
    if site_packages.is_dir():
        for d in sorted(site_packages.glob("*.dist-info")):
            meta = d / "METADATA"
            if not meta.is_file():
                continue
            name, _version = read_metadata(meta)
            if name is not None and normalize_dist_name(name) == want:
                found.append(d)
    if not found:
        raise PatchError(
            f"distribution {distribution!r} is not installed in {site_packages} (no *.dist-info/METADATA "
            f"with Name: {distribution}); point `site_packages:` in the profile's patches section at the "
            "install that the service runs"
        )
    if len(found) > 1:
        raise PatchError(
            f"{len(found)} dist-info directories of {distribution!r} in {site_packages}: "
            f"{', '.join(p.name for p in found)}; remove the stale one"
        )
    return found[0]


def read_metadata(metadata: Path) -> tuple[str | None, str | None]:
    """(Name, Version) from a METADATA file's header (the email-style part before the body)."""
    name: str | None = None
    version: str | None = None
    for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key.strip().lower() == "name" and name is None:
            name = value.strip()
        elif key.strip().lower() == "version" and version is None:
            version = value.strip()
    return name, version


def record_hash_to_hex(value: str) -> str | None:
    algo, _, digest = value.partition("=")
    if algo != "sha256" or not digest:
        return None
    raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
    return raw.hex()


def read_record(dist_info: Path) -> dict[str, str | None]:
    """Map each RECORD path to its sha256 hex (None when RECORD lists it without a hash)."""
    import csv

    out: dict[str, str | None] = {}
    text = (dist_info / "RECORD").read_text(encoding="utf-8")
    for row in csv.reader(text.splitlines()):
        if not row:
            continue
        path = row[0]
        out[path] = record_hash_to_hex(row[1]) if len(row) > 1 and row[1] else None
    return out


def flatten_target(target: str) -> str:
    """``sglang/srt/x.py`` -> ``sglang__srt__x.py.diff``: one flat, readable diffs/ folder."""
    return target.replace("/", "__") + ".diff"


@dataclass(frozen=True)
class PatchedFile:
    """One patched file: where it goes, its bytes, and the pristine bytes it replaces (None: new file)."""

    target: str
    patched: bytes
    pristine: bytes | None
    status: str  # "modified" | "added"

    def diff(self) -> str | None:
        """Unified diff text, or None for binary files (those ship as full copies only)."""
        try:
            new = self.patched.decode("utf-8")
            old = None if self.pristine is None else self.pristine.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return unified_diff(old, new, self.target)


@dataclass(frozen=True)
class PatchSet:
    """Everything the package records about patches (mode: "distribution", "files" or "none")."""

    mode: str
    distribution: str | None = None
    version: str | None = None
    record_text: str | None = None  # the dist's RECORD: the recorded layout deploy targets
    pristine_kind: str | None = None  # wheel | directory | git | files
    pristine_name: str | None = None  # a basename only: absolute paths are machine-specific
    files: tuple[PatchedFile, ...] = ()
    warnings: tuple[str, ...] = ()


class Pristine:
    """Read a file's original bytes from a wheel, a directory or a git checkout's HEAD."""

    _PREFIXES = ("", "python/", "src/")  # SGLang's repo keeps the package under python/

    def __init__(self, path: Path, prefix: str | None) -> None:
        self.path = path
        self.prefix = prefix
        if path.is_file() and zipfile.is_zipfile(path):
            self.kind = "wheel"
            self._zip: zipfile.ZipFile | None = zipfile.ZipFile(path)
        elif path.is_dir() and (path / ".git").exists():
            self.kind = "git"
            self._zip = None
        elif path.is_dir():
            self.kind = "directory"
            self._zip = None
        else:
            raise PatchError(
                f"pristine {path} is neither a wheel (.whl), a directory nor a git checkout; "
                "set `pristine:` in the profile's patches section to an unmodified copy of the distribution"
            )

    def _candidates(self, target: str) -> list[str]:
        prefixes = (self.prefix,) if self.prefix is not None else self._PREFIXES
        return [p.rstrip("/") + "/" + target if p else target for p in prefixes]

    def read(self, target: str) -> bytes | None:
        for cand in self._candidates(target):
            if self._zip is not None:
                try:
                    return self._zip.read(cand)
                except KeyError:
                    continue
            elif self.kind == "git":
                proc = subprocess.run(
                    ["git", "-C", str(self.path), "show", f"HEAD:{cand}"],
                    capture_output=True,
                    check=False,
                )
                if proc.returncode == 0:
                    return proc.stdout
            else:
                p = self.path / cand
                if p.is_file():
                    return p.read_bytes()
        return None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def ignored_record_path(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (
        not parts
        or parts[0] == ".."
        or parts[0].endswith(".dist-info")
        or "__pycache__" in parts
        or path.endswith((".pyc", ".pyo"))
    )


def distribution_patch_set(
    distribution: str, version: str | None, record_text: str | None, pristine_kind: str, pristine_name: str | None,
    files: Sequence[PatchedFile], warnings: Sequence[str],
) -> PatchSet:
    """The PatchSet of an installed distribution, once every target is proven safe to deploy."""
    for f in files:
        why = check_target_path(f.target)
        if why:
            raise PatchError(f"patches: {why}")
    return PatchSet(
        mode="distribution",
        distribution=distribution,
        version=version,
        record_text=record_text,
        pristine_kind=pristine_kind,
        pristine_name=pristine_name,
        files=tuple(sorted(files, key=lambda f: f.target)),
        warnings=tuple(warnings),
    )


def iter_diff_targets(files: Iterable[PatchedFile]) -> list[str]:
    """Targets whose flattened diff names collide (would overwrite each other in diffs/)."""
    seen: dict[str, str] = {}
    clashes: list[str] = []
    for f in files:
        flat = flatten_target(f.target)
        if flat in seen:
            clashes.append(f"{seen[flat]} and {f.target}")
        seen[flat] = f.target
    return clashes
