"""The errors and records of the service lifecycle, and what a controller can do.

The controller protocol itself (``Controller``, ``ControllerKind``) is in protocol.py; this
module keeps what every layer below it shares: the lifecycle's errors, a launch, how a service
ended, log reading, and the :class:`Capabilities` a controller declares (the validated profile
carries them, so it needs nothing of the controllers' modules).

A controller only *launches*; readiness is decided by the manager through HTTP, because only the
service itself knows when its model is loaded.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

ProgressFn = Callable[[str], None]
"""Where lifecycle progress lines go (the plugin writes them to the terminal)."""


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines()) or "    <empty>"



#: An environment variable's name as a shell can export it (POSIX: letters, digits, underscore): a
#: launch's environment reaches a shell (the slurm job script's ``export NAME=...``, a command
#: template), where any other name is either an error or code.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_RULE = ("not an environment variable name: letters, digits and '_', not starting with a digit "
                 "(a shell exports it)")


def is_env_name(name: object) -> bool:
    return isinstance(name, str) and _ENV_NAME.fullmatch(name) is not None

class ServiceError(Exception):
    """Base class of every lifecycle error; the plugin turns it into a test failure."""


class ServiceStartError(ServiceError):
    """The service did not become ready (crashed, failed, timed out, did not answer).

    The message shows everything a person needs to act without re-running: what went wrong, the
    exit code, how long it took and the tail of the service log.
    """

    def __init__(
        self,
        reason: str,
        exit_code: int | None = None,
        log_tail: str = "",
        elapsed: float | None = None,
        *,
        config_name: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.reason = reason
        self.exit_code = exit_code
        self.log_tail = log_tail
        self.elapsed = elapsed
        self.config_name = config_name
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        head = f"service for config {self.config_name}: {self.reason}" if self.config_name else self.reason
        parts = [head]
        if self.exit_code is not None:
            parts.append(f"exit code: {describe_exit_code(self.exit_code)}")
        if self.elapsed is not None:
            parts.append(f"after {self.elapsed:.1f} s")
        text = "; ".join(parts)
        if self.hint:
            text += f"\nwhat to do: {self.hint}"
        text += "\nlast lines of the service log:\n" + _indent(self.log_tail)
        return text


class ServiceDiedError(ServiceStartError):
    """The service was ready once, then exited while tests of its config were running."""


@dataclass(frozen=True)
class AppliedDiff:
    """One server_info key whose value is not what the config asked for."""

    key: str
    expected: object
    actual: object


class AppliedConfigMismatch(ServiceError):
    """The service came up but does not run the asked config (a flag was ignored or renamed).

    This is never "fixed" by falling back: measuring the wrong config is worse than failing.
    """

    def __init__(self, config_name: str, diffs: Sequence[AppliedDiff], source: str = "/server_info", hint: str | None = None,
                 *, not_speculating: str | None = None) -> None:
        self.config_name = config_name
        self.diffs = list(diffs)
        lines = [f"service does not run config {config_name}: {len(self.diffs)} applied value(s) differ in {source}"]
        if not_speculating:  # the one fact that explains every difference below
            lines[0] += f"; the server does not speculate: {not_speculating}"
        width = max([len(d.key) for d in self.diffs] + [3])
        lines.append(f"    {'key':<{width}}  expected  actual")
        for d in self.diffs:
            lines.append(f"    {d.key:<{width}}  {d.expected!r:<8}  {d.actual!r}")
        lines.append(hint or (
            "what to do: check that the profile's config_args flags are the ones this server build reads "
            "(upstream DFLASH silently forces topk=1), and that the applied keys name real /server_info keys"
        ))
        super().__init__("\n".join(lines))


class ConfigNotServed(ServiceError):
    """/server_info shows the config, but the service's behaviour shows another one: a verify
    accepted more drafts than the config allows, a copy probe piled up below its bound, a
    start-up line or /metrics printed other values, or the build logged that it overrode topk.
    The message carries the evidence (``pytest_ddtree.service.proof``)."""

    def __init__(self, config_name: str, failures: Sequence[str], log_tail: str = "") -> None:
        self.config_name = config_name
        self.failures = list(failures)
        self.log_tail = log_tail
        lines = [f"service reports config {config_name} in /server_info but does not serve it "
                 f"({len(self.failures)} piece(s) of evidence):"]
        lines += [f"  - {failure}" for failure in self.failures]
        lines.append("what to do: check which flags and environment variables this build really reads (its source, "
                     "its start-up log), and map the config's fields to those in the service profile")
        super().__init__("\n".join(lines))


class ExternalConfigMismatch(AppliedConfigMismatch):
    """An external service runs another config than the one asked for.

    A failure, not a skip: the user asked for this config to be gated, and a run that skips it
    exits 0 without having checked anything. The harness never restarts an external service, so
    the message says to point the profile at an instance running the config (or deselect it).
    """

    def __init__(self, config_name: str, url: str, diffs: Sequence[AppliedDiff], *, not_speculating: str | None = None) -> None:
        hint = (
            "what to do: the harness never restarts an external service; point the profile at an "
            f"instance running {config_name}, or leave {config_name} out of --ddtree-config"
        )
        super().__init__(config_name, diffs, source=f"/server_info of the external service {url}", hint=hint,
                         not_speculating=not_speculating)
        self.url = url


class ConfigNotAvailable(ServiceError):
    """The asked config cannot be tested on this service (external service running another config).

    The plugin turns this into a skip with the reason, not a failure: nobody asked the harness to
    restart an external service.
    """


@dataclass(frozen=True)
class ExitInfo:
    """How a service ended: exit code (negative = killed by that signal), what said so, log tail."""

    exit_code: int | None
    description: str
    log_tail: str


@dataclass(frozen=True)
class Launch:
    """Everything needed to launch one instance, and to reproduce that launch later."""

    name: str
    command: str
    port: int | None
    url: str
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    fields: Mapping[str, object] = field(default_factory=dict)
    """Template values of the command controller ({config_args}, {budget}, ...); empty elsewhere."""


def describe_exit_code(code: int) -> str:
    """``-9`` -> ``-9 (killed by SIGKILL)``; shell-style 128+N codes are explained as well."""
    import signal

    def signame(num: int) -> str | None:
        try:
            return signal.Signals(num).name
        except ValueError:
            return None

    if code < 0 and signame(-code):
        return f"{code} (killed by {signame(-code)})"
    if code > 128 and signame(code - 128):
        return f"{code} (128+{code - 128}: {signame(code - 128)})"
    return str(code)


def tail_file(path: Path | None, n: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last ``n`` lines of a log file, reading at most ``max_bytes`` from its end.

    Logs of a large model start-up run to megabytes; only the end explains a failure.
    """
    if path is None:
        return "<no log file>"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError as exc:
        return f"<cannot read log {path}: {exc.strerror or exc}>"
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # first line is probably cut
    return without_health_polls(lines, n)


#: How many more lines than it shows a log tail reads where it asks a tool for lines (journalctl -n,
#: a job log's tail -n): a start that never got ready logged mostly the harness's own polls.
POLL_LINES_FACTOR = 5


def without_health_polls(lines: Sequence[str], n: int) -> str:
    """The last ``n`` of ``lines`` that are not the harness's own readiness polls (uvicorn's access lines,
    SGLang's as the engine's: ``"GET /health_generate HTTP/1.1" 503``), which explain nothing, with how
    many were left out."""
    kept = [line for line in lines if not _HEALTH_POLL.search(line)]
    polls = len(lines) - len(kept)
    note = [f"({polls} access lines of the harness's own health polls left out)"] if polls else []
    return "\n".join(note + kept[-n:])


_HEALTH_POLL = re.compile(r'"(?:GET|HEAD) /health(?:_generate)?(?:\?\S*)? HTTP/[\d.]+"')


# A Python exception's last line (``ValueError: ...``, ``torch.OutOfMemoryError: ...``), as a
# server that dies while it starts prints it last.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt): \S")


def last_error_line(log_tail: str, limit: int = 300) -> str | None:
    """The last exception line of a log tail (None: none there): the one line that says why a
    service died, for the first line of the failure (pytest's summary shows only that one)."""
    for line in reversed(log_tail.splitlines()):
        line = line.strip()
        if _ERROR_LINE.match(line):
            return line[:limit]
    return None


STARTUP_LOG_LINES = 5000
"""Log lines read for the start-up lines (a journal or a remote log: its last lines)."""
STARTUP_LOG_BYTES = 4 * 1024 * 1024
"""Bytes read from the start of a process log for the start-up lines."""


def head_file(path: Path | None, max_bytes: int = STARTUP_LOG_BYTES) -> str | None:
    """The first ``max_bytes`` of a log file (None when it cannot be read)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            return fh.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return None


class Runner(Protocol):
    """Runs a command where the service runs (an ssh host, a step of a Slurm job), for the
    package's environment snapshot (repro/envsnap.py)."""

    name: str

    def run(self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None) -> Any: ...


class LaunchFrom(enum.Enum):
    """What a controller launches a config from."""

    NOTHING = "nothing"
    """Somebody else's service: adopted as it runs, never started, stopped or relaunched."""
    PROFILE_COMMAND = "command"
    """The profile's ``command:`` with ``{config_args}`` (it is required)."""
    OWN_TEMPLATES = "templates"
    """The controller's own profile keys (the command controller's start/stop/status templates)."""


class GpuWait(enum.Enum):
    """Which GPU-release wait comes before a launch (gpu.py)."""

    NONE = "none"
    """None: the GPUs are not the harness's to watch (a batch job's node, somebody else's server)."""
    SINCE_FIRST_LAUNCH = "baseline"
    """Until the memory is back to what was in use before this manager's first launch."""
    DRIVER_ONLY = "driver"
    """Until only the driver's overhead is left: the service held the GPU before the session did
    (a systemd unit running its default config)."""


@dataclass(frozen=True)
class Capabilities:
    """What a controller can do, asked by everything outside its module instead of its name."""

    launch: LaunchFrom
    gpu_wait: GpuWait
    log_file: bool = False
    """The launch writes its log to a file the manager names in its log folder (a child process)."""
    placed_by_scheduler: bool = False
    """A scheduler picks the node (and with ``port: auto`` the port) once the launch runs: no
    pool, each xdist worker its own instance, no lock on this machine or the host."""
    remote_hosts: bool = False
    """Runs on a profile's ``host:`` (or a pool of hosts) over ssh."""
    unit: bool = False
    """Drives a unit whose text the package records (``systemctl cat``)."""
    service_python_here: bool = False
    """Without a ``host:`` the service runs the profile's ``python`` on this machine (its build
    can be read here for the history)."""

    @property
    def relaunch(self) -> bool:
        """The harness starts, stops and relaunches the service (not somebody else's)."""
        return self.launch is not LaunchFrom.NOTHING


FailFn = Callable[[str, str], Exception]
"""``fail(key, problem)``: the profile validator's error naming the file and the key."""
KeyTypes = Mapping[str, tuple[type | tuple[type, ...], bool]]
"""A profile key's accepted types and whether it is required, as profile.py checks them."""
