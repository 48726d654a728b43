"""The ``plain`` backend: no namespaces, only a session, rlimits and a uid drop.

Why it exists: macOS and containers without namespaces still deserve a bounded run, but
its isolation is weak (the whole host is visible, the network is open), so the coding gate
uses it only when the user opts in (``--ddtree-sandbox=plain``), and never as root without a
uid drop (:func:`pytest_ddtree.sandbox.refusal`).  The run is started directly with
``Popen(user=uid)``; there is no stage, so no cgroup and no seccomp filter.
"""

from __future__ import annotations

__all__ = ["command"]


def command(*, uid: int | None, run: list[str]) -> tuple[list[str], int | None]:
    """The runner's argv itself, and the uid ``Popen`` drops to (None: none)."""
    return list(run), uid
