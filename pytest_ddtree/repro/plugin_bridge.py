"""Build a :class:`PackageRequest` from the plugin's session and write the package.

Why a bridge: the writer takes plain data so it can be tested and reused without pytest; the
session (settings, profile, matrix, records, failed tests) is the plugin's.  This module is
the only place that knows both, and it still does not import pytest. It takes
:class:`SessionFacts`, what it reads of the session (the session end builds them): the session
takes the package's environment snapshot (``envsnap.py``), so a bridge importing the session
would make the two import each other.
"""

from __future__ import annotations

import datetime as _dt
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.shapes import HostEnvData, RawRecord

from pytest_ddtree.repro.writer import FailedTest, PackagedLaunch, PackageReport, PackageRequest, write_package

if TYPE_CHECKING:
    from pytest_ddtree.measure.matrix import Matrix
    from pytest_ddtree.options import Settings
    from pytest_ddtree.service.profile import ServiceProfile

__all__ = ["SessionFacts", "package_from_session", "launches_from_records", "request_from_session"]


@dataclass(frozen=True)
class SessionFacts:
    """What a package reads of the plugin's session: its settings (the package options, the results
    folder, the matrix file), profile and matrix, the names of the configs it selected (none where the
    selection failed: it was reported at the start) and its failed tests."""

    settings: Settings
    profile: ServiceProfile
    matrix: Matrix
    selected: Sequence[str]
    failed_tests: Sequence[Mapping[str, str]]


def launches_from_records(records: Iterable[RawRecord]) -> list[PackagedLaunch]:
    """One PackagedLaunch per distinct (config, command, env, drop-in) of the session's ``launch`` records."""
    seen: set[tuple[str, str | None, tuple[tuple[str, str], ...], str | None]] = set()
    out: list[PackagedLaunch] = []
    for rec in records_mod.launch_records(records):
        launch = rec["launch"]  # the service manager's launch entry (records.LaunchEntry), checked
        config = launch["config"] or rec.get("config") or "unknown"
        command, env, dropin = launch["command"], dict(launch["env"]), launch.get("dropin")
        job = launch.get("slurm", {})
        key = (config, command, tuple(sorted(env.items())), dropin)
        if key in seen:
            continue
        seen.add(key)
        out.append(PackagedLaunch(config, command, env, dropin, job_script=job.get("script") or None,
                                slurm_version=job.get("version") or None))
    return out


def _systemd_unit_text(unit: str | None) -> str | None:
    """``systemctl cat UNIT`` (unit file plus drop-ins as systemd sees them), None when unavailable."""
    if not unit or shutil.which("systemctl") is None:
        return None
    try:
        proc = subprocess.run(["systemctl", "cat", "--no-pager", unit], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout else None


def _hosts_unit_text(host_envs: Mapping[str, HostEnvData]) -> str | None:
    """A fleet's unit as read on its first host (the one env/ describes), over ssh."""
    return next((str(e["systemd_unit"]) for _, e in sorted(host_envs.items()) if e.get("systemd_unit")), None)


def _stamp(value: str | None) -> _dt.datetime | None:
    if not value:
        return None
    try:
        return _dt.datetime.strptime(value, "%Y%m%dT%H%M%SZ").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return None


def request_from_session(session: SessionFacts, records: Sequence[RawRecord], exitstatus: int) -> PackageRequest:
    """Collect what the session ran."""
    settings, profile, matrix = session.settings, session.profile, session.matrix
    if settings.package is None:
        raise ValueError("the session asked for no package (--ddtree-package)")
    recommended = matrix.raw.get("recommended")
    try:
        matrix_text: str | None = Path(settings.matrix).read_text(encoding="utf-8")
    except OSError:
        matrix_text = None
    launches = launches_from_records(records)
    failed = [FailedTest(str(f.get("nodeid", "")), str(f.get("reason", ""))) for f in session.failed_tests]
    host_envs: dict[str, HostEnvData] = {r["host"]: r for r in records_mod.host_envs(records) if r.get("host")}
    unit_text = None
    if profile.capabilities.unit:
        # A fleet's unit lives on its hosts: never read this machine's unit of the same name.
        remote = bool(profile.host or profile.fleet.hosts)
        unit_text = _hosts_unit_text(host_envs) if remote else _systemd_unit_text(profile.unit)
    return PackageRequest(
        out_dir=settings.package,
        name=settings.package_name,
        force=bool(settings.package_force),
        profile=profile,
        profile_path=profile.source,
        profile_text=profile.text or None,
        launches=launches,
        systemd_unit_text=unit_text,
        results_dir=settings.results,
        matrix=matrix.names(),
        default_config=matrix.default.name,
        recommended_config=str(recommended) if recommended else None,
        configs_run=list(session.selected),
        configs_yaml_text=matrix_text,
        failed_tests=failed,
        session_start=_stamp(settings.session_stamp),
        exit_status=exitstatus,
        command_line="pytest " + shlex.join(sys.argv[1:]),
        host_envs=host_envs,
    )


def package_from_session(session: SessionFacts, records: Sequence[RawRecord], exitstatus: int) -> PackageReport:
    """The plugin's session-end entry point (main process only): write, verify, publish."""
    return write_package(request_from_session(session, records, exitstatus))
