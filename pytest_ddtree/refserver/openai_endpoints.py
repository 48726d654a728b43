"""The reference server's OpenAI-compatible endpoints: /v1/completions and /v1/chat/completions,
streamed or not, after SGLang's entrypoints/openai (serving_completions.py, serving_chat.py,
usage_processor.py), on the generation that /generate runs (generation_endpoints.py)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pytest_ddtree.refserver.engine import Engine
from pytest_ddtree.refserver.generation_endpoints import GenerationEndpoints
from pytest_ddtree.refserver.request_params import BadRequest, bool_field, finish_reason_openai, parse_sampling
from pytest_ddtree.refserver.request_state import Request, SamplingParams


class OpenAIEndpoints(GenerationEndpoints):
    def _openai_common(self, body: dict[str, Any], default_max: int) -> SamplingParams:
        n = body.get("n", 1)
        if n not in (None, 1):
            raise BadRequest("only n=1 is supported")
        max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        params = parse_sampling(body, max_key=max_key, default_max=default_max)
        return params

    def _usage(self, req: Request, reasoning_tokens: int = 0) -> dict[str, Any]:
        """entrypoints/openai/usage_processor.py: ``prompt_tokens_details.cached_tokens`` only with
        ``--enable-cache-report``, else null."""
        p, c = len(req.prompt_ids), len(req.output_ids)
        details = {"cached_tokens": req.cached_tokens} if self.state.server_args.get("enable_cache_report") else None
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c, "prompt_tokens_details": details,
                "reasoning_tokens": reasoning_tokens, "completion_tokens_details": None}

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
        thinking = _enable_thinking(body)
        prompt = models.tokenizer.render_chat(turns)
        if thinking is False:  # Qwen3's chat template: thinking off closes an empty think block after the header
            prompt.extend(models.tokenizer.encode(THINK_OFF_SUFFIX))
        if params.max_new_tokens == 1024 and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            params.max_new_tokens = max(1, min(1024, self.state.context_length - len(prompt)))
        self._check_length(prompt, params)
        # serving_chat.py _get_reasoning_from_request: with a parser whose template has the toggle on by
        # default, the text opens in reasoning unless enable_thinking is false
        parser = self.state.server_args.get("reasoning_parser")
        split = ReasoningSplit(forced=thinking is not False) if parser and body.get("separate_reasoning", True) is not False else None
        self._openai_run(eng, body, prompt, params, chat=True, split=split)

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

    def _openai_run(self, eng: Engine, body: dict[str, Any], prompt: list[int], params: SamplingParams, chat: bool,
                    split: ReasoningSplit | None = None) -> None:
        stream = bool_field(body, "stream")
        want_meta = bool_field(body, "return_meta_info")
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
            self._openai_reply(eng, req, chat, split, created, model, want_meta)
            return
        # usage.reasoning_tokens (tokenizer_manager.py counts the output up to the reasoning's end): the tokens
        # out while the split was still in reasoning, at a step's granularity
        thought = 0
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, finish: str | None, role: bool = False, reasoning: str | None = None) -> dict[str, Any]:
            # serving_chat.py's chunk (sse_utils.py StreamDelta): every delta carries reasoning_content, every choice matched_stop
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            if chat:
                delta: dict[str, Any] = {"reasoning_content": reasoning}
                if role:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                c["delta"] = delta
            else:
                c["text"] = delta_text or ""
            return {"id": req.rid, "object": obj, "created": created, "model": model, "choices": [c]}

        with self._stream(eng, req):
            if chat:
                self.sse(chunk("", None, role=True))
            sent = ""
            for ev in self._events(eng, req):
                text = self._text(req, ev.n_visible)
                delta = text[len(sent):] if text.startswith(sent) else text
                sent = text
                fin = finish_reason_openai(req.finish_reason) if ev.finished else None
                if split is not None:  # serving_chat.py _generate_stream_content: the reasoning chunk, then the content's
                    reasoning, delta = split.feed(delta, final=ev.finished)
                    if split.in_reasoning:
                        thought = ev.n_visible
                    if reasoning:
                        self.sse(chunk(None, None, reasoning=reasoning))
                if delta or fin:
                    c = chunk(delta or None, None)
                    if fin:  # the text first, then the finish in a chunk of its own, as SGLang sends it
                        if delta:
                            self.sse(c)
                        c = chunk(None, fin)
                    if fin:
                        c["choices"][0]["matched_stop"] = (req.finish_reason or {}).get("matched")
                        if want_meta:
                            c["choices"][0]["meta_info"] = self._meta(req)
                    self.sse(c)
            if chat and bool_field(body, "return_spec_tokens_details"):
                self._send_spec_details(req, obj, created, model)
            if include_usage:
                self.sse({"id": req.rid, "object": obj, "created": created, "model": model, "choices": [], "usage": self._usage(req, thought)})

    def _openai_reply(self, eng: Engine, req: Request, chat: bool, split: ReasoningSplit | None, created: int, model: str,
                      want_meta: bool) -> None:
        """Answer a non-streamed completion in one body once ``req`` finishes (serving_chat.py's
        _build_chat_response for a chat): none of the stream's chunking, only the reasoning split
        of the final text; with no steps to tell where the reasoning closed, usage.reasoning_tokens
        is every output token when it never closed, else 0."""
        thought = 0
        self._wait(eng, req)
        text = self._text(req, len(req.output_ids))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason_openai(req.finish_reason), "matched_stop": (req.finish_reason or {}).get("matched")}
        if chat:
            reasoning, answer = split.feed(text, final=True) if split is not None else (None, text)
            choice["message"] = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
            if split is not None and split.in_reasoning:  # it never closed: every output token was reasoning
                thought = len(req.output_ids)
        else:
            choice["text"] = text
        resp: dict[str, Any] = {"id": req.rid, "object": "chat.completion" if chat else "text_completion", "created": created, "model": model, "choices": [choice], "usage": self._usage(req, thought)}
        if want_meta:
            choice["meta_info"] = self._meta(req)
        self.send_generation(resp)

    def _send_spec_details(self, req: Request, obj: str, created: int, model: str) -> None:
        """serving_chat.py's sglext chunk (``return_spec_tokens_details``), before the usage chunk: the request's
        SpecTokensDetails (utils.py spec_tokens_details_from_meta_info: 0 and [] for what meta_info lacks;
        none without spec fields, so a request that did not speculate sends no chunk)."""
        meta = self._meta(req)
        if "spec_verify_ct" not in meta:
            return
        details = {"spec_accept_rate": meta.get("spec_accept_rate") or 0.0, "spec_accept_length": meta.get("spec_accept_length") or 0.0,
                   "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
                   "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
                   "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
                   "spec_verify_ct": meta["spec_verify_ct"],
                   "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [], "spec_cap_lens_histogram": []}
        self.sse({"id": req.rid, "object": obj, "created": created, "model": model, "choices": [], "usage": None,
                  "sglext": {"spec_tokens_details": details}})


#: What Qwen3's chat template writes after the assistant header when ``enable_thinking`` is false.
THINK_OFF_SUFFIX = "<think>\n\n</think>\n\n"
THINK_START, THINK_END = "<think>", "</think>"


def _enable_thinking(body: dict[str, Any]) -> bool | None:
    """``chat_template_kwargs.enable_thinking`` (protocol.py: an optional dict; serving_chat.py merges it into the
    template's arguments); None when not sent."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    value = kwargs.get("enable_thinking")
    return None if value is None else bool(value)


class ReasoningSplit:
    """A streamed answer's reasoning and content, as SGLang's Qwen3Detector splits them (reasoning_parser.py,
    ``(<think>)*(.*)</think>``): forced, the text is reasoning from its start; else from a ``<think>`` it
    opens with; reasoning ends at ``</think>``. A tail that may be the start of a tag is held back
    until the next delta (or the end), as the detector buffers it."""

    def __init__(self, forced: bool) -> None:
        self.in_reasoning = forced
        self.started = False
        self.held = ""

    def feed(self, text: str, final: bool = False) -> tuple[str | None, str]:
        """(reasoning, content) of the next piece of the answer."""
        text, self.held = self.held + text, ""
        if not self.started:
            if not final and len(text) < len(THINK_START) and THINK_START.startswith(text):
                self.held = text
                return None, ""
            self.started = True
            if text.startswith(THINK_START):
                self.in_reasoning, text = True, text[len(THINK_START):]
        if not self.in_reasoning:
            return None, text
        end = text.find(THINK_END)
        if end >= 0:
            self.in_reasoning = False
            return text[:end] or None, text[end + len(THINK_END):]
        keep = next((k for k in range(min(len(THINK_END) - 1, len(text)), 0, -1) if THINK_END.startswith(text[-k:])), 0)
        if keep and not final:
            text, self.held = text[:-keep], text[-keep:]
        return text or None, ""
