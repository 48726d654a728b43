"""A stand-in SGLang server for the load generator's tests (no tests in this module).

Why not the reference engine: these tests pin the load generator's arithmetic (tokens from
meta_info, ITL spreading, invalid cells) against a server whose every number is known in
advance: each stream chunk carries ``tokens_per_chunk`` tokens, ``step_s`` apart.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.loopback import served


@dataclass
class StandInConfig:
    tokens_per_chunk: int = 3
    step_s: float = 0.002
    prefill_s: float = 0.005
    fail_every: int = 0  # every n-th generate answers HTTP 500
    prompt_offset: int = 0  # report prompt_tokens off by this much
    output_cap: int | None = None  # stop early (ignore_eos "not honoured")
    accept: float = 3.0
    flush_status: int = 200
    no_meta: bool = False
    no_spec: bool = False  # no spec_verify_ct (speculation off)
    histogram: Any = None  # sent as meta_info.spec_accept_histogram on the last chunk (hostile values too)
    tokenize: bool = True  # answer POST /tokenize (one token per UTF-8 byte); False: 404 like an old build
    text_prompt_scale: float = 1.0  # a text prompt counts this many tokens per byte (text fallback tests)
    hostile_every: int = 0  # every n-th streamed generate (and every chat) sends ``hostile_chunk`` as its only chunk
    hostile_chunk: bytes = b"[" * 200_000  # the payload of that ``data:`` line (default: 200,000 nested arrays)
    verify_ct: int | None = None  # the finished chunk's spec_verify_ct (an impossible one), instead of the steps
    keepalive_s: float = 0.0  # > 0: every stream sends ``first_tokens`` tokens, then SSE comments this far apart for ever
    first_tokens: int = 0
    generate_calls: int = 0
    flushes: int = 0
    active: int = 0
    max_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    cfg: StandInConfig

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/model_info":
            self._json(200, {"model_path": "standin", "tokenizer_path": f"standin-{id(self.cfg)}"})
        elif self.path == "/server_info":
            self._json(200, {"version": "standin-1", "internal_states": [{"avg_spec_accept_length": self.cfg.accept}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        cfg = self.cfg
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/flush_cache":
            with cfg.lock:
                cfg.flushes += 1
            self._json(cfg.flush_status, {"ok": cfg.flush_status == 200})
            return
        if self.path == "/tokenize" and cfg.tokenize:
            self._json(200, {"tokens": [_ids(p) for p in body["prompt"]], "count": [len(_ids(p)) for p in body["prompt"]],
                             "max_model_len": 1 << 20})
            return
        if self.path == "/v1/chat/completions" and cfg.hostile_every:
            self._hostile()
            return
        if self.path != "/generate":
            self._json(404, {"error": "not found"})
            return
        prompt_tokens = len(body["input_ids"]) if "input_ids" in body else round(len(_ids(body["text"])) * cfg.text_prompt_scale)
        if not body.get("stream"):
            self._json(200, {"text": "x", "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": 1}})
            return
        with cfg.lock:
            cfg.generate_calls += 1
            n = cfg.generate_calls
            cfg.active += 1
            cfg.max_active = max(cfg.max_active, cfg.active)
        try:
            if cfg.fail_every and n % cfg.fail_every == 0:
                self._json(500, {"error": "injected"})
                return
            if cfg.hostile_every and n % cfg.hostile_every == 0:
                self._hostile()
                return
            if cfg.keepalive_s:
                self._keepalive(prompt_tokens)
                return
            sp = body["sampling_params"]
            want = int(sp["max_new_tokens"]) if sp.get("ignore_eos") else min(5, int(sp["max_new_tokens"]))
            if cfg.output_cap is not None:
                want = min(want, cfg.output_cap)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            time.sleep(cfg.prefill_s)
            done = 0
            steps = 0
            first = True
            while done < want:
                k = 1 if first else min(cfg.tokens_per_chunk, want - done)
                if not first:
                    time.sleep(cfg.step_s)
                first = False
                done += k
                steps += 1
                meta = {"prompt_tokens": prompt_tokens + cfg.prompt_offset, "completion_tokens": done,
                        "finish_reason": None}
                if not cfg.no_spec:
                    meta["spec_verify_ct"] = cfg.verify_ct if cfg.verify_ct is not None and done >= want else steps
                if cfg.histogram is not None and done >= want:
                    meta["spec_accept_histogram"] = cfg.histogram
                chunk = {"text": "x" * done} if cfg.no_meta else {"text": "x" * done, "meta_info": meta}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            with cfg.lock:
                cfg.active -= 1

    def _hostile(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: " + self.cfg.hostile_chunk + b"\n\ndata: [DONE]\n\n")

    def _keepalive(self, prompt_tokens: int) -> None:
        """A stream that stalls: ``first_tokens`` tokens, then only SSE comments until the client hangs up."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for done in range(1, self.cfg.first_tokens + 1):
            meta = {"prompt_tokens": prompt_tokens, "completion_tokens": done, "finish_reason": None}
            self.wfile.write(b"data: " + json.dumps({"text": "x" * done, "meta_info": meta}).encode() + b"\n\n")
        try:
            while True:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
                time.sleep(self.cfg.keepalive_s)
        except OSError:
            return  # the client hung up


def _ids(text: str) -> list[int]:
    """The stand-in's tokenizer: one token per UTF-8 byte (ids 100..355)."""
    return [100 + b for b in text.encode()]


@contextmanager
def standin_server(cfg: StandInConfig | None = None) -> Iterator[tuple[str, StandInConfig]]:
    """Run the stand-in on a free 127.0.0.1 port in a thread; yields (base_url, config)."""
    cfg = cfg or StandInConfig()
    handler = type("H", (_Handler,), {"cfg": cfg})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    with served(server) as url:
        yield url, cfg
