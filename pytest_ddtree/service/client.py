"""SGLang's API as the harness uses it, on the one HTTP layer (``pytest_ddtree.service.http``).

It speaks the same shapes to real SGLang and to the embedded reference engine; the endpoint
renames SGLang made (``/server_info`` was ``/get_server_info``, ...) are resolved in
``http.FALLBACKS``. It is deliberately thin: the harness must see what the server really said
(status codes, meta_info), so nothing here retries or "fixes" a response; callers decide.
One client per running service: the service manager closes it when it stops the service.
The load generator streams on connections from the same :class:`~pytest_ddtree.service.http.ServiceHTTP`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pytest_ddtree.service.http import (REQUEST_TIMEOUT_S, DeadlineExceeded, InvalidResponse, Limit, ServiceHTTP, ServiceHTTPError,
                                ServiceUnreachable)

__all__ = ["INFO_TIMEOUT_S", "RESPONSE_BODY_LIMIT", "DeadlineExceeded", "InvalidResponse", "SGLangClient", "ServiceHTTPError",
           "ServiceUnreachable"]

#: The whole-request deadline of a control call (``/server_info``, ``/model_info``, ``/metrics``,
#: ``/flush_cache``, health) unless the profile's ``info_timeout_s`` says otherwise: SGLang's own
#: test launcher gives its control calls ``aiohttp.ClientTimeout(total=30)``
#: (sglang 0.5.23 sglang/test/test_utils.py:1147).
INFO_TIMEOUT_S = 30.0

#: Largest generation body read (``/generate``, chat completions): an answer of
#: ``max_tokens`` tokens is a few KB; the coding gate refuses answers over 1,000,000
#: characters, which JSON escapes can inflate.  A longer body is an InvalidResponse.
RESPONSE_BODY_LIMIT = 16 * 1024 * 1024


class SGLangClient:
    """One service's client; its connections close with :meth:`close` (or ``with``)."""

    def __init__(self, base_url: str, timeout: float = REQUEST_TIMEOUT_S, info_timeout: float = INFO_TIMEOUT_S) -> None:
        """``timeout``: each generation request's deadline as a whole (``/generate``, chat,
        ``/tokenize``, a stream to its last event; the profile's ``request_timeout_s``);
        ``info_timeout``: each control call's (the profile's ``info_timeout_s``)."""
        self.http = ServiceHTTP(base_url, timeout=Limit(timeout, "request_timeout_s"))
        self.base_url = self.http.base_url
        self.timeout = timeout
        self.info_limit = Limit(info_timeout, "info_timeout_s")

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r})"

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    @property
    def closed(self) -> bool:
        return self.http.closed

    # -- endpoints -------------------------------------------------------------------------
    def _info(self, timeout: float | Limit | None) -> float | Limit:
        return self.info_limit if timeout is None else timeout

    def health(self, path: str = "/health_generate", timeout: float | Limit | None = None) -> int:
        """The status code of the health path; ServiceUnreachable when nothing answers
        (refused = not up yet)."""
        return self.http.request("GET", path, timeout=self._info(timeout)).status

    def server_info(self, timeout: float | Limit | None = None) -> dict[str, object]:
        return self.http.get_object("/server_info", self._info(timeout))

    def model_info(self, timeout: float | Limit | None = None) -> dict[str, Any]:
        return self.http.get_object("/model_info", self._info(timeout))

    def flush_cache(self, timeout: float | Limit | None = None) -> bool:
        """True when flushed; False when the server refused because requests are running (400)."""
        response = self.http.request("POST", "/flush_cache", timeout=self._info(timeout))
        if response.status == 400:
            return False
        response.raise_for_status()
        return True

    def metrics(self, timeout: float | Limit | None = None) -> str:
        return self.http.request("GET", "/metrics", timeout=self._info(timeout)).raise_for_status().text

    def tokenize(self, prompts: Sequence[str], add_special_tokens: bool = False, timeout: float | None = None) -> list[list[int]]:
        """Token ids of each prompt, by the served model's own tokenizer (``POST /tokenize``).

        Shapes follow SGLang's ``http_server.py`` (``TokenizeReqInput``): a list of prompts
        answers ``{"tokens": [[...], ...], "count": [...], "max_model_len"}``. Raises
        ServiceHTTPError with status 404 when the service has no tokenizer endpoint.
        """
        answer = self.http.post_json(
            "/tokenize", {"prompt": list(prompts), "add_special_tokens": add_special_tokens}, timeout)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if (not isinstance(tokens, list) or len(tokens) != len(prompts)
                or not all(isinstance(t, list) and all(isinstance(i, int) for i in t) for t in tokens)):
            raise ServiceHTTPError("POST", self.http.url("/tokenize"), 200,
                                   f"expected {{'tokens': [[ids], ...]}} for {len(prompts)} prompts, got {str(answer)[:200]}")
        return tokens

    def detokenize(self, tokens: Sequence[int], timeout: float | None = None) -> str:
        answer = self.http.post_json("/detokenize", {"tokens": list(tokens)}, timeout)
        text = answer.get("text") if isinstance(answer, dict) else None
        if not isinstance(text, str):
            raise ServiceHTTPError("POST", self.http.url("/detokenize"), 200, f"expected {{'text': str}}, got {str(answer)[:200]}")
        return text

    def generate(
        self,
        text: str | None = None,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Non-streaming ``/generate``; returns ``{text, output_ids, meta_info}``."""
        if (text is None) == (input_ids is None):
            raise ValueError("pass exactly one of text= or input_ids=")
        payload: dict[str, Any] = {"sampling_params": dict(sampling_params or {}), "stream": False, **extra}
        if text is not None:
            payload["text"] = text
        else:
            payload["input_ids"] = list(input_ids or [])
        result = self.http.post_json("/generate", payload, timeout, max_bytes=RESPONSE_BODY_LIMIT)
        if isinstance(result, list):  # batch form; we only ever send one prompt
            result = result[0] if result else None
        if not isinstance(result, dict):
            raise ServiceHTTPError("POST", self.http.url("/generate"), 200, f"expected a JSON object, got {str(result)[:200]}")
        return result

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        max_tokens: int = 1024,
        temperature: float = 0.0,
        return_meta_info: bool = True,
        model: str = "default",
        timeout: float | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Non-streaming OpenAI chat completion (SGLang adds ``meta_info`` with ``return_meta_info``)."""
        payload: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": False,
            **extra,
        }
        if return_meta_info:
            payload["return_meta_info"] = True
        result = self.http.post_json("/v1/chat/completions", payload, timeout, max_bytes=RESPONSE_BODY_LIMIT)
        if not isinstance(result, dict):
            raise InvalidResponse("POST", self.http.url("/v1/chat/completions"), 200, f"the body is a JSON {type(result).__name__}, not an object")
        return result
