"""The check of a JSON-shaped value against a typed shape (TypedDicts, lists, dicts, unions,
literals), with a message that names the key and what was expected (no pytest import).

Why its own module: every record read from another process, a file or a shared database is held
to its kind's shape (``shapes.check_record``) before a reader meets it, and the check must be both
exact and cheap - a large sweep's session end reads thousands of records - so each hint's check is
built once (``_checker``)."""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar, Union, cast

RawRecord = Mapping[str, object]


class RecordError(ValueError):
    """A record does not have its kind's shape; the message names the record, the key and what was expected."""


@functools.cache
def _hints(shape: type) -> dict[str, object]:
    return typing.get_type_hints(shape)


def _type_name(hint: object) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(str(a)) for a in typing.get_args(hint))
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if typing.is_typeddict(hint):
        return "an object"
    origin = typing.get_origin(hint)
    if origin is dict:
        return f"an object of {_type_name(typing.get_args(hint)[1])}"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    return {type(None): "null", float: "a number", int: "an integer", str: "a string", bool: "true or false"}.get(
        cast(type, hint), str(hint))


def _shown(value: object) -> str:
    text = repr(value)
    return f"{text[:60]}..." if len(text) > 60 else text


def _at(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _wrong(value: object, hint: object, where: str) -> str:
    """The message for a value that does not fit ``hint`` (built only then: naming the expected
    type walks the hint again, and most values fit)."""
    return f"{where or 'it'} is {_shown(value)}, expected {_type_name(hint)}"


Check = Callable[[object, str], str | None]


def problem_of(value: object, hint: object, where: str) -> str | None:
    """What is wrong with ``value`` as ``hint`` (a type of the shapes above), or None."""
    return _checker(hint)(value, where)


@functools.cache
def _checker(hint: object) -> Check:
    """The check of one hint, built once: every record the session reads or judges is checked
    (the control's judgement re-reads its earlier launches per cell), and walking the typing
    objects for each value made the check most of a large sweep's own time."""
    origin = typing.get_origin(hint)
    if hint is object:
        return lambda value, where: None
    if origin in (Union, types.UnionType):
        return _union_checker(hint)
    if origin is Literal:
        allowed = typing.get_args(hint)
        return lambda value, where: None if any(value == a for a in allowed) else _wrong(value, hint, where)
    if typing.is_typeddict(hint):
        return _typeddict_checker(cast(type, hint))
    if origin is dict:
        item = typing.get_args(hint)[1]

        def check_dict(value: object, where: str) -> str | None:
            if not isinstance(value, Mapping):
                return _wrong(value, hint, where)
            inner = _checker(item)
            return next((p for k, v in value.items() if (p := inner(v, _at(where, k))) is not None), None)
        return check_dict
    if origin is list:
        element = typing.get_args(hint)[0]

        def check_list(value: object, where: str) -> str | None:
            if not isinstance(value, list):
                return _wrong(value, hint, where)
            inner = _checker(element)
            return next((p for i, v in enumerate(value) if (p := inner(v, f"{where}[{i}]")) is not None), None)
        return check_list
    if hint is type(None):
        return lambda value, where: None if value is None else _wrong(value, hint, where)
    if hint is float:
        return lambda value, where: (None if isinstance(value, (int, float)) and not isinstance(value, bool)
                                     else _wrong(value, hint, where))
    if hint is int:
        return lambda value, where: (None if isinstance(value, int) and not isinstance(value, bool)
                                     else _wrong(value, hint, where))
    if isinstance(hint, type):
        kind = hint
        return lambda value, where: None if isinstance(value, kind) else _wrong(value, hint, where)
    raise TypeError(f"records: no check for {hint!r}")  # a shape above uses a type the check does not know


def _union_checker(hint: object) -> Check:
    arms = typing.get_args(hint)
    all_shapes = all(typing.is_typeddict(arm) for arm in arms)
    optional = type(None) in arms

    def check_union(value: object, where: str) -> str | None:
        if value is None and optional:  # most unions are ``X | None``: no message built for X's arm
            return None
        problems: list[str] = []
        for arm in arms:  # the first arm that fits ends the check
            if (arm_problem := _checker(arm)(value, where)) is None:
                return None
            problems.append(arm_problem)
        if isinstance(value, Mapping) and all_shapes:
            return "; or ".join(f"as {getattr(arm, '__name__')}: {p}" for arm, p in zip(arms, problems))
        return _wrong(value, hint, where)
    return check_union


def _typeddict_checker(shape: type) -> Check:
    required = sorted(getattr(shape, "__required_keys__"))

    def check_shape(value: object, where: str) -> str | None:
        if not isinstance(value, Mapping):
            return _wrong(value, shape, where)
        missing = [k for k in required if k not in value]
        if missing:
            return f"{where + ' ' if where else ''}lacks {', '.join(repr(k) for k in missing)}"
        hints = _hints(shape)
        for key, item in value.items():
            if key in hints and (p := _checker(hints[key])(item, _at(where, key))) is not None:
                return p
        return None
    return check_shape


def describe(record: RawRecord) -> str:
    """How a message names a record: its kind, config, cell and worker where it has them."""
    parts = [str(record.get("kind") or "record")]
    parts += [str(record[k]) for k in ("config", "cell") if isinstance(record.get(k), str)]
    worker = record.get("worker")
    return " ".join(parts) + (f" (from {worker})" if isinstance(worker, str) else "")


ShapeT = TypeVar("ShapeT")


def checked(shape: Callable[..., ShapeT], record: RawRecord) -> ShapeT:
    """``record`` as ``shape``, after checking it (``RecordError`` says what is wrong)."""
    problem = problem_of(record, shape, "")
    if problem is not None:
        raise RecordError(f"malformed record {describe(record)}: {problem}")
    return cast(ShapeT, record)
