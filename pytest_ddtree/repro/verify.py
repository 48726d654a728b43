"""Verify a reproduction package: the checks run right after writing and on the next machine.

Why these checks: a package is only worth something if it is intact and self-consistent
when someone needs it months later.  So: the manifest matches every file (and lists every
file); every .py parses; every diff, applied in reverse to its full copy, gives a file
whose sha256 is the recorded pristine hash (the RECORD hash of the install), and applied
forward to that gives the full copy again, so diffs and full copies cannot drift apart;
every path the deploy script touches is in the recorded layout; the scripts parse.
With ``site_packages`` it also checks the target install (version, each file pristine or
already patched, and each diff applied to the real file gives the full copy).
Environment differences with the recorded machine are reported apart from problems:
another driver is worth knowing, not a broken package.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from pytest_ddtree.repro import layout
from pytest_ddtree.repro.diffs import DiffError, apply_unified_diff, reverse_unified_diff
from pytest_ddtree.repro.patchset import (
    MAX_FILE_BYTES,
    MAX_PY_BYTES,
    PatchError,
    check_target_path,
    non_regular_problem,
    python_problem,
    read_regular,
    find_dist_info,
    read_metadata,
    record_hash_to_hex,
    sha256_bytes,
    sha256_file,
)

__all__ = ["VerifyReport", "verify_package", "write_manifest", "compare_env", "check_manifest"]

_MANIFEST_LINE = re.compile(r"^([0-9a-f]{64})  (.+)$")


@dataclass
class VerifyReport:
    """Problems make a package fail; differences (environment) and notes are informational."""

    path: Path
    problems: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        """Text for the terminal: verdict first, then problems, differences and notes."""
        lines = [f"{'OK' if self.ok else 'FAILED'}: {self.path}"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  difference: {d}" for d in self.differences]
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def _walk(root: Path) -> tuple[list[str], list[str]]:
    """(regular files, problems) of the package tree, never following a link or opening a file:
    a symlink, FIFO, device or socket is a problem, not a file to read (a FIFO blocks a reader
    for ever, ``-> /dev/zero`` never ends)."""
    import os
    import stat

    files: list[str] = []
    problems: list[str] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in sorted([*dirs, *names]):
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            if stat.S_ISLNK(mode):
                problems.append(f"{rel}: a symbolic link (a package holds regular files only)")
            elif not stat.S_ISREG(mode):
                problems.append(f"{rel}: not a regular file (a FIFO, device or socket: a package holds regular files only)")
            elif rel != layout.MANIFEST:
                files.append(rel)
    return sorted(files), problems


def _package_files(root: Path) -> list[str]:
    return _walk(root)[0]


def write_manifest(root: Path) -> None:
    """Write MANIFEST.sha256 last: sorted ``<sha256>  <path>`` lines (sha256sum -c --strict)."""
    lines = []
    for rel in _package_files(root):
        if "\n" in rel or "\\" in rel:
            raise ValueError(f"package file name {rel!r} cannot be listed in a sha256sum manifest")
        lines.append(f"{sha256_file(root / rel)}  {rel}\n")
    (root / layout.MANIFEST).write_text("".join(lines), encoding="utf-8")


def check_manifest(root: Path) -> list[str]:
    """Problems with MANIFEST.sha256: unparsable, unsorted, a hash mismatch, a file missing or unlisted."""
    try:
        text = read_regular(root, layout.MANIFEST, MAX_PY_BYTES).decode("utf-8", "replace")
    except PatchError as exc:
        return [str(exc) if not str(exc).endswith(": missing") else f"{layout.MANIFEST} is missing"]
    walked, problems = _walk(root)  # a link, FIFO or device anywhere fails the package
    listed: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _MANIFEST_LINE.match(line)
        if not m:
            problems.append(f"{layout.MANIFEST} line {n} is not '<sha256>  <path>': {line[:80]!r}")
            continue
        digest, rel = m.groups()
        listed.append(rel)
        p = root / rel
        if check_target_path(rel) is not None:
            problems.append(f"{layout.MANIFEST} line {n}: unsafe path {rel!r}")
        elif (why := non_regular_problem(root, rel)) is not None:
            problems.append(why if not why.endswith(": missing") else f"{rel}: listed in {layout.MANIFEST} but missing")
        elif p.lstat().st_size > MAX_FILE_BYTES:
            problems.append(f"{rel}: {p.lstat().st_size:,} bytes, over the {MAX_FILE_BYTES:,} a package file may have")
        elif sha256_file(p) != digest:
            problems.append(f"{rel}: sha256 does not match {layout.MANIFEST} (the file changed after packaging)")
    if listed != sorted(listed):
        problems.append(f"{layout.MANIFEST} is not sorted by path")
    if len(set(listed)) != len(listed):
        problems.append(f"{layout.MANIFEST} lists a path twice")
    for rel in sorted(set(walked) - set(listed)):
        problems.append(f"{rel}: present but not listed in {layout.MANIFEST} (added after packaging?)")
    return problems


def _read_small(root: Path, rel: str) -> str:
    """A small text file of the package, or "" when it is missing or not a regular file (check_manifest says which)."""
    try:
        return read_regular(root, rel, MAX_PY_BYTES).decode("utf-8", "replace")
    except PatchError:
        return ""


def _load_json(root: Path, rel: str, problems: list[str]) -> Any:
    try:
        return json.loads(read_regular(root, rel, MAX_PY_BYTES))
    except (OSError, ValueError, PatchError, RecursionError) as exc:
        problems.append(f"{rel}: cannot be read as JSON ({exc})")
        return None


def _read_tsv(root: Path) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for line in read_regular(root, layout.PATCHES_TSV, MAX_PY_BYTES).decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        cols = line.split("\t") + ["", ""]
        rows.append((cols[0], cols[1], cols[2]))
    return rows


def _record_layout(root: Path) -> tuple[dict[str, str | None], set[str]] | None:
    try:
        text = read_regular(root, layout.PATCHES_RECORD, MAX_PY_BYTES).decode("utf-8", "replace")
    except PatchError:  # missing (or not a regular file: check_manifest says so)
        return None
    import csv

    hashes: dict[str, str | None] = {}
    for row in csv.reader(text.splitlines()):
        if row:
            hashes[row[0]] = record_hash_to_hex(row[1]) if len(row) > 1 and row[1] else None
    tops = {PurePosixPath(p).parts[0] for p in hashes if len(PurePosixPath(p).parts) > 1}
    return hashes, tops


def _check_patches(root: Path, problems: list[str], notes: list[str]) -> list[dict[str, Any]]:
    meta = _load_json(root, layout.PATCHES_JSON, problems)
    if not isinstance(meta, dict):
        return []
    entries: list[dict[str, Any]] = [e for e in meta.get("files", []) if isinstance(e, dict)]
    recorded = _record_layout(root)
    if meta.get("mode") == "distribution" and recorded is None:
        problems.append(f"{layout.PATCHES_RECORD} is missing: the recorded layout of {meta.get('distribution')}")
    dist_text = _read_small(root, layout.PATCHES_DIST)
    want_dist = f"name={meta.get('distribution') or ''}\nversion={meta.get('version') or ''}\n"
    if dist_text != want_dist:
        problems.append(f"{layout.PATCHES_DIST} does not match {layout.PATCHES_JSON} (distribution/version)")
    try:
        tsv = _read_tsv(root)
    except (OSError, PatchError) as exc:
        problems.append(f"{layout.PATCHES_TSV}: {exc}")
        tsv = []
    want_tsv = [(e.get("target"), e.get("pristine_sha256") or "-", e.get("patched_sha256")) for e in entries]
    if tsv != want_tsv:
        problems.append(f"{layout.PATCHES_TSV} (what deploy_patches.sh reads) does not match {layout.PATCHES_JSON}")
    for e in entries:
        target = str(e.get("target"))
        why = check_target_path(target)
        if why:
            problems.append(f"{layout.PATCHES_JSON}: {why}")
            continue
        try:
            data = read_regular(root, f"{layout.PATCHES_FULL}/{target}")
        except PatchError as exc:
            problems.append(f"{exc} (deploy would copy it)")
            continue
        if sha256_bytes(data) != e.get("patched_sha256"):
            problems.append(f"{layout.PATCHES_FULL}/{target}: sha256 differs from the recorded patched_sha256")
        if recorded is not None:
            hashes, tops = recorded
            if e.get("status") == "modified":
                if target not in hashes:
                    problems.append(f"{target}: deploy touches it but it is not in the recorded layout ({layout.PATCHES_RECORD})")
                elif hashes[target] != e.get("pristine_sha256"):
                    problems.append(f"{target}: pristine_sha256 differs from the RECORD hash of the recorded install")
            elif PurePosixPath(target).parts[0] not in tops:
                problems.append(f"{target}: new file outside the distribution's top-level packages {sorted(tops)}")
        diff_rel = e.get("diff")
        if diff_rel is None:
            if target.endswith(".py"):
                problems.append(f"{target}: a .py file without a diff")
            continue
        try:
            diff = read_regular(root, str(diff_rel)).decode("utf-8")
            new = data.decode("utf-8")
            old = apply_unified_diff(new, reverse_unified_diff(diff))
            if e.get("pristine_sha256") is None:
                if old:
                    raise DiffError("a new file's diff must rebuild an empty pristine")
            elif sha256_bytes(old.encode("utf-8")) != e.get("pristine_sha256"):
                raise DiffError("reversing it on the full copy does not give the recorded pristine file")
            if apply_unified_diff(old, diff) != new:
                raise DiffError("applying it to the pristine file does not give the full copy")
        except PatchError as exc:
            problems.append(str(exc))
        except (DiffError, UnicodeDecodeError) as exc:
            problems.append(f"{diff_rel}: corrupt or inconsistent diff for {target}: {exc}")
    notes.append(f"patches: {len(entries)} file(s) checked (diff <-> full copy <-> pristine hash)")
    return entries


def _check_site(root: Path, site: Path, entries: list[dict[str, Any]], problems: list[str], notes: list[str]) -> None:
    dist_text = _read_small(root, layout.PATCHES_DIST)
    kv = dict(line.split("=", 1) for line in dist_text.splitlines() if "=" in line)
    if kv.get("name"):
        try:
            _name, version = read_metadata(find_dist_info(site, kv["name"]) / "METADATA")
        except PatchError as exc:
            problems.append(f"site-packages: {exc}")
            return
        if version != kv.get("version"):
            problems.append(
                f"site-packages: {kv['name']} {version} is installed but the package records {kv.get('version')}; "
                "deploy would refuse"
            )
    states: dict[str, int] = {"pristine": 0, "patched": 0}
    for e in entries:
        target = str(e.get("target"))
        dest = site / target
        if not dest.is_file():
            if e.get("pristine_sha256") is not None:
                problems.append(f"site-packages: {target} is missing; the recorded layout expects it")
            elif not dest.parent.is_dir():
                problems.append(f"site-packages: directory of new file {target} is missing")
            else:
                states["pristine"] += 1
            continue
        digest = sha256_file(dest)
        if digest == e.get("patched_sha256"):
            states["patched"] += 1
        elif digest == e.get("pristine_sha256"):
            states["pristine"] += 1
            if e.get("diff"):
                try:
                    got = apply_unified_diff(dest.read_text(encoding="utf-8"), read_regular(root, str(e["diff"])).decode("utf-8"))
                    if got.encode("utf-8") != read_regular(root, f"{layout.PATCHES_FULL}/{target}"):
                        problems.append(f"{e['diff']}: applied to {dest} it does not give the full copy")
                except (DiffError, OSError, UnicodeDecodeError, PatchError) as exc:
                    problems.append(f"{e['diff']}: does not apply to {dest}: {exc}")
        else:
            problems.append(f"site-packages: {target} is neither the pristine nor the patched version; deploy would refuse")
    notes.append(f"site-packages {site}: {states['pristine']} file(s) pristine, {states['patched']} already patched")


def _check_scripts(root: Path, problems: list[str]) -> None:
    bash = shutil.which("bash")
    for script in layout.SCRIPTS:
        p = root / script
        if non_regular_problem(root, script) is not None:  # missing, or a link/FIFO: check_manifest says so
            continue
        if bash:
            proc = subprocess.run([bash, "-n", str(p)], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                problems.append(f"{script}: bash -n fails: {proc.stderr.strip()[:200]}")


def verify_package(path: Path, site_packages: Path | None = None) -> VerifyReport:
    """Run every package check; never raises for a broken package (problems say what is wrong)."""
    root = Path(path)
    report = VerifyReport(root)
    if not root.is_dir():
        report.problems.append(f"{root} is not a directory")
        return report
    files, _ = _walk(root)  # its problems are check_manifest's
    for rel in layout.REQUIRED:
        present = non_regular_problem(root, rel) is None if rel == layout.MANIFEST else rel in files
        if not present:
            report.problems.append(f"{rel}: missing (every package has it)")
    report.problems += check_manifest(root)
    npy = 0
    for rel in (f for f in files if f.endswith(".py")):
        npy += 1
        try:
            problem = python_problem(read_regular(root, rel, MAX_PY_BYTES), rel)
        except PatchError as exc:
            problem = str(exc)
        if problem:
            report.problems.append(problem)
    report.notes.append(f"python: {npy} .py file(s) parse")
    entries: list[dict[str, Any]] = []
    if layout.PATCHES_JSON in files and layout.PATCHES_TSV in files:
        entries = _check_patches(root, report.problems, report.notes)
    _check_scripts(root, report.problems)
    if site_packages is not None:
        _check_site(root, Path(site_packages), entries, report.problems, report.notes)
    return report


def _versions(freeze: list[str]) -> dict[str, str]:
    out = {}
    for line in freeze:
        # pip freeze annotates editable installs with a comment that contains "name==version"
        if "==" in line and not line.lstrip().startswith("#"):
            name, _, ver = line.partition("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = ver.strip()
    return out


def compare_env(recorded: Mapping[str, Any], current: Mapping[str, Any], packages: bool = True) -> list[str]:
    """Human-readable differences between a recorded and a current env snapshot."""
    diffs: list[str] = []

    def cmp(label: str, a: Any, b: Any) -> None:
        if a != b:
            diffs.append(f"{label}: recorded {a!r}, here {b!r}")

    rn, cn = recorded.get("nvml", {}), current.get("nvml", {})
    cmp("NVIDIA driver", rn.get("driver_version"), cn.get("driver_version"))
    cmp("CUDA driver version", rn.get("cuda_driver_version"), cn.get("cuda_driver_version"))
    rg = [(g.get("name"), g.get("memory_total_bytes")) for g in rn.get("gpus", [])]
    cg = [(g.get("name"), g.get("memory_total_bytes")) for g in cn.get("gpus", [])]
    cmp("GPU count", len(rg), len(cg))
    cmp("GPU models", sorted({n for n, _ in rg}), sorted({n for n, _ in cg}))
    cmp("CUDA toolkit", recorded.get("cuda_toolkit"), current.get("cuda_toolkit"))
    cmp("Python", recorded.get("python", {}).get("version"), current.get("python", {}).get("version"))
    cmp("kernel", recorded.get("os", {}).get("kernel"), current.get("os", {}).get("kernel"))
    if packages and recorded.get("packages") and current.get("packages"):
        rv = _versions(recorded["packages"].get("freeze", []))
        cv = _versions(current["packages"].get("freeze", []))
        for name in sorted(set(rv) | set(cv)):
            if rv.get(name) != cv.get(name):
                diffs.append(f"package {name}: recorded {rv.get(name) or 'absent'}, here {cv.get(name) or 'absent'}")
    return diffs
