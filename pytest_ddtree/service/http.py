"""The one HTTP layer the harness speaks to a service through (no pytest import).

Why one layer on ``http.client`` instead of ``requests`` for calls and ``http.client`` for
streams: the load generator's fidelity depends on the client's own CPU cost per chunk and on
kept-alive connections (``benchmarks/bench_harness.py``), and every other call (health,
``/server_info``, ``/tokenize``, ``/generate``) is a small JSON exchange the standard library
does as well. One place then owns what differs between SGLang versions (the renamed
endpoints, see :data:`FALLBACKS`), the connection reuse, and the error wording.

A :class:`ServiceHTTP` belongs to one service: it keeps a small pool of idle kept-alive
connections for JSON calls (shared by threads; the lossless check sends from eight), hands out
dedicated connections for streaming closed-loop clients (:meth:`ServiceHTTP.connect`), and
closes everything when the service is closed. Nothing here retries a request or "fixes" a
response: the harness must see what the server said.

**Deadlines.** A socket timeout bounds one read, so a service that sends a byte a second (a
wedged scheduler's keep-alives, SSE comments) never trips it. Here every request has one
:class:`Deadline` as a whole (connect, sending, every byte of the answer, a stream's last
event), and a phase of several requests (readiness, the copy probe, a cell) can set an overall
one with :func:`phase`: a request ends at the tighter of the two. One watchdog thread enforces
them by shutting down the socket of a request whose deadline passed, so an honest request pays
nothing per byte or per token, only an entry in a heap when it starts and ends
(``benchmarks/bench_harness.py`` measures it). The failure, :class:`DeadlineExceeded`, names the
deadline, what had arrived, and the profile key that sets it.
"""

from __future__ import annotations

import contextvars
import heapq
import http.client
import itertools
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: SGLang renamed these endpoints; a 404 on the first name tries the next.
#: (``python/sglang/srt/entrypoints/http_server.py`` keeps the old ``/get_*`` routes as aliases
#: in recent versions; old builds have only them, ``/tokenize`` also answers as ``/v1/tokenize``.)
FALLBACKS: Mapping[str, tuple[str, ...]] = {
    "/server_info": ("/server_info", "/get_server_info"),
    "/model_info": ("/model_info", "/get_model_info"),
    "/tokenize": ("/tokenize", "/v1/tokenize"),
    "/detokenize": ("/detokenize", "/v1/detokenize"),
}

#: Idle connections kept per service for JSON calls; more concurrent callers just open more.
POOL_SIZE = 8

#: Largest body read from any endpoint unless the caller asks for less: a service's answers are
#: hostile input, and a ``/server_info`` or ``/tokenize`` that never ends must cost the harness an
#: error, not its memory. The largest honest answers are far below it: ``/tokenize`` of 32 prompts of
#: 16k tokens is ~3 MB of JSON, a busy server's ``/metrics`` a few MB.
BODY_LIMIT = 64 * 1024 * 1024

#: The whole-request deadline of a request that names none (``request_timeout_s`` of a profile).
REQUEST_TIMEOUT_S = 600.0
#: A stream that brings no new token for this long has stalled, whatever else it sends (SSE comments,
#: keep-alives): ``stall_timeout_s``; before its first token (the prefill, queueing behind the other
#: requests of a cell) ``first_token_timeout_s``. A hung server then costs a cell minutes, not the
#: request's 600 s per request and the cell's hour.
STALL_TIMEOUT_S = 30.0
FIRST_TOKEN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Stall:
    """How long a stream may go without a new token: before the first, and between two."""

    first_token_s: float = FIRST_TOKEN_TIMEOUT_S
    between_s: float = STALL_TIMEOUT_S

TRANSPORT_ERRORS = (OSError, http.client.HTTPException)
"""What a request can raise below HTTP (refused, reset, timed out, malformed answer); the
JSON calls here wrap them in :class:`ServiceUnreachable` (an OSError)."""


class ServiceHTTPError(RuntimeError):
    """The service answered with an error status; the message carries status and body."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        self.url = url
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:500]}")


class InvalidResponse(ServiceHTTPError):
    """The service answered with a success status but a body the harness cannot use (too
    large, not UTF-8, not JSON, not the expected shape); ``problem`` says what is wrong."""

    def __init__(self, method: str, url: str, status: int, problem: str) -> None:
        self.problem = problem
        super().__init__(method, url, status, f"invalid response: {problem}")


class ServiceUnreachable(ConnectionError):
    """No HTTP answer at all: refused, reset, timed out, or not HTTP. ``reason`` is short
    ("connection refused", "timed out", ...) for progress lines."""

    def __init__(self, method: str, url: str, exc: BaseException) -> None:
        self.reason = describe_transport_error(exc)
        super().__init__(f"{method} {url}: {self.reason} ({type(exc).__name__}: {exc})")


def describe_transport_error(exc: BaseException) -> str:
    if isinstance(exc, ServiceUnreachable):
        return exc.reason
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(exc, (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        return "connection closed by the service"
    if isinstance(exc, http.client.HTTPException):
        return "malformed HTTP answer"
    return f"connection error ({type(exc).__name__})"


@dataclass(frozen=True)
class Limit:
    """How long one request may take as a whole, and the profile key that sets it (None: a
    constant of the harness, or the caller's own argument)."""

    seconds: float
    key: str | None = None


@dataclass(frozen=True)
class Deadline:
    """A point in time (``time.monotonic``) by which something must be over, and its name."""

    name: str  # "request", "readiness", "copy probe", "cell c1_short"
    seconds: float
    key: str | None  # the profile key that sets it
    at: float

    @classmethod
    def after(cls, seconds: float, name: str, key: str | None = None) -> Deadline:
        return cls(name, seconds, key, time.monotonic() + seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def tighter(self, other: Deadline | None) -> Deadline:
        return self if other is None or self.at <= other.at else other

    def describe(self) -> str:
        where = f" ({self.key} in the profile)" if self.key else ""
        return f"the {self.name} deadline of {self.seconds:g} s{where}"

    def advice(self) -> str:
        if self.key:
            return f"raise {self.key} in the profile if the service is just slow"
        return "the service did not answer in time"


_PHASE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("ddtree_phase_deadline", default=None)


@contextmanager
def phase(deadline: Deadline) -> Iterator[Deadline]:
    """Every request of this thread (and of threads started with its context copied) ends by
    ``deadline`` at the latest, inside the block; nested phases keep the tighter one."""
    outer = _PHASE.get()
    effective = deadline.tighter(outer)
    token = _PHASE.set(effective)
    try:
        yield effective
    finally:
        _PHASE.reset(token)


def phase_expired() -> bool:
    """Whether the current phase (if any) is over: a loop of requests sends no more then."""
    phase = _PHASE.get()
    return phase is not None and phase.expired


def thread_in_phase(target: Callable[..., object], *args: object, name: str) -> threading.Thread:
    """A daemon thread running ``target(*args)`` under this thread's phase (its requests keep the
    phase's deadline: a thread starts with an empty context otherwise)."""
    return threading.Thread(target=contextvars.copy_context().run, args=(target, *args), name=name, daemon=True)


def request_deadline(limit: Limit | float) -> Deadline:
    """The deadline of a request starting now: its own limit, or the phase's if that is sooner."""
    if not isinstance(limit, Limit):
        limit = Limit(float(limit))
    own = Deadline.after(limit.seconds, "request", limit.key)
    return own.tighter(_PHASE.get())


class DeadlineExceeded(ServiceUnreachable):
    """A request was not over by its deadline (its own or its phase's), however many bytes kept
    arriving; ``deadline`` names it, ``arrived`` says what had come by then."""

    def __init__(self, method: str, url: str, deadline: Deadline, arrived: str) -> None:
        self.deadline = deadline
        self.arrived = arrived
        self.reason = f"{deadline.describe()} passed; {arrived}"
        ConnectionError.__init__(self, f"{method} {url}: {self.reason}; {deadline.advice()}")


def _timeout_of(deadline: Deadline) -> float:
    """The socket timeout of a request under ``deadline`` (the watchdog does the rest); raises
    TimeoutError when it has passed already (never 0, which would make the socket non-blocking)."""
    remaining = deadline.remaining()
    if remaining <= 0:
        raise TimeoutError("the deadline passed before the request was sent")
    return remaining


class _Alarm:
    __slots__ = ("sock", "fired")

    def __init__(self, sock: socket.socket) -> None:
        self.sock: socket.socket | None = sock
        self.fired = False


class _Watchdog:
    """One thread per process that shuts down the socket of each request whose deadline passed.

    Why a thread and not a timeout per read: a trickle resets every read's timeout; shutting the
    socket down ends a blocked read (and a send) at once, on any thread, and costs an honest
    request a heap push and a flag, nothing per byte. Disarmed alarms are dropped lazily (the
    heap is compacted when most of it is dead).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._dead = 0
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, at: float) -> _Alarm:
        alarm = _Alarm(sock)
        with self._cond:
            heapq.heappush(self._heap, (at, next(self._seq), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddtree-http-deadlines", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is alarm:
                self._cond.notify()
        return alarm

    def disarm(self, alarm: _Alarm) -> bool:
        """Stop watching; whether the alarm went off (the socket was shut down)."""
        with self._cond:
            if alarm.sock is not None:
                alarm.sock = None
                self._dead += 1
                if self._dead > 64 and self._dead * 2 > len(self._heap):
                    self._heap = [entry for entry in self._heap if entry[2].sock is not None]
                    heapq.heapify(self._heap)
                    self._dead = 0
            return alarm.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].sock is None:
                    heapq.heappop(self._heap)
                    self._dead = max(0, self._dead - 1)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, _, alarm = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                sock, alarm.sock = alarm.sock, None
                alarm.fired = True
                try:  # the base class's: an SSL socket's own shutdown would unwrap it under its reader
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # type: ignore[arg-type]
                except OSError:
                    pass

    def _after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG._after_fork)


class RequestWatch:
    """One request's deadline, enforced on its connection from :meth:`begin` to :meth:`end`."""

    __slots__ = ("deadline", "_alarm")

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self._alarm: _Alarm | None = None

    def begin(self, conn: http.client.HTTPConnection) -> None:
        """Connect ``conn`` if it is not (within the deadline), then watch its socket."""
        _set_timeout(conn, _timeout_of(self.deadline))
        if conn.sock is None:
            conn.connect()
        assert conn.sock is not None
        self._alarm = _WATCHDOG.arm(conn.sock, self.deadline.at)

    def end(self) -> bool:
        """Stop watching; True when the watchdog cut the request (its connection is shut down)."""
        alarm, self._alarm = self._alarm, None
        return _WATCHDOG.disarm(alarm) if alarm is not None else False

    def failed_by_deadline(self) -> bool:
        """After a transport error: whether the deadline caused it (the watchdog cut the socket,
        or a socket timeout set to the time left ran out)."""
        return self.end() or self.deadline.expired


def arrived_text(stage: str, body: bytes | bytearray, total: int) -> str:
    """What had arrived when a request's deadline passed: the stage, the body's size and head."""
    if not total:
        return f"nothing of the body had arrived ({stage})"
    head = bytes(body[:80]).decode("utf-8", "replace")
    return f"{total:,} bytes of the body had arrived ({stage}), starting {head!r}"


@dataclass(frozen=True)
class Response:
    """A complete, read answer."""

    status: int
    body: bytes
    url: str
    method: str

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except UnicodeDecodeError as exc:
            raise InvalidResponse(self.method, self.url, self.status, f"the body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
        except ValueError as exc:
            raise InvalidResponse(self.method, self.url, self.status, f"the body is not JSON ({exc}): {self.text[:200]}") from None
        except RecursionError:
            raise InvalidResponse(self.method, self.url, self.status, "the body is JSON nested too deeply to read") from None

    def raise_for_status(self) -> Response:
        if self.status >= 400:
            raise ServiceHTTPError(self.method, self.url, self.status, self.text)
        return self


class ServiceHTTP:
    """Connections to one service at ``base_url`` (``http://host:port[/prefix]``)."""

    def __init__(self, base_url: str, timeout: float | Limit = Limit(REQUEST_TIMEOUT_S, "request_timeout_s"),
                 pool_size: int = POOL_SIZE) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {base_url!r}: use http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        #: Each request's deadline as a whole unless the call names its own.
        self.limit = timeout if isinstance(timeout, Limit) else Limit(float(timeout))
        self.timeout = self.limit.seconds
        self.pool_size = pool_size
        #: A stream's stall deadlines (the profile's ``first_token_timeout_s`` and ``stall_timeout_s``).
        self.stall = Stall()
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"ServiceHTTP({self.base_url!r})"

    def __enter__(self) -> ServiceHTTP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def path(self, path: str) -> str:
        """The request target for ``path`` (the base URL's prefix in front)."""
        return self.prefix + (path if path.startswith("/") else "/" + path)

    # -- connections -------------------------------------------------------------------------
    def deadline(self, timeout: float | Limit | None = None) -> Deadline:
        """The deadline of a request starting now (``timeout``, else this service's limit; the
        current phase's if that is sooner)."""
        return request_deadline(self.limit if timeout is None else timeout)

    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        """A new connection of the caller's own (a streaming closed-loop client keeps one alive).

        It connects on first use, with TCP_NODELAY (:func:`nodelay_of` checks it), so a small
        request write is not held back by Nagle against the server's delayed ACK. Its requests
        are bounded by :class:`RequestWatch` (``generate_stream`` does it for a stream).
        """
        t = self.timeout if timeout is None else timeout
        if self.https:
            return _NoDelayHTTPSConnection(self.host, self.port, timeout=t)
        return _NoDelayHTTPConnection(self.host, self.port, timeout=t)

    def _take(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle pooled connection that is still open, else a new one; (conn, reused)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed (its service was stopped)")
            while self._idle:
                conn = self._idle.pop()
                if _still_open(conn):
                    _set_timeout(conn, timeout)
                    return conn, True
                conn.close()
        return self.connect(timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.pool_size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection; later calls raise. Dedicated connections are the caller's."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def idle_connections(self) -> int:
        with self._lock:
            return len(self._idle)

    # -- requests ----------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        timeout: float | Limit | None = None,
        max_bytes: int = BODY_LIMIT,
    ) -> Response:
        """Send one request (``payload`` as JSON), read the whole answer, return it; transport
        failures raise :class:`ServiceUnreachable`, HTTP error statuses are returned.  A body
        longer than ``max_bytes`` is not read on: :class:`InvalidResponse`. The request as a
        whole ends by its deadline (``timeout``, else this service's limit, or the current
        phase's if sooner): :class:`DeadlineExceeded`, however many bytes keep coming."""
        url = self.url(path)
        watch = RequestWatch(self.deadline(timeout))
        stage = "connecting"
        body = bytearray()
        try:
            conn, _ = self._take(_timeout_of(watch.deadline))
        except TRANSPORT_ERRORS as exc:
            if watch.failed_by_deadline():
                raise DeadlineExceeded(method, url, watch.deadline, arrived_text(stage, body, 0)) from None
            raise ServiceUnreachable(method, url, exc) from None
        status, reusable = 0, False
        try:
            watch.begin(conn)
            data = None if payload is None else json.dumps(payload).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            stage = "sending the request"
            conn.request(method, self.path(path), body=data, headers=headers)
            stage = "waiting for the status line and headers"
            resp = conn.getresponse()
            status, stage = resp.status, f"HTTP {resp.status}, reading the body"
            while len(body) <= max_bytes:  # read1: what has arrived is kept, whatever ends the next read
                piece = resp.read1(min(65536, max_bytes + 1 - len(body)))
                if not piece:
                    break
                body += piece
            resp.close()  # read to its end (read1 leaves a length-delimited answer open at 0 bytes left)
            reusable = not resp.will_close
        except TRANSPORT_ERRORS as exc:
            by_deadline = watch.failed_by_deadline()
            conn.close()
            if by_deadline:
                raise DeadlineExceeded(method, url, watch.deadline, arrived_text(stage, body, len(body))) from None
            raise ServiceUnreachable(method, url, exc) from None
        except BaseException:  # not the service's doing (an unserializable payload, Ctrl-C): no alarm left behind
            watch.end()
            conn.close()
            raise
        if watch.end():  # the answer ended because the watchdog shut its socket down
            conn.close()
            raise DeadlineExceeded(method, url, watch.deadline, arrived_text(stage, body, len(body)))
        if len(body) > max_bytes:
            conn.close()
            raise InvalidResponse(method, url, status, f"the body is larger than {max_bytes:,} bytes; not read on")
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return Response(status, bytes(body), url, method)

    def call(self, method: str, path: str, payload: Any = None, timeout: float | Limit | None = None,
             max_bytes: int = BODY_LIMIT) -> Response:
        """:meth:`request` with SGLang's endpoint renames: a 404 tries the next name in
        :data:`FALLBACKS`; the last answer is returned whatever its status."""
        names = FALLBACKS.get(path, (path,))
        response: Response | None = None
        for name in names:
            response = self.request(method, name, payload, timeout, max_bytes)
            if response.status != 404:
                return response
        assert response is not None
        return response

    def get_json(self, path: str, timeout: float | Limit | None = None) -> Any:
        return self.call("GET", path, timeout=timeout).raise_for_status().json()

    def post_json(self, path: str, payload: Any = None, timeout: float | Limit | None = None,
                  max_bytes: int = BODY_LIMIT) -> Any:
        return self.call("POST", path, payload, timeout, max_bytes).raise_for_status().json()

    def get_object(self, path: str, timeout: float | Limit | None = None) -> dict[str, Any]:
        """GET ``path`` (with fallbacks), which must answer a JSON object."""
        value = self.get_json(path, timeout)
        if not isinstance(value, dict):
            raise ServiceHTTPError("GET", self.url(path), 200, f"expected a JSON object, got {str(value)[:200]}")
        return value


class _NoDelayHTTPConnection(http.client.HTTPConnection):
    """Sets TCP_NODELAY itself: not every Python's ``http.client`` does."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayHTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection can carry another request.

    The server may have closed it while it sat idle (keep-alive timeout, restart); an idle
    socket that is readable has EOF (or junk) waiting, so it is dropped, as urllib3 does.
    """
    sock = conn.sock
    if sock is None:
        return True  # not connected yet: connects on use
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _set_timeout(conn: http.client.HTTPConnection, timeout: float) -> None:
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)


def nodelay_of(conn: http.client.HTTPConnection) -> bool:
    """Whether ``conn``'s socket has TCP_NODELAY (after it connected)."""
    if conn.sock is None:
        return False
    return bool(conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
