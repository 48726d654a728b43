"""The one HTTP layer: kept-alive pooled connections, SGLang's endpoint renames, errors, closing.

A small real HTTP/1.1 server on 127.0.0.1 counts the TCP connections it accepts, so reuse and
closing are observed from the server's side, not assumed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.http import ServiceHTTP, ServiceHTTPError, ServiceUnreachable, nodelay_of
from pytest_ddtree.service.manager import Clients, Pacing, Placement, ServiceManager
from pytest_ddtree.service.pool import free_port
from tests.loopback import served
from tests.service_helpers import BS8_B8_K4, BS8_B12_K6, make_profile


class _Counting(ThreadingHTTPServer):
    daemon_threads = True
    connections = 0
    lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, body: Any, close: bool = False) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/get_server_info":  # an old SGLang: only the old name
            self._json(200, {"version": "old"})
        elif self.path == "/close":
            self._json(200, {}, close=True)
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/v1/tokenize":  # only the /v1 alias
            self._json(200, {"tokens": [[len(p)] for p in body["prompt"]], "count": [1] * len(body["prompt"]),
                             "max_model_len": 99})
        elif self.path == "/boom":
            self._json(500, {"error": "kaput"})
        else:
            self._json(404, {"detail": "Not Found"})


@contextmanager
def server() -> Iterator[tuple[str, _Counting]]:
    srv = _Counting(("127.0.0.1", 0), _Handler)
    with served(srv) as url:
        yield url, srv


def test_json_calls_reuse_one_kept_alive_connection_and_follow_renames() -> None:
    with server() as (url, srv), SGLangClient(url) as client:
        for _ in range(5):
            assert client.server_info() == {"version": "old"}  # /server_info 404 -> /get_server_info
        assert client.tokenize(["abc", "de"]) == [[3], [2]]  # /tokenize 404 -> /v1/tokenize
        assert srv.connections == 1
        assert client.http.idle_connections() == 1


def test_a_connection_the_server_closed_is_not_reused() -> None:
    with server() as (url, srv), ServiceHTTP(url) as http:
        assert http.request("GET", "/close").status == 200
        assert http.idle_connections() == 0  # "Connection: close" answers are not pooled
        assert http.get_object("/server_info") == {"version": "old"}
        assert srv.connections == 2


def test_concurrent_callers_share_the_pool() -> None:
    with server() as (url, srv), SGLangClient(url) as client:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.server_info()["version"], range(64)))
        assert answers == ["old"] * 64
        assert srv.connections <= 8 * 2  # at most two tries per name per concurrent caller, never one per call


def test_errors_say_what_happened() -> None:
    with server() as (url, _), SGLangClient(url) as client:
        with pytest.raises(ServiceHTTPError) as info:
            client.http.post_json("/boom", {})
        assert info.value.status == 500 and "kaput" in str(info.value)
        with pytest.raises(ServiceHTTPError, match="HTTP 404"):
            client.model_info()
    dead = f"http://127.0.0.1:{free_port()}"
    with SGLangClient(dead, timeout=2) as client:
        with pytest.raises(ServiceUnreachable) as refused:
            client.health()
        assert refused.value.reason == "connection refused" and dead in str(refused.value)
        assert isinstance(refused.value, OSError)


def test_closed_client_closes_its_connections_and_refuses_calls() -> None:
    with server() as (url, _):
        client = SGLangClient(url)
        client.server_info()
        conn_socks = [c.sock for c in client.http._idle]
        client.close()
        assert client.closed and all(s is None or s.fileno() == -1 for s in conn_socks)
        with pytest.raises(RuntimeError, match="closed"):
            client.server_info()


def test_streaming_connections_have_tcp_nodelay() -> None:
    with server() as (url, _), ServiceHTTP(url) as http:
        conn = http.connect()
        try:
            conn.request("GET", http.path("/get_server_info"))
            conn.getresponse().read()
            assert nodelay_of(conn)
        finally:
            conn.close()


def test_the_manager_closes_each_services_client_when_it_stops_it(tmp_path: Path) -> None:
    made: list[SGLangClient] = []

    def factory(url: str, timeout: float) -> SGLangClient:
        made.append(SGLangClient(url, timeout=timeout))
        return made[-1]

    m = ServiceManager(make_profile(), Placement(0, tmp_path / "logs", tmp_path / "locks"),
                       pacing=Pacing(poll_interval=0.1), clients=Clients(factory))
    try:
        first = m.ensure(BS8_B8_K4)
        assert len(made) == 1 and first.client is made[0]  # one client per launch: health polls, then tests
        m.ensure(BS8_B12_K6)  # switching stops the first service ...
        assert made[0].closed and not made[1].closed  # ... and closes its client
    finally:
        m.close()
    assert all(c.closed for c in made)
