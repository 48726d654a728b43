"""The ``--ddtree-*`` options and ini keys, resolved once into a frozen Settings.

Like pytest-timeout, every setting is resolved in one place (command line, then ini, then the
default) so fixtures never re-read ``config.getoption`` with their own fallbacks and disagree.
This module registers options through the parser object pytest hands it, but does not import
pytest: it stays usable (and testable) as plain Python.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, Sequence


class OptionError(ValueError):
    """A --ddtree-* option has a bad value; raised as a usage error (exit 4)."""


class _Group(Protocol):
    def addoption(self, *opts: str, **attrs: Any) -> None: ...  # noqa: V107 (pytest's signature)


class _Parser(Protocol):
    def getgroup(self, name: str, description: str = "") -> _Group: ...

    def addini(self, name: str, help: str, type: Any = None, default: Any = None) -> None: ...  # noqa: V107


class _Config(Protocol):
    @property
    def rootpath(self) -> Path: ...

    def getoption(self, name: str, default: Any = None) -> Any: ...

    def getini(self, name: str) -> Any: ...


CODING_SETS = ("default", "full", "humaneval")


def add_options(parser: _Parser) -> None:
    group = parser.getgroup("ddtree", "DDTree speculative-decoding gates (pytest-ddtree)")
    add = group.addoption
    add("--ddtree-config", action="append", dest="ddtree_config", default=None, metavar="NAME",
        help="config(s) to gate: a name like bs8_b8_k4 (repeatable, comma lists, globs, or 'all': "
             "suites/configs.yaml's matrix as the profile's build runs it); default: the build's default")
    add("--ddtree-service", dest="ddtree_service", default=None, metavar="PATH",
        help="service profile YAML; default: the embedded reference engine (suites/services/reference.yaml)")
    add("--ddtree-matrix", dest="ddtree_matrix", default=None, metavar="PATH",
        help="config matrix YAML (default: suites/configs.yaml under the rootdir)")
    add("--ddtree-baselines", dest="ddtree_baselines", default=None, metavar="PATH",
        help="baseline store (default: baselines/ under the rootdir)")
    add("--ddtree-update-baselines", dest="ddtree_update_baselines", action="store_true", default=False,
        help="write this session's measurements as the new baselines (reviewable YAML diff)")
    add("--ddtree-require-baselines", dest="ddtree_require_baselines", action="store_true", default=False,
        help="fail (not just report) when a config has no baseline: use in CI")
    add("--ddtree-results", dest="ddtree_results", default=None, metavar="DIR",
        help="this session's results folder: new or empty, or a previous session's (then a subfolder "
             "per session); default: .ddtree/results/<session id>/")
    add("--ddtree-package", dest="ddtree_package", default=None, metavar="DIR",
        help="also write a verified reproduction package under DIR at session end")
    add("--ddtree-package-name", dest="ddtree_package_name", default=None, metavar="NAME",
        help="package folder name (default: <profile name>-<UTC date>)")
    add("--ddtree-package-force", dest="ddtree_package_force", action="store_true", default=False,
        help="replace an existing package of the same name (atomically)")
    add("--ddtree-coding-set", dest="ddtree_coding_set", default=None, metavar="NAME",
        help=f"coding problem set: {', '.join(CODING_SETS)} (default: default)")
    add("--ddtree-coding-limit", dest="ddtree_coding_limit", default=None, type=int, metavar="N",
        help="run only the first N problems of the coding set")
    add("--ddtree-coding-max-tokens", dest="ddtree_coding_max_tokens", default=None, type=int, metavar="N",
        help="max_tokens of each coding request (default: 1024)")
    add("--ddtree-sandbox", dest="ddtree_sandbox", default=None, metavar="TIER",
        help="sandbox the coding gate may use: strong (default: bwrap or unshare with a uid drop; "
             "fails the gate otherwise) or plain (explicitly accept weaker isolation)")
    add("--ddtree-ready-timeout", dest="ddtree_ready_timeout", default=None, type=float, metavar="SECONDS",
        help="override the profile's ready_timeout_s")
    add("--ddtree-repeats", dest="ddtree_repeats", default=None, type=int, metavar="N",
        help="interleaved repeats per throughput cell (default: 3, the minimum for statistics)")
    add("--ddtree-workload", dest="ddtree_workload", action="append", default=None, metavar="GLOB",
        help="throughput cells to run, by name glob (repeatable; default: all of configs.yaml)")
    add("--ddtree-dataset", dest="ddtree_dataset", default=None, metavar="PATH",
        help="a ShareGPT JSON file (bench_serving's format) whose text becomes every throughput cell's "
             "prompts, cut to each cell's exact length (default: each workload's prompts: source)")
    add("--ddtree-max-restarts", dest="ddtree_max_restarts", default=None, type=int, metavar="N",
        help="adaptive sweep: measure at most N of the selected configs (one service restart each), "
             "each chosen from what was measured so far, and predict the others (serial, no -n; "
             "needs the 'advisor' extra)")
    add("--ddtree-prior", dest="ddtree_prior", action="append", default=None, metavar="RESULTS_DIR",
        help="adaptive sweep: fit the model's shape from an earlier session's results folder on the "
             "same hardware profile (repeatable)")

    add("--ddtree-history", dest="ddtree_history", default=None, metavar="URL",
        help="append this session's cells (samples, verdicts, build) to a history database: a file path or "
             "sqlite:///path.db (SQLite), or postgresql://user@host:port/db (the 'postgres' extra); "
             "see it with ddtree-report --history URL")
    add("--ddtree-history-check", dest="ddtree_history_check", action="store_true", default=False,
        help="with --ddtree-history: fail the session when its measurements start a regression change point "
             "of the history (needs the 'history' extra)")

    parser.addini("ddtree_service", "default service profile path (like --ddtree-service)", default=None)
    parser.addini("ddtree_config", "default config selection (like --ddtree-config)", type="args", default=[])
    parser.addini("ddtree_baselines", "baseline store path (like --ddtree-baselines)", default=None)
    parser.addini("ddtree_results", "results root (like --ddtree-results)", default=None)
    parser.addini("ddtree_matrix", "config matrix path (like --ddtree-matrix)", default=None)
    parser.addini("ddtree_coding_set", "coding set (like --ddtree-coding-set)", default=None)
    parser.addini("ddtree_sandbox", "sandbox tier the coding gate may use (like --ddtree-sandbox)", default=None)
    parser.addini("ddtree_repeats", "throughput repeats per cell (like --ddtree-repeats)", default=None)
    parser.addini("ddtree_history", "history database URL or path (like --ddtree-history)", default=None)


#: --ddtree-sandbox values: "strong" requires a namespace tier with a uid drop (fail closed).
SANDBOX_CHOICES = ("strong", "plain")


@dataclass(frozen=True)
class Settings:
    """Every --ddtree-* setting after resolution; stored once in ``config.stash``."""

    rootdir: Path
    configs: tuple[str, ...]
    service: Path
    service_is_default: bool
    matrix: Path
    baselines: Path
    update_baselines: bool
    require_baselines: bool
    results: Path
    package: Path | None
    package_name: str | None
    package_force: bool
    coding_set: str
    coding_limit: int | None
    coding_max_tokens: int
    sandbox: str
    ready_timeout: float | None
    repeats: int
    workloads: tuple[str, ...]
    session_stamp: str
    session_id: str = ""
    """Unique per session (stamp + random): names its results folder and tags every record."""
    dataset: Path | None = None
    max_restarts: int | None = None
    """--ddtree-max-restarts: the adaptive sweep's restart budget (None: measure every config)."""
    priors: tuple[Path, ...] = ()
    history: str | None = None
    """--ddtree-history: the history database (an absolute SQLite path, or a PostgreSQL URL)."""
    history_check: bool = False


def _path(root: Path, value: str | os.PathLike[str]) -> Path:
    path = Path(os.path.expanduser(os.fspath(value)))
    return path if path.is_absolute() else root / path


def _history_url(value: str, base: Path) -> str:
    """A relative SQLite path is made absolute against ``base`` (xdist workers and the session end
    may run elsewhere); a PostgreSQL URL is kept as it is; any other scheme is refused."""
    if value.startswith(("postgresql://", "postgres://")):
        return value
    path_text = value.removeprefix("sqlite:///")
    if not path_text.strip() or "://" in path_text or path_text.startswith("sqlite:"):
        shown = value.rsplit("@", 1)[-1]  # never the password of a URL
        raise OptionError(f"--ddtree-history: {shown!r} is not a history database: give a file path, "
                          "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://user@host:port/db")
    return str(_path(base, path_text))


def session_stamp(now: datetime | None = None) -> str:
    """A UTC timestamp that sorts, is safe in paths, and is unique enough per session."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ")


def resolve_settings(config: _Config, stamp: str | None = None, invocation_dir: Path | None = None, session_id: str | None = None) -> Settings:
    """Command line beats ini beats default; relative CLI paths are relative to the invocation dir."""
    root = Path(config.rootpath)
    cwd = invocation_dir or Path.cwd()

    def pick(dest: str, ini: str | None = None) -> tuple[Any, Path]:
        value = config.getoption(dest)
        if value is not None and value is not False and value != []:
            return value, cwd
        if ini is not None:
            ini_value = config.getini(ini)
            if ini_value not in (None, "", []):
                return ini_value, root
        return None, root

    configs_value, _ = pick("ddtree_config", "ddtree_config")
    configs = tuple(configs_value or ())
    service_value, service_base = pick("ddtree_service", "ddtree_service")
    service_is_default = service_value is None
    service = _path(service_base, service_value) if service_value else root / "suites" / "services" / "reference.yaml"
    matrix_value, matrix_base = pick("ddtree_matrix", "ddtree_matrix")
    matrix = _path(matrix_base, matrix_value) if matrix_value else root / "suites" / "configs.yaml"
    baselines_value, baselines_base = pick("ddtree_baselines", "ddtree_baselines")
    baselines = _path(baselines_base, baselines_value) if baselines_value else root / "baselines"
    stamp = stamp or session_stamp()
    session_id = session_id or f"{stamp}-{secrets.token_hex(3)}"
    results_value, results_base = pick("ddtree_results", "ddtree_results")
    results = _path(results_base, results_value) if results_value else root / ".ddtree" / "results" / session_id
    package_value = config.getoption("ddtree_package")
    coding_set_value, _ = pick("ddtree_coding_set", "ddtree_coding_set")
    coding_set = str(coding_set_value or "default")
    if coding_set not in CODING_SETS:
        raise OptionError(f"--ddtree-coding-set: unknown set {coding_set!r}; choose one of {', '.join(CODING_SETS)}")
    coding_limit = config.getoption("ddtree_coding_limit")
    if coding_limit is not None and coding_limit < 1:
        raise OptionError(f"--ddtree-coding-limit must be at least 1, got {coding_limit}")
    max_tokens = config.getoption("ddtree_coding_max_tokens")
    if max_tokens is not None and max_tokens < 16:
        raise OptionError(f"--ddtree-coding-max-tokens must be at least 16, got {max_tokens}")
    sandbox_value, _ = pick("ddtree_sandbox", "ddtree_sandbox")
    sandbox_tier = str(sandbox_value or "strong")
    if sandbox_tier not in SANDBOX_CHOICES:
        raise OptionError(f"--ddtree-sandbox: unknown value {sandbox_tier!r}; choose one of {', '.join(SANDBOX_CHOICES)}")
    ready_timeout = config.getoption("ddtree_ready_timeout")
    if ready_timeout is not None and ready_timeout <= 0:
        raise OptionError(f"--ddtree-ready-timeout must be positive, got {ready_timeout}")
    repeats_value, _ = pick("ddtree_repeats", "ddtree_repeats")
    try:
        repeats = int(repeats_value) if repeats_value is not None else 3
    except (TypeError, ValueError):
        raise OptionError(f"ddtree repeats must be an integer, got {repeats_value!r}") from None
    if repeats < 3:
        raise OptionError(f"--ddtree-repeats must be at least 3 (statistics need 3 samples per cell), got {repeats}")
    workloads: Sequence[str] = config.getoption("ddtree_workload") or ()
    dataset_value = config.getoption("ddtree_dataset")
    dataset = _path(cwd, dataset_value) if dataset_value else None
    if dataset is not None and not dataset.is_file():
        raise OptionError(f"--ddtree-dataset: no such file {dataset} (give a ShareGPT JSON file, bench_serving's format)")
    max_restarts = config.getoption("ddtree_max_restarts")
    if max_restarts is not None and max_restarts < 1:
        raise OptionError(f"--ddtree-max-restarts must be at least 1 (each measured config is one restart), got {max_restarts}")
    priors = tuple(_path(cwd, value) for value in config.getoption("ddtree_prior") or ())
    for prior in priors:
        if not prior.is_dir():
            raise OptionError(f"--ddtree-prior: no such results folder {prior} (give an earlier session's "
                              "--ddtree-results folder, the one holding its results.json)")
    if priors and max_restarts is None:
        raise OptionError("--ddtree-prior only informs the adaptive sweep: add --ddtree-max-restarts N")
    history_value, history_base = pick("ddtree_history", "ddtree_history")
    history = _history_url(str(history_value), history_base) if history_value else None
    history_check = bool(config.getoption("ddtree_history_check"))
    if history_check and history is None:
        raise OptionError("--ddtree-history-check needs the history to check against: add --ddtree-history URL "
                          "(or the ini key ddtree_history)")
    name = config.getoption("ddtree_package_name")
    if name is not None and (not name or "/" in name or name in (".", "..")):
        raise OptionError(f"--ddtree-package-name must be a plain folder name, got {name!r}")
    return Settings(
        rootdir=root,
        configs=configs,
        service=service,
        service_is_default=service_is_default,
        matrix=matrix,
        baselines=baselines,
        update_baselines=bool(config.getoption("ddtree_update_baselines")),
        require_baselines=bool(config.getoption("ddtree_require_baselines")),
        results=results,
        package=_path(cwd, package_value) if package_value else None,
        package_name=name,
        package_force=bool(config.getoption("ddtree_package_force")),
        coding_set=coding_set,
        coding_limit=coding_limit,
        coding_max_tokens=max_tokens or 1024,
        sandbox=sandbox_tier,
        ready_timeout=ready_timeout,
        repeats=repeats,
        workloads=tuple(workloads),
        session_stamp=stamp,
        session_id=session_id,
        dataset=dataset,
        max_restarts=max_restarts,
        priors=priors,
        history=history,
        history_check=history_check,
    )
