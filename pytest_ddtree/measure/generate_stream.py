"""One streaming ``/generate``: sent, read and timed as SGLang's bench_serving times it (TTFT, ITL,
end to end), and bounded, because the stream comes from a service the harness does not trust: in
bytes (the limits below) and in time, as a whole (the request's deadline, ``http.RequestWatch``:
SSE comments and keep-alives after the first chunk do not extend it).

:mod:`pytest_ddtree.measure.load` runs many of these in a closed loop and folds them into a cell's metrics.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree import progress
from pytest_ddtree.service import proof
from pytest_ddtree.measure import accounting
from pytest_ddtree.measure.accounting import StreamError
from pytest_ddtree.service.http import Deadline, RequestWatch, ServiceHTTP, Stall
from pytest_ddtree.measure.prompts import Prompt

#: Bounds on what one streamed /generate may send. SGLang's chunks carry the text (and ids) so far,
#: so a stream grows with the square of its length: ~10 bytes per token per chunk, ~5 * n**2 bytes
#: for n tokens (10 MB at 1,024). Past these the stream is hostile or broken, and reading on would
#: cost the harness its memory: one line over STREAM_LINE_LIMIT, or a stream over
#: STREAM_BODY_LIMIT + STREAM_BYTES_PER_TOKEN_SQUARED * n**2 for n = max_new_tokens.
STREAM_LINE_LIMIT = 16 * 1024 * 1024
STREAM_BODY_LIMIT = 256 * 1024 * 1024
STREAM_BYTES_PER_TOKEN_SQUARED = 16
STREAM_TAIL_LIMIT = 64 * 1024



@dataclass
class RequestResult:
    """Timing and accounting of one streamed request (times in seconds)."""

    index: int
    expected_prompt_tokens: int
    expected_output_tokens: int
    prompt_tolerance: float = 0.0  # allowed relative error of the server's count (text prompts)
    sent_prompt_tokens: int | None = None  # tokens sent (None: text, the server counts)
    #: the server's prompt count includes a chat template's tokens (a chat cell): it is checked to be
    #: at least the message's, as the template's own count is the server's to know
    templated: bool = False
    ok: bool = False
    error: str | None = None
    #: why it failed, a key of ``accounting.FAILURE_KINDS`` (None: it did not fail)
    failure: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    spec_verify_ct: int | None = None
    #: verifies by drafts accepted (meta_info.spec_correct_drafts_histogram); None: not sent
    accept_histogram: list[int] | None = None
    start: float = 0.0
    end: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    chunks: int = 0
    #: meta_info.e2e_latency of the finished chunk: the service's own time from receiving the
    #: request to finishing it (SGLang's tokenizer_manager.py), None when absent
    server_e2e_s: float | None = None
    #: bytes of the event stream read, and how many of them came after its last data chunk (SSE
    #: comments, keep-alives): what a deadline's failure says had arrived
    stream_bytes: int = 0
    bytes_after_last_chunk: int = 0

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output tokens - 1), bench_serving's definition."""
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    @property
    def accept_length(self) -> float | None:
        """Accepted tokens per verify step: completion_tokens / spec_verify_ct."""
        if not self.spec_verify_ct:
            return None
        return self.completion_tokens / self.spec_verify_ct

    def problems(self) -> list[str]:
        """Why this request makes its cell invalid (empty: it is fine)."""
        if not self.ok:
            return [f"request {self.index} failed: {self.error}"]
        out: list[str] = []
        if self.templated:
            floor = self.expected_prompt_tokens * (1 - self.prompt_tolerance)
            if self.prompt_tokens is not None and self.prompt_tokens < floor:
                out.append(f"request {self.index}: server counted {self.prompt_tokens} prompt tokens for a chat message "
                           f"of {self.expected_prompt_tokens} tokens and its template (the message was cut?)")
        elif self.prompt_tokens is not None and self.prompt_tolerance > 0:
            if abs(self.prompt_tokens - self.expected_prompt_tokens) > self.prompt_tolerance * self.expected_prompt_tokens:
                out.append(
                    f"request {self.index}: server counted {self.prompt_tokens} prompt tokens for a text prompt "
                    f"aimed at {self.expected_prompt_tokens} (more than ±{self.prompt_tolerance:.0%} off)"
                )
        elif self.prompt_tokens is not None and self.prompt_tokens != self.expected_prompt_tokens:
            out.append(
                f"request {self.index}: server counted {self.prompt_tokens} prompt tokens, "
                f"sent {self.expected_prompt_tokens}"
            )
        if self.completion_tokens != self.expected_output_tokens:
            out.append(
                f"request {self.index}: {self.completion_tokens} output tokens, expected "
                f"{self.expected_output_tokens} (ignore_eos not honoured?)"
            )
        return out


def apply_chunk(result: RequestResult, t: float, completion_tokens: int, last_token_time: float | None) -> float | None:
    """Account one stream chunk arriving at ``t`` whose cumulative token count is given.

    Returns the new "time of the last token". The first token sets TTFT; every later chunk's
    inter-arrival time is spread evenly over the tokens it carries. Extra tokens that arrive
    *with* the first token get no ITL entry (their latency is the TTFT). A chunk without new
    tokens (a keep-alive, a finish notice) changes nothing.
    """
    new = completion_tokens - result.completion_tokens
    if new <= 0:
        return last_token_time
    if result.ttft_s is None:
        result.ttft_s = t - result.start
    elif last_token_time is not None:
        gap = (t - last_token_time) / new
        result.itl_s.extend([gap] * new)
    result.completion_tokens = completion_tokens
    return t


def stream_request(
    service: ServiceHTTP,
    index: int,
    prompt: Prompt,
    output_tokens: int,
    extra_sampling_params: Mapping[str, Any] | None = None,
    conn: http.client.HTTPConnection | None = None,
    tolerance: float = 0.0,
) -> RequestResult:
    """Send one streaming /generate and time it; never raises (errors land in the result).

    ``conn`` is a kept-alive connection to reuse (a closed-loop client keeps one; bench_serving
    0.5.23 does not: it opens a session per request): a fresh connection per request adds a TCP
    connect and an accept to every request's TTFT and, on short requests, percents to
    throughput. Without one, the request opens and closes its own.
    """
    result = RequestResult(index=index, expected_prompt_tokens=prompt.target_tokens, expected_output_tokens=output_tokens,
                           prompt_tolerance=tolerance, sent_prompt_tokens=prompt.sent_tokens)
    sampling: dict[str, Any] = {"max_new_tokens": output_tokens, "temperature": 0.0, "ignore_eos": True}
    if extra_sampling_params:
        sampling.update(extra_sampling_params)
    body = json.dumps({**prompt.payload(), "sampling_params": sampling, "stream": True}).encode()
    asked = sampling["max_new_tokens"] if isinstance(sampling["max_new_tokens"], int) else output_tokens
    body_limit = STREAM_BODY_LIMIT + STREAM_BYTES_PER_TOKEN_SQUARED * asked * asked

    def read(resp: Any, clock: Callable[[], float], stall: StallWatch) -> bool:
        done, last_payload, reusable = _read_events(resp, result, asked, body_limit, clock, stall)
        if not done:
            result.end = clock()
            raise StreamError("closed", "stream ended without 'data: [DONE]'")
        _read_final_meta(result, last_payload)
        return reusable  # more than a terminator after [DONE]: not a connection to reuse

    return send_stream(service, conn, "/generate", body, result, read)


def guarded(send: Callable[..., RequestResult], service: ServiceHTTP, index: int, prompt: Prompt, output_tokens: int,
            *args: Any) -> RequestResult:
    """``send(service, index, prompt, output_tokens, *args)``, whose exception (a bug: senders never raise)
    becomes the request's failure: a request sent is accounted for, whatever the client did."""
    try:
        return send(service, index, prompt, output_tokens, *args)
    except Exception as exc:  # noqa: BLE001
        return RequestResult(index=index, expected_prompt_tokens=prompt.target_tokens, expected_output_tokens=output_tokens,
                             error=f"{type(exc).__name__}: {exc}", failure=accounting.failure_kind(exc, False))


class StallWatch:
    """A stream's stall deadline (``service.stall``): no new token for ``between_s``, or before the
    first token for ``first_token_s``, ends it, however many SSE comments or keep-alives arrive
    meanwhile (the reader checks at each line); a silence that long ends the socket's wait (its
    timeout), so a stream that sends nothing at all stalls just the same."""

    def __init__(self, stall: Stall, sock: socket.socket | None, start: float) -> None:
        self.stall, self.sock, self.last, self.tokens = stall, sock, start, False
        self.limit_s = stall.first_token_s
        self._wait(stall.first_token_s)

    def _wait(self, seconds: float) -> None:
        if self.sock is not None:  # the request's own deadline stays with its watchdog
            current = self.sock.gettimeout()
            self.sock.settimeout(seconds if current is None else min(current, seconds))

    def token(self, t: float) -> None:
        """A new token arrived at ``t``."""
        self.last = t
        if not self.tokens:
            self.tokens, self.limit_s = True, self.stall.between_s
            self._wait(self.stall.between_s)

    def expired(self, t: float) -> bool:
        return t - self.last >= self.limit_s * 0.99  # a socket timeout wakes a hair early

    def error(self, t: float, result: RequestResult, after: int | None = None) -> StreamError:
        """The evidence: how long without which token, what had arrived, which key to raise."""
        key = "stall_timeout_s" if self.tokens else "first_token_timeout_s"
        after = result.bytes_after_last_chunk if after is None else after
        return StreamError("stall", f"stalled: no {'new' if self.tokens else 'first'} token for {t - self.last:.1f} s "
                                    f"({key} {self.limit_s:g} s); {result.completion_tokens} tokens had arrived, then "
                                    f"{after:,} bytes of SSE comments or keep-alives and no token; the cell stops at its "
                                    f"first stalled request (raise {key} in the profile if the service is only slow)")


def send_stream(service: ServiceHTTP, conn: http.client.HTTPConnection | None, path: str, body: bytes,
                result: RequestResult, read: Callable[[Any, Callable[[], float], StallWatch], bool]) -> RequestResult:
    """POST one streamed request under its whole-request deadline and its stall deadline, and time
    it into ``result``; never raises. ``read(resp, clock, stall)`` reads the 200 response's stream
    (raising ValueError on a hostile, broken, stalled or incomplete one) and says whether the
    connection may be reused. One place for what every streamed endpoint shares: the deadlines'
    watches, the error words, which connections are closed, the progress count."""
    own_conn = conn is None
    conn = service.connect() if conn is None else conn
    watch = RequestWatch(service.deadline())
    clock = time.perf_counter
    result.start = clock()
    stall: StallWatch | None = None
    try:
        watch.begin(conn)
        stall = StallWatch(service.stall, conn.sock, result.start)
        conn.request("POST", service.path(path), body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read(300).decode("utf-8", "replace").strip()
            result.end = clock()
            result.error, result.failure = f"HTTP {resp.status}: {detail}", "http"
            return result
        if not read(resp, clock, stall):
            own_conn = True
        result.ok = True
    except Exception as exc:  # noqa: BLE001 - whatever ends a request is its failure, never a lost request
        if not result.end:
            result.end = clock()
        by_deadline = watch.failed_by_deadline()
        if not by_deadline and isinstance(exc, TimeoutError) and stall is not None and stall.expired(clock()):
            exc = stall.error(clock(), result)  # a silence past the stall deadline
        result.failure = accounting.failure_kind(exc, by_deadline)
        result.error = deadline_error(watch.deadline, result) if by_deadline else f"{type(exc).__name__}: {exc}"
        own_conn = True  # a broken connection is never reused
    finally:
        if watch.end():  # cut after its last event: its socket is shut down
            own_conn = True
        if own_conn:
            conn.close()
        progress.request_done(result.completion_tokens if result.ok else 0)  # the wait's "requests done"
    return result


def deadline_error(deadline: Deadline, result: RequestResult) -> str:
    """Why a stream failed when its deadline passed: which deadline, what had arrived, what to raise."""
    if not result.stream_bytes:
        arrived = "nothing of the stream had arrived"
    else:
        arrived = (f"{result.stream_bytes:,} bytes of the stream had arrived ({result.chunks} chunks, {result.completion_tokens} "
                   f"tokens), {result.bytes_after_last_chunk:,} of them after the last chunk and no data "
                   "(SSE comments or keep-alives)")
    return f"DeadlineExceeded: {deadline.describe()} passed; {arrived}; {deadline.advice()}"


def _read_events(resp: http.client.HTTPResponse, result: RequestResult, asked: int, body_limit: int,
                 clock: Callable[[], float], stall: StallWatch) -> tuple[bool, bytes, bool]:
    """Read the event stream up to ``data: [DONE]``, timing each chunk into ``result``; a hostile
    or broken stream raises ValueError. Returns whether [DONE] came, the last chunk's payload,
    and whether the connection may be reused. The bytes read and the last line are left on
    ``result`` however it ends (once, not per line: the loop is the client's cost per token)."""
    last: float | None = None
    last_payload = b"{}"
    streamed = at_chunk = 0
    try:
        while True:
            line = resp.readline(STREAM_LINE_LIMIT + 1)
            t = clock()
            if not line:
                return False, last_payload, True
            streamed += len(line)
            if t - stall.last > stall.limit_s:
                raise stall.error(t, result, streamed - at_chunk)
            if len(line) > STREAM_LINE_LIMIT or streamed > body_limit:
                raise StreamError("too long", f"stream line over {STREAM_LINE_LIMIT:,} bytes or stream over {body_limit:,} "
                                              f"bytes for {asked} tokens: not read on (the stream is hostile or broken)")
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                result.end = t
                # the chunked stream's terminator; more than that after [DONE]: not a connection to reuse
                return True, last_payload, len(resp.read(STREAM_TAIL_LIMIT)) < STREAM_TAIL_LIMIT
            count = _fast_completion_tokens(payload)
            if count is None:  # unusual chunk (error, no meta_info): parse it fully
                count = _chunk_meta(payload).get("completion_tokens")
                if not isinstance(count, int):
                    raise ValueError("stream chunk without meta_info.completion_tokens (chunks are not tokens)")
            if count > asked:  # a server never exceeds max_new_tokens; a hostile count would size the ITL list
                raise StreamError("impossible", f"stream chunk claims {count} tokens, more than the {asked} asked for "
                                                "(max_new_tokens)")
            last_payload, at_chunk = payload, streamed
            result.chunks += 1
            if count > result.completion_tokens:
                stall.token(t)
            last = apply_chunk(result, t, count, last)
    finally:
        result.stream_bytes = streamed
        result.bytes_after_last_chunk = streamed - at_chunk


def _read_final_meta(result: RequestResult, last_payload: bytes) -> None:
    """The last chunk's meta_info: its token count must be the stream's, then the prompt tokens,
    verify count, server latency and acceptance histogram."""
    meta = _chunk_meta(last_payload)
    if meta.get("completion_tokens") != result.completion_tokens:
        raise ValueError(f"last chunk says {meta.get('completion_tokens')} tokens, the stream counted "
                         f"{result.completion_tokens}")
    result.prompt_tokens = accounting.count(meta.get("prompt_tokens"), "meta_info.prompt_tokens")
    result.spec_verify_ct = accounting.count(meta.get("spec_verify_ct"), "meta_info.spec_verify_ct")
    result.server_e2e_s = accounting.latency(meta.get("e2e_latency"), "meta_info.e2e_latency")
    try:
        result.accept_histogram = proof.histogram_of(meta, result.spec_verify_ct)
    except proof.HistogramError as exc:
        raise ValueError(f"invalid response: {exc}") from None
    if result.ttft_s is None:
        raise ValueError("stream produced no tokens")


_CT_KEY = b'"completion_tokens":'


def _fast_completion_tokens(payload: bytes) -> int | None:
    """``meta_info.completion_tokens`` of a chunk without parsing it.

    SGLang streams the *cumulative* text (and output ids) in every chunk, so parsing each
    chunk is quadratic in the output length and dominates the client's CPU. The key is
    found from the end (meta_info comes last); inside the generated text a quote would be
    escaped (``\\"completion_tokens\\":``), so the unescaped pattern only matches the key.
    The last chunk is always parsed fully and must agree (see :func:`stream_request`).
    """
    i = payload.rfind(_CT_KEY)
    if i < 0 or payload.lstrip().startswith(b'{"error"'):
        return None
    j = i + len(_CT_KEY)
    n = len(payload)
    while j < n and payload[j] in b" \t":
        j += 1
    k = j
    while k < n and 48 <= payload[k] <= 57 and k - j <= 18:
        k += 1
    return int(payload[j:k]) if 0 < k - j <= 18 else None


def _chunk_meta(payload: bytes) -> Mapping[str, Any]:
    """Fully parse one chunk; raise ValueError for errors and non-objects."""
    chunk = accounting.parse_json(payload)
    if not isinstance(chunk, dict):
        raise ValueError(f"stream chunk is not a JSON object: {payload[:80]!r}")
    if "error" in chunk:
        raise StreamError("server error", f"server error in stream: {str(chunk['error'])[:300]}")
    meta = chunk.get("meta_info") or {}
    return meta if isinstance(meta, dict) else {}

