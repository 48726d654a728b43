"""Readiness: wait until the service answers its health path, then prove the config applied.

The campaign's first sweep died because a readiness loop under ``set -e`` treated the first
refused connection as fatal. Here everything that is normal while a model loads - refused
connections, timeouts, 503 - is retried until one deadline, while a *real* failure (the process
exited, the unit failed) ends the wait within a poll interval, with the exit code and the log.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Protocol

from pytest_ddtree import progress as progress_mod
from pytest_ddtree.service.http import Deadline, DeadlineExceeded, describe_transport_error, phase
from pytest_ddtree.service.base import (
    AppliedConfigMismatch,
    AppliedDiff,
    ProgressFn,
    ServiceStartError,
    last_error_line,
)
from pytest_ddtree.service.ports import PortTaken
from pytest_ddtree.service.protocol import Controller

MISSING = "<missing>"


class HealthClient(Protocol):
    """What readiness needs from pytest_ddtree.service.client.SGLangClient."""

    def health(self, path: str, timeout: float = ...) -> int: ...

    def server_info(self) -> dict[str, Any]: ...


def _default_gpu_memory() -> int | None:
    try:
        from pytest_ddtree.service import gpu
    except ImportError:  # pragma: no cover - gpu.py is part of the package
        return None
    try:
        return gpu.gpu_memory_used_bytes()
    except Exception:  # noqa: BLE001 - progress must never fail the start
        return None


def _last_log_line(controller: Controller) -> str:
    """The service log's last line, cut for a status line ("" where there is none to show)."""
    try:
        tail = controller.log_tail(3)
    except Exception:  # noqa: BLE001 - progress must never fail the start
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines or lines[-1].startswith("<"):  # "<no log ...>": nothing of the service's own
        return ""
    shown = "".join(ch if ch.isprintable() else "?" for ch in lines[-1])  # a hostile log cannot move the cursor
    return shown if len(shown) <= 120 else shown[:117] + "..."


def wait_ready(
    client: HealthClient,
    controller: Controller,
    health_path: str,
    timeout_s: float,
    progress: ProgressFn | None = None,
    poll_interval: float = 0.5,
    *,
    progress_interval: float = 10.0,
    gpu_memory: Callable[[], int | None] | None = _default_gpu_memory,
    config_name: str | None = None,
    what: str = "service",
    health_timeout_s: float = 5.0,
) -> float:
    """Poll ``health_path`` until HTTP 200; return the seconds it took.

    Raises ServiceStartError when the controller reports the service dead (checked before every
    poll, so within ``poll_interval`` plus one refused connect) or when ``timeout_s`` passes: it is
    the readiness phase's deadline, so a poll that trickles bytes ends there too (``http.phase``).
    """
    with phase(Deadline.after(timeout_s, "readiness", "ready_timeout_s")):
        return _wait_ready(client, controller, health_path, timeout_s, progress, poll_interval, progress_interval,
                           gpu_memory, config_name, what, health_timeout_s)


def _wait_ready(client: HealthClient, controller: Controller, health_path: str, timeout_s: float,
                progress: ProgressFn | None, poll_interval: float, progress_interval: float,
                gpu_memory: Callable[[], int | None] | None, config_name: str | None, what: str,
                health_timeout_s: float) -> float:
    start = time.monotonic()
    deadline = start + timeout_s
    next_progress = start + progress_interval
    next_look = start  # the status line's GPU memory and log line: at once, then every progress_interval
    last = "no answer yet"
    mem_text, log_line = "", ""
    polls = 0
    # the status line clears when the wait ends, ready or not
    with progress_mod.activity(f"waiting for {what}{' ' + config_name if config_name else ''}"):
        while True:
            info = controller.failure()
            if info is not None:
                error = last_error_line(info.log_tail)
                raise ServiceStartError(
                    f"{what} exited while starting: {info.description}" + (f": {error}" if error else ""),
                    exit_code=info.exit_code,
                    log_tail=info.log_tail,
                    elapsed=time.monotonic() - start,
                    config_name=config_name,
                    hint="read the log tail; the flags of this config may not be supported by this server build",
                )
            try:
                status = client.health(health_path, timeout=health_timeout_s)
                polls += 1
                if status == 200:
                    if (stranger := controller.answered_by_another()) is not None:
                        # PortTaken: an auto-chosen port is chosen again (another process took it while
                        # ours was still loading: a real SGLang binds its port a minute after it starts)
                        raise PortTaken(f"{what}'s health path answered, but not from the process it started: "
                                                f"{stranger}", log_tail=controller.log_tail(),
                                                elapsed=time.monotonic() - start, config_name=config_name,
                                                hint="stop the other server, or set port: auto in the profile")
                    return time.monotonic() - start
                last = f"HTTP {status}"
            except OSError as exc:  # ServiceUnreachable: refused, reset, timed out, past a deadline
                polls += 1
                if not (polls > 1 and isinstance(exc, DeadlineExceeded) and exc.deadline.name == "readiness"):
                    last = describe_transport_error(exc)  # (a poll the readiness deadline cut short keeps the last answer)
            now = time.monotonic()
            if now >= deadline:
                raise ServiceStartError(
                    f"{what} not ready after {timeout_s:g} s (last answer from {health_path}: {last})",
                    exit_code=None,
                    log_tail=controller.log_tail(),
                    elapsed=now - start,
                    config_name=config_name,
                    hint="raise ready_timeout_s in the profile (or --ddtree-ready-timeout) if loading is just slow",
                )
            if now >= next_look:  # the expensive parts (GPU memory, a remote log) every progress_interval
                next_look = now + progress_interval
                mem = gpu_memory() if gpu_memory is not None else None
                mem_text = f", GPU memory in use {mem / 2**30:.1f} GiB" if mem is not None else ""
                log_line = _last_log_line(controller) if progress_mod.showing() else ""
            if now >= next_progress:
                next_progress = now + progress_interval
                if progress is not None and not progress_mod.showing():
                    progress(f"waiting for {what}{' ' + config_name if config_name else ''} ({controller.describe()}): "
                             f"{now - start:.0f} s elapsed, last: {last}{mem_text}")
            progress_mod.status(f"waiting for {what}{' ' + config_name if config_name else ''} to be ready: "
                                f"{now - start:.0f} s of {timeout_s:.0f} s, health {last}{mem_text}"
                                + (f"; log: {log_line}" if log_line else ""))
            time.sleep(max(0.0, min(poll_interval, deadline - time.monotonic())))


def _lookup(info: Mapping[str, Any], key: str) -> object:
    """Top-level key, or a dotted path (``internal_states.0.x``) for nested values."""
    if key in info:
        return info[key]
    node: object = info
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def _same(expected: object, actual: object) -> bool:
    if expected is None or actual is None:
        # "no window" is reported as null, 0 or -1 by different builds.
        return actual in (None, 0, -1, "None", "none", "null") and expected in (None, 0, -1)
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return float(expected) == float(actual)
    return str(expected) == str(actual)


def applied_diff(expected: Mapping[str, object], server_info: Mapping[str, object]) -> list[AppliedDiff]:
    """Key-by-key differences between what a config must show and what the server reports."""
    diffs = []
    for key, want in expected.items():
        got = _lookup(server_info, key)
        if got is MISSING or not _same(want, got):
            diffs.append(AppliedDiff(key, want, got))
    return diffs


def verify_applied(config_name: str, expected: Mapping[str, object], server_info: Mapping[str, object], *,
                   not_speculating: str | None = None) -> None:
    """The applied check, the one the start-up (service/manager.py) and the health suite
    (suites/test_health.py) both run: raise AppliedConfigMismatch (with the diff, and
    ``not_speculating``'s finding where there is one) unless every expected key matches as
    :func:`applied_diff` compares (SGLang 0.5.23 reports an unset arg as null; other builds write
    "no window" as 0 or -1)."""
    diffs = applied_diff(expected, server_info)
    if diffs:
        raise AppliedConfigMismatch(config_name, diffs, not_speculating=not_speculating)


def not_speculating(server_info: Mapping[str, object], keys: Iterable[str] = ()) -> str | None:
    """What in ``/server_info`` shows a server that does not speculate (None: it speculates, or
    does not say); ``keys``: the profile's applied keys, named where they are null too.

    Why: a profile whose flags the build does not read starts a plain server that answers every
    request; every config would then be measured, and pass, as no speculation at all. SGLang
    reports every server arg, so ``speculative_algorithm`` is there, null when nothing
    speculates (sglang 0.5.23 sglang/srt/arg_groups/fields/spec.py:31-34).
    """
    if "speculative_algorithm" not in server_info:
        return None
    algorithm = server_info["speculative_algorithm"]
    if algorithm is not None and str(algorithm).upper() != "NONE":
        return None
    unset = sorted({key for key in keys if key in server_info and server_info[key] is None})
    return (f"/server_info has speculative_algorithm {'null' if algorithm is None else repr(algorithm)}"
            + (f" (and {', '.join(unset)} null)" if unset else ""))
