"""Every request of a cell accounted for, and no number that cannot be true let in.

Why: a service the harness measures can choose which requests are counted by failing the ones it
finds inconvenient in a way the client does not expect (a chunk nested 200,000 deep raised
``RecursionError`` through the load generator's thread, and the cell reported "46 of 48 completed,
0 failed" and was blessed), or can report figures no config can produce (16 tokens per verify at
block size 8, a negative verify count). So a request is completed, failed with a named reason
(:data:`FAILURE_KINDS`), or not sent; a repeat's ``completed + failed == sent`` is checked; and a
number that cannot be true makes its request or its cell invalid where it enters, with the value
and the bound, so nothing of it reaches a baseline.
"""

from __future__ import annotations

import http.client
import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol


class CountedRequest(Protocol):
    """What these checks read of a request (``generate_stream.RequestResult``)."""

    index: int
    ok: bool
    failure: str | None
    completion_tokens: int
    spec_verify_ct: int | None

#: Why a request failed, as the cell's summary counts them.
FAILURE_KINDS = {
    "unparseable": "a chunk or body that is not JSON (or not UTF-8)",
    "too deep": "JSON nested deeper than the parser's recursion limit",
    "too long": "a line or stream over its byte bound",
    "closed": "the connection closed or broke before 'data: [DONE]'",
    "deadline": "the request's (or the cell's) deadline passed",
    "stall": "no new token within the stall deadline (stall_timeout_s)",
    "http": "an HTTP error status",
    "server error": "an error the server sent in the stream",
    "impossible": "a number no config can produce (a count or latency out of its bounds)",
    "invalid": "a response of the wrong shape",
    "client error": "an exception of the client itself (a bug of the harness: report it)",
}


class StreamError(ValueError):
    """A response that ends its request, with the reason's kind (a key of :data:`FAILURE_KINDS`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_json(payload: bytes, what: str = "stream chunk") -> Any:
    """``json.loads`` for bytes from a service: a document nested past the parser's recursion limit
    (which raises ``RecursionError``, not ``ValueError``) or one that is not JSON raises
    :class:`StreamError` saying which."""
    try:
        return json.loads(payload)
    except RecursionError:
        raise StreamError("too deep", f"{what} is JSON nested too deeply to read ({len(payload):,} bytes, starting "
                                      f"{payload[:40]!r}): the service is hostile or broken") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise StreamError("unparseable", f"{what} is not JSON ({str(exc)[:120]}): {payload[:80]!r}") from None


def failure_kind(exc: BaseException, by_deadline: bool) -> str:
    """The :data:`FAILURE_KINDS` key for an exception that ended a request."""
    if by_deadline:
        return "deadline"
    if isinstance(exc, StreamError):
        return exc.kind
    if isinstance(exc, RecursionError):
        return "too deep"
    if isinstance(exc, (OSError, http.client.HTTPException)):
        return "closed"
    if isinstance(exc, ValueError):
        return "invalid"
    return "client error"


def count(value: Any, what: str, *, floor: int = 0) -> int | None:
    """A count the service sent (None: absent); one that is not an integer of at least ``floor``
    cannot be true and raises :class:`StreamError` with the value and the bound."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < floor:
        raise StreamError("impossible", f"{what} is {str(value)[:40]}: not a count of at least {floor}")
    return value


def latency(value: Any, what: str) -> float | None:
    """A latency in seconds the service sent (None: absent); negative or non-finite raises."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise StreamError("impossible", f"{what} is {str(value)[:40]}: not a finite latency of at least 0 s")
    return float(value)


def verify_problem(result: CountedRequest, max_tokens_per_verify: int | None) -> str | None:
    """Why a completed request's tokens per verify cannot be true, or None.

    Each verify yields at least one token (the bonus) and at most ``max_tokens_per_verify`` (the
    config's most accepted drafts + 1: :func:`proof.accept_bound` + 1), and the prefill yields one
    token besides: so ``verify_ct <= completion_tokens <= max * verify_ct + 1``."""
    verify = result.spec_verify_ct
    if not verify:  # not sent (0: SGLang's "no verify"); a speculative cell flags that on its own
        return None
    tokens = result.completion_tokens
    if verify > tokens:
        return (f"request {result.index}: spec_verify_ct {verify} for {tokens} completion tokens is "
                f"{tokens / verify:.2f} tokens per verify, below 1 (every verify yields at least one token)")
    if max_tokens_per_verify is not None and tokens > max_tokens_per_verify * verify + 1:
        return (f"request {result.index}: {tokens} completion tokens in {verify} verifies is {tokens / verify:.2f} tokens "
                f"per verify, above the config's maximum of {max_tokens_per_verify} (min(block_size - 1, steps, budget) + 1): "
                "the service reports a verify count no config can produce")
    return None


def account(requests: Sequence[CountedRequest], sent: int | None) -> list[str]:
    """Why a repeat's requests are not all accounted for: ``completed + failed == sent`` (``sent``
    None: not counted by its loop), and each failed request's reason counted by kind."""
    out: list[str] = []
    failed = [r for r in requests if not r.ok]
    if sent is not None and len(requests) != sent:
        out.append(f"{sent} requests were sent but {len(requests)} have a result ({len(requests) - len(failed)} completed, "
                   f"{len(failed)} failed): {sent - len(requests)} vanished in the client")
    if failed:
        kinds = Counter(r.failure if r.failure in FAILURE_KINDS else "invalid" for r in failed)
        shown = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
        out.append(f"{len(failed)} of {len(requests)} requests failed ({shown})")
    return out
