"""Patched files of an engine installed from source: editable (``pip install -e``) or built from a
local checkout (``pip install ./python``).

Why: a DDTree fork is installed from its source tree, and a wheel-style ``RECORD`` then says
nothing useful. An editable install's RECORD lists only the hook that points at the tree
(a PEP 660 finder, an ``__editable__`` ``.pth`` or a legacy ``.egg-link``), so the patched files
are in the source tree, and a from-source build's RECORD hashes the *patched* files, so comparing
with it finds nothing. Both are found here, from what pip records:

* PEP 610 ``direct_url.json`` in the dist-info: where the source tree is, and whether the install
  is editable;
* for an editable install, the package directories: the PEP 660 finder's ``MAPPING``, the
  ``__editable__*.pth`` path lines, an ``<name>.egg-link``, else the ``direct_url`` folder
  (and its ``python/`` or ``src/``, where SGLang and others keep the package);
* the pristine text: the git checkout's ``HEAD`` (``git diff HEAD`` and untracked files give the
  patched and the added files), or the profile's ``pristine:`` when given.

The package's ``RECORD`` for such an install is written from the pristine tree (path, sha256,
size of each file at ``HEAD``), so the verifier's layout checks hold as for a wheel install.
"""

from __future__ import annotations

import ast
import base64
import csv
import io
import json
import subprocess
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlparse

from pytest_ddtree.repro.patchset import (
    PatchedFile,
    PatchError,
    PatchSet,
    Pristine,
    distribution_patch_set,
    ignored_record_path,
    normalize_dist_name,
    read_metadata,
    sha256_bytes,
)

__all__ = ["direct_url", "editable_package_dirs", "collect_source_install", "legacy_egg_info"]


def direct_url(dist_info: Path) -> dict[str, Any] | None:
    """The PEP 610 record of where the distribution was installed from (None: from an index)."""
    path = dist_info / "direct_url.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _source_dir(info: Mapping[str, Any]) -> Path | None:
    url = urlparse(str(info.get("url", "")))
    return Path(unquote(url.path)) if url.scheme == "file" and "dir_info" in info else None


def _top_level_names(dist_info: Path, distribution: str) -> list[str]:
    top = dist_info / "top_level.txt"
    if top.is_file():
        names = [ln.strip() for ln in top.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if names:
            return names
    return [normalize_dist_name(distribution).replace("-", "_")]


def _finder_mapping(path: Path) -> dict[str, str]:
    """``MAPPING = {...}`` of a setuptools PEP 660 finder module, read without importing it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MAPPING" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            if isinstance(value, dict):
                return {str(k): str(v) for k, v in value.items()}
    return {}


def editable_package_dirs(site: Path, dist_info: Path, distribution: str, record: Mapping[str, Any]) -> dict[str, Path]:
    """Top-level package name -> its directory in the source tree, for an editable install."""
    found: dict[str, Path] = {}
    roots: list[Path] = []
    for rel in record:
        name = Path(rel).name
        if name.startswith("__editable__") and name.endswith("_finder.py"):
            found.update({k: Path(v) for k, v in _finder_mapping(site / rel).items() if "." not in k})
        elif name.startswith("__editable__") and name.endswith(".pth") and (site / rel).is_file():
            for line in (site / rel).read_text(encoding="utf-8").splitlines():
                if line.strip() and not line.startswith(("import ", "#")) and Path(line.strip()).is_dir():
                    roots.append(Path(line.strip()))
    want = normalize_dist_name(distribution)
    for link in sorted(site.glob("*.egg-link")):
        if normalize_dist_name(link.stem) == want:
            first = link.read_text(encoding="utf-8").splitlines()[:1]
            if first and first[0].strip():
                roots.append(Path(first[0].strip()))
    info = direct_url(dist_info)
    source = _source_dir(info) if info else None
    if source is not None:
        roots += [source, source / "src", source / "python"]
    if dist_info.name.endswith(".egg-info"):  # setup.py develop: the metadata sits in the source root
        roots.append(dist_info.parent)
    if not found:
        for name in _top_level_names(dist_info, distribution):
            for root in roots:
                if (root / name).is_dir():
                    found[name] = (root / name).resolve()
                    break
    return found


def legacy_egg_info(site: Path, distribution: str) -> Path | None:
    """The ``*.egg-info`` of a legacy editable install (``setup.py develop``): reached through
    ``<site>/<name>.egg-link`` (its first line is the source root), or ``site`` is that root."""
    want = normalize_dist_name(distribution)
    roots = [site]
    for link in sorted(site.glob("*.egg-link")):
        first = link.read_text(encoding="utf-8").splitlines()[:1]
        if normalize_dist_name(link.stem) == want and first and first[0].strip():
            roots.insert(0, Path(first[0].strip()))
    for root in roots:
        for egg in sorted(root.glob("*.egg-info")):
            if (egg / "PKG-INFO").is_file() and normalize_dist_name(read_metadata(egg / "PKG-INFO")[0] or "") == want:
                return egg
    return None


def _git(repo: Path, *args: str) -> bytes:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if proc.returncode != 0:
        raise PatchError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def _git_toplevel(path: Path) -> Path | None:
    proc = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False)
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


def _record_text(rows: Mapping[str, bytes]) -> str:
    """A wheel-style RECORD (path, sha256 in urlsafe base64, size) of the pristine files."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for target, data in sorted(rows.items()):
        digest = base64.urlsafe_b64encode(bytes.fromhex(sha256_bytes(data))).rstrip(b"=").decode()
        writer.writerow([target, f"sha256={digest}", len(data)])
    return out.getvalue()


def _git_tree_patches(package: str, pkg_dir: Path, files: list[PatchedFile], pristine_rows: dict[str, bytes], warnings: list[str]) -> str:
    repo = _git_toplevel(pkg_dir)
    if repo is None:
        raise PatchError(
            f"the editable install of {package} lives in {pkg_dir}, which is not a git checkout; give `pristine:` "
            "(a wheel, a directory or a git checkout of the unmodified version) in the profile's patches section"
        )
    repo, pkg_dir = repo.resolve(), pkg_dir.resolve()
    import_root = pkg_dir.parent
    rel_pkg = pkg_dir.relative_to(repo).as_posix()

    def target_of(repo_rel: str) -> str:
        return (repo / repo_rel).resolve().relative_to(import_root).as_posix()

    tracked = [p for p in _git(repo, "ls-files", "-z", "--", rel_pkg).decode().split("\0") if p]
    changed = {p for p in _git(repo, "diff", "--name-only", "-z", "HEAD", "--", rel_pkg).decode().split("\0") if p}
    untracked = [p for p in _git(repo, "ls-files", "-z", "--others", "--exclude-standard", "--", rel_pkg).decode().split("\0") if p]
    for repo_rel in tracked:
        target = target_of(repo_rel)
        if ignored_record_path(target):
            continue
        working = repo / repo_rel
        if repo_rel not in changed:
            if working.is_file():
                pristine_rows[target] = working.read_bytes()
            continue
        original = _git(repo, "show", f"HEAD:{repo_rel}")
        pristine_rows[target] = original
        if not working.is_file():
            warnings.append(f"{target}: deleted in the source tree {repo} (deleted files are not packaged)")
            continue
        files.append(PatchedFile(target, working.read_bytes(), original, "modified"))
    for repo_rel in untracked:
        target = target_of(repo_rel)
        if not ignored_record_path(target) and (repo / repo_rel).is_file():
            files.append(PatchedFile(target, (repo / repo_rel).read_bytes(), None, "added"))
    return repo.name


def collect_source_install(
    site: Path, dist_info: Path, distribution: str, version: str | None, record: Mapping[str, str | None],
    pristine_path: Path | None, pristine_prefix: str | None,
) -> PatchSet | None:
    """The PatchSet of an editable or from-source install; None for an install from an index or
    a wheel file (the RECORD-hash path in ``patches.collect_patches`` handles those)."""
    info = direct_url(dist_info)
    editable = dist_info.name.endswith(".egg-info") or bool(
        info and isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable"))
    pkg_dirs = editable_package_dirs(site, dist_info, distribution, record) if editable or info is None else {}
    source = _source_dir(info) if info else None
    if not pkg_dirs and source is None:
        return None  # an install from an index or a wheel file
    files: list[PatchedFile] = []
    warnings: list[str] = []
    pristine_rows: dict[str, bytes] = {}
    if pkg_dirs and pristine_path is None:
        names = [_git_tree_patches(name, d, files, pristine_rows, warnings) for name, d in sorted(pkg_dirs.items())]
        pristine_kind, pristine_name = "git", names[0]
    else:
        # Compare the installed (or, editable, the source tree's) files with the pristine copy byte
        # for byte: a from-source build's RECORD hashes the patched files, so it cannot be used.
        if pristine_path is None:
            top = _git_toplevel(source) if source is not None else None
            if top is None:
                raise PatchError(
                    f"{distribution} was installed from {source}, which is not a git checkout; give `pristine:` "
                    "(a wheel, a directory or a git checkout of the unmodified version) in the profile's patches section"
                )
            pristine_path = top
        pristine = Pristine(pristine_path, pristine_prefix)
        try:
            if pkg_dirs:
                installed = {p.relative_to(d.parent).as_posix(): p for d in pkg_dirs.values() for p in sorted(d.rglob("*")) if p.is_file()}
            else:
                installed = {rel: site / rel for rel in record if (site / rel).is_file()}
            for target, path in sorted(installed.items()):
                if ignored_record_path(target) or target.split("/")[0].endswith((".dist-info", ".data")) or target.startswith("__editable__"):
                    continue
                data = path.read_bytes()
                original = pristine.read(target)
                if original is not None:
                    pristine_rows[target] = original
                if original is None:
                    files.append(PatchedFile(target, data, None, "added"))
                elif original != data:
                    files.append(PatchedFile(target, data, original, "modified"))
        finally:
            pristine.close()
        pristine_kind, pristine_name = pristine.kind, pristine.path.name
    return distribution_patch_set(distribution, version, _record_text(pristine_rows), pristine_kind, pristine_name, files, warnings)
