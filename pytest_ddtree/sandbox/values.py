"""Plain-data form of Python values crossing the sandbox wall, and the parent's comparison.

Why: the verdict is decided outside the sandbox.  Inputs go in and the candidate's results
come out as JSON data, never as objects: the parent compares them with the expected values
by type and value, so no ``__eq__``, ``__repr__`` or ``__hash__`` of the candidate's ever
runs in the harness, and nothing the candidate writes can be more than a (wrong) value.

The form is a flat node list (root at index 0, children after their parent), so a value
nested 10,000 deep encodes and decodes without recursion and the JSON text has depth 3.
Node kinds: ``["N"]`` None, ``["B", bool]``, ``["I", hex]``, ``["F", repr]``,
``["C", re, im]``, ``["S", str]``, ``["Y", hex]`` bytes, ``["L"|"T"|"E"|"G", [child...]]``
list/tuple/set/frozenset, ``["D", [k, v, k, v, ...]]`` dict, and ``["O", type name, note]``
for anything else (a subclass, a cycle, an object): an opaque node never equals an
expected value.

This file runs on both sides of the wall: the launcher prepends its text to the in-sandbox
runner, so it uses only the standard library and names nothing from the package.
"""

import math
from typing import Any

#: Largest number of nodes one value may have (the pipe is size-capped as well).
MAX_NODES = 2_000_000

_SEQ_TAGS: dict[type, str] = {list: "L", tuple: "T", set: "E", frozenset: "G"}


def encode(value: Any, max_nodes: int = MAX_NODES) -> list[list[Any]]:
    """Nodes of ``value``; exact builtin types only (subclasses and cycles become opaque)."""
    nodes: list[list[Any]] = []
    on_path: set[int] = set()
    stack: list[tuple[bool, Any, list[Any] | None]] = [(True, value, None)]
    while stack:
        entering, obj, parent_children = stack.pop()
        if not entering:
            on_path.discard(id(obj))
            continue
        if len(nodes) >= max_nodes:
            raise ValueError(f"value has more than {max_nodes} parts")
        index = len(nodes)
        if parent_children is not None:
            parent_children.append(index)
        kind = type(obj)
        if obj is None:
            nodes.append(["N"])
        elif kind is bool:
            nodes.append(["B", obj])
        elif kind is int:
            nodes.append(["I", hex(obj)])
        elif kind is float:
            nodes.append(["F", repr(obj)])
        elif kind is complex:
            nodes.append(["C", repr(obj.real), repr(obj.imag)])
        elif kind is str:
            nodes.append(["S", obj])
        elif kind is bytes:
            nodes.append(["Y", obj.hex()])
        elif kind in _SEQ_TAGS or kind is dict:
            if id(obj) in on_path:
                nodes.append(["O", kind.__name__, "a reference to itself (cycle)"])
                continue
            children: list[Any] = []
            nodes.append(["D" if kind is dict else _SEQ_TAGS[kind], children])
            on_path.add(id(obj))
            stack.append((False, obj, None))
            items: list[Any] = []
            if kind is dict:
                for key, item in list(obj.items()):
                    items += [key, item]
            else:
                items = list(obj)
            for item in reversed(items):
                stack.append((True, item, children))
        else:
            nodes.append(["O", _type_name(obj), ""])
    return nodes


def _type_name(obj: Any) -> str:
    name = getattr(type(obj), "__qualname__", "?")
    return name if isinstance(name, str) else "?"


class Opaque:
    """A result that is not plain data: never equal to an expected value."""

    __slots__ = ("type_name", "note")

    def __init__(self, type_name: str, note: str = "") -> None:
        self.type_name = type_name
        self.note = note

    def __repr__(self) -> str:
        return f"<{self.type_name}{': ' + self.note if self.note else ''}>"


def decode(nodes: Any) -> Any:
    """The value of a node list.  Raises ``ValueError`` for anything malformed (a forged or
    truncated result), so bad data is an error verdict, never a crash or a pass."""
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("empty value")
    built: list[Any] = [None] * len(nodes)
    for index in range(len(nodes) - 1, -1, -1):
        node = nodes[index]
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError(f"malformed node {index}")
        tag, args = node[0], node[1:]
        try:
            built[index] = _build(tag, args, built, index)
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            raise ValueError(f"malformed node {index} ({tag}): {exc}") from None
    return built[0]


def _children(args: list[Any], built: list[Any], index: int) -> list[Any]:
    refs = args[0]
    if not isinstance(refs, list) or not all(type(r) is int and index < r < len(built) for r in refs):
        raise ValueError("bad child reference")
    return [built[r] for r in refs]


def _build(tag: str, args: list[Any], built: list[Any], index: int) -> Any:
    if tag == "N":
        return None
    if tag == "B" and type(args[0]) is bool:
        return args[0]
    if tag == "I":
        return int(str(args[0]), 16)
    if tag == "F":
        return float(str(args[0]))
    if tag == "C":
        return complex(float(str(args[0])), float(str(args[1])))
    if tag == "S" and type(args[0]) is str:
        return args[0]
    if tag == "Y":
        return bytes.fromhex(str(args[0]))
    if tag in ("L", "T", "E", "G"):
        items = _children(args, built, index)
        return {"L": list, "T": tuple, "E": set, "G": frozenset}[tag](items)
    if tag == "D":
        items = _children(args, built, index)
        if len(items) % 2:
            raise ValueError("odd dict item list")
        return dict(zip(items[0::2], items[1::2]))
    if tag == "O":
        return Opaque(str(args[0])[:200], str(args[1])[:200] if len(args) > 1 else "")
    raise ValueError(f"unknown tag {tag!r}")


def short(value: Any, width: int = 300) -> str:
    """repr of a decoded or expected value (plain data only, so repr is safe), cut to width."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= width else text[:width] + "..."


def difference(expected: Any, actual: Any, tolerance: float = 1e-6) -> str | None:
    """None when ``actual`` matches ``expected`` by type and value, else where it differs.

    Exact types, except that an int is accepted where a float is expected; floats and
    complex numbers compare within ``tolerance`` (relative or absolute) and NaN equals NaN.
    Both sides are plain data here, so ``==`` on them runs only builtin code.
    """
    stack: list[tuple[Any, Any, str]] = [(expected, actual, "")]
    while stack:
        exp, act, where = stack.pop()
        at = f" at {where}" if where else ""
        if isinstance(act, Opaque):
            return f"expected {short(exp, 80)}{at}, got a {act!r} (not plain data)"
        if type(exp) is float and type(act) in (float, int):
            if not (_close(exp, float(act), tolerance)):
                return f"expected {exp!r}{at}, got {act!r}"
            continue
        if type(exp) is complex and type(act) in (complex, float, int):
            if not (_close(exp.real, complex(act).real, tolerance) and _close(exp.imag, complex(act).imag, tolerance)):
                return f"expected {exp!r}{at}, got {act!r}"
            continue
        if type(exp) is not type(act):
            return f"expected {type(exp).__name__} {short(exp, 80)}{at}, got {type(act).__name__} {short(act, 80)}"
        if type(exp) in (list, tuple):
            if len(exp) != len(act):
                return f"expected {len(exp)} items{at}, got {len(act)}"
            for i in range(len(exp) - 1, -1, -1):
                stack.append((exp[i], act[i], f"{where}[{i}]"))
        elif type(exp) is dict:
            if set(exp) != set(act):
                missing = [k for k in exp if k not in act][:5]
                extra = [k for k in act if k not in exp][:5]
                return f"dict keys differ{at}: missing {short(missing, 80)}, unexpected {short(extra, 80)}"
            for key in exp:
                stack.append((exp[key], act[key], f"{where}[{key!r}]"))
        elif exp != act:
            return f"expected {short(exp, 120)}{at}, got {short(act, 120)}"
    return None


def _close(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
