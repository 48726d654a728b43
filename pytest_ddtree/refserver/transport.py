"""The reference server's HTTP plumbing: JSON and text responses, request bodies (also chunked), Server-Sent Event streams.

The endpoint classes (:mod:`.admin_endpoints`, :mod:`.generation_endpoints`) build on :class:`HandlerBase`;
:class:`pytest_ddtree.refserver.server.Handler` joins them and dispatches on method and path.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from pytest_ddtree.refserver.engine import Engine
from pytest_ddtree.refserver.request_params import BadRequest, ContractError, InvalidRequest
from pytest_ddtree.refserver.state import ServerState

MAX_BODY = 32 * 1024 * 1024


class HandlerBase(BaseHTTPRequestHandler):
    """One connection's plumbing and the checks every endpoint shares."""

    protocol_version = "HTTP/1.1"
    server_version = "refserver"
    # TCP_NODELAY, as uvicorn/asyncio set it: a response goes out as headers + body (and a
    # stream as one write per step, then [DONE] and the terminator back to back); with Nagle
    # a write behind an unacknowledged one waits for the client's delayed ACK (~40 ms on
    # Linux), which kept-alive connections hit on every request.
    disable_nagle_algorithm = True
    sys_version = ""
    state: ServerState  # set on the subclass made by make_server

    # -- plumbing -----------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
        """uvicorn-style access lines, like SGLang's log."""
        self.state.log(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.log_message('"%s" %s %s', self.requestline, str(code), str(size))

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def send_text(self, status: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        self._send(status, text.encode(), ctype)

    def send_error_json(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}.get(status, "Error")
        err = {"message": message, "type": kind, "param": None, "code": status}
        self.send_json(status, {"object": "error", **err, "error": err})

    #: SGLang's own endpoints (not the OpenAI ones): a body FastAPI cannot validate is its
    #: ``ErrorResponse`` with type "Bad Request" (sglang 0.5.23 sglang/srt/entrypoints/http_server.py:634-691).
    NATIVE_PATHS = frozenset({"/generate", "/tokenize", "/v1/tokenize", "/detokenize", "/v1/detokenize"})

    def send_bad_request(self, path: str, exc: BadRequest) -> None:
        """A 400 in the body shape of the SGLang handler ``path`` follows (see request_params.py)."""
        if isinstance(exc, ContractError):
            self.send_json(400, {"error": str(exc)})
        elif isinstance(exc, InvalidRequest) and path == "/generate":
            self.send_json(400, {"error": {"message": str(exc)}})
        elif path in self.NATIVE_PATHS:
            self.send_json(400, {"object": "error", "message": str(exc), "type": "Bad Request", "param": None, "code": 400})
        else:
            self.send_error_json(400, str(exc))

    def read_json(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = self._read_chunked()
        else:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise BadRequest("bad Content-Length") from None
            if n < 0 or n > MAX_BODY:
                raise BadRequest("request body too large")
            raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            raise BadRequest("request body must be a JSON object")
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"malformed JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise BadRequest("request body must be a JSON object")
        return obj

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip() or b"0", 16)
            except ValueError:
                raise BadRequest("bad chunked body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline(8)
            if len(out) > MAX_BODY:
                raise BadRequest("request body too large")

    # -- streaming (chunked transfer + SSE) ---------------------------------------

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def sse(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        body = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(body):X}\r\n".encode() + body + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        self.sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def trickled(self, kind: str, stream: bool = False) -> bool:
        """The trickle fault: once ``kind`` has had its answers, answer this request with a 200 that
        never ends, a byte a second (a stream: one chunk, then an SSE comment a second), until the
        client hangs up; True when it did (the request is over)."""
        st = self.state
        limit = st.faults.trickle.get(kind)
        if limit is None:
            return False
        with st.lock:
            st.answered[kind] = done = st.answered.get(kind, 0) + 1
        if done <= limit:
            return False
        st.log(f"WARNING:  injected fault trickle={kind}:{limit}: answering a byte a second")
        self.close_connection = True
        try:
            if stream:
                self.start_stream()
                self.sse({"text": "a", "output_ids": [1], "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}})
                piece = b": keep-alive\n\n"
                frame = f"{len(piece):X}\r\n".encode() + piece + b"\r\n"
            else:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(1 << 30))
                self.end_headers()
                frame = b" "  # JSON's whitespace: a body that is never complete
            while True:
                self.wfile.write(frame)
                self.wfile.flush()
                time.sleep(1.0)
        except OSError:
            pass  # the client hung up
        return True

    def _hang(self) -> None:
        """hang-after fault: never answer (the connection stays open)."""
        while True:
            time.sleep(3600)

    def _engine_or_503(self) -> Engine | None:
        eng = self.state.engine
        if eng is None or not self.state.ready.is_set():
            self.send_error_json(503, "server is starting up (loading weights)")
            return None
        return eng

    def _drain_body(self) -> None:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if 0 < n <= MAX_BODY:
            self.rfile.read(n)
