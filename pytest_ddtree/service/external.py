"""The ``external`` controller: a service somebody else runs; we never restart it.

Used for shared deployments and for pools given as URLs. ``start`` only proves the URL answers;
whether the running config is the asked one is decided by the manager from /server_info, and a
different config means the tests of that config are *skipped* with the reason (we were not
allowed to change it), not failed.
"""

from __future__ import annotations

from typing import Protocol

from pytest_ddtree.service.base import Controller, ExitInfo, Launch, ServiceStartError


class _Health(Protocol):
    def health(self, path: str) -> int: ...


class ExternalController(Controller):
    """Checks reachability only; stop/restore are no-ops by design."""

    kind = "external"

    def __init__(self, client: _Health, health_path: str) -> None:
        self.client = client
        self.health_path = health_path
        self._launch: Launch | None = None

    def start(self, launch: Launch) -> None:
        self._launch = launch
        try:
            status = self.client.health(self.health_path)
        except OSError as exc:  # ServiceUnreachable
            raise ServiceStartError(
                f"external service at {launch.url} does not answer {self.health_path}: {type(exc).__name__}: {exc}",
                log_tail="<external service: no log available>",
                config_name=launch.name,
                hint="start the service (the harness never starts an external one) or fix 'url'/'pool' in the profile",
            ) from None
        if status >= 500 and status != 503:
            raise ServiceStartError(
                f"external service at {launch.url} answers {self.health_path} with HTTP {status}",
                log_tail="<external service: no log available>",
                config_name=launch.name,
                hint="check the service's own logs",
            )

    def close_client(self) -> None:
        """Close the health client's connections (the manager calls it at session end)."""
        close = getattr(self.client, "close", None)
        if callable(close):
            close()

    def failure(self) -> ExitInfo | None:
        return None

    def stop(self) -> None:
        return None

    def log_tail(self, n: int = 40) -> str:
        return "<external service: no log available>"

    def startup_log(self) -> str | None:
        return None

    def describe(self) -> str:
        return f"external service {self._launch.url if self._launch else ''}".rstrip()
