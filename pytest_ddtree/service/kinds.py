"""The registry of controller kinds: the profile's ``controller:`` name -> the module that runs it.

Why a registry and not a chain of ``if controller == ...``: a way of running a service (a child
process, a systemd unit, a Slurm job, shell templates, somebody else's server; tomorrow a
Kubernetes deployment) is one module exporting a :class:`~pytest_ddtree.service.base.ControllerKind`
with its capabilities and profile keys. The profile validator maps the name to its kind here,
once; everything else asks the kind's capabilities (tests/test_codebase.py refuses a branch on
the name). ``register`` adds a kind from outside the package (a plugin, a test).
"""

from __future__ import annotations

from typing import Callable

from pytest_ddtree.service import command, external, process, slurm, systemd
from pytest_ddtree.service.base import Capabilities, KeyTypes
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind

_KINDS: dict[str, ControllerKind] = {
    kind.name: kind for kind in (process.KIND, systemd.KIND, external.KIND, command.KIND, slurm.KIND)
}


def register(kind: ControllerKind) -> ControllerKind:
    """Make ``kind`` a valid ``controller:`` of profiles parsed from now on; its name must be new."""
    if kind.name in _KINDS:
        raise ValueError(f"controller kind {kind.name!r} is registered already")
    owned = owned_keys()
    clash = sorted(key for key in kind.profile_keys if key in owned)
    if clash:
        raise ValueError(f"controller kind {kind.name!r}: profile key {clash[0]!r} belongs to controller {owned[clash[0]].name}")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget the kind ``name`` (a test's own kind, once the test is done)."""
    _KINDS.pop(name, None)


def names() -> tuple[str, ...]:
    """Every valid ``controller:`` value, in registration order (the built-in five first)."""
    return tuple(_KINDS)


def kind_named(name: str) -> ControllerKind:
    """The kind of ``controller: name`` (KeyError: no such kind; the validator says which exist)."""
    return _KINDS[name]


def make_controller(context: ControllerContext) -> Controller:
    """The controller of ``context.profile``, made by the module of its ``controller:`` (a name
    the validator accepted, so registered here)."""
    return kind_named(context.profile.controller).make(context)


def owned_keys() -> dict[str, ControllerKind]:
    """Each controller-owned profile key -> the kind that owns it."""
    return {key: kind for kind in _KINDS.values() for key in kind.profile_keys}


def key_types() -> KeyTypes:
    """The types of every controller-owned profile key, for the validator's type check."""
    return {key: types for kind in _KINDS.values() for key, types in kind.profile_keys.items()}


def kinds_that(can: Callable[[Capabilities], bool]) -> tuple[ControllerKind, ...]:
    """The registered kinds whose capabilities ``can`` accepts (for messages naming them)."""
    return tuple(kind for kind in _KINDS.values() if can(kind.capabilities))
