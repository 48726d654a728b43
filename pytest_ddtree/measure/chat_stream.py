"""One streaming ``/v1/chat/completions``: a chat cell's request (``api: chat``), through the model's
chat template, timed as SGLang's bench_serving times its ``openai-chat`` backend, and bounded
against a hostile stream as :mod:`pytest_ddtree.measure.generate_stream` bounds /generate.

Why chat cells at all: raw /generate skips the chat template, and what the template puts before the
answer (its turn markers; a thinking block opened, or closed empty when thinking is off) changes what
a drafter is asked to continue: thinking on or off moved DFlash acceptance from 25% to 60%
(z-lab/dflash#133). So a chat cell sends ``messages`` and, where it names ``thinking``,
``chat_template_kwargs: {"enable_thinking": ...}`` (serving_chat.py merges it into the template's
arguments, and its reasoning parser reads it to decide whether the text opens in reasoning).

How it is timed (sglang 0.5.23 ``benchmark/serving.py`` ``async_request_openai_chat_completions``):
TTFT at the first delta carrying ``content`` or ``reasoning_content`` (bench_serving counts a
reasoning model's thoughts like content); one ITL entry per later such delta, the gap since the
previous one; the output length from the ``usage`` chunk (``stream_options.include_usage``), never
from deltas, which carry text, not tokens (a speculative step's delta holds several). A chat delta
does not say how many tokens it holds, so unlike /generate's ITL (spread over a chunk's tokens)
this ITL is per delta, as bench_serving's is; TPOT, from the usage count, is exact either way.
Verify counts come from the stream's ``sglext.spec_tokens_details`` chunk, which SGLang sends when
asked (``return_spec_tokens_details``: protocol.py's ``SpecTokensDetails``; a streamed chat refuses
``return_meta_info``, serving_chat.py).

Bounds: chat chunks carry deltas, so a stream grows linearly with its tokens; past
``CHAT_LINE_LIMIT`` per line, ``CHAT_BODY_BASE + CHAT_BYTES_PER_TOKEN * n`` in all, or more text
deltas than ``2 n + 4`` (a step yields at most a reasoning and a content delta) for ``n`` asked
tokens, the stream is hostile or broken and is not read on.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_ddtree.measure import accounting
from pytest_ddtree.measure.accounting import StreamError
from pytest_ddtree.measure.generate_stream import STREAM_TAIL_LIMIT, RequestResult, StallWatch, send_stream
from pytest_ddtree.measure.prompts import Prompt, PromptSet
from pytest_ddtree.service import proof
from pytest_ddtree.service.http import ServiceHTTP

CHAT_LINE_LIMIT = 1024 * 1024
CHAT_BODY_BASE = 1024 * 1024
CHAT_BYTES_PER_TOKEN = 8192
CHAT_PATH = "/v1/chat/completions"


def chat_body(prompt: Prompt, output_tokens: int, extra_sampling_params: Mapping[str, Any] | None,
              thinking: bool | None) -> dict[str, Any]:
    """The request bench_serving's openai-chat backend sends (one user message, greedy and
    ``ignore_eos`` unless the cell samples), streamed with a usage chunk, asking for the verify counts."""
    body: dict[str, Any] = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt.text or ""}],
        "max_completion_tokens": output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True,
    }
    body.update(extra_sampling_params or {})
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    return body


def chat_prompts(prompts: PromptSet, detokenize: Callable[[Sequence[int]], str]) -> PromptSet:
    """The cell's prompts as message text: each exact-length id prompt decoded by the service's own
    tokenizer (a chat message is text; the template's tokens come on top, counted by the server)."""
    out = [p if p.input_ids is None else Prompt(p.target_tokens, text=detokenize(list(p.input_ids)), category=p.category)
           for p in prompts.prompts]
    return PromptSet(out, prompts.source, f"{prompts.method}, as chat text", prompts.tolerance, prompts.notes)


def stream_chat(service: ServiceHTTP, index: int, prompt: Prompt, output_tokens: int,
                extra_sampling_params: Mapping[str, Any] | None = None, conn: http.client.HTTPConnection | None = None,
                tolerance: float = 0.0, thinking: bool | None = None) -> RequestResult:
    """Send one streamed chat completion and time it; never raises (errors land in the result).
    ``conn``: a kept-alive connection to reuse, as :func:`generate_stream.stream_request` takes one."""
    result = RequestResult(index=index, expected_prompt_tokens=prompt.target_tokens, expected_output_tokens=output_tokens,
                           prompt_tolerance=tolerance, templated=True)
    body = chat_body(prompt, output_tokens, extra_sampling_params, thinking)
    asked = body["max_completion_tokens"] if isinstance(body["max_completion_tokens"], int) else output_tokens
    return send_stream(service, conn, CHAT_PATH, json.dumps(body).encode(), result,
                       lambda resp, clock, stall: read_chat_events(resp, result, asked, clock, stall))


def read_chat_events(resp: Any, result: RequestResult, asked: int, clock: Callable[[], float], stall: StallWatch) -> bool:
    """Read a chat event stream up to ``data: [DONE]`` into ``result``; a hostile, broken or
    incomplete stream raises ValueError. Returns whether the connection may be reused."""
    limit = CHAT_BODY_BASE + CHAT_BYTES_PER_TOKEN * max(1, asked)
    streamed = at_chunk = 0
    last: float | None = None
    usage: Mapping[str, Any] | None = None
    try:
        while True:
            line = resp.readline(CHAT_LINE_LIMIT + 1)
            t = clock()
            if not line:
                raise StreamError("closed", "stream ended without 'data: [DONE]'")
            streamed += len(line)
            if t - stall.last > stall.limit_s:
                raise stall.error(t, result, streamed - at_chunk)
            if len(line) > CHAT_LINE_LIMIT or streamed > limit:
                raise StreamError("too long", f"stream line over {CHAT_LINE_LIMIT:,} bytes or stream over {limit:,} bytes for "
                                              f"{asked} tokens: not read on (the stream is hostile or broken)")
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                result.end = t
                reusable = len(resp.read(STREAM_TAIL_LIMIT)) < STREAM_TAIL_LIMIT
                break
            chunk = _chunk(payload)
            at_chunk = streamed
            result.chunks += 1
            usage = _usage(chunk, asked) or usage
            _spec_details(chunk, result)
            if _has_text(chunk):
                stall.token(t)
                if result.ttft_s is None:
                    result.ttft_s = t - result.start
                elif last is not None:
                    result.itl_s.append(t - last)
                    if len(result.itl_s) > 2 * asked + 4:
                        raise StreamError("too long", f"more than {2 * asked + 4} text deltas for {asked} tokens (the stream "
                                                      "is hostile)")
                last = t
    finally:
        result.stream_bytes = streamed
        result.bytes_after_last_chunk = streamed - at_chunk
    if usage is None:
        raise ValueError("no usage chunk with completion_tokens (stream_options.include_usage not honoured?)")
    result.completion_tokens = int(usage["completion_tokens"])
    result.prompt_tokens = accounting.count(usage.get("prompt_tokens"), "usage.prompt_tokens")
    if result.ttft_s is None:
        raise ValueError("stream produced no content or reasoning_content")
    return reusable


def _chunk(payload: bytes) -> Mapping[str, Any]:
    """One parsed chunk; errors (SGLang's streamed ``{"error": ...}`` or an ``object: error``) raise."""
    chunk = accounting.parse_json(payload)
    if not isinstance(chunk, dict):
        raise ValueError(f"stream chunk is not a JSON object: {payload[:80]!r}")
    if "error" in chunk or chunk.get("object") == "error":
        raise StreamError("server error", f"server error in stream: {str(chunk.get('error') or chunk.get('message'))[:300]}")
    return chunk


def _has_text(chunk: Mapping[str, Any]) -> bool:
    """Whether the chunk's first choice's delta carries content or reasoning_content (bench_serving's
    ``_combine_openai_chat_content``); the role chunk's empty content does not count."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    if not isinstance(delta, dict):
        return False
    return any(isinstance(delta.get(k), str) and delta[k] for k in ("content", "reasoning_content"))


def _usage(chunk: Mapping[str, Any], asked: int) -> Mapping[str, Any] | None:
    """The chunk's usage, when it carries a token count (checked: never above what was asked)."""
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return None
    count = accounting.count(usage.get("completion_tokens"), "usage.completion_tokens")
    if count is None:
        raise StreamError("impossible", "usage.completion_tokens is not a count: None")
    if count > asked:
        raise StreamError("impossible", f"usage claims {count} completion tokens, more than the {asked} asked for (max_completion_tokens)")
    return usage


def _spec_details(chunk: Mapping[str, Any], result: RequestResult) -> None:
    """``sglext.spec_tokens_details``: the request's verify count and acceptance histogram (SGLang's
    SpecTokensDetails sends 0 and [] for what it lacks: those read as not sent)."""
    ext = chunk.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, list):  # one per choice (n > 1); a cell sends n = 1
        details = details[0] if details else None
    if not isinstance(details, dict):
        return
    verify = accounting.count(details.get("spec_verify_ct"), "sglext.spec_tokens_details.spec_verify_ct")
    if verify:
        result.spec_verify_ct = verify
    hist = details.get("spec_correct_drafts_histogram")
    if hist:
        try:
            result.accept_histogram = proof.histogram_of({"spec_correct_drafts_histogram": hist}, result.spec_verify_ct)
        except proof.HistogramError as exc:
            raise ValueError(f"invalid response: {exc}") from None
