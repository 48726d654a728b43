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

from pytest_ddtree.repro.diffs import unified_diff


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


#: The largest package file verify and deploy read or hash, and the largest .py they parse: a
#: package comes from elsewhere, and a 2 GiB sparse file must cost an error, not the machine.
MAX_FILE_BYTES = 1 << 30
MAX_PY_BYTES = 16 << 20
#: Deepest bracket nesting and longest run of operators a package's .py may have: CPython's parser
#: recurses on both (200,000 unary minus signs end in a MemoryError), honest code stays far below.
MAX_PY_NESTING = 100
MAX_PY_OPERATOR_RUN = 200


def non_regular_problem(root: Path, rel: str) -> str | None:
    """Why ``root/rel`` is not a regular file inside ``root`` (a symlink anywhere on the way, a
    FIFO, a device, a socket, missing), or None. Checked with lstat, so nothing is opened or followed."""
    import stat

    path = root
    for part in PurePosixPath(rel).parts:
        path = path / part
        try:
            mode = path.lstat().st_mode
        except OSError:
            return f"{rel}: missing"
        if stat.S_ISLNK(mode):
            return f"{rel}: {path.relative_to(root).as_posix()} is a symbolic link (a package holds regular files only)"
    if not stat.S_ISREG(mode):
        return f"{rel}: not a regular file (a FIFO, device or socket: a package holds regular files only)"
    return None


def read_regular(root: Path, rel: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file inside ``root``, at most ``limit``; PatchError otherwise."""
    import os
    import stat

    why = non_regular_problem(root, rel)
    if why:
        raise PatchError(why)
    fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PatchError(f"{rel}: not a regular file")
        if info.st_size > limit:
            raise PatchError(f"{rel}: {info.st_size:,} bytes, over the {limit:,} a package file may have")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise PatchError(f"{rel}: over the {limit:,} bytes a package file may have")
    return data


def python_problem(data: bytes, name: str) -> str | None:
    """Why ``data`` is not Python this package may hold (too large, nested too deep, a syntax
    error), or None: parsed in a bounded way (size, then a linear token scan, then ast.parse)."""
    import ast
    import io
    import tokenize

    if len(data) > MAX_PY_BYTES:
        return f"{name}: {len(data):,} bytes, over the {MAX_PY_BYTES:,} a package's .py may have"
    depth = run = 0
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            if tok.type != tokenize.OP:
                run = 0
                continue
            if tok.string in "([{":
                depth += 1
            elif tok.string in ")]}":
                depth -= 1
            run += 1
            if depth > MAX_PY_NESTING or run > MAX_PY_OPERATOR_RUN:
                return (f"{name}: nested deeper than {MAX_PY_NESTING} brackets or {MAX_PY_OPERATOR_RUN} operators in a row: "
                        "not parsed (hostile or generated code)")
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError) as exc:
        return f"{name}: does not parse: {exc}"
    try:
        ast.parse(data, filename=name)
    except (SyntaxError, ValueError) as exc:
        return f"{name}: does not parse: {exc}"
    except (MemoryError, RecursionError):
        return f"{name}: too complex to parse (nested too deeply)"
    return None


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
    if parts[0].startswith("."):
        return f"{target!r} is under a hidden folder of site-packages (the deploy's backups live in .ddtree-backup/)"
    return None


def check_new_file_target(target: str, tops: set[str]) -> str | None:
    """Why a package may not add ``target`` (a file the install does not have), or None: a new
    file goes inside one of the patched distribution's own top-level folders (``tops``, from its
    RECORD), never beside them (a ``.pth`` at the top of site-packages runs at every start)."""
    parts = PurePosixPath(target).parts
    if len(parts) < 2 or parts[0] not in tops:
        return (f"{target!r} is a new file outside the patched distribution's own folders ({', '.join(sorted(tops)) or 'none'}); "
                "a package may add files only inside them")
    return None


def record_tops(dist_info: Path) -> set[str]:
    """The top-level folders an installed distribution's RECORD lists files under (not its dist-info)."""
    import csv

    tops: set[str] = set()
    try:
        rows = list(csv.reader((dist_info / "RECORD").read_text(encoding="utf-8").splitlines()))
    except OSError:
        return tops
    for row in rows:
        parts = PurePosixPath(row[0]).parts if row else ()
        if len(parts) > 1 and not parts[0].endswith((".dist-info", ".data")) and not parts[0].startswith("."):
            tops.add(parts[0])
    return tops


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
