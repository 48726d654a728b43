"""HTTP front end with SGLang's endpoint shapes (stdlib only).

Why stdlib ``http.server``: the engine must run anywhere the plugin runs, with no new
dependency. ``ThreadingHTTPServer`` gives a thread per connection; HTTP/1.1 keep-alive
is supported (load generators reuse connections) and streams use chunked transfer
encoding with Server-Sent Events (``data: {...}\\n\\n`` ... ``data: [DONE]``), one event per
engine step, so under speculation one event carries several tokens, as in SGLang.

Every handler validates its input and answers 400 with a JSON error for anything
malformed; unexpected exceptions become 500s. Bad input never kills the server.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .engine import VERSION, Engine, Request, SamplingParams, StepEvent
from .faults import Faults
from .logprobs import LogprobRequest, LogprobTracker
from .profiler import ProfileRefused, ProfileRequestError, ProfileSettings
from .model import Models, uniform

MAX_BODY = 32 * 1024 * 1024
STEP_TIMEOUT_S = 600.0


class BadRequest(Exception):
    """Raised by request parsing; becomes an HTTP 400 with the message."""


@dataclass(frozen=True)
class MemoryModel:
    """Simulated memory figures (GB per GPU) reported in /server_info.

    The draft KV cache holds ``min(window, context_length)`` tokens per running
    request, so a draft window shrinks it (what "compact cache" buys on a GPU).
    """

    weight_gb: float = 15.25
    draft_weight_gb: float = 0.93
    kvcache_gb: float = 14.0
    draft_kv_per_token_gb: float = 0.000012

    def figures(self, window: int | None, context_length: int, max_running: int, spec: bool) -> dict[str, float]:
        held = context_length if window is None else min(window, context_length)
        draft_kv = self.draft_kv_per_token_gb * held * max_running if spec else 0.0
        draft_w = self.draft_weight_gb if spec else 0.0
        total = self.weight_gb + self.kvcache_gb + draft_w + draft_kv
        return {
            "weight_gb": round(self.weight_gb, 3),
            "kvcache_gb": round(self.kvcache_gb, 3),
            "draft_weight_gb": round(draft_w, 3),
            "draft_kvcache_gb": round(draft_kv, 3),
            "total_gb": round(total, 3),
        }


@dataclass
class ServerState:
    """Everything the handlers share; ``engine`` is None while loading."""

    server_args: dict[str, Any]
    faults: Faults
    seed: int
    context_length: int
    log: Callable[[str], None]
    memory: MemoryModel = field(default_factory=MemoryModel)
    models: Models | None = None
    engine: Engine | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gen_requests_seen: int = 0
    gen_requests_done: int = 0
    chat_requests: int = 0
    started: float = field(default_factory=time.time)

    @property
    def model_path(self) -> str:
        return str(self.server_args["model_path"])


# ----------------------------------------------------------------------------------
# request parsing
# ----------------------------------------------------------------------------------


def _num(obj: dict[str, Any], key: str, default: float, kind: type = float, lo: float | None = None) -> Any:
    v = obj.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"{key} must be a number, got {type(v).__name__}")
    if kind is int:
        if isinstance(v, float) and not v.is_integer():
            raise BadRequest(f"{key} must be an integer")
        v = int(v)
    else:
        v = float(v)
    if lo is not None and v < lo:
        raise BadRequest(f"{key} must be >= {lo}, got {v}")
    return v


def _stop_list(v: Any, key: str = "stop") -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return [s for s in v if s]
    raise BadRequest(f"{key} must be a string or a list of strings")


def _int_list(v: Any, key: str) -> list[int]:
    if v is None:
        return []
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    raise BadRequest(f"{key} must be a list of integers")


def _bool(obj: dict[str, Any], key: str, default: bool = False) -> bool:
    v = obj.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{key} must be a boolean")
    return v


def parse_sampling(sp: Any, *, max_key: str = "max_new_tokens", default_max: int = 128) -> SamplingParams:
    """SGLang's sampling params (python/sglang/srt/sampling/sampling_params.py: max_new_tokens
    defaults to 128, temperature to 1.0)."""
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object")
    seed = sp.get("sampling_seed", sp.get("seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("seed must be an integer")
    return SamplingParams(
        max_new_tokens=_num(sp, max_key, default_max, int, 0),
        temperature=_num(sp, "temperature", 1.0, float, 0.0),
        stop=_stop_list(sp.get("stop")),
        stop_token_ids=_int_list(sp.get("stop_token_ids"), "stop_token_ids"),
        ignore_eos=_bool(sp, "ignore_eos"),
        seed=int(seed or 0),
    )


def finish_reason_openai(fr: dict[str, Any] | None) -> str | None:
    if fr is None:
        return None
    return "length" if fr.get("type") == "length" else str(fr.get("type"))


# ----------------------------------------------------------------------------------
# the handler
# ----------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """One connection; dispatches on method + path."""

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

    # -- dispatch -----------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        st = self.state
        if st.hung.is_set():
            self._hang()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "/health"): self.h_health,
            ("GET", "/health_generate"): self.h_health,
            ("GET", "/server_info"): self.h_server_info,
            ("GET", "/get_server_info"): self.h_server_info,
            ("GET", "/model_info"): self.h_model_info,
            ("GET", "/get_model_info"): self.h_model_info,
            ("GET", "/flush_cache"): self.h_flush_cache,
            ("POST", "/flush_cache"): self.h_flush_cache,
            ("GET", "/metrics"): self.h_metrics,
            ("GET", "/start_profile"): self.h_start_profile,
            ("POST", "/start_profile"): self.h_start_profile,
            ("GET", "/stop_profile"): self.h_stop_profile,
            ("POST", "/stop_profile"): self.h_stop_profile,
            ("GET", "/v1/models"): self.h_models,
            ("POST", "/generate"): self.h_generate,
            ("POST", "/v1/completions"): self.h_completions,
            ("POST", "/v1/chat/completions"): self.h_chat,
            ("POST", "/tokenize"): self.h_tokenize,
            ("POST", "/v1/tokenize"): self.h_tokenize,
            ("POST", "/detokenize"): self.h_detokenize,
            ("POST", "/v1/detokenize"): self.h_detokenize,
        }
        handler = routes.get((method, path))
        try:
            if handler is None:
                if method in ("POST", "PUT"):
                    self._drain_body()
                if any(p == path for _, p in routes):
                    self.send_error_json(405, f"method {method} not allowed on {path}")
                else:
                    self.send_error_json(404, f"not found: {path}")
                return
            handler()
        except BadRequest as exc:
            self.send_error_json(400, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug must not kill the server
            st.log("ERROR:    " + "".join(traceback.format_exception(exc)).rstrip())
            try:
                self.send_error_json(500, f"internal error: {exc!r}")
            except OSError:
                self.close_connection = True

    def _hang(self) -> None:
        """hang-after fault: never answer (the connection stays open)."""
        while True:
            time.sleep(3600)

    # -- simple endpoints ---------------------------------------------------------

    def _engine_or_503(self) -> Engine | None:
        eng = self.state.engine
        if eng is None or not self.state.ready.is_set():
            self.send_error_json(503, "server is starting up (loading weights)")
            return None
        return eng

    def h_health(self) -> None:
        """http_server.py ``health_generate``: 503 while the server status is Starting (warm-up)."""
        eng = self._engine_or_503()
        if eng is None:
            return
        if not eng.alive():
            self.send_error_json(503, "scheduler is not running")
            return
        self.send_text(200, "")

    def h_server_info(self) -> None:
        """http_server.py ``server_info``: server args top-level, ``version``, ``internal_states``."""
        st = self.state
        info = dict(st.server_args)
        info["version"] = VERSION
        spec_on = st.server_args["speculative_algorithm"] != "NONE"
        mem = st.memory.figures(
            st.server_args.get("speculative_draft_window_size"),
            st.context_length,
            int(st.server_args["max_running_requests"]),
            spec_on,
        )
        info["memory_usage"] = mem
        internal: dict[str, Any] = {"memory_usage": mem}
        if st.engine is not None:
            internal.update(st.engine.accounting())
        internal["status"] = "ready" if st.ready.is_set() else "loading"
        info["internal_states"] = [internal]
        info["uptime_s"] = round(time.time() - st.started, 3)
        self.send_json(200, info)

    def h_model_info(self) -> None:
        """http_server.py ``model_info``: exactly SGLang's keys (no vocab size, no tokenizer name)."""
        st = self.state
        body: dict[str, Any] = {
            "model_path": st.model_path,
            "tokenizer_path": st.server_args.get("tokenizer_path", st.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "infinigram",
            "architectures": ["InfiniGramForCausalLM"],
        }
        self.send_json(200, body)

    def h_models(self) -> None:
        self.send_json(200, {"object": "list", "data": [{"id": self.state.model_path, "object": "model", "owned_by": "refserver", "root": self.state.model_path, "max_model_len": self.state.context_length}]})

    # /tokenize and /detokenize follow SGLang's python/sglang/srt/entrypoints/openai/serving_tokenize.py
    # (routes in entrypoints/http_server.py, request shapes TokenizeRequest / DetokenizeRequest in
    # entrypoints/openai/protocol.py): a string prompt answers {"tokens": [...], "count": n}, a list
    # of prompts {"tokens": [[...], ...], "count": [...]}, both with "max_model_len".

    def _tokenizer_or_503(self) -> Any:
        models = self.state.models
        if models is None:
            self.send_error_json(503, "server is starting up (loading weights)")
            return None
        return models.tokenizer

    def h_tokenize(self) -> None:
        body = self.read_json()
        tok = self._tokenizer_or_503()
        if tok is None:
            return
        _bool(body, "add_special_tokens", True)  # validated; this tokenizer adds no BOS/EOS either way
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = tok.encode(prompt)
            self.send_json(200, {"tokens": ids, "count": len(ids), "max_model_len": self.state.context_length})
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            lists = [tok.encode(p) for p in prompt]
            self.send_json(200, {"tokens": lists, "count": [len(i) for i in lists], "max_model_len": self.state.context_length})
        else:
            raise BadRequest(f"Invalid prompt type: {type(prompt).__name__}. Expected str or List[str].")

    def h_detokenize(self) -> None:
        body = self.read_json()
        tok = self._tokenizer_or_503()
        if tok is None:
            return
        skip = _bool(body, "skip_special_tokens", True)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise BadRequest(f"Invalid tokens type: {type(tokens).__name__}. Expected List[int] or List[List[int]].")
        nested = bool(tokens) and isinstance(tokens[0], list)
        lists = tokens if nested else [tokens]
        for ids in lists:
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise BadRequest("Invalid input: 'tokens' must be a list of integers (or of lists of integers).")
            bad = [t for t in ids if not 0 <= t < tok.vocab_size]
            if bad:
                raise BadRequest(f"Error decoding tokens: ids out of range [0, {tok.vocab_size}): {bad[:5]}")
        texts = [tok.decode(ids, skip_special_tokens=skip) for ids in lists]
        self.send_json(200, {"text": texts if nested else texts[0]})

    def _query(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.path.split("?", 1)[1]) if "?" in self.path else {}

    def h_flush_cache(self) -> None:
        """http_server.py ``flush_cache(timeout: float = Query(0.0, ge=0.0))`` -> the scheduler's
        flush (scheduler_components/flush_wrapper.py, see Engine.flush_cache): 200 "Cache flushed..."
        once flushed; else 400 with the scheduler's message, "Flush cache failed." when it has none
        (busy with no timeout), "Timed out waiting for idle state." (busy for the whole timeout),
        "Another flush_cache is already in progress."."""
        eng = self._engine_or_503()
        if eng is None:
            return
        if self.command == "POST":
            self._drain_body()
        values = self._query().get("timeout", [])
        timeout = 0.0
        if values:
            try:
                timeout = float(values[-1])
            except ValueError:
                raise BadRequest("timeout: Input should be a valid number, unable to parse string as a number") from None
            if not timeout >= 0.0 or timeout == float("inf"):
                raise BadRequest("timeout: Input should be greater than or equal to 0")
        ok, message = eng.flush_cache(timeout)
        if ok:
            self.send_text(200, "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")
        else:
            self.send_text(400, message or "Flush cache failed.\n")

    def h_start_profile(self) -> None:
        """http_server.py ``start_profile_async`` (see profiler.py): 200 ``Start profiling.``; a
        malformed ProfileReq is a 400; a profile already running is SGLang's 500."""
        eng = self._engine_or_503()
        if eng is None:
            return
        body = self._optional_json()
        try:
            eng.profiler.start(ProfileSettings.parse(body))
        except ProfileRequestError as exc:
            raise BadRequest(str(exc)) from None
        except ProfileRefused as exc:
            self._internal_error(exc)
            return
        self.send_text(200, "Start profiling.\n")

    def h_stop_profile(self) -> None:
        """http_server.py ``stop_profile_async``: writes the trace; 200 ``Stop profiling. This will take
        some time.``; no profile running is SGLang's 500."""
        eng = self._engine_or_503()
        if eng is None:
            return
        self._optional_json()
        try:
            eng.profiler.stop()
        except ProfileRefused as exc:
            self._internal_error(exc)
            return
        except OSError as exc:
            self._internal_error(exc)
            return
        self.send_text(200, "Stop profiling. This will take some time.\n")

    def _internal_error(self, exc: Exception) -> None:
        """An exception SGLang's handlers do not catch: Starlette's plain 500 (the cause is in the log)."""
        self.state.log(f"ERROR:    Exception in ASGI application: {type(exc).__name__}: {exc}")
        self.send_text(500, "Internal Server Error")

    def _optional_json(self) -> dict[str, Any] | None:
        """A POST body that may be absent or empty (FastAPI's ``Body()`` with a None default)."""
        if self.command != "POST":
            return None
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("bad Content-Length") from None
        if self.headers.get("Transfer-Encoding", "").lower() != "chunked" and n == 0:
            return None
        body = self.read_json()
        return body if body else None

    def _drain_body(self) -> None:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if 0 < n <= MAX_BODY:
            self.rfile.read(n)

    def h_metrics(self) -> None:
        """Prometheus text, only with ``--enable-metrics`` (SGLang mounts /metrics only then:
        entrypoints/http_server.py ``add_prometheus_middleware``). ``sglang:spec_num_draft_tokens``
        (the worker's block size) appears once the first decode-log interval has been folded, as the
        scheduler's metrics reporter sets it (managers/scheduler_components/metrics_reporter.py)."""
        st = self.state
        if not st.server_args.get("enable_metrics"):
            self.send_error_json(404, "not found: /metrics (start the server with --enable-metrics)")
            return
        eng = st.engine
        name = st.model_path
        lab = f'{{model_name="{name}"}}'
        lines: list[str] = []

        def metric(mname: str, kind: str, help_: str, value: float) -> None:
            lines.extend([f"# HELP {mname} {help_}", f"# TYPE {mname} {kind}", f"{mname}{lab} {value}"])

        if eng is not None:
            acc = eng.accounting()
            metric("sglang:num_running_reqs", "gauge", "The number of running requests.", acc["num_running_reqs"])
            metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", acc["num_waiting_reqs"])
            metric("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
                   acc.get("avg_spec_accept_length", 0.0))
            if eng.spec.speculative and eng.acct.spec_total_num_forward_ct:
                metric("sglang:spec_num_draft_tokens", "gauge", "The number of draft tokens per verify (the block size).",
                       eng.spec.block_size)
            metric("sglang:spec_verify_calls_total", "counter", "Speculative verify calls (forward passes x requests).", acc["total_verify_steps"])
            metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", acc["total_prompt_tokens"])
            metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", acc["total_output_tokens"])
            metric("sglang:num_requests_total", "counter", "Number of requests completed.", acc["requests_completed"])
            metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", acc["last_gen_throughput"])
            metric("sglang:simulated_busy_seconds_total", "counter", "Simulated accelerator busy time.", acc["simulated_busy_seconds"])
            for mname, hist, help_ in (
                ("sglang:time_to_first_token_seconds", eng.ttft, "Histogram of time to first token in seconds."),
                ("sglang:e2e_request_latency_seconds", eng.e2e, "Histogram of End-to-end request latency in seconds"),
            ):
                lines += [f"# HELP {mname} {help_}", f"# TYPE {mname} histogram"]
                for b, c in zip(hist.buckets, hist.counts):
                    lines.append(f'{mname}_bucket{{le="{b}",model_name="{name}"}} {c}')
                lines.append(f'{mname}_bucket{{le="+Inf",model_name="{name}"}} {hist.total}')
                lines.append(f"{mname}_sum{lab} {hist.sum}")
                lines.append(f"{mname}_count{lab} {hist.total}")
        self.send_text(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4; charset=utf-8")

    # -- generation ---------------------------------------------------------------

    def _begin_generation(self) -> Engine | None:
        """Readiness and the http500 fault, shared by the generation endpoints."""
        eng = self._engine_or_503()
        if eng is None:
            return None
        st = self.state
        with st.lock:
            st.gen_requests_seen += 1
            n = st.gen_requests_seen
        if st.faults.http500_rate and uniform(st.seed, 0x500, n) < st.faults.http500_rate:
            self.send_error_json(500, "internal server error (injected fault http500-rate)")
            return None
        return eng

    def _count_completion(self) -> bool:
        """Count a completed generation request *before* its response goes out and
        apply hang-after; True when exit-after says the process must exit after it.

        Counting first closes races: a client that got the N-th answer can never slip
        another request in before the hang starts.
        """
        st = self.state
        with st.lock:
            st.gen_requests_done += 1
            done = st.gen_requests_done
        f = st.faults
        if f.hang_after is not None and done >= f.hang_after and not st.hung.is_set():
            st.log(f"WARNING:  injected fault hang-after={f.hang_after}: no longer answering")
            st.hung.set()
        return f.exit_after is not None and done >= f.exit_after

    def _exit_now(self) -> None:
        st = self.state
        st.log(f"ERROR:    Scheduler hit an exception: injected fault exit-after={st.faults.exit_after}; exiting")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def send_generation(self, obj: Any) -> None:
        """The final (non-streaming) answer of a generation request.

        When exit-after fires, the answer is sent without Content-Length and with
        ``Connection: close``: the client only has the whole body at EOF, i.e. when the
        process is already exiting, so a harness that checks the process right after
        the N-th answer reliably sees it gone.
        """
        if not self._count_completion():
            self.send_json(200, obj)
            return
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self._exit_now()

    def _tokenize_prompt(self, text: Any, input_ids: Any) -> list[int]:
        models = self.state.models
        assert models is not None
        if input_ids is not None:
            if text is not None:
                raise BadRequest("give either text or input_ids, not both")
            ids = _int_list(input_ids, "input_ids")
            vocab = models.tokenizer.vocab_size
            if any(not 0 <= x < vocab for x in ids):  # tokenizer_manager.py _validate_input_ids_in_vocab
                shown = ids if len(ids) <= 16 else [*ids[:16], "..."]
                raise BadRequest(f"The input_ids {shown} contains values greater than the vocab size ({vocab}).")
            return ids
        if not isinstance(text, str):
            if isinstance(text, list):
                raise BadRequest("batched text is not supported; send one prompt per request")
            raise BadRequest("text (a string) or input_ids (a list of integers) is required")
        return models.tokenizer.encode(text)

    def _check_length(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise BadRequest("the prompt is empty")
        limit = self.state.context_length
        if len(prompt) + params.max_new_tokens > limit:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {limit} tokens. "
                f"You requested a total of {len(prompt) + params.max_new_tokens} tokens: "
                f"{len(prompt)} tokens from the input messages and {params.max_new_tokens} tokens for the completion."
            )

    def _events(self, eng: Engine, req: Request) -> Iterator[StepEvent]:
        while True:
            try:
                ev = req.events.get(timeout=STEP_TIMEOUT_S)
            except Exception:
                eng.abort(req)
                raise RuntimeError("engine step timed out") from None
            yield ev
            if ev.finished:
                return

    def _wait(self, eng: Engine, req: Request) -> None:
        if not req.done.wait(STEP_TIMEOUT_S):
            eng.abort(req)
            raise RuntimeError("engine timed out")

    def _text(self, req: Request, n: int) -> str:
        models = self.state.models
        assert models is not None
        text = models.tokenizer.decode(req.output_ids[:n])
        if req.text_limit is not None and n >= len(req.output_ids):
            text = text[: req.text_limit]
        return text

    def _meta(self, req: Request, n: int | None = None, final: bool = True) -> dict[str, Any]:
        """meta_info as SGLang's tokenizer_manager.py ``_handle_batch_output``: e2e_latency and the
        spec fields (``_calculate_spec_decoding_metrics``, only under speculation and when the
        request had a verify step) come with the finished chunk only."""
        n = len(req.output_ids) if n is None else n
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": n,
            "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish_reason if final else None,
        }
        if not final:
            return meta
        meta["e2e_latency"] = round(req.e2e_latency(), 6)
        engine = self.state.engine
        if engine is not None and engine.spec.speculative and req.verify_ct > 0:
            meta["spec_verify_ct"] = req.verify_ct
            meta["spec_accept_length"] = round(n / req.verify_ct, 6)
            if req.accept_histogram:
                # tokenizer_manager.py's spec-decoding meta: the per-request histogram under its
                # 2026-05 name and, kept by upstream as a backward-compatible alias, the old one.
                meta["spec_correct_drafts_histogram"] = list(req.accept_histogram)
                meta["spec_accept_histogram"] = list(req.accept_histogram)
        return meta

    def _logprob_request(self, body: dict[str, Any], prompt: list[int]) -> LogprobRequest | None:
        """The logprob fields of a /generate body (io_struct.py ``GenerateReqInput``), validated as
        SGLang does (scheduler.py ``_create_generation_req``; tokenizer_manager.py
        ``_validate_token_ids_logprob``); None unless ``return_logprob``."""
        if not _bool(body, "return_logprob"):
            return None
        start = _num(body, "logprob_start_len", -1, int)
        if start == -1:  # scheduler.py: the default reports output tokens only
            start = len(prompt)
        if start < 0:
            raise BadRequest(f"logprob_start_len must be >= -1, got {start}")
        if start > len(prompt):
            raise BadRequest(f"req.logprob_start_len={start} is higher than the number of input tokens "
                             f"len(req.origin_input_ids)={len(prompt)}. Please use a smaller logprob_start_len.")
        top_k = _num(body, "top_logprobs_num", 0, int, 0)
        ids_raw = body.get("token_ids_logprob")
        token_ids: tuple[int, ...] | None = None
        if ids_raw is not None:
            if not isinstance(ids_raw, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids_raw):
                raise BadRequest("token_ids_logprob must be a flat list of integers.")
            assert self.state.models is not None
            vocab = self.state.models.tokenizer.vocab_size
            for t in ids_raw:
                if not 0 <= t < vocab:
                    raise BadRequest(f"token_ids_logprob contains out-of-vocabulary token id {t}; valid range is [0, {vocab}).")
            token_ids = tuple(ids_raw)
        if top_k > 1024 or (token_ids is not None and len(token_ids) > 1024):
            raise BadRequest("top_logprobs_num and token_ids_logprob are limited to 1024 entries here")
        return LogprobRequest(start=start, top_k=top_k, token_ids=token_ids,
                              with_text=_bool(body, "return_text_in_logprobs"))

    def h_generate(self) -> None:
        """http_server.py ``generate_request``: {text | input_ids, sampling_params, stream}; a stream is
        ``data: {json}`` events, then ``data: [DONE]``; bad input is a 400 (ValueError there)."""
        body = self.read_json()
        eng = self._begin_generation()
        if eng is None:
            return
        params = parse_sampling(body.get("sampling_params"))
        prompt = self._tokenize_prompt(body.get("text"), body.get("input_ids"))
        self._check_length(prompt, params)
        stream = _bool(body, "stream")
        rid = body.get("rid")
        wanted = self._logprob_request(body, prompt)
        req = Request(prompt, params, rid=str(rid) if isinstance(rid, str) else "")
        tracker: LogprobTracker | None = None
        if wanted is not None:
            req.logprob_start_len = wanted.start
            assert self.state.models is not None
            tracker = LogprobTracker(self.state.models, prompt, wanted, params.temperature, params.ignore_eos)
        eng.submit(req)

        def meta(n: int, final: bool) -> dict[str, Any]:
            out = self._meta(req, n, final)
            if tracker is not None:
                tracker.extend(req.output_ids[:n])
                out.update(tracker.meta())
            return out

        if not stream:
            self._wait(eng, req)
            n_out = len(req.output_ids)
            self.send_generation({"text": self._text(req, n_out), "output_ids": list(req.output_ids), "meta_info": meta(n_out, True)})
            return
        self.start_stream()
        try:
            for ev in self._events(eng, req):
                n = ev.n_visible
                self.sse({"text": self._text(req, n), "output_ids": req.output_ids[:n], "meta_info": meta(n, ev.finished)})
            exit_now = self._count_completion()
            self.end_stream()
        except (BrokenPipeError, ConnectionResetError):
            eng.abort(req)
            raise
        if exit_now:
            self._exit_now()

    def _openai_common(self, body: dict[str, Any], default_max: int) -> SamplingParams:
        n = body.get("n", 1)
        if n not in (None, 1):
            raise BadRequest("only n=1 is supported")
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        params = parse_sampling(body, max_key=max_key, default_max=default_max)
        return params

    def _usage(self, req: Request) -> dict[str, Any]:
        """entrypoints/openai/usage_processor.py: ``prompt_tokens_details.cached_tokens`` only with
        ``--enable-cache-report``, else null."""
        p, c = len(req.prompt_ids), len(req.output_ids)
        details = {"cached_tokens": req.cached_tokens} if self.state.server_args.get("enable_cache_report") else None
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "prompt_tokens_details": details}

    def h_completions(self) -> None:
        body = self.read_json()
        eng = self._begin_generation()
        if eng is None:
            return
        params = self._openai_common(body, default_max=16)
        prompt_in = body.get("prompt")
        if isinstance(prompt_in, list) and len(prompt_in) == 1 and isinstance(prompt_in[0], (str, list)):
            prompt_in = prompt_in[0]
        if isinstance(prompt_in, list):
            prompt = self._tokenize_prompt(None, prompt_in)
        else:
            prompt = self._tokenize_prompt(prompt_in, None)
        self._check_length(prompt, params)
        self._openai_run(eng, body, prompt, params, chat=False)

    def h_chat(self) -> None:
        """entrypoints/openai/serving_chat.py: OpenAI shape with usage; return_meta_info adds meta_info."""
        body = self.read_json()
        eng = self._begin_generation()
        if eng is None:
            return
        if self.state.faults.chat_body:
            self._send_chat_fault()
            return
        params = self._openai_common(body, default_max=1024)
        models = self.state.models
        assert models is not None
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        turns: list[tuple[str, str]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string role")
            content = m.get("content")
            if content is None:
                content = ""
            if isinstance(content, list):
                parts = []
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                        parts.append(part["text"])
                    else:
                        raise BadRequest(f"messages[{i}].content: only text parts are supported")
                content = "".join(parts)
            if not isinstance(content, str):
                raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")
            turns.append((m["role"], content))
        prompt = models.tokenizer.render_chat(turns)
        if params.max_new_tokens == 1024 and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            params.max_new_tokens = max(1, min(1024, self.state.context_length - len(prompt)))
        self._check_length(prompt, params)
        self._openai_run(eng, body, prompt, params, chat=True)

    def _send_chat_fault(self) -> None:
        """The ``chat-body`` fault: a 200 whose body is malformed or hostile (not SGLang's
        behaviour: it proves the harness's handling of a service that misbehaves)."""
        st = self.state
        with st.lock:
            st.chat_requests += 1
            kind = st.faults.chat_body[(st.chat_requests - 1) % len(st.faults.chat_body)]
        code = "```python\ndef f():\n    return 1\n```"
        message: Any = {"role": "assistant", "content": code}
        resp: dict[str, Any] = {"id": "chatcmpl-fault", "object": "chat.completion", "created": int(time.time()), "model": "fault",
                                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}}
        if kind == "message-not-object":
            resp["choices"][0]["message"] = code
        elif kind == "no-choices":
            del resp["choices"]
        elif kind == "content-not-string":
            message["content"] = [code]
        elif kind == "usage-not-object":
            resp["usage"] = "many"
        elif kind == "error-body":
            resp = {"object": "error", "message": "injected fault chat-body=error-body", "type": "InternalServerError", "param": None, "code": 500}
        elif kind == "huge-body":
            message["content"] = "x" * (17 * 1024 * 1024)
        elif kind == "huge-answer":
            message["content"] = "```python\n" + "#" * 2_000_000 + "\n```"
        elif kind == "think-bomb":
            message["content"] = "<think>" * 40_000 + "\n" + code
        elif kind == "fence-bomb":
            message["content"] = ("```" + " " * 4000 + "`\n") * 50
        data = json.dumps(resp).encode()
        if kind == "invalid-utf8":
            data = data.replace(b"def f", b"def \xff\xfe", 1)
        elif kind == "truncated-json":
            data = data[: len(data) // 2]
        self._count_completion()
        self._send(200, data, "application/json")

    def _openai_run(self, eng: Engine, body: dict[str, Any], prompt: list[int], params: SamplingParams, chat: bool) -> None:
        stream = _bool(body, "stream")
        want_meta = _bool(body, "return_meta_info")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise BadRequest("stream_options must be an object")
        include_usage = bool(opts.get("include_usage", False))
        model = str(self.state.server_args.get("served_model_name") or self.state.model_path)
        created = int(time.time())
        prefix = "chatcmpl-" if chat else "cmpl-"
        req = Request(prompt, params, rid=prefix + uuid.uuid4().hex[:24])
        eng.submit(req)
        if not stream:
            self._wait(eng, req)
            text = self._text(req, len(req.output_ids))
            choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason_openai(req.finish_reason), "matched_stop": (req.finish_reason or {}).get("matched")}
            if chat:
                choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
            else:
                choice["text"] = text
            resp: dict[str, Any] = {"id": req.rid, "object": "chat.completion" if chat else "text_completion", "created": created, "model": model, "choices": [choice], "usage": self._usage(req)}
            if want_meta:
                meta = self._meta(req)
                choice["meta_info"] = meta
                resp["meta_info"] = meta
            self.send_generation(resp)
            return
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                c["delta"] = delta
            else:
                c["text"] = delta_text or ""
            return {"id": req.rid, "object": obj, "created": created, "model": model, "choices": [c]}

        self.start_stream()
        try:
            if chat:
                self.sse(chunk("", None, role=True))
            sent = ""
            for ev in self._events(eng, req):
                text = self._text(req, ev.n_visible)
                delta = text[len(sent):] if text.startswith(sent) else text
                sent = text
                fin = finish_reason_openai(req.finish_reason) if ev.finished else None
                if delta or fin:
                    c = chunk(delta or None, fin)
                    if fin:
                        c["choices"][0]["matched_stop"] = (req.finish_reason or {}).get("matched")
                        if want_meta:
                            c["choices"][0]["meta_info"] = self._meta(req)
                    self.sse(c)
            if include_usage:
                self.sse({"id": req.rid, "object": obj, "created": created, "model": model, "choices": [], "usage": self._usage(req)})
            exit_now = self._count_completion()
            self.end_stream()
        except (BrokenPipeError, ConnectionResetError):
            eng.abort(req)
            raise
        if exit_now:
            self._exit_now()


class RefHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def make_server(state: ServerState, host: str, port: int) -> RefHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    return RefHTTPServer((host, port), handler)
