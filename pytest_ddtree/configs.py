"""Speculative configurations, their canonical names, and the sweep matrix.

A configuration is a value for some of the axes of :mod:`pytest_ddtree.axes` (DDTree's four,
block size, budget, topk and window, and any other a build takes: EAGLE's steps, a tree width, the
attention backend...). Its name is one ``<token><value>`` segment per axis it sets, e.g.
``bs8_b8_k4``, ``bs8_b12_k6_w2048`` or ``b7_k4_steps3``. Names are the user interface
(``--ddtree-config``), the test ids, the baseline file names and the keys of every result, so they
must be canonical: ``parse_config_name(c.name) == c`` for every config, and one config has exactly
one name.

An axis a name leaves out means "the build's own": for the window (no ``_w`` suffix) the service
profile's default window, deliberately left unresolved here, because the same name must mean the
same thing against every profile, and only the profile knows what its default is; for any other
axis the value the build uses when the launch does not set it.
"""

from __future__ import annotations

import enum
import fnmatch
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.axes import AxisError, AxisValue
from pytest_ddtree.suggest import did_you_mean
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

if TYPE_CHECKING:  # imported where used: configs is read by modules those two import (a cycle otherwise)
    from pytest_ddtree.measure.openloop import Arrivals
    from pytest_ddtree.measure.slo import SLO, SearchPlan


class ConfigError(ValueError):
    """A configuration name, selection or matrix file is invalid; the message says how to fix it."""


class _ProfileDefault(enum.Enum):
    """Sentinel type for "use the profile's default window" (no ``_w`` suffix in the name)."""

    TOKEN = "profile-default"

    def __repr__(self) -> str:
        return "DEFAULT_WINDOW"


DEFAULT_WINDOW = _ProfileDefault.TOKEN
Window = int | None | _ProfileDefault

#: The config-name grammar as a pattern other patterns embed (:func:`config_in_nodeid`); what a
#: name means is :mod:`pytest_ddtree.axes`' catalogue, and every module reads names through here.
NAME_PATTERN = axes_mod.NAME_PATTERN
#: The DDTree axes a config holds as attributes of its own (every name before the axes had them).
CORE_FIELDS = ("block_size", "budget", "topk", "window")


@dataclass(frozen=True)
class DDTreeConfig:
    """One speculative-decoding configuration under test.

    ``block_size``, ``budget``, ``topk``: a positive integer, or None where the name leaves the axis
    out (the build's own). ``window`` is an int (draft window of that many tokens), ``None`` (no
    window: the drafter sees the whole context) or ``DEFAULT_WINDOW`` (whatever the profile's
    ``default_window`` is). ``extra``: (axis, value) for every other axis the config sets, in
    catalogue order.
    """

    block_size: int | None = None
    budget: int | None = None
    topk: int | None = None
    window: Window = field(default=DEFAULT_WINDOW, compare=False)
    extra: tuple[tuple[str, AxisValue], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        for label, value in (("block_size", self.block_size), ("budget", self.budget), ("topk", self.topk)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{label} must be a positive integer, got {value!r}")
        if self.block_size is not None and self.block_size < 2:
            raise ConfigError(f"block_size must be at least 2 (one drafted position), got {self.block_size}")
        if not (self.window is None or self.window is DEFAULT_WINDOW or (isinstance(self.window, int) and self.window >= 1)):
            raise ConfigError(f"window must be a positive integer, None or DEFAULT_WINDOW, got {self.window!r}")
        checked: dict[str, AxisValue] = {}
        for name, given in self.extra:
            if name in CORE_FIELDS or name in checked:
                raise ConfigError(f"axis {name!r} is given twice")
            try:
                checked[name] = axes_mod.axis(name).check(given)
            except AxisError as exc:
                raise ConfigError(str(exc)) from None
        object.__setattr__(self, "extra", tuple((n, checked[n]) for n in axes_mod.order(checked)))
        if not self.set_axes():
            raise ConfigError("a config sets at least one axis (e.g. block_size, budget, topk or steps)")

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> DDTreeConfig:
        """The config setting ``values`` (axis name -> value; the window's absence: DEFAULT_WINDOW)."""
        extra = tuple((k, v) for k, v in values.items() if k not in CORE_FIELDS)
        return cls(values.get("block_size"), values.get("budget"), values.get("topk"),
                   values.get("window", DEFAULT_WINDOW), extra)

    def values(self) -> dict[str, Any]:
        """Axis -> value for every axis the config sets (its name's segments, in order)."""
        out: dict[str, Any] = {k: v for k, v in (("block_size", self.block_size), ("budget", self.budget),
                                                 ("topk", self.topk)) if v is not None}
        if self.window is not DEFAULT_WINDOW:
            out["window"] = self.window
        out.update(self.extra)
        return out

    def set_axes(self) -> tuple[str, ...]:
        return tuple(self.values())

    def tree_shape(self) -> tuple[int, int, int] | None:
        """(block_size, budget, topk) for a plain DDTree config (those three set, no other axis but
        the window), else None: the budget/block-size tables and the drafter-bound diagnosis read these."""
        if self.block_size is None or self.budget is None or self.topk is None or self.extra:
            return None
        return (self.block_size, self.budget, self.topk)

    def replaced(self, changes: Mapping[str, Any]) -> DDTreeConfig:
        """This config with ``changes`` (axis -> value) applied."""
        return DDTreeConfig.of({**self.values(), **changes})

    @property
    def name(self) -> str:
        """The canonical name, e.g. ``bs8_b8_k4``, ``bs8_b12_k6_w2048`` or ``b7_k4_steps3``."""
        return "_".join(axes_mod.axis(n).token + axes_mod.axis(n).format(v) for n, v in self.values().items())

    def resolved_window(self, profile_default: int | None) -> int | None:
        """The window actually launched: the config's own, else the profile's default."""
        if self.window is DEFAULT_WINDOW:
            return profile_default
        return self.window

    def field_values(self, profile_default_window: int | None) -> dict[str, Any]:
        """Axis name -> launch value: the four DDTree axes always (None: left out, or no window),
        then every other axis the config sets; the names are those a profile's ``config_args`` maps."""
        return {
            "block_size": self.block_size,
            "budget": self.budget,
            "topk": self.topk,
            "window": self.resolved_window(profile_default_window),
            **dict(self.extra),
        }

    def sort_key(self) -> tuple[Any, ...]:
        """Orders a sweep the way people read the campaign's table: block size, budget, topk,
        then window (profile default first, no window last), then the other axes (left out first)."""
        window = self.window
        rank = -1 if window is DEFAULT_WINDOW else (10**9 if window is None else int(window))
        extra = dict(self.extra)
        rest = tuple((0, (0, 0)) if a.name not in extra else (1, a.sort_rank(extra[a.name]))
                     for a in axes_mod.catalogue() if a.name not in CORE_FIELDS)
        return (self.block_size or 0, self.budget or 0, self.topk or 0, rank, *rest)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DDTreeConfig):
            return NotImplemented
        return self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name


def parse_config_name(name: str) -> DDTreeConfig:
    """Parse a canonical config name; raise ConfigError saying what a valid one looks like."""
    text = name.strip()
    values: dict[str, Any] = {}
    try:
        if not text or not re.fullmatch(NAME_PATTERN, text):
            raise AxisError("a name is <token><value> segments joined by _")
        for segment in text.split("_"):
            axis, value = axes_mod.split_segment(segment)
            if axis.name in values:
                raise AxisError(f"{axis.name} ({axis.token}) is given twice")
            values[axis.name] = value
        config = DDTreeConfig.of(values)
    except (AxisError, ConfigError) as exc:
        raise ConfigError(
            f"malformed config name {name!r} ({exc}): expected <token><value> segments such as "
            "bs<block_size>_b<budget>_k<topk> with an optional _w<window> or _wnone, and any other axis "
            "after them (e.g. bs8_b8_k4, bs8_b12_k6_w2048, b7_k4_steps3)"
        ) from None
    if config.name != text:  # leading zeros are refused by each axis; this catches the order of the segments
        raise ConfigError(f"config name {name!r} is not canonical; write it as {config.name!r}")
    return config


def config_in_nodeid(nodeid: str) -> str | None:
    """The config name in a parametrized test's id (``...::test_x[c4-bs8_b8_k4]``), or None.

    The parameter id, not the rest of the node id: the config is what the plugin parametrized,
    and pytest may decorate node ids in other ways (xdist, 9.2's structured ids). A name has no
    ``-`` (:mod:`pytest_ddtree.axes`), so the id's ``-``-separated parts are tried in turn; a part
    that merely looks like one (a workload called ``c1_short``) does not parse.
    """
    param = nodeid.rsplit("::", 1)[-1]
    if "[" not in param or not param.endswith("]"):
        return None
    for part in param[param.index("[") + 1:-1].split("-"):
        if config_or_none(part) is not None:
            return part
    return None


def config_or_none(name: str) -> DDTreeConfig | None:
    """The config a canonical name stands for, or None (records may carry any string)."""
    try:
        return parse_config_name(name)
    except ConfigError:
        return None


def name_sort_key(name: str) -> tuple[Any, ...]:
    """Sort key for config names as found in records: configs in table order, other names after."""
    config = config_or_none(name)
    return (1, (), name) if config is None else (0, config.sort_key(), name)


@dataclass(frozen=True)
class Workload:
    """One throughput cell: closed-loop concurrency (or an open-loop request rate) x prompt length x
    output length.

    An open-loop cell (``open_loop``: its ``request_rate`` and arrival process) has no client
    count; its ``concurrency`` is the most requests it can have in flight (``max_concurrency``,
    else all of its requests), which is what the closed-loop figures that read it need."""

    name: str
    concurrency: int
    context_tokens: int
    output_tokens: int
    requests: int
    warmup_requests: int
    prompts: str = "documents"  # a bundled source, "random", or a ShareGPT .json path (see prompts.py)
    open_loop: Arrivals | None = None
    #: sampling params of every request (temperature, top_p); empty: greedy, as the lossless gate always is
    sampling: tuple[tuple[str, float], ...] = ()
    #: the endpoint it measures: ``generate`` (raw /generate, no template) or ``chat`` (/v1/chat/completions)
    api: str = "generate"
    #: a chat cell's ``chat_template_kwargs.enable_thinking`` (None: not sent, the template's default)
    thinking: bool | None = None


@dataclass(frozen=True)
class Matrix:
    """The contents of ``suites/configs.yaml``: the sweep, its default, and the workloads."""

    path: Path
    default: DDTreeConfig
    configs: tuple[DDTreeConfig, ...]
    workloads: tuple[Workload, ...]
    raw: Mapping[str, Any]
    slo: SLO | None = None  # the matrix's ``slo:`` (--ddtree-slo beats it)
    #: ``rate_search:``: the workload whose sustainable rate each config's search finds, and the search's bounds
    rate_search: tuple[Workload, SearchPlan] | None = None
    #: the axes its ``axes:`` declares (the catalogue's, as restated, and any it adds)
    axes: tuple[axes_mod.Axis, ...] = ()

    def names(self) -> list[str]:
        return [c.name for c in self.configs]


def expand_matrix_entry(entry: Any, where: str) -> list[DDTreeConfig]:
    """A matrix entry is a name, or a product spec of axes: ``{block_size: [..], budget: [..],
    topk: [..], window: [..], steps: [..]}`` (a value or a list per axis; the window's ``default``
    is the profile's, as a name without ``_w``)."""
    if isinstance(entry, str):
        return [parse_config_name(entry)]
    if not isinstance(entry, Mapping) or not entry:
        raise ConfigError(f"{where}: each matrix entry must be a config name or a mapping of axes to lists, got {entry!r}")
    known = [a.name for a in axes_mod.catalogue()]
    unknown = sorted(set(map(str, entry)) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown axis {unknown[0]!r} in matrix entry; "
                          f"{did_you_mean(unknown[0], known)}axes: {', '.join(known)} (configs.yaml's axes: declares more)")
    keys = axes_mod.order(map(str, entry))
    lists = []
    for key in keys:
        value = entry[key]
        items = list(value) if isinstance(value, list) else [value]
        if key == "window":
            items = [DEFAULT_WINDOW if v == "default" else None if isinstance(v, str) and v.lower() == "none" else v
                     for v in items]
        lists.append(items)
    configs: list[DDTreeConfig] = []
    for combo in itertools.product(*lists):
        try:
            configs.append(DDTreeConfig.of(dict(zip(keys, combo))))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return configs


#: Workload keys of an open-loop cell (bench_serving's --request-rate and --max-concurrency).
OPEN_LOOP_KEYS = ("request_rate", "arrival", "burstiness", "max_concurrency", "deadline_s")
#: Workload keys of a sampled cell: SGLang's sampling params (sampling_params.py: temperature >= 0, 0 < top_p <= 1).
SAMPLING_KEYS = ("temperature", "top_p")
#: Workload keys of the endpoint a cell measures: ``api: generate | chat``, ``thinking: on | off`` (chat only).
API_KEYS = ("api", "thinking")
APIS = ("generate", "chat")


def _workload(entry: Any, where: str, defaults: Mapping[str, Any], base: Path | None = None) -> Workload:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: a workload must be a mapping, got {entry!r}")
    merged = {**defaults, **entry}
    allowed = {"name", "concurrency", "context_tokens", "output_tokens", "requests", "warmup_requests", "prompts",
               *OPEN_LOOP_KEYS, *SAMPLING_KEYS, *API_KEYS}
    unknown = set(merged) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown workload key(s) {sorted(unknown)}; "
                          f"{did_you_mean(min(unknown), sorted(allowed))}allowed: {', '.join(sorted(allowed))}")
    arrivals = _arrivals(merged, where)
    try:
        if arrivals is not None:
            if "concurrency" in merged:
                raise ConfigError(f"{where}: an open-loop workload (request_rate) sends on its schedule, not from "
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
        raise ConfigError(f"{where}: workload needs {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: workload values must be integers ({exc})") from None
    default_name = f"c{concurrency}_ctx{context}" if arrivals is None else f"r{arrivals.request_rate:g}_ctx{context}"
    name = str(merged.get("name") or default_name)
    if min(concurrency, context, output, requests) < 1 or warmup < 0:
        raise ConfigError(f"{where}: workload {name!r} needs positive concurrency, context, output and requests")
    prompts = str(merged.get("prompts") or "documents")
    if prompts not in ("coding", "chat", "documents", "random"):
        if not prompts.endswith(".json"):
            raise ConfigError(f"{where}: workload {name!r}: prompts must be coding, chat, documents, random or a "
                              f"ShareGPT .json file, got {prompts!r}")
        if base is not None and not Path(prompts).is_absolute():
            prompts = str(base / prompts)
    api, thinking = _api(merged, f"{where}: workload {name!r}")
    return Workload(name, concurrency, context, output, requests, warmup, prompts, arrivals, _sampling(merged, where),
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
    """The open-loop schedule a workload asks for, or None (a closed-loop cell)."""
    from pytest_ddtree.measure.openloop import Arrivals

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
        raise ConfigError(f"{where}: open-loop workload: {exc}") from None


def load_matrix(path: Path) -> Matrix:
    """Load ``configs.yaml``; every error names the file and the offending key."""
    try:
        raw = read_yaml(path)[0] or {}
    except YAMLFileError as exc:
        raise ConfigError(str(exc) if exc.syntax else f"cannot read config matrix {path}: {exc.problem}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: top level must be a mapping with 'default', 'matrix' and 'workloads'")
    top = ("axes", "default", "matrix", "workloads", "workload_defaults", "recommended", "slo", "rate_search")
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
    defaults = raw.get("workload_defaults") or {}
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"{path}: workload_defaults must be a mapping")
    workloads = tuple(_workload(w, f"{path}: workloads[{i}]", defaults, path.parent)
                      for i, w in enumerate(raw.get("workloads") or []))
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: workload names must be unique, got {names}")
    from pytest_ddtree.measure.slo import SLOError, slo_from_mapping

    try:
        slo = slo_from_mapping(raw["slo"], f"{path}: slo") if raw.get("slo") is not None else None
        search = _rate_search(raw.get("rate_search"), f"{path}: rate_search", workloads)
    except SLOError as exc:
        raise ConfigError(str(exc)) from None
    return Matrix(path=path, default=default, configs=tuple(configs), workloads=workloads, raw=raw, slo=slo,
                  rate_search=search, axes=declared)


def _rate_search(entry: Any, where: str, workloads: Sequence[Workload]) -> tuple[Workload, SearchPlan] | None:
    """``rate_search: {workload: NAME, min_rate: R, max_rate: R, resolution: 0.1, max_probes: 12}``."""
    from pytest_ddtree.measure.slo import SearchPlan

    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping with workload, min_rate and max_rate")
    unknown = sorted(set(entry) - {"workload", "min_rate", "max_rate", "resolution", "max_probes"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (allowed: workload, min_rate, max_rate, resolution, max_probes)")
    by_name = {w.name: w for w in workloads}
    name = entry.get("workload")
    if name not in by_name:
        raise ConfigError(f"{where}: workload {name!r} is not a workload of the matrix; valid: {', '.join(by_name)}")
    try:
        plan = SearchPlan(float(entry["min_rate"]), float(entry["max_rate"]), float(entry.get("resolution", 0.10)),
                          int(entry.get("max_probes", 12)))
    except KeyError as exc:
        raise ConfigError(f"{where}: needs {exc.args[0]!r} (requests/s)") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return by_name[str(name)], plan


def select_cells(patterns: Sequence[str], matrix: Matrix) -> list[Workload]:
    """The cells ``--ddtree-cell`` asks for, in matrix order; all of them without patterns.

    Each pattern must match at least one cell: a typo would otherwise run nothing and pass.
    """
    if not patterns:
        return list(matrix.workloads)
    inline = [inline_cell(p, matrix) for p in patterns if "=" in p]
    patterns = [p for p in patterns if "=" not in p]
    names = [w.name for w in matrix.workloads]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(w.name, pattern) for w in matrix.workloads):
            raise ConfigError(f"--ddtree-cell {pattern!r} matches no cell of {matrix.path}; "
                              f"{did_you_mean(pattern, names)}valid: {', '.join(names)}, or a cell inline "
                              f"({INLINE_EXAMPLE})")
    return [w for w in matrix.workloads if any(fnmatch.fnmatchcase(w.name, p) for p in patterns)] + inline


#: bench_serving's names (its flags without the dashes, and short forms) for the workload keys.
INLINE_ALIASES = {"rate": "request_rate", "request_rate": "request_rate", "max_concurrency": "max_concurrency",
                  "concurrency": "concurrency", "prompts": "requests", "num_prompts": "requests", "requests": "requests",
                  "input": "context_tokens", "random_input_len": "context_tokens", "context_tokens": "context_tokens",
                  "output": "output_tokens", "random_output_len": "output_tokens", "output_tokens": "output_tokens",
                  "warmup": "warmup_requests", "warmup_requests": "warmup_requests", "dataset": "prompts",
                  "source": "prompts", "name": "name", "arrival": "arrival", "burstiness": "burstiness",
                  "temperature": "temperature", "top_p": "top_p", "api": "api"}
INLINE_EXAMPLE = "'rate=4,max_concurrency=16,prompts=200,input=1024,output=512' or 'concurrency=8,input=4096,output=64'"


def inline_cell(spec: str, matrix: Matrix) -> Workload:
    """A cell written on the command line as bench_serving's options name it: ``rate`` (its
    --request-rate), ``max_concurrency``, ``prompts`` / ``num_prompts`` (its --num-prompts: the
    measured requests), ``input`` / ``random_input_len`` (the exact prompt length), ``output`` /
    ``random_output_len``, ``dataset`` (a bundled source or a ShareGPT .json), ``concurrency`` (a closed
    loop), ``name``; the matrix's workload_defaults fill the rest. No baseline names it unless blessed."""
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
    defaults = matrix.raw.get("workload_defaults") if isinstance(matrix.raw.get("workload_defaults"), Mapping) else {}
    return _workload(entry, f"--ddtree-cell {spec!r}", defaults or {}, matrix.path.parent)
