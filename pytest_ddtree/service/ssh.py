"""Where the systemd and command controllers run their commands: here, or on a host over ssh.

A fleet sweep drives SGLang units on several GPU hosts. The harness reaches them with the system
OpenSSH client (whatever keys, agents, jump hosts and known_hosts the user already has work
unchanged) in BatchMode, so a missing key or an unknown host key is an error at once instead
of a password prompt that hangs the sweep. One ControlMaster socket per host carries every
call, so a sweep that runs systemctl, journalctl and nvidia-smi hundreds of times opens one
TCP connection per host, not hundreds. Every call has a timeout, and a failure of ssh itself
(exit 255: refused, unreachable, auth) becomes an :class:`SSHError` that names the host and
quotes ssh's own words, so the configs of a dead host fail with that reason and never hang.

The same small interface (:class:`LocalHost`, :class:`SSHHost`) runs a command, writes a file
and removes one, so the controllers are written once for both places.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Protocol, Sequence

from pytest_ddtree.service.base import ProgressFn, ServiceError

SSH_ERROR_EXIT = 255
"""What the OpenSSH client exits with when ssh itself failed (not the remote command)."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_COMMAND_TIMEOUT_S = 60.0
COMMAND_NOT_FOUND_EXIT = 127


class SSHError(ServiceError):
    """ssh could not run a command on a host (refused, unreachable, auth failed, timed out)."""

    def __init__(self, host: str, command: str, problem: str) -> None:
        self.host = host
        self.command = command
        self.problem = problem
        super().__init__(
            f"ssh to {host} failed: {problem}\n"
            f"    while running: {command}\n"
            "what to do: check that the host is up and that `ssh -o BatchMode=yes HOST true` works with the "
            "profile's ssh_options (key-based login, known host key)"
        )


def unreachable_host(exc: BaseException | None) -> str | None:
    """The host of the :class:`SSHError` behind ``exc`` (itself, or what it was raised from or
    while handling), None when ssh did not fail: the manager wraps a lost host's error in the
    config's own failure (``ServiceDiedError``)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SSHError):
            return exc.host
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class SSHTimedOut(SSHError):
    """ssh gave no answer within the call's deadline (the command's own plus the connection's)."""

    def __init__(self, host: str, command: str, problem: str, timeout_s: float) -> None:
        super().__init__(host, command, problem)
        self.timeout_s = timeout_s


class RemoteCommandError(ServiceError):
    """A command ran (locally or on a host) and exited non-zero where success was needed."""


class CommandTimedOut(RemoteCommandError):
    """A command ran past its whole-command deadline and was killed (its process group here; over
    ssh, the ssh client): callers that own a deadline of their own name it (``timeout_s``)."""

    def __init__(self, message: str, timeout_s: float) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class OutputTooLarge(RemoteCommandError):
    """A command printed more than its caller's bound and was killed: one that floods its output
    would otherwise fill the disk, or memory, before its deadline."""


@dataclass(frozen=True)
class SSHTarget:
    """``user@node[:port]`` of a profile's ``host`` (``[v6addr]:port`` for IPv6)."""

    node: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> SSHTarget:
        match = re.fullmatch(r"(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<node>[^:@\s\[\]]+))(?::(?P<port>\d+))?", text)
        if not match:
            raise ValueError(f"not a host: {text!r} (expected user@node or user@node:port)")
        port = int(match["port"]) if match["port"] else None
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"not a TCP port in {text!r}: {port}")
        return cls(node=match["v6"] or match["node"], user=match["user"], port=port)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.node}" if self.user else self.node

    @property
    def url_host(self) -> str:
        """The node as it goes into a URL (IPv6 in brackets)."""
        return f"[{self.node}]" if ":" in self.node else self.node

    def __str__(self) -> str:
        text = f"{self.user + '@' if self.user else ''}{self.url_host}"
        return f"{text}:{self.port}" if self.port else text


class Host(Protocol):
    """Runs commands and edits files in one place (this machine, or a host over ssh)."""

    name: str
    """``local`` or the ``user@node[:port]`` text, for messages and result records."""

    def run(
        self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None, privileged: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv``; a non-zero exit is returned, not raised (ssh's own failures are raised).

        ``privileged``: a command that manages the unit (systemctl, journalctl, the drop-in), run
        with ``sudo -n`` under ``sudo: true``; reads like nvidia-smi or the env snapshot are not."""

    def run_shell(self, script: str, *, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run a shell script (``sh -c``); output is stdout and stderr together, in order."""

    def write_file(self, path: str, text: str) -> None:
        """Write ``text`` to ``path`` atomically (a temporary file renamed), creating the folder."""

    def remove_file(self, path: str) -> None:
        """Remove ``path`` (gone already is fine) and its folder if that is left empty."""

    def read_file(self, path: str) -> str | None:
        """The text of ``path``, None when there is no such file."""

    def close(self) -> None:
        """Release connections; safe to call twice."""


def output_tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "<no output>"


#: As pytest_ddtree.atomicfile does it here: a temp file of a unique name in the target's folder
#: (same file system: the rename is atomic; two writers never share it), its mode as a plain
#: write would give, fsynced (``sync FILE``; a plain ``sync`` where that is not understood),
#: renamed over the target, then the folder synced; the temp file is removed if anything fails.
_WRITE_SCRIPT = (
    'set -e; dir=$(dirname "$1"); mkdir -p "$dir"; '
    'tmp=$(mktemp "$dir/.$(basename "$1").ddtree-XXXXXX"); trap \'rm -f "$tmp"\' EXIT; '
    'cat > "$tmp"; chmod "$(printf %o $((0666 & ~$(umask))))" "$tmp"; '
    'sync "$tmp" 2>/dev/null || sync; mv -f "$tmp" "$1"; trap - EXIT; sync "$dir" 2>/dev/null || true'
)
_REMOVE_SCRIPT = 'rm -f "$1"; rmdir "$(dirname "$1")" 2>/dev/null || true'
_READ_SCRIPT = 'test -e "$1" || exit 66; cat "$1"'
_MISSING_EXIT = 66


class _FileOps:
    """File edits as small ``sh`` scripts through ``run``: one code path here and over ssh
    (privileged: ``sudo: true`` prefixes them like systemctl)."""

    name: str

    def run(
        self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None, privileged: bool = False
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def write_file(self, path: str, text: str) -> None:
        _check(self.name, self.run(["sh", "-c", _WRITE_SCRIPT, "sh", path], input_text=text, privileged=True), f"write {path}")

    def remove_file(self, path: str) -> None:
        _check(self.name, self.run(["sh", "-c", _REMOVE_SCRIPT, "sh", path], privileged=True), f"remove {path}")

    def read_file(self, path: str) -> str | None:
        result = self.run(["sh", "-c", _READ_SCRIPT, "sh", path], privileged=True)
        if result.returncode == _MISSING_EXIT:
            return None
        _check(self.name, result, f"read {path}")
        return result.stdout


class LocalHost(_FileOps):
    """This machine: the commands run as children, with the same timeouts as remote ones."""

    name = "local"
    remote = False
    """Commands run on this machine: its GPUs (NVML) and its environment are the service's."""

    def __init__(self, command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S, sudo: bool = False) -> None:
        self.command_timeout_s = command_timeout_s
        self.prefix = ["sudo", "-n"] if sudo else []

    def lock(self, path: str) -> HostLock | None:
        """None: on this machine the pool's instance lock (pool.py) already keeps sessions apart."""
        return None

    def run(
        self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None, privileged: bool = False,
        max_output_bytes: int | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full = (self.prefix if privileged else []) + list(argv)
        timeout = timeout_s or self.command_timeout_s
        try:
            return _run_bounded(full, input_text, timeout, merge=False, max_bytes=max_output_bytes)
        except FileNotFoundError:
            return subprocess.CompletedProcess(full, COMMAND_NOT_FOUND_EXIT, "", f"{full[0]}: command not found")
        except subprocess.TimeoutExpired:
            raise CommandTimedOut(f"`{shlex.join(full)}` did not finish within {timeout:.0f} s (killed)", timeout) from None

    def run_shell(self, script: str, *, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        timeout = timeout_s or self.command_timeout_s
        try:
            return _run_bounded(["sh", "-c", script], None, timeout, merge=True)
        except subprocess.TimeoutExpired:
            raise CommandTimedOut(f"`{script}` did not finish within {timeout:.0f} s (killed)", timeout) from None

    def close(self) -> None:
        return None


def _check(host: str, result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise RemoteCommandError(
            f"cannot {what} on {host}: exit {result.returncode}: {output_tail(result.stderr or result.stdout)}\n"
            "what to do: log in as a user that may write there (root, or sudo: true with a sudoers rule), "
            "or point dropin_dir at a writable folder"
        )


def _run_bounded(argv: list[str], input_text: str | None, timeout_s: float, *, merge: bool,
                 max_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own session; on timeout kill its whole process group.

    Output goes to temporary files, not pipes: a command that leaves a background child behind
    (``nohup server &``, an ssh ControlMaster) would otherwise hold the pipe open and make us wait
    for the timeout although the command itself returned. Its own session keeps a Ctrl-C on the
    terminal from killing a restore command half-way. ``max_bytes``: the command is killed once its
    output passes that (:class:`OutputTooLarge`), and only the last ``max_bytes`` of each stream are read.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=out if merge else err,
            start_new_session=True,
        )
        try:
            if input_text is not None:
                assert proc.stdin is not None
                try:
                    proc.stdin.write(input_text.encode())
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
            if max_bytes is None:
                proc.wait(timeout=timeout_s)
            else:
                _wait_bounded(proc, argv, timeout_s, max_bytes, (out, err))
        except BaseException:
            _kill_group(proc)
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, _read_tail(out, max_bytes), _read_tail(err, max_bytes))


#: How often a command whose output is bounded has its output's size looked at.
_OUTPUT_POLL_S = 0.1


def _wait_bounded(proc: subprocess.Popen[Any], argv: list[str], timeout_s: float, max_bytes: int, files: Sequence[IO[bytes]]) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(argv, timeout_s)
        try:
            proc.wait(timeout=min(_OUTPUT_POLL_S, left))
            return
        except subprocess.TimeoutExpired:
            written = sum(os.fstat(f.fileno()).st_size for f in files)
            if written > max_bytes:
                raise OutputTooLarge(f"`{shlex.join(argv)}` printed more than {max_bytes} bytes "
                                     "(killed)") from None


def _read_tail(stream: IO[bytes], max_bytes: int | None) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - max_bytes) if max_bytes is not None else 0)
    return stream.read().decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
        pass


class SSHHost(_FileOps):
    """A host reached with the system ``ssh``: BatchMode, one ControlMaster socket, timeouts.

    ``options`` are the profile's ``ssh_options`` (``-i KEY``, ``-o Name=value``, ``-J jump``...);
    they come first on the command line, and ssh takes the first value it sees of an option, so
    they override the defaults here.
    """

    remote = True
    """Commands run on another machine: its GPUs (nvidia-smi there), its lock and its environment."""

    def __init__(
        self,
        target: str,
        options: Sequence[str] = (),
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
        sudo: bool = False,
        ssh: str = "ssh",
    ) -> None:
        self.target = SSHTarget.parse(target)
        self.name = str(self.target)
        self.options = list(options)
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self.prefix = ["sudo", "-n"] if sudo else []
        self.ssh = ssh
        # Short and private: a unix socket path must stay under ~100 bytes, and the socket
        # grants the holder our login on the host.
        self._control_dir: str | None = None
        self._lock = threading.Lock()

    def _control_path(self) -> str:
        with self._lock:
            if self._control_dir is None:
                self._control_dir = tempfile.mkdtemp(prefix="ddtree-ssh-", dir="/tmp" if os.path.isdir("/tmp") else None)
            return os.path.join(self._control_dir, "%C")

    def lock(self, path: str) -> HostLock:
        """The host's lock at ``path`` (not taken yet): two sessions never drive one service."""
        return HostLock(self, path)

    def ssh_argv(self, remote_command: str, *, master: bool = True) -> list[str]:
        """The full local argv that runs ``remote_command`` (a shell command line) on the host."""
        if shutil.which(self.ssh) is None:
            raise SSHError(self.name, remote_command, f"the ssh client {self.ssh!r} is not installed (apt-get install openssh-client)")
        connect = max(1, int(round(self.connect_timeout_s)))
        argv = [self.ssh, *self.options]
        argv += [
            "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={connect}",
            # A host that vanishes mid-call (power, network) is noticed in ~3 probes, not at TCP's 15 min.
            "-o", f"ServerAliveInterval={max(1, connect // 3)}",
            "-o", "ServerAliveCountMax=3",
        ]
        if master:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._control_path()}", "-o", "ControlPersist=300"]
        if self.target.port is not None:
            argv += ["-p", str(self.target.port)]
        return argv + ["--", self.target.destination, remote_command]

    def _call(self, remote_command: str, input_text: str | None, timeout_s: float | None, *, merge: bool,
              max_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
        timeout = (timeout_s or self.command_timeout_s) + self.connect_timeout_s
        argv = self.ssh_argv(remote_command)
        try:
            result = _run_bounded(argv, input_text, timeout, merge=merge, max_bytes=max_bytes)
        except subprocess.TimeoutExpired:
            raise SSHTimedOut(self.name, remote_command, f"no answer within {timeout:.0f} s (ssh killed)", timeout) from None
        if result.returncode == SSH_ERROR_EXIT:
            raise SSHError(self.name, remote_command, f"exit {SSH_ERROR_EXIT}: {output_tail(result.stderr or result.stdout, 3)}")
        return result

    def run(
        self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None, privileged: bool = False,
        max_output_bytes: int | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return self._call(shlex.join((self.prefix if privileged else []) + list(argv)), input_text, timeout_s, merge=False,
                          max_bytes=max_output_bytes)

    def run_shell(self, script: str, *, timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        return self._call(shlex.join(["sh", "-c", script]), None, timeout_s, merge=True)

    def open_session(self, remote_command: str) -> subprocess.Popen[str]:
        """A long-running remote command whose stdin we hold (the host lock); output on a pipe."""
        return subprocess.Popen(
            self.ssh_argv(remote_command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def close(self) -> None:
        """Stop the ControlMaster and remove its folder (the master would otherwise linger 5 min)."""
        with self._lock:
            control_dir, self._control_dir = self._control_dir, None
        if control_dir is None:
            return
        path = os.path.join(control_dir, "%C")
        argv = [self.ssh, *self.options, "-o", f"ControlPath={path}", "-O", "exit"]
        if self.target.port is not None:
            argv += ["-p", str(self.target.port)]
        try:
            _run_bounded(argv + ["--", self.target.destination], None, 10.0, merge=True)
        except (OSError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(control_dir, ignore_errors=True)


def make_host(
    target: str | None,
    options: Sequence[str] = (),
    *,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    sudo: bool = False,
) -> LocalHost | SSHHost:
    """The place a profile's commands run: ``host: null`` is this machine."""
    if not target:
        return LocalHost(command_timeout_s, sudo=sudo)
    return SSHHost(target, options, connect_timeout_s=connect_timeout_s, command_timeout_s=command_timeout_s, sudo=sudo)


class HostLock:
    """An exclusive lock on a host (``flock`` there), so two sessions never drive one service.

    The lock is held by a remote ``flock ... cat`` that lives as long as our ssh session: when
    this process ends in any way (even SIGKILL), ssh closes, ``cat`` reads end-of-file, and the
    kernel on the host drops the lock. The holder writes who it is next to the lock, so a session
    that has to wait says for whom.
    """

    BUSY_EXIT = 75

    def __init__(self, host: SSHHost, path: str) -> None:
        self.host = host
        self.path = path
        self._proc: subprocess.Popen[str] | None = None

    @property
    def held(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def acquire(self, owner: str, progress: ProgressFn | None = None, timeout_s: float | None = None, poll_s: float = 2.0) -> None:
        if self.held:
            return
        start = time.monotonic()
        told = False
        quoted = shlex.quote(self.path)
        script = (
            f"exec flock -n -E {self.BUSY_EXIT} {quoted} sh -c "
            + shlex.quote(f'echo "$1" > {quoted}.owner; echo ddtree-lock-held; exec cat > /dev/null')
            + f" sh {shlex.quote(owner)}"
        )
        # A plain call first: it opens the ControlMaster (a master born from the lock's session
        # would inherit the lock's pipes and hold them open) and fails cleanly on a dead host.
        self.host.run(["true"])
        while True:
            proc = self.host.open_session(script)
            assert proc.stdout is not None
            first = _readline_within(proc.stdout, self.host.connect_timeout_s + self.host.command_timeout_s)
            if first.strip() == "ddtree-lock-held":
                self._proc = proc
                return
            rest = _finish(proc)
            code = proc.returncode
            if code == SSH_ERROR_EXIT or code is None:
                raise SSHError(self.host.name, f"flock {self.path}", output_tail(first + rest, 3) if code else "no answer (ssh killed)")
            if code != self.BUSY_EXIT:
                raise RemoteCommandError(
                    f"cannot lock {self.path} on {self.host.name}: exit {code}: {output_tail(first + rest)}\n"
                    "what to do: the host needs flock (util-linux) and a writable lock_path"
                )
            if progress is not None and not told:
                holder = self.host.run(["cat", f"{self.path}.owner"]).stdout.strip() or "another session"
                progress(f"host {self.host.name} is locked by {holder} ({self.path}); waiting")
                told = True
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise ServiceError(f"host {self.host.name} stayed locked ({self.path}) for {timeout_s:.0f} s")
            time.sleep(poll_s)

    def release(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _finish(proc)


def _readline_within(stream: IO[str], timeout_s: float) -> str:
    """One line from ``stream``, or what there is after ``timeout_s`` ('' if nothing)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0] if box else ""


def _finish(proc: subprocess.Popen[str]) -> str:
    """Close our end (the remote ``cat`` ends), collect what is left, kill after 10 s."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
    out = proc.stdout.read() if proc.stdout is not None else ""
    if proc.stdout is not None:
        proc.stdout.close()
    return out or ""
