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
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from collections.abc import Mapping
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

    def __init__(self, base_url: str, timeout: float = 600.0, pool_size: int = POOL_SIZE) -> None:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {base_url!r}: use http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.pool_size = pool_size
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
    def connect(self, timeout: float | None = None) -> http.client.HTTPConnection:
        """A new connection of the caller's own (a streaming closed-loop client keeps one alive).

        It connects on first use, with TCP_NODELAY (:func:`nodelay_of` checks it), so a small
        request write is not held back by Nagle against the server's delayed ACK.
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
        timeout: float | None = None,
        max_bytes: int = BODY_LIMIT,
    ) -> Response:
        """Send one request (``payload`` as JSON), read the whole answer, return it; transport
        failures raise :class:`ServiceUnreachable`, HTTP error statuses are returned.  A body
        longer than ``max_bytes`` is not read on: :class:`InvalidResponse`."""
        url = self.url(path)
        conn, _ = self._take(self.timeout if timeout is None else timeout)
        try:
            data = None if payload is None else json.dumps(payload).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, self.path(path), body=data, headers=headers)
            resp = conn.getresponse()
            body = resp.read(max_bytes + 1)
            reusable = not resp.will_close
        except TRANSPORT_ERRORS as exc:
            conn.close()
            raise ServiceUnreachable(method, url, exc) from None
        if len(body) > max_bytes:
            conn.close()
            raise InvalidResponse(method, url, resp.status, f"the body is larger than {max_bytes:,} bytes; not read on")
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return Response(resp.status, body, url, method)

    def call(self, method: str, path: str, payload: Any = None, timeout: float | None = None,
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

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        return self.call("GET", path, timeout=timeout).raise_for_status().json()

    def post_json(self, path: str, payload: Any = None, timeout: float | None = None, max_bytes: int = BODY_LIMIT) -> Any:
        return self.call("POST", path, payload, timeout, max_bytes).raise_for_status().json()

    def get_object(self, path: str, timeout: float | None = None) -> dict[str, Any]:
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
