"""A service whose answers never end: every read of the harness is bounded.

A real HTTP/1.1 server on 127.0.0.1 answers the control endpoints (``/server_info``,
``/tokenize``, ``/metrics``) with bodies that go on for ever, and ``/generate`` with streams that
do (a line without an end, chunks without an end, a token count of 10**15). The server counts the
bytes it managed to send before the harness hung up, so "bounded" is observed from its side: the
harness stops reading within its limit (plus what the sockets buffer), with an error that says
so, instead of reading until its memory runs out.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pytest_ddtree.service import http as http_mod
from pytest_ddtree.measure import generate_stream, load
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.http import InvalidResponse, ServiceHTTP
from pytest_ddtree.measure.prompts import Prompt
from tests.loopback import served

LIMIT = 1 << 20  # the limits are lowered to 1 MiB here so each test moves a few MB, not hundreds
SOCKET_SLACK = 16 << 20  # what kernel socket buffers on loopback can hold beyond what was read
PIECE = b"0" * 65536


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    sent = 0
    lock = threading.Lock()

    def count(self, n: int) -> None:
        with self.lock:
            self.sent += n


class _Endless(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send_for_ever(self, first: bytes, piece: bytes, chunked: bool) -> None:
        """Write ``first`` then ``piece`` again and again until the client hangs up."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if not chunked else "text/event-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(1 << 40))  # a terabyte, announced
        self.end_headers()
        try:
            for data in (first, *(piece for _ in range(1 << 20))):
                frame = b"%x\r\n%s\r\n" % (len(data), data) if chunked else data
                self.wfile.write(frame)
                self.server.count(len(data))
        except OSError:
            pass  # the client hung up: what this test wants
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/server_info":
            self._send_for_ever(b'{"version": "', PIECE, chunked=False)
        elif self.path == "/metrics":
            self._send_for_ever(b"# HELP sglang:num_requests_running\n", b"sglang:x 1\n" * 4096, chunked=True)
        else:
            self.send_error(404)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize":
            self._send_for_ever(b'{"tokens": [[', b"1, " * 20000, chunked=True)
        elif self.path == "/generate" and request.get("sampling_params", {}).get("max_new_tokens") == 1:
            # a stream line that never ends
            self._send_for_ever(b'data: {"text": "', PIECE, chunked=True)
        elif self.path == "/generate" and request.get("sampling_params", {}).get("max_new_tokens") == 2:
            # well-formed chunks of one token each, for ever
            chunk = b'data: {"text": "a", "meta_info": {"completion_tokens": 1}}\n\n'
            self._send_for_ever(chunk, chunk * 256, chunked=True)
        elif self.path == "/generate":
            # one chunk that claims 10**15 tokens (its ITL list would be that long)
            body = b'data: {"text": "a", "meta_info": {"completion_tokens": 1000000000000000}}\n\n'
            self._send_for_ever(body, b"\n", chunked=True)
        else:
            self.send_error(404)


@contextmanager
def _endless_server() -> Iterator[tuple[str, _Server]]:
    server = _Server(("127.0.0.1", 0), _Endless)
    with served(server) as url:
        yield url, server


@pytest.fixture
def endless(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, _Server]]:
    monkeypatch.setattr(http_mod, "BODY_LIMIT", LIMIT)
    monkeypatch.setattr(generate_stream, "STREAM_LINE_LIMIT", LIMIT)
    monkeypatch.setattr(generate_stream, "STREAM_BODY_LIMIT", LIMIT)
    with _endless_server() as served:
        yield served


def _sent_within_limit(server: _Server) -> None:
    assert server.sent <= LIMIT + SOCKET_SLACK, f"the server sent {server.sent:,} bytes before the harness hung up"


@pytest.mark.parametrize("call", ["server_info", "tokenize", "metrics"])
def test_a_control_endpoint_that_never_ends_is_an_invalid_response(endless: tuple[str, _Server], call: str) -> None:
    url, server = endless
    # the default is bound when the function is defined: the limit is passed as the code's callers do
    with ServiceHTTP(url, timeout=30) as http:
        with pytest.raises(InvalidResponse, match=f"larger than {LIMIT:,} bytes"):
            if call == "server_info":
                http.call("GET", "/server_info", max_bytes=http_mod.BODY_LIMIT)
            elif call == "tokenize":
                http.call("POST", "/tokenize", {"prompt": ["x"]}, max_bytes=http_mod.BODY_LIMIT)
            else:
                http.call("GET", "/metrics", max_bytes=http_mod.BODY_LIMIT)
    _sent_within_limit(server)


def test_the_clients_endpoints_are_bounded_by_default() -> None:
    """Without a limit of their own, the client's calls read at most BODY_LIMIT (the real default)."""
    with _endless_server() as (url, server), SGLangClient(url, timeout=60) as client:
        with pytest.raises(InvalidResponse, match=f"larger than {http_mod.BODY_LIMIT:,} bytes"):
            client.server_info()
    assert server.sent <= http_mod.BODY_LIMIT + SOCKET_SLACK


@pytest.mark.parametrize(("max_new_tokens", "words"), [
    (1, "stream line over"),
    (2, "stream over"),
    (3, "claims 1000000000000000 tokens, more than the 3 asked for"),
])
def test_a_stream_that_never_ends_fails_its_request_not_the_harness(
        endless: tuple[str, _Server], max_new_tokens: int, words: str) -> None:
    url, server = endless
    with ServiceHTTP(url, timeout=30) as http:
        result = load.stream_request(http, 0, Prompt(target_tokens=3, input_ids=(1, 2, 3)), max_new_tokens)
    assert not result.ok and words in (result.error or ""), result.error
    assert len(result.itl_s) <= max_new_tokens
    assert server.sent <= LIMIT + SOCKET_SLACK + (generate_stream.STREAM_BYTES_PER_TOKEN_SQUARED * max_new_tokens ** 2), server.sent
