"""xdist scheduling that keeps each config's tests on one worker.

Restarting a service is the expensive step (about ten minutes on the campaign's GPUs), so the
tests of one config must run on one worker, back to back. xdist's ``loadgroup`` does that by
appending ``@group`` to node ids on the workers, which pytest 9.2 no longer honours (node ids
are derived from a structured id there), and node ids must never be keyed on anyway (FACTS.md).
This scheduler groups by the config name found in the test's parameter id instead: it is the
same name on every worker, whatever pytest does to node ids. Tests without a config are each
their own scope, so they spread like ``--dist load``.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

from pytest_ddtree.configs import config_in_nodeid


def config_scope(nodeid: str) -> str:
    """The config name in a parametrized node id, or the node id itself when there is none."""
    name = config_in_nodeid(nodeid)
    return f"ddtree-config:{name}" if name else nodeid


class ConfigScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """LoadScopeScheduling whose scope is the DDTree config (see module docstring)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return config_scope(nodeid)
