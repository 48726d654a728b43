"""Write a reproduction package from what a session ran, verify it, then publish it.

Why a pure function: the plugin calls :func:`write_package` once at session end on the
xdist main process, after the tests; everything it needs is in a :class:`PackageRequest`, so
the writer is testable without pytest and reusable from scripts.  The package is written
to a temporary sibling directory, verified with the same checks as ``ddtree-repro verify``,
and only then renamed into place, so a half-written or unverifiable package never sits at
the final path and an existing package is replaced in one rename (``--ddtree-package-force``).

Determinism: the same inputs give byte-identical files except the one recorded timestamp
(``created`` in package.json, repeated in REPRODUCE.md), which honours SOURCE_DATE_EPOCH.
JSON is written with sorted keys, lists are sorted where order carries no meaning, and
no temporary path is written into the package.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_ddtree.repro import layout
from pytest_ddtree.repro.envsnap import NO_GPU, is_secret_name, render_env_text, snapshot_env
from pytest_ddtree.repro.patches import collect_patches
from pytest_ddtree.repro.patchset import PatchError, PatchSet, flatten_target, iter_diff_targets, sha256_bytes
from pytest_ddtree.repro.verify import VerifyReport, verify_package, write_manifest

if TYPE_CHECKING:  # the session's host-env records (the writer itself takes plain data)
    from pytest_ddtree.records.shapes import HostEnvData

__all__ = [
    "PackagedLaunch",
    "FailedTest",
    "PackageRequest",
    "PackageReport",
    "ReproError",
    "write_package",
    "check_package_dir_writable",
    "check_profile_patches",
    "default_package_name",
    "package_timestamp",
]


class ReproError(ValueError):
    """A usage problem with the package options (the plugin turns it into a usage error, exit 4)."""


@dataclass(frozen=True)
class PackagedLaunch:
    """How one configuration was started: the exact command, its environment, a systemd drop-in."""

    config: str
    command: str | None
    env: Mapping[str, str] = field(default_factory=dict)
    dropin: str | None = None  # the systemd drop-in text the harness wrote for this config
    job_script: str | None = None  # the slurm batch script the harness submitted for this config
    slurm_version: str | None = None  # `sbatch --version` where it was submitted


@dataclass(frozen=True)
class FailedTest:
    """A test that did not pass, so REPRODUCE.md can say the package records a failing session."""

    nodeid: str
    reason: str = ""


@dataclass(frozen=True)
class PackageRequest:
    """Everything the writer needs; the plugin fills it from the session.

    ``profile`` is the ServiceProfile (a dataclass) or its mapping; only ``name``,
    ``description``, ``controller``, ``unit``, ``patches`` and ``draft_model_path`` are
    read.  ``profile_path`` resolves relative paths in the patches section and
    ``profile_text`` is copied verbatim (the mapping is dumped when it is None).
    """

    out_dir: Path
    profile: Any
    name: str | None = None
    force: bool = False
    profile_path: Path | None = None
    profile_text: str | None = None
    launches: Sequence[PackagedLaunch] = ()
    systemd_unit_text: str | None = None  # `systemctl cat <unit>` of the base unit
    results_dir: Path | None = None
    matrix: Sequence[str] = ()
    default_config: str | None = None
    recommended_config: str | None = None
    configs_run: Sequence[str] = ()
    configs_yaml_text: str | None = None
    failed_tests: Sequence[FailedTest] = ()
    session_start: _dt.datetime | None = None
    exit_status: int | None = None
    command_line: str = "pytest suites"
    environ: Mapping[str, str] | None = None  # None: os.environ
    # Fleet sweeps: host -> {"snapshot": envsnap dict} or {"error": text}, plus "systemd_unit"
    # (`systemctl cat` there), taken over ssh on the hosts that ran the service; env/ then
    # describes the first of them, env/hosts/<host>/ each.
    host_envs: Mapping[str, HostEnvData] = field(default_factory=dict)


@dataclass
class PackageReport:
    """What happened: ``ok`` False means the session must exit non-zero with :meth:`summary`."""

    path: Path | None
    ok: bool
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    files: int = 0

    def summary(self) -> str:
        """One block of text for the terminal summary."""
        if self.ok:
            head = f"reproduction package written and verified: {self.path} ({self.files} files)"
        else:
            head = "reproduction package FAILED" + (f" (left for inspection at {self.path})" if self.path else "")
        lines = [head]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def package_timestamp(request_time: _dt.datetime | None = None) -> _dt.datetime:
    """The one recorded timestamp: SOURCE_DATE_EPOCH, else the session start, else now (UTC)."""
    sde = os.environ.get("SOURCE_DATE_EPOCH")
    if sde:
        try:
            return _dt.datetime.fromtimestamp(int(sde), tz=_dt.timezone.utc)
        except (ValueError, OverflowError, OSError):
            pass
    t = request_time or _dt.datetime.now(_dt.timezone.utc)
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.astimezone(_dt.timezone.utc).replace(microsecond=0)


def _drives_a_unit(prof: Mapping[str, Any]) -> bool:
    """Whether the profile's controller drives a unit whose text and drop-ins the package keeps
    (its kind's capability, service/kinds.py; an unknown name: no)."""
    from pytest_ddtree.service.kinds import kind_named

    try:
        return kind_named(str(prof.get("controller"))).capabilities.unit
    except KeyError:
        return False


def _profile_dict(profile: Any) -> dict[str, Any]:
    if profile is None:
        return {}
    if isinstance(profile, Mapping):
        return dict(profile)
    if dataclasses.is_dataclass(profile) and not isinstance(profile, type):
        return {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile)}
    keys = ("name", "description", "controller", "unit", "patches", "draft_model_path", "command", "python")
    return {k: getattr(profile, k) for k in keys if hasattr(profile, k)}


def _service_python(prof: Mapping[str, Any]) -> str | None:
    """The service's interpreter (profile ``python:``, else the command's Python): what env/
    freezes and where the patched distribution is looked up."""
    from pytest_ddtree.service.profile import resolve_service_python

    return resolve_service_python(prof.get("python"), prof.get("command"))


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith(".") or "\n" in name:
        raise ReproError(
            f"package name {name!r} is not a plain directory name; pass --ddtree-package-name with letters, "
            "digits, '-', '_' or '.'"
        )


def default_package_name(profile_name: str | None, when: _dt.datetime | None = None) -> str:
    """``<profile name>-<UTC date>``, e.g. ``k26-ddtree-20250102``."""
    stamp = package_timestamp(when).strftime("%Y%m%d")
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in (profile_name or "ddtree")).strip(".-") or "ddtree"
    return f"{base}-{stamp}"


def check_package_dir_writable(directory: Path, name: str | None = None, force: bool = False) -> None:
    """Fail early (at session start) when the package cannot be written at the end.

    Creates ``directory`` if needed and writes/removes a probe file.  With a ``name``, an
    existing package without ``force`` is refused too.  Raises ReproError with what to do.
    """
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".ddtree-write-probe-{os.getpid()}"
        probe.write_text("probe\n", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise ReproError(
            f"cannot create or write the directory {directory} ({exc.strerror or exc}); choose a writable directory"
        ) from None
    if name is not None:
        _check_name(name)
        if (directory / name).exists() and not force:
            raise ReproError(
                f"{directory / name} already exists; pass --ddtree-package-force to replace it "
                "or --ddtree-package-name to choose another name"
            )


def check_profile_patches(profile: Any, profile_path: Path | None = None) -> int:
    """Resolve the profile's ``patches`` section now (at session start) and return the file count.

    A typo in the patches section (wrong pristine path, distribution not installed, a
    pristine of another version) would otherwise surface only after a sweep of hours.
    Raises ReproError naming the problem.
    """
    prof = _profile_dict(profile)
    src = profile_path or prof.get("source")
    base = Path(src).resolve().parent if src else None
    try:
        return len(collect_patches(prof.get("patches"), base, python=_service_python(prof)).files)
    except PatchError as exc:
        raise ReproError(f"profile patches section: {exc}") from None


# --------------------------------------------------------------------------- writing


class _Tree:
    """Collects files (relative POSIX path -> bytes) and writes them; refuses duplicates."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths: set[str] = set()

    def put(self, rel: str, data: bytes | str, mode: int = 0o644) -> None:
        if rel in self.paths:
            raise RuntimeError(f"package file {rel} written twice")
        self.paths.add(rel)
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(p, mode)

    def json(self, rel: str, obj: Any) -> None:
        self.put(rel, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n")


def _write_host_envs(tree: _Tree, host_envs: Mapping[str, HostEnvData]) -> dict[str, Any] | None:
    """env/hosts/<host>/ for every fleet host; returns the first host's snapshot (or None)."""
    first: dict[str, Any] | None = None
    for host, entry in sorted(host_envs.items()):
        base = "env/hosts/" + re.sub(r"[^A-Za-z0-9_.@-]+", "_", host)
        if entry.get("systemd_unit"):  # `systemctl cat` there: each host's unit, also when they differ
            tree.put(f"{base}/systemctl-cat.txt", str(entry["systemd_unit"]))
        snap = entry.get("snapshot")
        if not isinstance(snap, Mapping):
            tree.put(f"{base}/ERROR.txt", f"no environment snapshot of {host}: {entry.get('error', 'unknown')}\n")
            continue
        first = first or dict(snap)
        tree.json(f"{base}/environment.json", snap)
        tree.put(f"{base}/environment.txt", render_env_text(snap))
        packages = snap.get("packages")
        freeze = packages.get("freeze") if isinstance(packages, Mapping) else None
        tree.put(f"{base}/pip-freeze.txt", "".join(f"{ln}\n" for ln in freeze or []))
    return first


def _write_env(tree: _Tree, req: PackageRequest, python: str | None) -> dict[str, Any]:
    # A fleet's service ran on its hosts: describe them, not the machine that ran pytest.
    snap = _write_host_envs(tree, req.host_envs) or snapshot_env(req.environ, python=python)
    pk = snap.get("packages") or {"source": "none", "freeze": []}
    freeze: list[str] = pk["freeze"]
    tree.put(layout.ENV_FREEZE, "".join(f"{ln}\n" for ln in freeze))
    pinned = [ln for ln in freeze if "==" in ln and not ln.startswith("-e")]
    other = [ln for ln in freeze if ln not in pinned]
    tree.put(
        layout.ENV_REQUIREMENTS,
        "# pinned from the recorded machine's pip freeze; unpinned entries are commented out\n"
        + "".join(f"{ln}\n" for ln in pinned)
        + "".join(f"# {ln}\n" for ln in other),
    )
    topo = snap.get("nvidia_smi_topo")
    if topo:
        tree.put(layout.ENV_TOPO, topo)
    nv = snap["nvml"]
    gpus = nv.get("gpus") or []
    expected = {
        "PYTHON_VERSION": snap["python"]["version"],
        "DRIVER_VERSION": nv.get("driver_version") or "",
        "CUDA_DRIVER_VERSION": nv.get("cuda_driver_version") or "",
        "GPU_COUNT": str(len(gpus)) if nv.get("available") else "0",
        "GPU_NAME": gpus[0]["name"] if gpus else "",
    }
    tree.put(layout.ENV_EXPECTED, "".join(f"{k}={v}\n" for k, v in sorted(expected.items())))
    tree.json(layout.ENV_JSON, snap)
    tree.put(layout.ENV_TXT, render_env_text(snap))
    return snap


def _redact(env: Mapping[str, str]) -> dict[str, str]:
    return {k: ("<redacted>" if is_secret_name(k) else str(v)) for k, v in sorted(env.items())}


def _write_services(tree: _Tree, req: PackageRequest, prof: Mapping[str, Any]) -> list[str]:
    import yaml

    warnings: list[str] = []
    if req.profile_text is not None:
        text = req.profile_text
    else:
        text = yaml.safe_dump(_jsonable(prof), sort_keys=True, default_flow_style=False)
    tree.put("services/profile.yaml", text)
    launches = sorted(req.launches, key=lambda r: r.config)
    tree.json(
        "services/launch-commands.json",
        [{"config": r.config, "command": r.command, "env": _redact(r.env)} for r in launches],
    )
    lines = ["# The exact launch command of every configuration the session ran.",
             "# Secret-looking environment values are redacted.", ""]
    for r in launches:
        lines.append(f"## {r.config}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in _redact(r.env).items())
        lines.append(((f"env {env} ") if env else "") + (r.command or "(no command: controller did not start it)"))
        lines.append("")
    tree.put("services/launch-commands.txt", "\n".join(lines))
    if _drives_a_unit(prof):
        unit = str(prof.get("unit") or "service.service")
        if "/" in unit or unit.startswith("."):
            unit = unit.replace("/", "_").lstrip(".")
        if req.systemd_unit_text is not None:
            tree.put(f"services/systemd/{unit}", req.systemd_unit_text)
        else:
            warnings.append(f"systemd unit {unit}: its text was not provided; only the drop-ins are packaged")
        written: dict[str, str] = {}
        for r in launches:
            if r.dropin is None:
                continue
            rel = f"services/systemd/{unit}.d/ddtree-{r.config}.conf"
            n = 1
            while rel in written and written[rel] != r.dropin:
                n += 1
                rel = f"services/systemd/{unit}.d/ddtree-{r.config}-{n}.conf"
            if rel not in written:
                written[rel] = r.dropin
                tree.put(rel, r.dropin)
    _write_job_scripts(tree, launches)  # nothing without a scheduler's job script or version
    return warnings


def _write_job_scripts(tree: _Tree, launches: Sequence[PackagedLaunch]) -> None:
    """services/slurm/: each config's batch script as submitted (secret-looking exports
    redacted) and the Slurm version it was submitted to."""
    versions = sorted({r.slurm_version for r in launches if r.slurm_version})
    if versions:
        tree.put("services/slurm/slurm-version.txt", "".join(f"{v}\n" for v in versions))
    for r in launches:
        if r.job_script is None:
            continue
        text = re.sub(r"^(export ([A-Za-z_][A-Za-z0-9_]*)=).*$",
                      lambda m: m.group(1) + "'<redacted>'" if is_secret_name(m.group(2)) else m.group(0),
                      r.job_script, flags=re.M)
        tree.put(f"services/slurm/{r.config}.sbatch", text, mode=0o755)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _write_patches(tree: _Tree, ps: PatchSet) -> list[dict[str, Any]]:
    tree.put(layout.PATCHES_DIST, f"name={ps.distribution or ''}\nversion={ps.version or ''}\n")
    if ps.record_text is not None:
        tree.put(layout.PATCHES_RECORD, ps.record_text)
    clashes = iter_diff_targets(ps.files)
    if clashes:
        raise PatchError(f"patches: flattened diff names collide for {'; '.join(clashes)}")
    entries: list[dict[str, Any]] = []
    tsv = ["# target\tpristine_sha256 ('-': new file)\tpatched_sha256"]
    for f in ps.files:
        tree.put(f"{layout.PATCHES_FULL}/{f.target}", f.patched)
        diff = f.diff()
        diff_rel = None
        if diff is not None:
            diff_rel = f"{layout.PATCHES_DIFFS}/{flatten_target(f.target)}"
            tree.put(diff_rel, diff)
        pristine_sha = None if f.pristine is None else sha256_bytes(f.pristine)
        entries.append({
            "target": f.target,
            "status": f.status,
            "pristine_sha256": pristine_sha,
            "patched_sha256": sha256_bytes(f.patched),
            "full": f"{layout.PATCHES_FULL}/{f.target}",
            "diff": diff_rel,
        })
        tsv.append(f"{f.target}\t{pristine_sha or '-'}\t{sha256_bytes(f.patched)}")
    tree.put(layout.PATCHES_TSV, "\n".join(tsv) + "\n")
    tree.json(layout.PATCHES_JSON, {
        "mode": ps.mode,
        "distribution": ps.distribution,
        "version": ps.version,
        "pristine": {"kind": ps.pristine_kind, "name": ps.pristine_name},
        "files": entries,
    })
    return entries


_MAX_BENCH_FILE = 64 * 2**20  # service logs of a big model can be huge; the package must stay portable


def _write_bench(tree: _Tree, req: PackageRequest) -> tuple[str | None, list[str]]:
    rd = req.results_dir
    if rd is None or not Path(rd).is_dir():
        tree.put("bench/README.txt", "The session left no results directory.\n")
        return None, [f"no results directory ({rd}); bench/ is empty"] if rd is not None else []
    rd = Path(rd)
    out_root = Path(req.out_dir).resolve()
    md: str | None = None
    skipped: list[str] = []
    for p in sorted(rd.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        if out_root == p.resolve() or out_root in p.resolve().parents:
            continue  # never package the package
        rel = p.relative_to(rd).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        if p.stat().st_size > _MAX_BENCH_FILE:
            skipped.append(f"bench: {rel} skipped ({p.stat().st_size} bytes > {_MAX_BENCH_FILE})")
            continue
        data = p.read_bytes()
        tree.put(f"bench/{rel}", data)
        if rel == "results.md":
            md = data.decode("utf-8", "replace")
    warnings = [] if md is not None else [f"{rd} has no results.md; REPRODUCE.md has no sweep table"]
    return md, warnings + skipped


def _write_drafter(tree: _Tree, prof: Mapping[str, Any], base: Path | None) -> tuple[dict[str, Any], list[str]]:
    raw = prof.get("draft_model_path")
    if not raw:
        tree.json("drafter/metadata.json", {"readable": False, "reason": "the profile sets no draft_model_path"})
        return {}, []
    path = Path(str(raw)).expanduser()
    if not path.is_absolute() and base is not None and (base / path).exists():
        path = base / path
    meta: dict[str, Any] = {"path": str(raw)}
    cfg_file = path / "config.json"
    try:
        cfg_bytes = cfg_file.read_bytes()
        cfg = json.loads(cfg_bytes)
    except (OSError, ValueError) as exc:
        meta.update(readable=False, reason=f"cannot read {cfg_file}: {exc}")
        tree.json("drafter/metadata.json", meta)
        return meta, [f"drafter: {meta['reason']}"]
    tree.put("drafter/config.json", cfg_bytes)
    for extra in ("generation_config.json", "dflash_config.json"):
        if (path / extra).is_file():
            tree.put(f"drafter/{extra}", (path / extra).read_bytes())
    block = None
    for key in ("block_size", "dflash_block_size", "num_draft_tokens"):
        for src in (cfg, cfg.get("dflash_config") or {}, cfg.get("speculative_config") or {}):
            if isinstance(src, dict) and isinstance(src.get(key), int):
                block = src[key]
                break
        if block is not None:
            break
    archs = cfg.get("architectures")
    meta.update(
        readable=True,
        architecture=archs[0] if isinstance(archs, list) and archs else cfg.get("model_type"),
        model_type=cfg.get("model_type"),
        block_size=block,
        revision=_revision(path),
        weights=sorted(
            f"{p.name} ({p.stat().st_size} bytes)"
            for p in path.glob("*") if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file()
        ),
    )
    tree.json("drafter/metadata.json", meta)
    return meta, []


def _revision(path: Path) -> str | None:
    """The drafter's revision: a HF cache snapshot hash, a git HEAD, or a `revision` file."""
    parts = path.resolve().parts
    if len(parts) >= 2 and parts[-2] == "snapshots":
        return parts[-1]
    head = path / ".git" / "HEAD"
    try:
        text = head.read_text(encoding="utf-8").strip()
        if text.startswith("ref: "):
            ref = path / ".git" / text[5:]
            return ref.read_text(encoding="utf-8").strip() if ref.is_file() else text[5:]
        return text
    except OSError:
        pass
    for name in ("revision", "REVISION", ".revision"):
        if (path / name).is_file():
            return (path / name).read_text(encoding="utf-8").strip() or None
    return None


def _demote_headings(markdown: str) -> str:
    """Nest results.md's headings under REPRODUCE.md's "Sweep results" section (## -> ####)."""
    out = []
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        out.append("##" + line if not in_code and line.startswith("#") else line)
    return "\n".join(out)


def _tool_version() -> str:
    """pytest-ddtree's installed version (recorded so a package says what wrote it)."""
    import importlib.metadata as md

    try:
        return md.version("pytest-ddtree")
    except md.PackageNotFoundError:
        return "unknown"


def _render_reproduce(
    req: PackageRequest, name: str, created: str, prof: Mapping[str, Any], snap: Mapping[str, Any],
    ps: PatchSet, entries: Sequence[Mapping[str, Any]], sweep: str | None,
) -> str:
    tool_version = _tool_version()
    launches = {r.config: r for r in req.launches}
    rec = req.recommended_config or req.default_config
    rec_cmd = launches[rec].command if rec in launches and launches[rec].command else None
    if ps.mode == "none":
        patches_text = "The profile declares no patches; `deploy_patches.sh` has nothing to do."
    else:
        rows = ["| file | status | diff |", "| --- | --- | --- |"]
        rows += [f"| `{e['target']}` | {e['status']} | {('`' + e['diff'] + '`') if e['diff'] else 'binary: full copy only'} |"
                 for e in entries]
        src = f"{ps.distribution} {ps.version}" if ps.distribution else "an explicit file list"
        patches_text = f"{len(entries)} patched file(s) of {src} (pristine: {ps.pristine_kind}).\n\n" + "\n".join(rows)
    failed = sorted(req.failed_tests, key=lambda f: f.nodeid)
    if failed:
        failed_text = f"{len(failed)} test(s) failed in the recorded session:\n\n" + "\n".join(
            f"- `{f.nodeid}`" + (f": {f.reason.strip().splitlines()[0]}" if f.reason.strip() else "") for f in failed)
        outcome = f"{len(failed)} test(s) FAILED (listed under \"Failed tests\")."
    else:
        failed_text = "None."
        outcome = "all tests passed." if req.exit_status in (None, 0) else f"exit status {req.exit_status}."
    py_minor = ".".join(str(snap["python"]["version"]).split(".")[:2])
    values = {
        "name": name,
        "tool_version": tool_version,
        "created": created,
        "command_line": req.command_line,
        "profile_name": prof.get("name") or "?",
        "profile_description": f": {prof['description']}" if prof.get("description") else "",
        "outcome": outcome,
        "env_text": render_env_text(snap),
        "patches_text": patches_text,
        "dist_label": ps.distribution or "engine",
        "python_minor": py_minor,
        "systemd_hint": "; systemd units and drop-ins in `services/systemd/`" if _drives_a_unit(prof) else "",
        "recommended_command": rec_cmd or "(see services/launch-commands.txt)",
        "recommended": rec or "bs8_b8_k4",
        "sweep_table": _demote_headings(sweep.strip()) if sweep else "No results table was recorded (see `bench/`).",
        "recommended_text": (
            f"`{rec}`" + (f" (the matrix default is `{req.default_config}`)" if req.default_config and req.default_config != rec else "")
            if rec else "No recommendation was recorded."
        ),
        "failed_text": failed_text,
    }
    tmpl = (layout.kit_dir() / "REPRODUCE.md.in").read_text(encoding="utf-8")
    return string.Template(tmpl).substitute(values)


def _build(tmp: Path, req: PackageRequest, name: str, when: _dt.datetime) -> list[str]:
    tree = _Tree(tmp)
    prof = _profile_dict(req.profile)
    base = Path(req.profile_path).resolve().parent if req.profile_path else None
    warnings: list[str] = []
    created = when.strftime("%Y-%m-%dT%H:%M:%SZ")

    python = _service_python(prof)
    ps = collect_patches(prof.get("patches"), base, python=python)
    warnings += list(ps.warnings)
    entries = _write_patches(tree, ps)
    snap = _write_env(tree, req, python)
    if snap["python"].get("service_interpreter_error"):
        warnings.append(f"env: {snap['python']['service_interpreter_error']}; env/ holds the harness's interpreter instead")
    if not snap["nvml"].get("available"):
        warnings.append(f"env: {snap['nvml'].get('error') or NO_GPU}")
    warnings += _write_services(tree, req, prof)
    sweep, w = _write_bench(tree, req)
    warnings += w
    drafter, w = _write_drafter(tree, prof, base)
    warnings += w
    tree.json("configs/configs.json", {
        "matrix": list(req.matrix),
        "default": req.default_config,
        "recommended": req.recommended_config,
        "run": sorted(set(req.configs_run) | {r.config for r in req.launches}),
    })
    if req.configs_yaml_text is not None:
        tree.put("configs/configs.yaml", req.configs_yaml_text)
    for script in layout.SCRIPTS:
        tree.put(script, (layout.kit_dir() / script).read_bytes(), mode=0o755)
    tree.put(layout.REPRODUCE, _render_reproduce(req, name, created, prof, snap, ps, entries, sweep))
    tool_version = _tool_version()
    tree.json(layout.PACKAGE_JSON, {
        "format": layout.FORMAT_VERSION,
        "name": name,
        "created": created,
        "tool": f"pytest-ddtree {tool_version}",
        "profile": prof.get("name"),
        "command_line": req.command_line,
        "exit_status": req.exit_status,
        "failed_tests": [{"nodeid": f.nodeid, "reason": f.reason} for f in sorted(req.failed_tests, key=lambda f: f.nodeid)],
        "patches": {"mode": ps.mode, "distribution": ps.distribution, "version": ps.version, "files": len(entries)},
        "drafter": {k: drafter.get(k) for k in ("architecture", "block_size", "revision")} if drafter else None,
    })
    write_manifest(tmp)
    return warnings


def write_package(request: PackageRequest) -> PackageReport:
    """Write, verify and publish ``out_dir/<name>``; never raises for expected failures.

    Returns a report whose ``ok`` is False (with problems naming what and why) when the
    package exists and force is off, the patches section is unusable, a file cannot be
    written, or verification fails.  A package that fails verification is left at
    ``out_dir/<name>.rejected`` for inspection and never replaces an existing one.
    """
    out_dir = Path(request.out_dir)
    when = package_timestamp(request.session_start)
    prof = _profile_dict(request.profile)
    name = request.name or default_package_name(prof.get("name"), when)
    try:
        _check_name(name)
        check_package_dir_writable(out_dir)
    except ReproError as exc:
        return PackageReport(None, False, [str(exc)])
    final = out_dir / name
    if final.exists() and not request.force:
        return PackageReport(None, False, [
            f"{final} already exists; pass --ddtree-package-force to replace it or --ddtree-package-name to choose another name"])
    tmp = out_dir / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        warnings = _build(tmp, request, name, when)
    except PatchError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return PackageReport(None, False, [f"patches: {exc}"])
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return PackageReport(None, False, [f"cannot write the package in {out_dir}: {exc}"])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a half-written sibling behind
        raise
    report: VerifyReport = verify_package(tmp)
    nfiles = sum(1 for p in tmp.rglob("*") if p.is_file())
    if not report.ok:
        rejected = out_dir / f"{name}.rejected"
        if rejected.exists():
            shutil.rmtree(rejected)
        tmp.rename(rejected)
        return PackageReport(rejected, False, report.problems, warnings, nfiles)
    if final.exists():
        old = out_dir / f".{name}.old-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    return PackageReport(final, True, [], warnings, nfiles)


