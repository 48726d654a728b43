"""Service lifecycle: profiles, controllers (process, systemd, external), readiness, the manager.

The plugin uses :class:`ServiceManager` (one per xdist worker) and catches
:class:`ServiceError` (fail the config's tests, among them :class:`ExternalConfigMismatch`:
an external service running another config).
"""

from pytest_ddtree.service.base import (
    AppliedConfigMismatch,
    AppliedDiff,
    ConfigNotAvailable,
    Controller,
    ExitInfo,
    ExternalConfigMismatch,
    Launch,
    ServiceDiedError,
    ServiceError,
    ServiceStartError,
)
from pytest_ddtree.service.manager import RunningService, ServiceManager
from pytest_ddtree.service.pool import InstanceLock, free_port, instance_for_worker, worker_index
from pytest_ddtree.service.process import install_signal_handlers, kill_all_groups

__all__ = [
    "AppliedConfigMismatch",
    "AppliedDiff",
    "ConfigNotAvailable",
    "Controller",
    "ExitInfo",
    "ExternalConfigMismatch",
    "InstanceLock",
    "Launch",
    "RunningService",
    "ServiceDiedError",
    "ServiceError",
    "ServiceManager",
    "ServiceStartError",
    "free_port",
    "install_signal_handlers",
    "instance_for_worker",
    "kill_all_groups",
    "worker_index",
]
