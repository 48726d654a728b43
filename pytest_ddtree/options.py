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
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

if TYPE_CHECKING:  # parsed where read: importing the plugin loads the option declarations only
    from pytest_ddtree.measure.slo import SLO


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


@dataclass(frozen=True)
class Option:
    """One ``--ddtree-*`` option, spelled once: its flag is ``--ddtree-<name>`` (dashes), its
    ``dest`` and its ini key (where it has one) ``ddtree_<name>``."""

    name: str
    help: str
    metavar: str | None = None
    type: type | None = None
    action: str | None = None
    #: Where the option has an ini key: what the key holds (its help adds "like --ddtree-<name>").
    ini: str | None = None
    ini_type: str | None = None
    #: Old names still read, each as its own ``--ddtree-<alias>`` flag (and ini key, where the option
    #: has one), so a renamed option breaks no command line; using one warns with the new spelling.
    aliases: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return _flag(self.name)

    @property
    def dest(self) -> str:
        return "ddtree_" + self.name

    @property
    def dests(self) -> tuple[str, ...]:
        """Where pytest keeps this option's value under each spelling."""
        return tuple("ddtree_" + name for name in (self.name, *self.aliases))

    def alias_note(self, alias: str) -> str:
        """The deprecation warning for a use of ``alias``."""
        return (f"{_flag(alias)} (ini ddtree_{alias}) is deprecated: use {self.flag}" if self.ini is not None
                else f"{_flag(alias)} is deprecated: use {self.flag} (same values)")


def _flag(name: str) -> str:
    return "--ddtree-" + name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("config", "config(s) to gate: a name like bs8_b8_k4 (repeatable, comma lists, globs, or 'all': "
           "suites/configs.yaml's matrix as the profile's build runs it); default: the build's default",
           metavar="NAME", action="append", ini="default config selection", ini_type="args"),
    Option("allow_unlisted", "run a --ddtree-config name that no matrix lists (a one-off probe); without it an "
           "unlisted name is a usage error naming the closest listed ones (a typo must not pass as 'missing')",
           action="store_true"),
    Option("service", "service profile YAML, or the name of an installed one (entry point group pytest_ddtree.profiles); "
           "default: the embedded reference engine (suites/services/reference.yaml)",
           metavar="PATH", ini="default service profile path"),
    Option("url", "gate the SGLang service already running at URL (like bench_serving's --base-url), with no profile "
           "file: an external profile read from its /server_info; the harness never restarts it and gates the config it "
           "runs (not with --ddtree-service)", metavar="URL"),
    Option("matrix", "config matrix YAML (default: suites/configs.yaml under the rootdir)", metavar="PATH",
           ini="config matrix path"),
    Option("baselines", "baseline store (default: baselines/ under the rootdir)", metavar="PATH", ini="baseline store path"),
    Option("update_baselines", "write this session's measurements as the new baselines (reviewable YAML diff)",
           action="store_true"),
    Option("measure_only", "measure and report the selected cells (tok/s, TTFT/TPOT/ITL, req/s, acceptance where it "
           "speculates) with no gate: nothing is compared with a baseline, no control; any server, a plain one too "
           "(with --ddtree-url: bench_serving's numbers in the sweep table and results)", action="store_true"),
    Option("require_baselines", "fail (not just report) when a config has no baseline: use in CI", action="store_true"),
    Option("output_file", "append one JSON line per measured repeat with bench_serving's result keys, as its "
           "--output-file (config, cell and spoiled added)", metavar="PATH"),
    Option("results", "this session's results folder: new or empty, or a previous session's (then a subfolder "
           "per session); default: .ddtree/results/<session id>/", metavar="DIR", ini="results root"),
    Option("package", "also write a verified reproduction package under DIR at session end", metavar="DIR"),
    Option("package_name", "package folder name (default: <profile name>-<UTC date>)", metavar="NAME"),
    Option("package_force", "replace an existing package of the same name (atomically)", action="store_true"),
    Option("coding_set", f"coding problem set: {', '.join(CODING_SETS)} (default: default)", metavar="NAME",
           ini="coding set"),
    Option("coding_limit", "run only the first N problems of the coding set", metavar="N", type=int),
    Option("coding_max_tokens", "max_tokens of each coding request (default: 1024)", metavar="N", type=int),
    Option("sandbox", "sandbox the coding gate may use: strong (default: bwrap or unshare with a uid drop; "
           "fails the gate otherwise) or plain (explicitly accept weaker isolation)", metavar="TIER",
           ini="sandbox tier the coding gate may use"),
    Option("ready_timeout", "override the profile's ready_timeout_s", metavar="SECONDS", type=float),
    Option("repeats", "interleaved repeats per throughput cell (default: 3, the minimum for statistics)", metavar="N",
           type=int, ini="throughput repeats per cell"),
    Option("cell", "throughput cells to run, by name glob (repeatable; default: all of configs.yaml)", metavar="GLOB",
           action="append", aliases=("workload",)),
    Option("dataset", "a ShareGPT JSON file (bench_serving's format) whose text becomes every throughput cell's "
           "prompts, cut to each cell's exact length (default: each cell's prompts: source)", metavar="PATH"),
    Option("max_restarts", "adaptive sweep: measure at most N of the selected configs (one service restart each), "
           "each chosen from what was measured so far, and predict the others (serial, no -n; "
           "needs the 'advisor' extra)", metavar="N", type=int),
    Option("prior", "adaptive sweep: fit the model's shape from an earlier session's results folder on the "
           "same hardware profile (repeatable)", metavar="RESULTS_DIR", action="append"),
    Option("history", "append this session's cells (samples, verdicts, build) to a history database: a file path or "
           "sqlite:///path.db (SQLite), or postgresql://user@host:port/db (the 'postgres' extra); "
           "see it with ddtree-report --history URL", metavar="URL", ini="history database URL or path"),
    Option("slo", "latency SLO for goodput and the sustainable rate: ttft_ms=..,tpot_ms=..,e2e_ms=.. (any of them) "
           "and percentile=.. (default 99), e.g. ttft_ms=500,tpot_ms=50; beats the matrix's and the profile's slo:",
           metavar="TARGETS", ini="latency SLO"),
    Option("history_check", "with --ddtree-history: fail the session when its measurements start a regression change point "
           "of the history (needs the 'history' extra)", action="store_true"),
)
OPTION = {option.name: option for option in OPTIONS}


def add_options(parser: _Parser) -> None:
    group = parser.getgroup("ddtree", "DDTree speculative-decoding gates (pytest-ddtree)")
    for option in OPTIONS:
        attrs: dict[str, Any] = {"default": False if option.action == "store_true" else None}
        attrs.update({k: v for k, v in (("metavar", option.metavar), ("type", option.type), ("action", option.action)) if v is not None})
        group.addoption(option.flag, dest=option.dest, help=option.help, **attrs)
        for alias in option.aliases:
            group.addoption(_flag(alias), dest="ddtree_" + alias, help=f"deprecated spelling of {option.flag}", **attrs)
    for option in OPTIONS:
        if option.ini is not None:
            for name, text in ((option.name, option.ini), *((a, f"deprecated spelling of ddtree_{option.name}") for a in option.aliases)):
                parser.addini("ddtree_" + name, f"{text} (like {option.flag})", type=option.ini_type,
                              default=[] if option.ini_type == "args" else None)


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
    cells: tuple[str, ...]
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
    slo: SLO | None = None
    """--ddtree-slo: the latency SLO goodput is counted against (None: the matrix's or profile's, if any)."""
    allow_unlisted: bool = False
    """--ddtree-allow-unlisted: an explicit config name need not be in a matrix (selection.py)."""
    url: str | None = None
    """--ddtree-url: a running service to gate with a profile read from its /server_info (no profile file)."""
    measure_only: bool = False
    """--ddtree-measure-only: measure and report, judge nothing (gates/measure_only.py)."""
    output_file: Path | None = None
    """--ddtree-output-file: the JSON-lines file every measured repeat is appended to (bench_serving's --output-file)."""
    deprecated: tuple[str, ...] = ()
    """One note per old option spelling (``Option.aliases``) this run used: plugin.py warns with each."""


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


def _given(value: Any) -> bool:
    return value is not None and value is not False and value != [] and value != ""


class _Reader:
    """An option's value: the command line beats the ini key beats nothing (None), with the
    folder a relative path in it is relative to (the invocation dir, else the rootdir). An old
    spelling (``Option.aliases``) counts as the option and leaves its deprecation note in ``notes``;
    a repeatable option's values from both spellings add up."""

    def __init__(self, config: _Config, root: Path, cwd: Path) -> None:
        self.config, self.root, self.cwd = config, root, cwd
        self.notes: dict[str, None] = {}  # ordered, each once

    def _first(self, option: Option, get: Callable[[str], Any]) -> Any:
        values: list[Any] = []
        for name in (option.name, *option.aliases):
            value = get("ddtree_" + name)
            if _given(value):
                if name != option.name:
                    self.notes[option.alias_note(name)] = None
                values.append(value)
        if option.action == "append" or option.ini_type == "args":
            return [item for value in values for item in value] or None
        return values[0] if values else None

    def read(self, name: str) -> tuple[Any, Path]:
        option = OPTION[name]
        value = self._first(option, self.config.getoption)
        if value is not None:
            return value, self.cwd
        if option.ini is not None:
            ini_value = self._first(option, self.config.getini)
            if ini_value is not None:
                return ini_value, self.root
        return None, self.root

    def value(self, name: str) -> Any:
        return self.read(name)[0]

    def optional_path(self, name: str) -> Path | None:
        value, base = self.read(name)
        return _path(base, value) if value else None

    def path(self, name: str, default: Path) -> Path:
        return self.optional_path(name) or default


def installed_service(value: str, base: Path) -> Path:
    """``--ddtree-service``'s value: a profile file (relative to ``base``), else the name of one an
    installed distribution declares (entry point group ``pytest_ddtree.profiles``, service/installed.py);
    a value that is neither is a usage error naming the profiles installed."""
    path = _path(base, value)
    if path.exists() or "/" in value or os.sep in value or value.endswith((".yaml", ".yml")):
        return path
    from pytest_ddtree.service.installed import InstalledProfileError, profile_path
    from pytest_ddtree.suggest import did_you_mean

    try:
        return profile_path(value)
    except InstalledProfileError as exc:
        raise OptionError(f"--ddtree-service {value}: " + str(exc).replace("; ", "; " + did_you_mean(value, exc.known), 1)) from None


def resolve_settings(config: _Config, stamp: str | None = None, invocation_dir: Path | None = None, session_id: str | None = None) -> Settings:
    """Command line beats ini beats default; relative CLI paths are relative to the invocation dir."""
    root = Path(config.rootpath)
    read = _Reader(config, root, invocation_dir or Path.cwd())
    value, base = read.read("service")
    service = installed_service(str(value), base) if value else None
    stamp = stamp or session_stamp()
    session_id = session_id or f"{stamp}-{secrets.token_hex(3)}"
    results = read.path("results", root / ".ddtree" / "results" / session_id)
    coding_set, coding_limit, max_tokens, sandbox_tier = _coding(read)
    ready_timeout = read.value("ready_timeout")
    if ready_timeout is not None and ready_timeout <= 0:
        raise OptionError(f"--ddtree-ready-timeout must be positive, got {ready_timeout}")
    repeats = _repeats(read.value("repeats"))
    dataset = read.optional_path("dataset")
    if dataset is not None and not dataset.is_file():
        raise OptionError(f"--ddtree-dataset: no such file {dataset} (give a ShareGPT JSON file, bench_serving's format)")
    max_restarts, priors = _adaptive(read)
    history, history_check = _history(read)
    slo = _slo(read.value("slo"))
    url = read.value("url")
    if url is not None and (not str(url).startswith(("http://", "https://")) or service is not None):
        raise OptionError(f"--ddtree-url {url!r}: give the service's base URL, http://host:port (as bench_serving's "
                          "--base-url)" if service is None else
                          "--ddtree-url and --ddtree-service both say which service to gate: give one of them")
    measure_only = bool(read.value("measure_only"))
    if measure_only:
        _check_measure_only(read)
    name = read.value("package_name")
    if name is not None and (not name or "/" in name or name in (".", "..")):
        raise OptionError(f"--ddtree-package-name must be a plain folder name, got {name!r}")
    return Settings(
        rootdir=root,
        configs=tuple(read.value("config") or ()),
        service=service or root / "suites" / "services" / "reference.yaml",
        service_is_default=service is None and url is None,
        matrix=read.path("matrix", root / "suites" / "configs.yaml"),
        baselines=read.path("baselines", root / "baselines"),
        update_baselines=bool(read.value("update_baselines")),
        require_baselines=bool(read.value("require_baselines")),
        results=results,
        package=read.optional_path("package"),
        package_name=name,
        package_force=bool(read.value("package_force")),
        coding_set=coding_set,
        coding_limit=coding_limit,
        coding_max_tokens=max_tokens or 1024,
        sandbox=sandbox_tier,
        ready_timeout=ready_timeout,
        repeats=repeats,
        cells=tuple(read.value("cell") or ()),
        session_stamp=stamp,
        session_id=session_id,
        dataset=dataset,
        max_restarts=max_restarts,
        priors=priors,
        history=history,
        history_check=history_check,
        slo=slo,
        allow_unlisted=bool(read.value("allow_unlisted")),
        url=str(url).rstrip("/") if url else None,
        output_file=read.optional_path("output_file"),
        measure_only=measure_only,
        deprecated=tuple(read.notes),
    )



#: The options that ask for ddtree work by being given (the rest tune a run that does it).
_ASKING_FOR_DDTREE = ("config", "service", "url", "matrix", "package", "cell")


def explicitly_configured(config: _Config) -> bool:
    return any(config.getoption(dest) for name in _ASKING_FOR_DDTREE for dest in OPTION[name].dests)


def args_and_addopts(config: Any) -> list[str]:
    """The command line and the ini's addopts (pytest's ``Config``): where a user chose pytest's own behaviour."""
    return [str(arg) for arg in (*config.invocation_params.args, *config.getini("addopts"))]


def in_use(config: _Config, settings: Settings) -> bool:
    """The user asked for ddtree work, or the default files exist: a run of unrelated tests with
    the plugin installed must neither fail nor read files because no suites/ folder is near."""
    return explicitly_configured(config) or (settings.matrix.exists() and settings.service.exists())


def gate_run(config: _Config) -> bool:
    """Whether this run gates configs (:func:`in_use`), before the session exists."""
    if explicitly_configured(config):
        return True
    try:
        settings = resolve_settings(config)
    except OptionError:
        return False  # pytest_configure reports it
    return settings.matrix.exists() and settings.service.exists()


def hides_benchmark_table(args: Sequence[str]) -> bool:
    """pytest-benchmark's table (Min Max Mean StdDev OPS Rounds of each cell's repeats, in ms per
    round) beside the sweep's tok/s reads as a second, different result. The throughput suite
    files every cell as a benchmark record for users of its tooling (--benchmark-json,
    --benchmark-autosave); those users ask for it with a --benchmark-* option in ``args`` (the
    command line and addopts), and then get pytest-benchmark as it always is. A gate run without
    one keeps the records, not the table."""
    return not any(arg.startswith("--benchmark-") for arg in args)

#: What --ddtree-measure-only cannot go with: each judges or blesses, and a measure-only run does neither.
_NOT_WITH_MEASURE_ONLY = {
    "update_baselines": "a bless writes baselines from a gated run; bless without --ddtree-measure-only",
    "require_baselines": "it fails cells without a baseline, and a measure-only run compares none",
    "history_check": "it gates the session on the history; keep --ddtree-history to store the numbers",
    "max_restarts": "the adaptive sweep predicts and recommends from gated configs; select the configs to measure",
}


def _check_measure_only(read: _Reader) -> None:
    for name, why in _NOT_WITH_MEASURE_ONLY.items():
        if read.value(name):
            raise OptionError(f"--ddtree-measure-only and {OPTION[name].flag} do not go together: {why}")


def _coding(read: _Reader) -> tuple[str, int | None, int | None, str]:
    """The coding gate's set, problem limit, max_tokens and sandbox tier."""
    coding_set = str(read.value("coding_set") or "default")
    if coding_set not in CODING_SETS:
        raise OptionError(f"--ddtree-coding-set: unknown set {coding_set!r}; choose one of {', '.join(CODING_SETS)}")
    coding_limit = read.value("coding_limit")
    if coding_limit is not None and coding_limit < 1:
        raise OptionError(f"--ddtree-coding-limit must be at least 1, got {coding_limit}")
    max_tokens = read.value("coding_max_tokens")
    if max_tokens is not None and max_tokens < 16:
        raise OptionError(f"--ddtree-coding-max-tokens must be at least 16, got {max_tokens}")
    sandbox_tier = str(read.value("sandbox") or "strong")
    if sandbox_tier not in SANDBOX_CHOICES:
        raise OptionError(f"--ddtree-sandbox: unknown value {sandbox_tier!r}; choose one of {', '.join(SANDBOX_CHOICES)}")
    return coding_set, coding_limit, max_tokens, sandbox_tier


def _repeats(value: Any) -> int:
    try:
        repeats = int(value) if value is not None else 3
    except (TypeError, ValueError):
        raise OptionError(f"ddtree repeats must be an integer, got {value!r}") from None
    if repeats < 3:
        raise OptionError(f"--ddtree-repeats must be at least 3 (statistics need 3 samples per cell), got {repeats}")
    return repeats


def _adaptive(read: _Reader) -> tuple[int | None, tuple[Path, ...]]:
    """The adaptive sweep's restart budget and the earlier results folders it starts from."""
    max_restarts = read.value("max_restarts")
    if max_restarts is not None and max_restarts < 1:
        raise OptionError(f"--ddtree-max-restarts must be at least 1 (each measured config is one restart), got {max_restarts}")
    priors = tuple(_path(read.cwd, value) for value in read.value("prior") or ())
    for prior in priors:
        if not prior.is_dir():
            raise OptionError(f"--ddtree-prior: no such results folder {prior} (give an earlier session's "
                              "--ddtree-results folder, the one holding its results.json)")
    if priors and max_restarts is None:
        raise OptionError("--ddtree-prior only informs the adaptive sweep: add --ddtree-max-restarts N")
    return max_restarts, priors


def _slo(value: Any) -> SLO | None:
    if not value:
        return None
    from pytest_ddtree.measure.slo import SLOError, parse_slo

    try:
        return parse_slo(str(value))
    except SLOError as exc:
        raise OptionError(str(exc)) from None


def _history(read: _Reader) -> tuple[str | None, bool]:
    history_value, history_base = read.read("history")
    history = _history_url(str(history_value), history_base) if history_value else None
    history_check = bool(read.value("history_check"))
    if history_check and history is None:
        raise OptionError("--ddtree-history-check needs the history to check against: add --ddtree-history URL "
                          "(or the ini key ddtree_history)")
    return history, history_check
