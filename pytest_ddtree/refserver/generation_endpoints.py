"""The reference server's generation endpoints: /generate, streamed or not, and what the OpenAI-compatible
endpoints (openai_endpoints.py) share with it: a generation begun, its prompt checked, its steps
waited for, its text and meta_info."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from pytest_ddtree.refserver.engine import Engine
from pytest_ddtree.refserver.logprobs import LogprobRequest, LogprobTracker
from pytest_ddtree.refserver.model import uniform
from pytest_ddtree.refserver.request_params import (
    BadRequest,
    ContractError,
    InvalidRequest,
    bool_field,
    check_sampling_contract,
    int_list,
    number_field,
    parse_sampling,
    verify_sampling,
)
from pytest_ddtree.refserver.request_state import Request, SamplingParams, StepEvent
from pytest_ddtree.refserver.transport import HandlerBase

STEP_TIMEOUT_S = 600.0



def spec_block(engine: Engine) -> int:
    return int(engine.spec.block_size)


class GenerationEndpoints(HandlerBase):
    """/generate, /v1/completions and /v1/chat/completions, with the faults that hit them."""

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
            ids = int_list(input_ids, "input_ids")
            vocab = models.tokenizer.vocab_size
            if any(not 0 <= x < vocab for x in ids):  # tokenizer_manager.py _validate_input_ids_in_vocab
                shown = ids if len(ids) <= 16 else [*ids[:16], "..."]
                # deliberate (docs/conformance.md): 0.5.23 has no such check and its scheduler dies
                raise InvalidRequest(f"The input_ids {shown} contains values greater than the vocab size ({vocab}).")
            return ids
        if not isinstance(text, str):
            if isinstance(text, list):
                raise BadRequest("batched text is not supported; send one prompt per request")
            raise InvalidRequest("Either text, input_ids or input_embeds should be provided.")  # io_struct.py:445-455
        return models.tokenizer.encode(text)

    def _check_length(self, prompt: list[int], params: SamplingParams) -> None:
        """sglang 0.5.23 sglang/srt/managers/tokenizer_manager.py:1333-1377 (``_validate_one_request``):
        a prompt of the context length or more, then prompt + max_new_tokens over it, each a
        ValueError with SGLang's message."""
        if not prompt:
            raise BadRequest("the prompt is empty")
        limit = self.state.context_length
        if len(prompt) >= limit:
            raise InvalidRequest(f"The input ({len(prompt)} tokens) is longer than the model's context length ({limit} tokens).")
        if len(prompt) + params.max_new_tokens > limit:
            raise InvalidRequest(
                f"Requested token count exceeds the model's maximum context length of {limit} tokens. "
                f"You requested a total of {len(prompt) + params.max_new_tokens} tokens: "
                f"{len(prompt)} tokens from the input messages and {params.max_new_tokens} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion to fit within the limit."
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
            "finish_reason": req.finish_reason if final else None,
            "prompt_tokens": len(req.prompt_ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": n,
            "cached_tokens": req.cached_tokens,
            # scheduler output's per-tier breakdown: present once part of the prompt was cached
            "cached_tokens_details": {"device": req.cached_tokens, "host": 0} if req.cached_tokens else None,
            "dp_rank": None,
        }
        if not final:
            return meta
        meta["e2e_latency"] = round(req.e2e_latency(), 6)
        engine = self.state.engine
        if engine is not None and engine.spec.speculative and req.verify_ct > 0:
            # tokenizer_manager.py:3148-3172 (0.5.23): the accept rate's denominator is config
            # arithmetic, verify_ct x (speculative_num_draft_tokens - 1), never a measurement
            draft_tokens = self.state.server_args.get("speculative_num_draft_tokens") or spec_block(engine)
            correct = sum(i * c for i, c in enumerate(req.accept_histogram))
            proposed = req.verify_ct * (int(draft_tokens) - 1)
            if proposed > 0:
                meta["spec_accept_rate"] = correct / proposed
                meta["spec_accept_length"] = round(n / req.verify_ct, 6)
                meta["spec_num_correct_drafts"] = correct
                meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = req.verify_ct
            if (scale := self.state.faults.verify_ct) is not None:  # the verify-ct fault: a count no config can give
                meta["spec_verify_ct"] = round(req.verify_ct * scale)
            elif req.accept_histogram:
                # sglang 0.5.23 sglang/srt/managers/tokenizer_manager.py:3193-3201: the per-request
                # histogram under its one name (the old alias spec_accept_histogram is gone there).
                meta["spec_correct_drafts_histogram"] = list(req.accept_histogram)
        return meta

    def _logprob_request(self, body: dict[str, Any], prompt: list[int]) -> LogprobRequest | None:
        """The logprob fields of a /generate body (io_struct.py ``GenerateReqInput``), validated as
        SGLang does (scheduler.py ``_create_generation_req``; tokenizer_manager.py
        ``_validate_token_ids_logprob``); None unless ``return_logprob``."""
        if not bool_field(body, "return_logprob"):
            return None
        start = number_field(body, "logprob_start_len", -1, int)
        if start == -1:  # scheduler.py: the default reports output tokens only
            start = len(prompt)
        if start < 0:
            raise BadRequest(f"logprob_start_len must be >= -1, got {start}")
        if start > len(prompt):
            raise BadRequest(f"req.logprob_start_len={start} is higher than the number of input tokens "
                             f"len(req.origin_input_ids)={len(prompt)}. Please use a smaller logprob_start_len.")
        top_k = number_field(body, "top_logprobs_num", 0, int, 0)
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
                              with_text=bool_field(body, "return_text_in_logprobs"))

    def h_generate(self) -> None:
        """http_server.py ``generate_request``: {text | input_ids, sampling_params, stream}; a stream is
        ``data: {json}`` events, then ``data: [DONE]``; bad input is a 400 in the shape SGLang gives
        it (request_params.py: ContractError, InvalidRequest), streamed as an error event.
        meta_info.e2e_latency counts from the request's receipt, before tokenization, as
        tokenizer_manager.py's ``created_time`` (the request's ``received_time``) does."""
        body = self.read_json()
        received = time.monotonic()
        if self.trickled("stream" if body.get("stream") is True else "generate", stream=body.get("stream") is True):
            return
        eng = self._begin_generation()
        if eng is None:
            return
        sampling = body.get("sampling_params")
        check_sampling_contract(sampling)
        stream = body.get("stream", False)
        if not isinstance(stream, bool) and stream is not None:
            raise ContractError(f"invalid type: {json.dumps(stream)[:40]}, expected a boolean")
        stream = bool(stream)
        try:
            verify_sampling(sampling or {})
            params = parse_sampling(sampling)
            prompt = self._tokenize_prompt(body.get("text"), body.get("input_ids"))
            self._check_length(prompt, params)
            wanted = self._logprob_request(body, prompt)
        except InvalidRequest as exc:
            if not stream:
                raise
            # http_server.py:957-975: in a stream SGLang's ValueError is an event, then [DONE]
            self.start_stream()
            self.sse({"error": {"message": str(exc), "type": "invalid_request_error", "code": 400, "retryable": False}})
            self.end_stream()
            return
        rid = body.get("rid")
        req = Request(prompt, params, rid=str(rid) if isinstance(rid, str) else "", arrival=received)
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
        with self._stream(eng, req):
            if self._deep_chunk():
                eng.abort(req)
                return
            for ev in self._events(eng, req):
                n = ev.n_visible
                self.sse({"text": self._text(req, n), "output_ids": req.output_ids[:n], "meta_info": meta(n, ev.finished)})

    def _deep_chunk(self) -> bool:
        """The deep-chunk fault: every N-th stream is one chunk of 200,000 nested arrays (then its end)."""
        every = self.state.faults.deep_chunk
        if every is None:
            return False
        with self.state.lock:
            self.state.answered["deep-chunk"] = count = self.state.answered.get("deep-chunk", 0) + 1
        if count % every:
            return False
        self.sse("[" * 200_000)
        return True

    @contextlib.contextmanager
    def _stream(self, eng: Engine, req: Request) -> Iterator[None]:
        """One SSE response around the chunks the body writes: the stream's end, the completion
        count (the exit-after fault), and the request aborted when the client hangs up, as
        SGLang aborts a request whose connection closed."""
        self.start_stream()
        try:
            yield
            exit_now = self._count_completion()
            self.end_stream()
        except (BrokenPipeError, ConnectionResetError):
            eng.abort(req)
            raise
        if exit_now:
            self._exit_now()
