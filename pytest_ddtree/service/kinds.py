"""The registry of controller kinds: the profile's ``controller:`` name -> the module that runs it.

Why a registry and not a chain of ``if controller == ...``: a way of running a service (a child
process, a systemd unit, a Slurm job, shell templates, somebody else's server; tomorrow a
Kubernetes deployment) is one module exporting a :class:`~pytest_ddtree.service.base.ControllerKind`
with its capabilities and profile keys. The profile validator maps the name to its kind here,
once; everything else asks the kind's capabilities (tests/test_codebase.py refuses a branch on
the name). A kind from outside the package comes in two ways: a distribution declares it in the
entry point group ``pytest_ddtree.controllers`` (``pidfile = mypkg.controller:KIND``, the name being
the kind's), read once, at the first question asked of the registry, as pytest reads its ``pytest11``
group; or a plugin loaded with ``-p`` (a test, a conftest) calls ``register``.
"""

from __future__ import annotations

from importlib import metadata
from typing import Callable

from pytest_ddtree.service import command, external, process, slurm, systemd
from pytest_ddtree.service.base import Capabilities, KeyTypes
from pytest_ddtree.service.installed import describe
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind
from pytest_ddtree.service.validated_profile import ProfileError

#: The entry point group a distribution declares its controller kinds in (``name = module:KIND``).
ENTRY_POINT_GROUP = "pytest_ddtree.controllers"

_KINDS: dict[str, ControllerKind] = {
    kind.name: kind for kind in (process.KIND, systemd.KIND, external.KIND, command.KIND, slurm.KIND)
}


class ControllerLoadError(ProfileError):
    """An installed distribution's controller kind could not be loaded: a usage error naming the
    distribution and its entry point, so the user fixes or uninstalls that distribution."""


#: Why the installed distributions' kinds could not be loaded (raised again at every question), or
#: None; ``_loaded`` once they were read.
_load_error: ControllerLoadError | None = None
_loaded = False


def _installed() -> None:
    """Register the kinds of the ``pytest_ddtree.controllers`` entry points, once (lazily: a run
    that never reads a profile imports none of them)."""
    global _loaded, _load_error
    if _load_error is not None:
        raise _load_error
    if _loaded:
        return
    _loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        where, fix = describe(entry)
        try:
            kind = entry.load()
            if not isinstance(kind, ControllerKind):
                raise TypeError(f"it names a {type(kind).__name__}, not a ControllerKind (service/protocol.py)")
            if kind.name != entry.name:
                raise ValueError(f"its kind is named {kind.name!r}: the entry point's name must be the kind's")
            _add(kind)
        except Exception as exc:  # noqa: BLE001 - a third party's import can raise anything
            _load_error = ControllerLoadError(
                f"controller kind {where} could not be loaded: {type(exc).__name__}: {exc}; {fix}")
            raise _load_error from None


def register(kind: ControllerKind) -> ControllerKind:
    """Make ``kind`` a valid ``controller:`` of profiles parsed from now on; its name must be new."""
    _installed()
    return _add(kind)


def _add(kind: ControllerKind) -> ControllerKind:
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
    _installed()
    return tuple(_KINDS)


def kind_named(name: str) -> ControllerKind:
    """The kind of ``controller: name`` (KeyError: no such kind; the validator says which exist)."""
    _installed()
    return _KINDS[name]


def make_controller(context: ControllerContext) -> Controller:
    """The controller of ``context.profile``, made by the module of its ``controller:`` (a name
    the validator accepted, so registered here)."""
    return kind_named(context.profile.controller).make(context)


def owned_keys() -> dict[str, ControllerKind]:
    """Each controller-owned profile key -> the kind that owns it."""
    _installed()
    return {key: kind for kind in _KINDS.values() for key in kind.profile_keys}


def key_types() -> KeyTypes:
    """The types of every controller-owned profile key, for the validator's type check."""
    _installed()
    return {key: types for kind in _KINDS.values() for key, types in kind.profile_keys.items()}


def kinds_that(can: Callable[[Capabilities], bool]) -> tuple[ControllerKind, ...]:
    """The registered kinds whose capabilities ``can`` accepts (for messages naming them)."""
    _installed()
    return tuple(kind for kind in _KINDS.values() if can(kind.capabilities))
