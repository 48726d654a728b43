"""Patched-file discovery, unified diffs and a strict pure-Python diff applier.

Why this module exists: the campaign's most valuable artefact was the set of engine files
that had been edited in place inside an installed SGLang.  A wheel install's
``*.dist-info/RECORD`` holds the sha256 of every installed file, so the edited files can be
found without guessing; a pristine copy (a wheel, a directory or a git checkout's HEAD)
gives their original text for the diffs.  The diff applier is pure Python (no ``patch``
binary needed) and deliberately strict: no fuzz and no offsets, because it is used to
*prove* that a diff and a full copy agree, not to coax a diff onto a drifting tree.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping, Sequence

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
]

_NO_NEWLINE = "\\ No newline at end of file"


class PatchError(Exception):
    """The profile's ``patches`` section cannot be turned into patch files (message says why)."""


class DiffError(Exception):
    """A unified diff is malformed or does not apply exactly (message names the hunk)."""


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


def _record_hash_to_hex(value: str) -> str | None:
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
        out[path] = _record_hash_to_hex(row[1]) if len(row) > 1 and row[1] else None
    return out


# --------------------------------------------------------------------------- diffs


def _split_lines(text: str) -> list[str]:
    """Split on '\\n' only, keeping ends (str.splitlines would also split on \\r, \\f, ...)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(old: str | None, new: str, target: str, context: int = 3) -> str:
    """A git-style unified diff (``a/<target>`` -> ``b/<target>``, no timestamps).

    ``old`` None means the file is new (``--- /dev/null``).  Deterministic output and the
    ``\\ No newline at end of file`` marker make it apply with ``patch -p1`` from
    site-packages as well as with :func:`apply_unified_diff`.
    """
    import difflib

    a = _split_lines(old or "")
    b = _split_lines(new)
    fromfile = "/dev/null" if old is None else f"a/{target}"
    out: list[str] = []
    for line in difflib.unified_diff(a, b, fromfile=fromfile, tofile=f"b/{target}", n=context):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + _NO_NEWLINE + "\n")
    return "".join(out)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class _Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (tag, text incl. newline or not)


def _parse_diff(diff: str) -> list[_Hunk]:
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    hunks: list[_Hunk] = []
    i = 0
    while i < len(lines) and not lines[i].startswith("@@"):
        if lines[i] and not lines[i].startswith(("---", "+++", "diff ", "index ", "new file", "deleted file")):
            raise DiffError(f"line {i + 1}: unexpected text before the first hunk: {lines[i][:60]!r}")
        i += 1
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            raise DiffError(f"line {i + 1}: expected a hunk header '@@ -a,b +c,d @@', got {lines[i][:60]!r}")
        h = _Hunk(
            int(m.group(1)),
            int(m.group(2)) if m.group(2) is not None else 1,
            int(m.group(3)),
            int(m.group(4)) if m.group(4) is not None else 1,
        )
        header_line = i + 1
        i += 1
        n_old = n_new = 0
        while i < len(lines) and (n_old < h.old_len or n_new < h.new_len or lines[i].startswith("\\")):
            line = lines[i]
            if line.startswith("\\"):
                if not h.lines:
                    raise DiffError(f"line {i + 1}: 'No newline' marker without a preceding line")
                tag, text = h.lines[-1]
                h.lines[-1] = (tag, text[:-1] if text.endswith("\n") else text)
                i += 1
                continue
            tag = line[:1]
            if tag not in (" ", "-", "+"):
                if line == "":
                    tag = " "  # some tools strip the space of empty context lines
                else:
                    raise DiffError(f"line {i + 1}: hunk at line {header_line} has a bad line {line[:60]!r}")
            h.lines.append((tag, line[1:] + "\n"))
            if tag in (" ", "-"):
                n_old += 1
            if tag in (" ", "+"):
                n_new += 1
            i += 1
        if n_old != h.old_len or n_new != h.new_len:
            raise DiffError(
                f"hunk at line {header_line} is truncated or miscounted: header says -{h.old_len} +{h.new_len}, "
                f"body has -{n_old} +{n_new}"
            )
        hunks.append(h)
    return hunks


def apply_unified_diff(original: str, diff: str) -> str:
    """Apply ``diff`` to ``original`` exactly (no fuzz, no offset); raise DiffError otherwise."""
    src = _split_lines(original)
    out: list[str] = []
    pos = 0  # index into src of the next line not yet copied
    for n, h in enumerate(_parse_diff(diff), 1):
        start = h.old_start - 1 if h.old_len > 0 else h.old_start
        if start < pos:
            raise DiffError(f"hunk {n} (@@ -{h.old_start}) overlaps the previous hunk")
        if start > len(src):
            raise DiffError(f"hunk {n} starts at line {h.old_start} but the file has {len(src)} lines")
        out.extend(src[pos:start])
        pos = start
        for tag, text in h.lines:
            if tag in (" ", "-"):
                if pos >= len(src) or src[pos] != text:
                    got = src[pos] if pos < len(src) else "<end of file>"
                    raise DiffError(
                        f"hunk {n} (@@ -{h.old_start},{h.old_len}) does not match line {pos + 1}: "
                        f"expected {text!r}, found {got!r}"
                    )
                pos += 1
            if tag in (" ", "+"):
                out.append(text)
    out.extend(src[pos:])
    return "".join(out)


def reverse_unified_diff(diff: str) -> str:
    """The inverse diff (old and new swapped), used to rebuild the pristine text from a full copy."""
    out: list[str] = []
    for line in diff.split("\n"):
        m = _HUNK.match(line)
        if line.startswith("--- "):
            out.append("+++ " + line[4:])
        elif line.startswith("+++ "):
            out.append("--- " + line[4:])
        elif m:
            old = m.group(1) + ("," + m.group(2) if m.group(2) is not None else "")
            new = m.group(3) + ("," + m.group(4) if m.group(4) is not None else "")
            out.append(f"@@ -{new} +{old} @@" + line[m.end():])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        elif line.startswith("+"):
            out.append("-" + line[1:])
        else:
            out.append(line)
    # header lines were swapped in place; put '---' before '+++' again
    for i in range(len(out) - 1):
        if out[i].startswith("+++ ") and out[i + 1].startswith("--- "):
            out[i], out[i + 1] = out[i + 1], out[i]
    return "\n".join(out)


def flatten_target(target: str) -> str:
    """``sglang/srt/x.py`` -> ``sglang__srt__x.py.diff``: one flat, readable diffs/ folder."""
    return target.replace("/", "__") + ".diff"


# --------------------------------------------------------------------------- collection


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


class _Pristine:
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


def _skip(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return (
        not parts
        or parts[0] == ".."
        or parts[0].endswith(".dist-info")
        or "__pycache__" in parts
        or path.endswith((".pyc", ".pyo"))
    )


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
    site: Path | None = None
    if spec.get("site_packages") is not None:
        site = _resolve(base_dir, spec["site_packages"], "site_packages")
    elif dist_name:
        site = _site_packages_of(dist_name, python)

    version: str | None = None
    record: dict[str, str | None] = {}
    record_text: str | None = None
    if dist_name and site is not None:
        try:
            dist_info = find_dist_info(site, dist_name)
        except PatchError:
            from .sourcetree import legacy_egg_info  # ``setup.py develop``: an .egg-link and an .egg-info

            found = legacy_egg_info(site, dist_name)
            if found is None:
                raise
            dist_info = found
        meta_file = dist_info / "METADATA" if (dist_info / "METADATA").is_file() else dist_info / "PKG-INFO"
        _n, version = read_metadata(meta_file)
        if (dist_info / "RECORD").is_file():
            record = read_record(dist_info)
            record_text = (dist_info / "RECORD").read_text(encoding="utf-8")

    if version is None and isinstance(spec.get("version"), str):
        version = spec["version"]
    if "files" in spec:
        return _collect_files(spec["files"], base_dir, dist_name, version, record_text)
    if not dist_name or site is None:
        raise PatchError("patches: give either `distribution:` (with `pristine:`) or a `files:` list")
    prefix = spec.get("pristine_prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise PatchError(f"patches: pristine_prefix must be a string, got {prefix!r}")
    from .sourcetree import collect_source_install  # editable and from-source installs (PEP 610/660)

    given = _resolve(base_dir, spec["pristine"], "pristine") if "pristine" in spec else None
    from_source = collect_source_install(site, dist_info, dist_name, version, record, given, prefix)
    if from_source is not None:
        return from_source
    if "pristine" not in spec:
        raise PatchError(
            f"patches: `pristine:` is required with distribution {dist_name!r}: a wheel, a directory or a git "
            "checkout of the unmodified version, so the package can hold diffs (an editable or from-source "
            "install of a git checkout needs none: its HEAD is the pristine)"
        )
    pristine = _Pristine(_resolve(base_dir, spec["pristine"], "pristine"), prefix)
    warnings: list[str] = []
    files: list[PatchedFile] = []
    try:
        for path, digest in sorted(record.items()):
            if _skip(path) or digest is None:
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
        for top in _top_level_dirs(record):
            root = site / top
            if not root.is_dir():
                continue
            for p in sorted(root.rglob("*")):
                rel = p.relative_to(site).as_posix()
                if p.is_file() and not p.is_symlink() and rel not in record and not _skip(rel):
                    files.append(PatchedFile(rel, p.read_bytes(), None, "added"))
    finally:
        pristine.close()
    return distribution_patch_set(dist_name, version, record_text, pristine.kind, pristine.path.name, files, warnings)


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
