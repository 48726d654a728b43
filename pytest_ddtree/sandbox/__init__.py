"""Run untrusted, model-generated Python code and its tests in a sandbox.

Why this module exists: the coding gate executes whatever the service under test answers.
A broken or hostile answer (a fork bomb, a memory bomb, an output flood, a write to the
harness's files, a daemon that outlives the run) must end with a clear verdict and leave
nothing behind.  The guards of human-eval/evalplus (a fork of the big process with some
functions nulled) are not a sandbox; this module follows their issue trackers' lessons
instead: a fresh interpreter per run, its own session and process group, stdin from
/dev/null, bounded output capture, a private temp dir, a scrubbed environment, rlimits, a
wall-clock limit that kills everything, and OS isolation where the machine offers it.

The verdict is decided here, not in the run: only the code, the calls and their input
values enter the sandbox, and the results come back as data that
:func:`pytest_ddtree.sandbox.calls.judge_outcome` compares with the expected values.

Isolation tiers (detected once per process by a probe run, see :func:`isolation`; the
docs/sandbox.md lists what each guarantees and the test that proves it):

``bwrap`` (Linux, root, bubblewrap installed): the root stage (:mod:`.stage`) joins the
    run's cgroup and drops to a per-run unprivileged uid; bubblewrap (:mod:`.bwrap`) builds a
    root of read-only ``/usr`` and interpreter, tmpfs work dir and ``/tmp``, new
    user/PID/network/IPC/UTS/cgroup namespaces, ``no_new_privs`` and the seccomp filter
    (:mod:`.seccomp`).
``unshare`` (Linux, root, util-linux ``unshare``, no bubblewrap): the same view, built by
    the stage itself as PID 1 of new namespaces (``pivot_root`` into a fresh tmpfs), the
    same cgroup, uid drop, ``no_new_privs`` and filter.
``userns`` (Linux, not root, unprivileged user namespaces): the ``unshare`` stage inside a
    user namespace, without a uid drop or cgroup.
``plain`` (anything else): a session, rlimits, a uid drop where the interpreter is
    reachable; the coding gate refuses it unless the user opts in, and never runs code as
    root (:func:`refusal`).

The per-run uid makes ``RLIMIT_NPROC`` effective (root ignores it) and every file it does
not own read-only; the PID namespace means nothing survives (the kernel kills the rest when
its first process dies, also children that called ``setsid``).  In every tier, after the
run (and at once on a timeout or an output flood) the process group is SIGKILLed, then every
process still owned by the run's uid or descended from it, and the run's cgroup is removed.

This module only re-exports the public names.  Where the work lives: :mod:`.jobs` (``run_code``,
``run_many``), :mod:`.tiers` (detection, guarantees, refusal), :mod:`.execute` (one run end to
end), :mod:`.launch` (its command line, environment, limits, work dir), :mod:`.view` (what the
run sees of the host), :mod:`.processes` (per-run uid, the /proc sweep), :mod:`.limits`,
:mod:`.outcome`; inside the run :mod:`.runner` and :mod:`.values`; the parent's judgement
:mod:`.calls` and :mod:`.predicate`.
"""

from __future__ import annotations

from pytest_ddtree.sandbox.calls import StepError, TestPlan, parse_tests
from pytest_ddtree.sandbox.jobs import Job, default_workers, run_code, run_many
from pytest_ddtree.sandbox.limits import Limits, speed_factor
from pytest_ddtree.sandbox.outcome import RunResult, Verdict
from pytest_ddtree.sandbox.processes import UID_BASE, find_leftovers
from pytest_ddtree.sandbox.tiers import TIERS, Isolation, isolation, refusal
from pytest_ddtree.sandbox.view import hidden_paths

__all__ = [
    "Isolation",
    "StepError",
    "TIERS",
    "UID_BASE",
    "refusal",
    "TestPlan",
    "parse_tests",
    "Job",
    "Limits",
    "RunResult",
    "Verdict",
    "default_workers",
    "find_leftovers",
    "hidden_paths",
    "isolation",
    "run_code",
    "run_many",
    "speed_factor",
]
