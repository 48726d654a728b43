"""Service lifecycle: profiles, controllers (one module each behind protocol.py), readiness, the manager.

The plugin uses :class:`ServiceManager` (one per xdist worker) and catches
:class:`ServiceError` (fail the config's tests, among them :class:`ExternalConfigMismatch`:
an external service running another config).

The names below are imported on first use (PEP 562), not here: the plugin is loaded into every
pytest run of every project in its environment, and the manager pulls in the controllers, the
ssh transport, the HTTP layer and the proof of what a service serves; a run that never starts a
service must not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_ddtree.service.base import (
        AppliedConfigMismatch,
        AppliedDiff,
        ConfigNotAvailable,
        ExitInfo,
        ExternalConfigMismatch,
        Launch,
        ServiceDiedError,
        ServiceError,
        ServiceStartError,
    )
    from pytest_ddtree.service.manager import RunningService, ServiceManager
    from pytest_ddtree.service.protocol import Controller, ControllerKind
    from pytest_ddtree.service.pool import InstanceLock, free_port, instance_for_worker, worker_index
    from pytest_ddtree.service.process import install_signal_handlers, kill_all_groups

_HOME = {
    "AppliedConfigMismatch": "base",
    "AppliedDiff": "base",
    "ConfigNotAvailable": "base",
    "Controller": "protocol",
    "ControllerKind": "protocol",
    "ExitInfo": "base",
    "ExternalConfigMismatch": "base",
    "Launch": "base",
    "ServiceDiedError": "base",
    "ServiceError": "base",
    "ServiceStartError": "base",
    "RunningService": "manager",
    "ServiceManager": "manager",
    "InstanceLock": "pool",
    "free_port": "pool",
    "instance_for_worker": "pool",
    "worker_index": "pool",
    "install_signal_handlers": "process",
    "kill_all_groups": "process",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
