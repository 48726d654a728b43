"""Which isolation tier this machine offers (found once by probe runs), what it guarantees, and when the coding gate must refuse it."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

from pytest_ddtree.sandbox import bwrap, cgroup, seccomp, unshare
from pytest_ddtree.sandbox.calls import parse_tests
from pytest_ddtree.sandbox.execute import execute_in_tier
from pytest_ddtree.sandbox.limits import Limits
from pytest_ddtree.sandbox.outcome import Verdict
from pytest_ddtree.sandbox.view import interpreter_under_tmp


@dataclass(frozen=True)
class Isolation:
    """What the sandbox gives on this machine: the tier and what it guarantees."""

    tier: str  # "bwrap" | "unshare" | "userns" | "plain"
    uid_drop: bool
    network_isolated: bool
    pid_namespace: bool
    private_tmp: bool
    notes: tuple[str, ...] = ()
    cgroup: str | None = None  # "v1" | "v2": memory and pids counted by the kernel
    seccomp: bool = False
    minimal_view: bool = False  # only /usr, the interpreter and tmpfs are visible

    @property
    def strong(self) -> bool:
        """A namespace tier with a uid drop: what the coding gate requires without opt-in."""
        return self.tier in ("bwrap", "unshare") and self.uid_drop

    def describe(self) -> str:
        parts = [f"tier={self.tier}"]
        parts.append("uid drop" if self.uid_drop else "no uid drop")
        parts.append("no network" if self.network_isolated else "network NOT isolated")
        parts.append("pid namespace" if self.pid_namespace else "no pid namespace")
        parts.append("private /tmp" if self.private_tmp else "shared /tmp")
        if self.minimal_view:
            parts.append("minimal read-only view (/usr + interpreter, no site-packages)" if self.tier == "bwrap" else "minimal read-only view (/usr + interpreter, no site-packages, pivot_root)")
        else:
            parts.append("the whole host visible")
        parts.append(f"memory+pids by cgroup {self.cgroup}" if self.cgroup else "memory by RLIMIT_AS only (shared memory: memfd, tmpfs, NOT bounded)")
        parts.append("seccomp + no_new_privs" if self.seccomp else "no seccomp")
        return ", ".join(parts)


_iso_lock = threading.Lock()
_iso_cache: Isolation | None = None
_PROBE_CODE = "def f(x):\n    return x + 1\n"
_PROBE_TESTS = "f(1) == 2\n"


def _probe(tier: str, want_uid: bool) -> str | None:
    """Run a trivial job in a tier; None when it works, else why not."""
    try:
        res = execute_in_tier(tier, _PROBE_CODE, parse_tests(_PROBE_TESTS, "f"), Limits(wall_s=20.0, cpu_s=10.0), want_uid)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if res.verdict is Verdict.PASSED:
        return None
    return f"{res.verdict.value}: {res.message[:300]}"


TIERS = ("bwrap", "unshare", "userns", "plain")


def isolation() -> Isolation:
    """Detect (once per process, cached) the strongest tier that passes a probe run here.

    ``DDTREE_SANDBOX_TIER`` (one of :data:`TIERS`) starts the search at that tier, e.g.
    ``plain`` for tests of the weakest one.
    """
    global _iso_cache
    with _iso_lock:
        if _iso_cache is not None:
            return _iso_cache
        notes: list[str] = []
        forced = os.environ.get("DDTREE_SANDBOX_TIER", "")
        start = TIERS.index(forced) if forced in TIERS else 0
        is_root = hasattr(os, "getuid") and os.getuid() == 0
        linux = sys.platform.startswith("linux")
        group = cgroup.available()  # not root: only a delegated (writable) v2 subtree
        has_seccomp = seccomp.program() is not None
        candidates = []
        if linux and is_root:
            if bwrap.find():
                candidates.append("bwrap")
            else:
                notes.append("bubblewrap (bwrap) not installed: apt-get install bubblewrap")
            if unshare.find():
                candidates.append("unshare")
            else:
                notes.append("util-linux unshare not found")
        elif linux and unshare.find():
            candidates.append("userns")
        for tier in candidates:
            if TIERS.index(tier) < start:
                continue
            why = _probe(tier, want_uid=is_root)
            if why is None:
                _iso_cache = Isolation(tier, is_root, True, True, True, tuple(notes), cgroup=group, seccomp=has_seccomp, minimal_view=True)
                return _iso_cache
            notes.append(f"{tier} tier unavailable ({why})")
            if interpreter_under_tmp() and not any("under /tmp" in n for n in notes):
                notes.append(f"the interpreter {interpreter_under_tmp()} lies under /tmp, hidden in the run by its private /tmp")
        if is_root:
            why = _probe("plain", want_uid=True)
            if why is None:
                _iso_cache = Isolation("plain", True, False, False, False, tuple(notes))
                return _iso_cache
            notes.append(f"uid drop unavailable ({why})")
        _iso_cache = Isolation("plain", False, False, False, False, tuple(notes))
        return _iso_cache


def _fix(iso: Isolation) -> str:
    """What to do about a weak tier, from what actually failed (not always "install")."""
    exe = interpreter_under_tmp()
    if exe is not None:
        return (f"the interpreter {exe} lies under /tmp, which the sandbox covers with a private tmpfs, so no run can "
                "start it: use an interpreter (or create the venv) outside /tmp, or set the tier explicitly")
    if os.environ.get("DDTREE_SANDBOX_TIER", "") in TIERS[1:]:
        return f"DDTREE_SANDBOX_TIER={os.environ['DDTREE_SANDBOX_TIER']} skipped the stronger tiers: unset it"
    if not (hasattr(os, "getuid") and os.getuid() == 0):
        return "run as root (the namespace tiers drop to a per-run uid), with bubblewrap (apt-get install bubblewrap) or util-linux unshare"
    if not bwrap.find() and not unshare.find():
        return "install bubblewrap (apt-get install bubblewrap) or util-linux"
    return "the probe runs of the namespace tiers failed as noted; fix that cause (CAP_SYS_ADMIN and CAP_SETUID are needed)"


def refusal(iso: Isolation, allow_plain: bool) -> str | None:
    """Why the coding gate must not run generated code here (None: it may).

    Fail closed: without a namespace tier with a uid drop the gate runs only when the user
    opted in (``--ddtree-sandbox=plain``), and never as root without a uid drop.  The fix
    named is the one for what failed (:func:`_fix`).
    """
    is_root = hasattr(os, "getuid") and os.getuid() == 0
    if is_root and not iso.uid_drop:
        return (
            f"the sandbox would run generated code as root ({iso.describe()}; {'; '.join(iso.notes) or 'no uid drop'}). "
            f"Fix: {_fix(iso)}"
        )
    if iso.strong or allow_plain:
        return None
    why = "; ".join(iso.notes) or ("not root: no uid drop, no cgroup" if iso.tier == "userns" else "no namespaces")
    return (
        f"the strongest sandbox tier is unavailable: {iso.describe()} ({why}). "
        f"Fix: {_fix(iso)}; or accept the weaker isolation explicitly with --ddtree-sandbox=plain (ini: ddtree_sandbox = plain)"
    )
