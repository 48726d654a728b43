"""The axes a config name is made of: each a name, a type, its valid values and a short token.

Why data and not a regex: the knobs people sweep moved past DDTree's four (block size, budget,
topk, window): EAGLE3's ``--speculative-num-steps``, a DFLASH tree width, ``SGLANG_DFLASH_MAX_NUM_NODES``,
the fork's tree algorithm, and knobs that are no speculation at all but change the numbers a gate
compares (attention backend, page size, overlap scheduling, tp/dp). Each is an :class:`Axis`; a config
is a value for some of them; its name is one ``<token><value>`` segment per axis it sets, joined by
``_`` in catalogue order (``bs8_b8_k4``, ``b7_k4_steps3``, ``bs8_b8_k4_attnfa3_overlapoff``).

The grammar is one-to-one: a segment's token is the longest catalogue token it starts with whose
remainder is a value of that axis; :func:`declare` refuses a token that would make that ambiguous
(a token that is another's prefix while its axis takes a value starting with the rest: a choice or bool axis, or the window's none), values are written one way only
(no leading zeros; a choice value without its ``_``: ``trtllm_mha`` is ``attntrtllmmha``), and an axis appears at most once, in catalogue
order. tests/test_axes.py proves ``parse(name(c)) == c`` over generated values of every axis type.

An axis a name leaves out means "the build's own": the profile's default window for ``w`` (the names
of every baseline stored before the axes), the build's default or fixed value for any other.

The catalogue is one per process: configs.yaml and a profile may declare more axes (``axes:``), and
an axis declared twice must be declared the same, so a name means the same thing everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pytest_ddtree.suggest import did_you_mean

#: The axis types: a positive integer; a window (a positive integer, or ``none``: no window);
#: one of a list of words; on/off.
AXIS_TYPES = ("int", "window", "choice", "bool")
#: A value of any axis, as a config holds it (None: the window's "no window").
AxisValue = int | str | bool | None

_TOKEN = re.compile(r"[a-z]+")
_WORD = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
_INT = re.compile(r"[1-9][0-9]*")


class AxisError(ValueError):
    """An axis declaration, or a value for an axis, is invalid; the message says how to fix it."""


@dataclass(frozen=True)
class Axis:
    """One knob a config can set."""

    name: str
    token: str
    type: str
    #: choice: the words it takes (empty: any lower-case word); int: the values it takes (empty: any >= minimum)
    values: tuple[Any, ...] = ()
    minimum: int = 1
    #: whether the axis changes what is drafted or verified (greedy acceptance may show it) or only
    #: how the service runs (backend, page size, overlap, parallelism: acceptance must not move)
    speculative: bool = True
    doc: str = ""

    def format(self, value: AxisValue) -> str:
        """The value as a name writes it."""
        if self.type == "window":
            return "none" if value is None else str(value)
        if self.type == "bool":
            return "on" if value else "off"
        if self.type == "choice":
            return str(value).replace("_", "")
        return str(value)

    def parse(self, text: str) -> AxisValue:
        """The value a name's segment (its token stripped) stands for; AxisError if it is none."""
        if self.type == "window" and text == "none":
            return None
        if self.type in ("int", "window"):
            if not _INT.fullmatch(text) and not (self.minimum == 0 and text == "0"):
                raise AxisError(f"{self.name} ({self.token}) takes a whole number >= {self.minimum}"
                                + (" or none" if self.type == "window" else "") + f", got {text!r}")
            return self.check(int(text))
        if self.type == "bool":
            if text not in ("on", "off"):
                raise AxisError(f"{self.name} ({self.token}) takes on or off, got {text!r}")
            return text == "on"
        for value in self.values:
            if self.format(value) == text:
                return str(value)
        if self.values or not re.fullmatch(r"[a-z0-9]+", text):
            raise AxisError(f"{self.name} ({self.token}) takes one of "
                            + (", ".join(self.format(v) for v in self.values) or "a lower-case word") + f", got {text!r}")
        return text

    def check(self, value: Any) -> AxisValue:
        """``value`` (from YAML, a name or code) as this axis holds it; AxisError naming the valid ones."""
        if self.type == "window" and value is None:
            return None
        if self.type in ("int", "window"):
            if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
                raise AxisError(f"{self.name} must be a whole number >= {self.minimum}"
                                + (" or none" if self.type == "window" else "") + f", got {value!r}")
            if self.values and value not in self.values:
                raise AxisError(f"{self.name} {value} is not one of its values: {', '.join(map(str, self.values))}")
            return value
        if self.type == "bool":
            if isinstance(value, str) and value in ("on", "off"):
                return value == "on"
            if not isinstance(value, bool):
                raise AxisError(f"{self.name} must be on or off (true or false), got {value!r}")
            return value
        if not isinstance(value, str) or not (_WORD if self.values else re.compile(r"[a-z0-9]+")).fullmatch(value):
            raise AxisError(f"{self.name} must be a lower-case word (letters, digits"
                            + (", _" if self.values else "") + f"), got {value!r}")
        if self.values and value not in self.values:
            raise AxisError(f"{self.name} {value!r} is not one of its values; "
                            f"{did_you_mean(value, [str(v) for v in self.values])}valid: {', '.join(map(str, self.values))}")
        return value

    def sort_rank(self, value: AxisValue) -> tuple[int, Any]:
        """Orders values the way a table reads them: numbers up, no window last, words by their list."""
        if value is None:
            return (2, 0)
        if self.type == "choice":
            return (1, self.values.index(value) if value in self.values else len(self.values)) if self.values else (1, str(value))
        return (1, int(value))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "token": self.token, "type": self.type}
        if self.values:
            out["values"] = list(self.values)
        if not self.speculative:
            out["speculative"] = False
        return out


#: The four DDTree axes every name has had since the first baseline: ``bs8_b8_k4_w2048``.
CORE = (
    Axis("block_size", "bs", "int", minimum=2, doc="drafted block incl. the root: at most block_size - 1 drafts accepted"),
    Axis("budget", "b", "int", doc="tree nodes verified, the root not counted"),
    Axis("topk", "k", "int", doc="candidates per depth"),
    Axis("window", "w", "window", doc="draft window in tokens (none: the whole context); left out: the profile's default_window"),
)

#: ``--attention-backend``'s choices in SGLang 0.5.23 (the wheel's sglang/srt/arg_groups/choices.py:69-99).
ATTENTION_BACKENDS = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4", "flashinfer",
    "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "hpc_ops",
    "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
)

#: The axes the shipped profiles map (configs.yaml's ``axes:`` may add more); docs/profiles.md lists them.
STANDARD = (
    Axis("steps", "steps", "int", doc="EAGLE's --speculative-num-steps: draft depth, at most steps drafts accepted"),
    Axis("tree_width", "tw", "int", doc="a DFLASH tree's width (PR 36196's --speculative-dflash-tree-width)"),
    Axis("max_nodes", "nodes", "int", doc="PR 36196's SGLANG_DFLASH_MAX_NUM_NODES"),
    Axis("max_topk", "maxk", "int", doc="PR 29907's SGLANG_DDTREE_MAX_TOPK"),
    Axis("verify_budget", "vb", "int", doc="PR 32053's --speculative-dflash-verify-budget"),
    Axis("tree_algo", "algo", "choice", ("fused", "ddtree"), doc="the SubSir fork's SGLANG_DFLASH_TREE_ALGO"),
    Axis("attention_backend", "attn", "choice", ATTENTION_BACKENDS, speculative=False, doc="--attention-backend"),
    Axis("page_size", "page", "int", speculative=False, doc="--page-size"),
    Axis("overlap", "overlap", "bool", speculative=False, doc="overlap scheduling (off: --disable-overlap-schedule)"),
    Axis("tp", "tp", "int", speculative=False, doc="--tp-size"),
    Axis("dp", "dp", "int", speculative=False, doc="--dp-size"),
    Axis("speculation", "spec", "choice", ("none",), speculative=False,
         doc="none: a server without --speculative-algorithm, measured with --ddtree-measure-only (specnone)"),
)

_CATALOGUE: dict[str, Axis] = {}


def _register(axis: Axis, where: str) -> None:
    if axis.name in _CATALOGUE:
        if _CATALOGUE[axis.name] != axis:
            known = _CATALOGUE[axis.name]
            raise AxisError(f"{where}: axis {axis.name!r} is declared as {axis.as_dict()}, but it is already "
                            f"{known.as_dict()}: an axis means one thing in every file (rename the new one)")
        return
    if not _TOKEN.fullmatch(axis.token):
        raise AxisError(f"{where}: axis {axis.name!r}: token must be lower-case letters, got {axis.token!r}")
    if axis.type not in AXIS_TYPES:
        raise AxisError(f"{where}: axis {axis.name!r}: type must be one of {', '.join(AXIS_TYPES)}, got {axis.type!r}")
    for other in _CATALOGUE.values():
        if other.token == axis.token:
            raise AxisError(f"{where}: axis {axis.name!r}: token {axis.token!r} is already {other.name!r}'s")
        for short, long in ((other, axis), (axis, other)):
            rest = long.token[len(short.token):]
            if long.token.startswith(short.token) and (short.type in ("choice", "bool")
                                                       or short.type == "window" and "none".startswith(rest)):
                raise AxisError(f"{where}: axis {axis.name!r}: token {axis.token!r} and {other.name!r}'s {other.token!r} "
                                f"would make names ambiguous ({short.token!r} takes words); choose another token")
    if axis.type == "choice":
        for value in axis.values:
            if not isinstance(value, str) or not _WORD.fullmatch(value):
                raise AxisError(f"{where}: axis {axis.name!r}: a choice value must be a lower-case word, got {value!r}")
        forms = [axis.format(v) for v in axis.values]
        if len(set(forms)) != len(forms):
            raise AxisError(f"{where}: axis {axis.name!r}: two values are written the same in a name without their _: {forms}")
    elif axis.values and not all(isinstance(v, int) and not isinstance(v, bool) and v >= axis.minimum for v in axis.values):
        raise AxisError(f"{where}: axis {axis.name!r}: its values must be whole numbers >= {axis.minimum}, got {list(axis.values)}")
    _CATALOGUE[axis.name] = axis


for _axis in (*CORE, *STANDARD):
    _register(_axis, "pytest_ddtree.axes")


def catalogue() -> tuple[Axis, ...]:
    """Every axis known in this process, in name order (the four DDTree axes first)."""
    return tuple(_CATALOGUE.values())


def axis(name: str) -> Axis:
    """The axis of that name; AxisError naming the closest ones."""
    found = _CATALOGUE.get(name)
    if found is None:
        raise AxisError(f"unknown axis {name!r}; {did_you_mean(name, list(_CATALOGUE))}known: {', '.join(_CATALOGUE)}")
    return found


def is_axis(name: object) -> bool:
    return isinstance(name, str) and name in _CATALOGUE


def declare(entries: Any, where: str) -> tuple[Axis, ...]:
    """``axes:`` of configs.yaml or a profile: a list of ``{name, token, type, values}`` (a known
    axis may be restated by its name alone, or exactly as it is); each joins the catalogue."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise AxisError(f"{where}: axes must be a list of {{name, token, type, values}} mappings")
    out: list[Axis] = []
    for index, entry in enumerate(entries):
        here = f"{where}[{index}]"
        if isinstance(entry, str):
            out.append(axis(entry))
            continue
        if not isinstance(entry, Mapping):
            raise AxisError(f"{here}: an axis is a name or a mapping with name, token, type (and values), got {entry!r}")
        unknown = sorted(set(entry) - {"name", "token", "type", "values", "minimum", "speculative", "doc"})
        if unknown:
            raise AxisError(f"{here}: unknown key(s) {unknown}; {did_you_mean(unknown[0], ['name', 'token', 'type', 'values'])}"
                            "allowed: name, token, type, values, minimum, speculative, doc")
        try:
            name, token, kind = str(entry["name"]), str(entry["token"]), str(entry["type"])
        except KeyError as exc:
            raise AxisError(f"{here}: needs {exc.args[0]!r}") from None
        values = entry.get("values") or ()
        if not isinstance(values, (list, tuple)):
            raise AxisError(f"{here}: values must be a list, got {values!r}")
        known = _CATALOGUE.get(name)
        made = Axis(name, token, kind, tuple(values), int(entry.get("minimum", 1)), bool(entry.get("speculative", True)),
                    str(entry.get("doc", known.doc if known else "")))
        if known is not None and made.doc != known.doc:
            made = Axis(made.name, made.token, made.type, made.values, made.minimum, made.speculative, known.doc)
        _register(made, here)
        out.append(_CATALOGUE[name])
    return tuple(out)


def order(names: Iterable[str]) -> list[str]:
    """``names`` in catalogue order (a name's segments, a table's columns)."""
    rank = {name: i for i, name in enumerate(_CATALOGUE)}
    return sorted(names, key=lambda n: rank.get(n, len(rank)))


def split_segment(segment: str) -> tuple[Axis, AxisValue]:
    """The axis and value one ``_``-separated segment of a name stands for (see the module docstring)."""
    problems: list[str] = []
    for candidate in sorted(_CATALOGUE.values(), key=lambda a: -len(a.token)):
        if segment.startswith(candidate.token) and len(segment) > len(candidate.token):
            try:
                return candidate, candidate.parse(segment[len(candidate.token):])
            except AxisError as exc:
                problems.append(str(exc))
    tokens = [a.token for a in _CATALOGUE.values()]
    head = re.match(r"[a-z]*", segment)
    hint = did_you_mean(head.group(0) if head else segment, tokens)
    raise AxisError(f"segment {segment!r}: " + ("; ".join(problems) if problems else
                    f"no axis has its token; {hint}tokens: {', '.join(tokens)}"))


#: A name, for patterns that embed one (a test id): segments of a token and a value, no ``-``.
NAME_PATTERN = r"[a-z]+[a-z0-9]*(?:_[a-z]+[a-z0-9]*)*"
