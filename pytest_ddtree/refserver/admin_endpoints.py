"""The reference server's endpoints besides generation: health, server and model info, tokenize, flush_cache, profiling, /metrics."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from pytest_ddtree.refserver.profiler import ProfileRefused, ProfileRequestError, ProfileSettings
from pytest_ddtree.refserver.request_params import BadRequest, bool_field
from pytest_ddtree.refserver.transport import HandlerBase



class AdminEndpoints(HandlerBase):
    """GET/POST endpoints that do not generate; each follows the SGLang handler it names."""

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
        info["version"] = st.version
        info["status"] = "ready" if st.ready.is_set() else "starting"  # http_server.py server_info, top-level in 0.5.23
        spec_on = st.server_args["speculative_algorithm"] not in (None, "NONE")  # SGLang reports null when off
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
        """http_server.py ``model_info``: SGLang 0.5.23's keys but its ``embedding`` block (no vocab
        size, no tokenizer name; tests/test_sglang_conformance.py compares them with the real one)."""
        st = self.state
        body: dict[str, Any] = {
            "model_path": st.model_path,
            "served_model_name": st.server_args.get("served_model_name") or st.model_path,
            "tokenizer_path": st.server_args.get("tokenizer_path", st.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "infinigram",
            "architectures": ["InfiniGramForCausalLM"],
        }
        self.send_json(200, body)

    def h_models(self) -> None:
        self.send_json(200, {"object": "list", "data": [{"id": self.state.model_path, "object": "model", "created": int(self.state.started), "owned_by": "refserver", "root": self.state.model_path, "parent": None, "max_model_len": self.state.context_length}]})

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
        bool_field(body, "add_special_tokens", True)  # validated; this tokenizer adds no BOS/EOS either way
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
        skip = bool_field(body, "skip_special_tokens", True)
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

    def h_metrics(self) -> None:
        """Prometheus text, only with ``--enable-metrics`` (SGLang mounts /metrics only then:
        entrypoints/http_server.py ``add_prometheus_middleware``). The ``sglang:spec_*`` series are
        there from start-up at 0 and move as SGLang 0.5.23's metrics reporter moves them
        (spec_gauges.py)."""
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
            for series in eng.acct.gauges.series():  # SGLang's cadence: spec_gauges.py
                metric(*series)
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
