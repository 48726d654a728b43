"""Speculative configurations and their canonical names (the sweep matrix of them: ``measure/matrix.py``).

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
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.axes import AxisError, AxisValue
from pytest_ddtree.suggest import did_you_mean


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


#: The fixture a suite test takes its config by (the plugin parametrizes it over the selection).
CONFIG_FIXTURE = "ddtree_config"


def item_config(item: Any) -> DDTreeConfig | None:
    """The config a collected test (pytest's ``Item``) was parametrized with, or None for a test of no config."""
    callspec = getattr(item, "callspec", None)
    value = callspec.params.get(CONFIG_FIXTURE) if callspec is not None else None
    return value if isinstance(value, DDTreeConfig) else None
