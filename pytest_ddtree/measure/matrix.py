"""The sweep matrix (``suites/configs.yaml``): its configs and default, its cells, the SLO and the rate search.

The configs are names of :mod:`pytest_ddtree.configs`; a cell (a ``Cell``) is what the load
generator runs: closed-loop concurrency or an open-loop arrival schedule
(:mod:`pytest_ddtree.measure.openloop`) x prompt length x output length, with its prompts,
sampling and endpoint. ``--ddtree-cell`` selects cells of the matrix or writes one inline.
"""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.axes import AxisError
from pytest_ddtree.configs import ConfigError, DDTreeConfig, expand_matrix_entry, parse_config_name
from pytest_ddtree.measure.openloop import Arrivals
from pytest_ddtree.measure.slo import SLO, SearchPlan, SLOError, slo_from_mapping
from pytest_ddtree.suggest import did_you_mean
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml


@dataclass(frozen=True)
class Cell:
    """One throughput cell: closed-loop concurrency (or an open-loop request rate) x prompt length x
    output length, as configs.yaml's ``cells:`` lists it, a ``--ddtree-cell`` writes it inline,
    or a test or benchmark makes one.

    An open-loop cell (``open_loop``: its ``request_rate`` and arrival process) has no client
    count; its ``concurrency`` is the most requests it can have in flight (``max_concurrency``,
    else all of its requests), which is what the closed-loop figures that read it need."""

    name: str
    concurrency: int
    context_tokens: int
    output_tokens: int
    requests: int
    warmup_requests: int = -1  # -1: one request per concurrent worker
    prompts: str = "documents"  # a bundled source, "random", or a ShareGPT .json path (see prompts.py)
    open_loop: Arrivals | None = None
    #: sampling params of every request (temperature, top_p); empty: greedy, as the lossless gate always is
    sampling: tuple[tuple[str, float], ...] = ()
    #: the endpoint it measures: ``generate`` (raw /generate, no template) or ``chat`` (/v1/chat/completions)
    api: str = "generate"
    #: a chat cell's ``chat_template_kwargs.enable_thinking`` (None: not sent, the template's default)
    thinking: bool | None = None
    #: what its prompts and arrival gaps are seeded by (empty: its name); see ``load.seed_name``
    seed_name: str = ""

    def __post_init__(self) -> None:
        if self.warmup_requests < 0:
            object.__setattr__(self, "warmup_requests", self.concurrency)


@dataclass(frozen=True)
class Matrix:
    """The contents of ``suites/configs.yaml``: the sweep, its default, and the cells."""

    path: Path
    default: DDTreeConfig
    configs: tuple[DDTreeConfig, ...]
    cells: tuple[Cell, ...]
    raw: Mapping[str, Any]
    slo: SLO | None = None  # the matrix's ``slo:`` (--ddtree-slo beats it)
    #: ``rate_search:``: the cell whose sustainable rate each config's search finds, and the search's bounds
    rate_search: tuple[Cell, SearchPlan] | None = None
    #: the axes its ``axes:`` declares (the catalogue's, as restated, and any it adds)
    axes: tuple[axes_mod.Axis, ...] = ()

    def names(self) -> list[str]:
        return [c.name for c in self.configs]


#: Cell keys of an open-loop cell (bench_serving's --request-rate and --max-concurrency).
OPEN_LOOP_KEYS = ("request_rate", "arrival", "burstiness", "max_concurrency", "deadline_s")


#: Cell keys of a sampled cell: SGLang's sampling params (sampling_params.py: temperature >= 0, 0 < top_p <= 1).
SAMPLING_KEYS = ("temperature", "top_p")


#: Cell keys of the endpoint a cell measures: ``api: generate | chat``, ``thinking: on | off`` (chat only).
API_KEYS = ("api", "thinking")


APIS = ("generate", "chat")


def _cell(entry: Any, where: str, defaults: Mapping[str, Any], base: Path | None = None) -> Cell:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: a cell must be a mapping, got {entry!r}")
    merged = {**defaults, **entry}
    allowed = {"name", "concurrency", "context_tokens", "output_tokens", "requests", "warmup_requests", "prompts",
               *OPEN_LOOP_KEYS, *SAMPLING_KEYS, *API_KEYS}
    unknown = set(merged) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown cell key(s) {sorted(unknown)}; "
                          f"{did_you_mean(min(unknown), sorted(allowed))}allowed: {', '.join(sorted(allowed))}")
    arrivals = _arrivals(merged, where)
    try:
        if arrivals is not None:
            if "concurrency" in merged:
                raise ConfigError(f"{where}: an open-loop cell (request_rate) sends on its schedule, not from "
                                  "concurrency clients: drop concurrency, or cap the requests in flight with max_concurrency")
            requests = int(merged.get("requests", 16))
            concurrency = arrivals.max_concurrency or requests
        else:
            concurrency = int(merged["concurrency"])
            requests = int(merged.get("requests", max(concurrency * 2, 4)))
        context = int(merged["context_tokens"])
        output = int(merged.get("output_tokens", 128))
        warmup = int(merged.get("warmup_requests", concurrency if arrivals is None else min(8, concurrency)))
    except KeyError as exc:
        raise ConfigError(f"{where}: cell needs {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: cell values must be integers ({exc})") from None
    default_name = f"c{concurrency}_ctx{context}" if arrivals is None else f"r{arrivals.request_rate:g}_ctx{context}"
    name = str(merged.get("name") or default_name)
    if min(concurrency, context, output, requests) < 1 or warmup < 0:
        raise ConfigError(f"{where}: cell {name!r} needs positive concurrency, context, output and requests")
    prompts = str(merged.get("prompts") or "documents")
    if prompts not in ("coding", "chat", "documents", "random"):
        if not prompts.endswith(".json"):
            raise ConfigError(f"{where}: cell {name!r}: prompts must be coding, chat, documents, random or a "
                              f"ShareGPT .json file, got {prompts!r}")
        if base is not None and not Path(prompts).is_absolute():
            prompts = str(base / prompts)
    api, thinking = _api(merged, f"{where}: cell {name!r}")
    return Cell(name, concurrency, context, output, requests, warmup, prompts, arrivals, _sampling(merged, where),
                    api, thinking)


def _api(merged: Mapping[str, Any], where: str) -> tuple[str, bool | None]:
    """The endpoint a cell measures and, for chat, whether thinking is asked on or off. Raw /generate
    skips the chat template, and thinking on or off moves acceptance (issue #33), so both are the cell's."""
    api = merged.get("api", "generate")
    if api not in APIS:
        raise ConfigError(f"{where}: api must be one of {', '.join(APIS)}, got {api!r}; {did_you_mean(str(api), APIS)}".rstrip("; "))
    if "thinking" not in merged or merged["thinking"] is None:
        return str(api), None
    raw = merged["thinking"]
    # YAML reads a bare on/off as a boolean; the quoted words mean the same
    value = raw if isinstance(raw, bool) else {"on": True, "off": False}.get(str(raw).lower()) if isinstance(raw, str) else None
    if value is None:
        raise ConfigError(f"{where}: thinking must be on or off, got {raw!r}; {did_you_mean(str(raw), ('on', 'off'))}".rstrip("; "))
    if api != "chat":
        raise ConfigError(f"{where}: thinking: {'on' if value else 'off'} needs api: chat (raw /generate has no chat "
                          "template to switch thinking in)")
    return str(api), value


def _sampling(merged: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    """A sampled cell's params (SGLang's ranges), in SAMPLING_KEYS order; empty for a greedy cell."""
    out: list[tuple[str, float]] = []
    for key in SAMPLING_KEYS:
        if key not in merged:
            continue
        value = merged[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
        if (key == "temperature" and not 0 <= value < 100) or (key == "top_p" and not 0 < value <= 1):
            raise ConfigError(f"{where}: {key} {value!r} is out of range (temperature >= 0, 0 < top_p <= 1)")
        out.append((key, float(value)))
    return tuple(out)


def _arrivals(merged: Mapping[str, Any], where: str) -> Arrivals | None:
    """The open-loop schedule a cell asks for, or None (a closed-loop cell)."""
    given = [k for k in OPEN_LOOP_KEYS if k in merged]
    if not given:
        return None
    if "request_rate" not in merged:
        raise ConfigError(f"{where}: {', '.join(given)} describe an open-loop cell: add request_rate (requests/s)")
    try:
        rate = float(merged["request_rate"])
        cap = merged.get("max_concurrency")
        deadline = merged.get("deadline_s")
        return Arrivals(rate, str(merged.get("arrival", "poisson")), float(merged.get("burstiness", 1.0)),
                        int(cap) if cap is not None else None, float(deadline) if deadline is not None else None)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: open-loop cell: {exc}") from None


#: configs.yaml's old key names, still read: the unit is a cell everywhere else (tables, records, --ddtree-cell).
OLD_KEYS = {"workloads": "cells", "workload_defaults": "cell_defaults"}


def _renamed_keys(raw: Mapping[str, Any], path: Path) -> Mapping[str, Any]:
    """``raw`` with its old keys (``OLD_KEYS``, and rate_search's ``workload``) under their new names,
    each old one warned about (a FutureWarning: shown to whoever runs it, and this module imports no
    pytest); both spellings of one key is an error, as one would silently win."""
    renamed = dict(raw)
    search = raw.get("rate_search")
    olds = [(renamed, old, new) for old, new in OLD_KEYS.items() if old in raw]
    if isinstance(search, Mapping) and "workload" in search:
        renamed["rate_search"] = dict(search)
        olds.append((renamed["rate_search"], "workload", "cell"))
    for mapping, old, new in olds:
        if new in mapping:
            raise ConfigError(f"{path}: both {old!r} and {new!r}: {old!r} is the old name of {new!r}; keep {new!r}")
        mapping[new] = mapping.pop(old)
        where = "rate_search's " if new == "cell" else ""
        warnings.warn(f"{path}: {where}{old!r} is deprecated: call it {new!r} (same contents)", FutureWarning, stacklevel=3)
    return renamed


def load_matrix(path: Path) -> Matrix:
    """Load ``configs.yaml``; every error names the file and the offending key."""
    try:
        raw = read_yaml(path)[0] or {}
    except YAMLFileError as exc:
        raise ConfigError(str(exc) if exc.syntax else f"cannot read config matrix {path}: {exc.problem}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping with 'default', 'matrix' and 'cells'")
    raw = _renamed_keys(raw, path)
    top = ("axes", "default", "matrix", "cells", "cell_defaults", "recommended", "slo", "rate_search")
    unknown = set(raw) - set(top)
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}; "
                          f"{did_you_mean(str(min(unknown, key=str)), top)}allowed: {', '.join(top)}")
    try:
        declared = axes_mod.declare(raw.get("axes"), f"{path}: axes")
    except AxisError as exc:
        raise ConfigError(str(exc)) from None
    configs: list[DDTreeConfig] = []
    for index, entry in enumerate(raw.get("matrix") or []):
        for config in expand_matrix_entry(entry, f"{path}: matrix[{index}]"):
            if config not in configs:
                configs.append(config)
    try:
        default = parse_config_name(str(raw.get("default", "bs8_b8_k4")))
    except ConfigError as exc:
        raise ConfigError(f"{path}: default: {exc}") from None
    if default not in configs:
        configs.insert(0, default)
    defaults = raw.get("cell_defaults") or {}
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"{path}: cell_defaults must be a mapping")
    cells = tuple(_cell(w, f"{path}: cells[{i}]", defaults, path.parent)
                  for i, w in enumerate(raw.get("cells") or []))
    names = [w.name for w in cells]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: cell names must be unique, got {names}")
    try:
        slo = slo_from_mapping(raw["slo"], f"{path}: slo") if raw.get("slo") is not None else None
        search = _rate_search(raw.get("rate_search"), f"{path}: rate_search", cells)
    except SLOError as exc:
        raise ConfigError(str(exc)) from None
    return Matrix(path=path, default=default, configs=tuple(configs), cells=cells, raw=raw, slo=slo,
                  rate_search=search, axes=declared)


def _rate_search(entry: Any, where: str, cells: Sequence[Cell]) -> tuple[Cell, SearchPlan] | None:
    """``rate_search: {cell: NAME, min_rate: R, max_rate: R, resolution: 0.1, max_probes: 12}``."""
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping with cell, min_rate and max_rate")
    unknown = sorted(set(entry) - {"cell", "min_rate", "max_rate", "resolution", "max_probes"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (allowed: cell, min_rate, max_rate, resolution, max_probes)")
    by_name = {w.name: w for w in cells}
    name = entry.get("cell")
    if name not in by_name:
        raise ConfigError(f"{where}: cell {name!r} is not a cell of the matrix; valid: {', '.join(by_name)}")
    try:
        plan = SearchPlan(float(entry["min_rate"]), float(entry["max_rate"]), float(entry.get("resolution", 0.10)),
                          int(entry.get("max_probes", 12)))
    except KeyError as exc:
        raise ConfigError(f"{where}: needs {exc.args[0]!r} (requests/s)") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return by_name[str(name)], plan


def select_cells(patterns: Sequence[str], matrix: Matrix) -> list[Cell]:
    """The cells ``--ddtree-cell`` asks for, in matrix order; all of them without patterns.

    Each pattern must match at least one cell: a typo would otherwise run nothing and pass.
    """
    if not patterns:
        return list(matrix.cells)
    inline = [inline_cell(p, matrix) for p in patterns if "=" in p]
    patterns = [p for p in patterns if "=" not in p]
    names = [w.name for w in matrix.cells]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(w.name, pattern) for w in matrix.cells):
            raise ConfigError(f"--ddtree-cell {pattern!r} matches no cell of {matrix.path}; "
                              f"{did_you_mean(pattern, names)}valid: {', '.join(names)}, or a cell inline "
                              f"({INLINE_EXAMPLE})")
    return [w for w in matrix.cells if any(fnmatch.fnmatchcase(w.name, p) for p in patterns)] + inline


#: bench_serving's names (its flags without the dashes, and short forms) for the cell keys.
INLINE_ALIASES = {"rate": "request_rate", "request_rate": "request_rate", "max_concurrency": "max_concurrency",
                  "concurrency": "concurrency", "prompts": "requests", "num_prompts": "requests", "requests": "requests",
                  "input": "context_tokens", "random_input_len": "context_tokens", "context_tokens": "context_tokens",
                  "output": "output_tokens", "random_output_len": "output_tokens", "output_tokens": "output_tokens",
                  "warmup": "warmup_requests", "warmup_requests": "warmup_requests", "dataset": "prompts",
                  "source": "prompts", "name": "name", "arrival": "arrival", "burstiness": "burstiness",
                  "temperature": "temperature", "top_p": "top_p", "api": "api"}


INLINE_EXAMPLE = "'rate=4,max_concurrency=16,prompts=200,input=1024,output=512' or 'concurrency=8,input=4096,output=64'"


def inline_cell(spec: str, matrix: Matrix) -> Cell:
    """A cell written on the command line as bench_serving's options name it: ``rate`` (its
    --request-rate), ``max_concurrency``, ``prompts`` / ``num_prompts`` (its --num-prompts: the
    measured requests), ``input`` / ``random_input_len`` (the exact prompt length), ``output`` /
    ``random_output_len``, ``dataset`` (a bundled source or a ShareGPT .json), ``concurrency`` (a closed
    loop), ``name``; the matrix's cell_defaults fill the rest. No baseline names it unless blessed."""
    entry: dict[str, Any] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        key, _, raw = part.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if key not in INLINE_ALIASES:
            raise ConfigError(f"--ddtree-cell {spec!r}: unknown key {key!r}; "
                              f"{did_you_mean(key, sorted(INLINE_ALIASES))}known: {', '.join(sorted(INLINE_ALIASES))}")
        value: Any = raw.strip()
        if key in ("rate", "request_rate", "burstiness", "temperature", "top_p"):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"--ddtree-cell {spec!r}: {key} must be a number, got {raw!r}") from None
        elif key not in ("dataset", "source", "name", "arrival", "api"):
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(f"--ddtree-cell {spec!r}: {key} must be an integer, got {raw!r}") from None
        entry[INLINE_ALIASES[key]] = value
    if "request_rate" not in entry and "concurrency" not in entry:
        entry["concurrency"] = entry.pop("max_concurrency", 1)  # bench_serving without a rate: every request at once, capped
    defaults = matrix.raw.get("cell_defaults") if isinstance(matrix.raw.get("cell_defaults"), Mapping) else {}
    return _cell(entry, f"--ddtree-cell {spec!r}", defaults or {}, matrix.path.parent)
