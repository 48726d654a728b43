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

The parent handles these nodes as hostile input, with bounds it can prove (no child process
needed): :func:`decode` accepts only a tree (every node but the root is the child of exactly
one node that comes before it; a shared or cyclic node list, whose value would be
exponentially larger than its text, is refused), at most :data:`MAX_NODES` nodes, set
elements and dict keys nested at most :data:`MAX_HASHED_DEPTH` deep (hashing a deeper tuple
recurses in C and can crash the interpreter), and sets and dicts whose elements share hash
values only a little (:data:`MAX_COLLISION_WORK`: CPython's sets are quadratic in a group of
equal hashes, which ints and tuples let anyone build).  :func:`short` prints any value within
a character budget without building its whole repr, and :func:`difference` walks both values
without recursion.

This file runs on both sides of the wall: the launcher prepends its text to the in-sandbox
runner, so it uses only the standard library and names nothing from the package.
"""

import math
from collections.abc import Iterator
from typing import Any

#: Largest number of nodes one value may have (the pipe is size-capped as well).
MAX_NODES = 2_000_000
#: Deepest nesting of tuples and frozensets inside a set element or a dict key.
MAX_HASHED_DEPTH = 100
#: Per set or dict: the sum of the squared sizes of its groups of elements (keys) that share
#: one hash value.  Distinct honest values rarely share a hash; 1,000 colliding ones do.
MAX_COLLISION_WORK = 100_000

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
    truncated result) or beyond the bounds of the module docstring, so bad data is an error
    verdict, never a crash, a hang or a pass.  Linear in the number of nodes."""
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("empty value")
    count = len(nodes)
    if count > MAX_NODES:
        raise ValueError(f"value has {count} parts, more than {MAX_NODES}")
    built: list[Any] = [None] * count
    depth = [0] * count  # nesting of hashable containers (tuple, frozenset) at each node
    claimed: set[int] = set()  # nodes already some node's child: a second claim is sharing
    for index in range(count - 1, -1, -1):
        node = nodes[index]
        if type(node) is not list or not node:
            raise ValueError(f"malformed node {index}")
        tag = node[0]
        try:
            if tag == "I":
                built[index] = int(node[1], 16)  # only a str converts with a base
            elif tag == "S" and type(node[1]) is str:
                built[index] = node[1]
            elif tag in _CONTAINERS:
                built[index] = _container(tag, node[1], built, index, depth, claimed)
            else:
                built[index] = _scalar(tag, node[1:])
        except (TypeError, ValueError, IndexError, OverflowError) as exc:
            raise ValueError(f"malformed node {index} ({str(tag)[:20]}): {exc}") from None
    if len(claimed) != count - 1:
        raise ValueError(f"{count - 1 - len(claimed)} node(s) are not part of the value")
    return built[0]


_CONTAINERS = {"L": list, "T": tuple, "E": set, "G": frozenset, "D": dict}


def _container(tag: str, refs: Any, built: list[Any], index: int, depth: list[int], claimed: set[int]) -> Any:
    if type(refs) is not list:
        raise ValueError("bad child reference")
    if refs:
        if min(refs) <= index or max(refs) >= len(built):
            raise ValueError("bad child reference")
        before = len(claimed)
        claimed.update(refs)
        if len(claimed) - before != len(refs):
            raise ValueError("a node is shared (a child of two nodes, or twice of one): results are trees, a shared or cyclic structure is refused")
    items = list(map(built.__getitem__, refs))  # a float or other non-int reference raises TypeError
    if tag == "L":
        return items
    if tag == "T":
        depth[index] = 1 + max(map(depth.__getitem__, refs), default=0)
        return tuple(items)
    if tag == "D":
        if len(items) % 2:
            raise ValueError("odd dict item list")
        _hashed(items[0::2], refs[0::2], depth, "dict key")
        return dict(zip(items[0::2], items[1::2]))
    _hashed(items, refs, depth, "set element")
    if tag == "G":
        depth[index] = 1 + max(map(depth.__getitem__, refs), default=0)
        return frozenset(items)
    return set(items)


def _hashed(items: list[Any], refs: list[int], depth: list[int], what: str) -> None:
    """Refuse elements nested too deep to hash safely, and hash-collision bombs."""
    deepest = max(map(depth.__getitem__, refs), default=0)
    if deepest > MAX_HASHED_DEPTH:
        raise ValueError(f"{what} nested {deepest} levels deep (more than {MAX_HASHED_DEPTH})")
    if len(items) < 2:
        return
    # bounded: depth-capped, and in a tree each node is hashed a fixed number of times
    hashes = list(map(hash, items))
    if len(set(hashes)) < len(hashes):
        groups: dict[int, int] = {}
        for h in hashes:
            groups[h] = groups.get(h, 0) + 1
        work = sum(n * n for n in groups.values() if n > 1)
        if work > MAX_COLLISION_WORK:
            raise ValueError(f"{max(groups.values())} {what}s share one hash value (a hash-collision bomb): refused")


def _scalar(tag: Any, args: list[Any]) -> Any:
    if tag == "N":
        return None
    if tag == "B" and type(args[0]) is bool:
        return args[0]
    if tag == "F":
        return float(args[0])
    if tag == "C":
        return complex(float(args[0]), float(args[1]))
    if tag == "Y":
        return bytes.fromhex(args[0])
    if tag == "O":
        return Opaque(str(args[0])[:200], str(args[1])[:200] if len(args) > 1 else "")
    raise ValueError(f"unknown tag {str(tag)[:20]!r}")


class _Child:
    """A value to print inside a container (a plain ``str`` token is printed as is)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_BRACKETS: dict[type, tuple[str, str]] = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})")}


def _tokens(obj: Any) -> Iterator[str | _Child]:
    """The pieces of a container's repr, lazily: literals and :class:`_Child` values."""
    kind = type(obj)
    if kind is dict:
        yield "{"
        for i, (key, item) in enumerate(obj.items()):
            yield ", " if i else ""
            yield _Child(key)
            yield ": "
            yield _Child(item)
        yield "}"
        return
    if kind in (set, frozenset) and not obj:
        yield f"{kind.__name__}()"
        return
    opening, closing = _BRACKETS[kind]
    yield opening
    for i, item in enumerate(obj):
        yield ", " if i else ""
        yield _Child(item)
    yield "," + closing if kind is tuple and len(obj) == 1 else closing


def _leaf(obj: Any, budget: int) -> str:
    kind = type(obj)
    if kind in (str, bytes):
        return repr(obj) if len(obj) <= budget else repr(obj[:budget])[:-1] + "..."
    if kind is int and obj.bit_length() > 3000:  # repr is quadratic (and refused past 4300 digits)
        return f"<int of {obj.bit_length()} bits>"
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a trusted expected value of an unusual type
        return f"<{kind.__name__}>"
    return text if len(text) <= budget else text[:budget] + "..."


def short(value: Any, width: int = 300) -> str:
    """repr-like text of a decoded or expected value, cut to ``width`` characters.

    It prints piece by piece and stops at the budget, without recursion: a value with
    millions of parts, or nested 20,000 deep, costs about ``width`` steps, not its whole
    repr (which, for a shared structure, is exponential in its depth).
    """
    pieces: list[str] = []
    used = 0
    stack: list[Any] = [iter((_Child(value),))]
    while stack and used <= width:
        token = next(stack[-1], None)
        if token is None:
            stack.pop()
            continue
        if type(token) is str:
            piece = token
        elif type(token.value) in (list, tuple, set, frozenset, dict):
            stack.append(_tokens(token.value))
            continue
        else:
            piece = _leaf(token.value, width - used + 1)
        pieces.append(piece)
        used += len(piece)
    text = "".join(pieces)
    return text if used <= width and not stack else text[:width] + "..."


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
            if not (_close(exp, _as_float(act), tolerance)):
                return f"expected {exp!r}{at}, got {short(act, 80)}"
            continue
        if type(exp) is complex and type(act) in (complex, float, int):
            got = complex(_as_float(act)) if type(act) is int else complex(act)
            if not (_close(exp.real, got.real, tolerance) and _close(exp.imag, got.imag, tolerance)):
                return f"expected {exp!r}{at}, got {short(act, 80)}"
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
                stack.append((exp[key], act[key], f"{where}[{short(key, 80)}]"))
        elif exp != act:
            return f"expected {short(exp, 120)}{at}, got {short(act, 120)}"
    return None


def _as_float(number: float) -> float:
    """An int result where a float is expected; one too large for a float is infinite."""
    try:
        return float(number)
    except OverflowError:
        return math.inf if number > 0 else -math.inf


def _close(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
