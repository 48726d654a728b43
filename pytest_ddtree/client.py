"""A small HTTP client for the part of SGLang's API the harness uses.

It speaks the same shapes to real SGLang and to the embedded reference engine, and follows the
renames SGLang has made (``/server_info`` was ``/get_server_info``, ``/model_info`` was
``/get_model_info``). It is deliberately thin: the harness must see what the server really said
(status codes, meta_info), so nothing here retries or "fixes" a response; callers decide.
Streaming measurement lives in ``load.py`` on bare ``http.client`` connections, because the
client's own CPU cost per chunk matters there.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import requests


class ServiceHTTPError(RuntimeError):
    """The service answered with an error status; the message carries status and body."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {url} -> HTTP {status}: {body[:500]}")


class SGLangClient:
    """Requests-based client; one ``requests.Session`` per client (connection reuse)."""

    def __init__(self, base_url: str, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # never route loopback traffic through a proxy from the env

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r})"

    def close(self) -> None:
        self.session.close()

    # -- plumbing --------------------------------------------------------------------------
    def _url(self, path: str) -> str:
        return self.base_url + (path if path.startswith("/") else "/" + path)

    def _check(self, method: str, response: requests.Response) -> requests.Response:
        if response.status_code >= 400:
            raise ServiceHTTPError(method, response.url, response.status_code, response.text)
        return response

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        response = self.session.get(self._url(path), timeout=timeout or self.timeout)
        return self._check("GET", response).json()

    def post_json(self, path: str, payload: Mapping[str, Any], timeout: float | None = None) -> Any:
        response = self.session.post(self._url(path), json=payload, timeout=timeout or self.timeout)
        return self._check("POST", response).json()

    def _get_with_fallback(self, paths: Sequence[str], timeout: float | None) -> Any:
        last: ServiceHTTPError | None = None
        for path in paths:
            try:
                return self.get_json(path, timeout=timeout)
            except ServiceHTTPError as exc:
                if exc.status != 404:
                    raise
                last = exc
        assert last is not None
        raise last

    # -- endpoints -------------------------------------------------------------------------
    def health(self, path: str = "/health_generate", timeout: float = 30.0) -> int:
        """The status code of the health path; connection errors propagate (refused = not up yet)."""
        return self.session.get(self._url(path), timeout=timeout).status_code

    def server_info(self, timeout: float | None = 30.0) -> dict[str, Any]:
        info = self._get_with_fallback(["/server_info", "/get_server_info"], timeout)
        if not isinstance(info, dict):
            raise ServiceHTTPError("GET", self._url("/server_info"), 200, f"expected a JSON object, got {info!r}")
        return info

    def model_info(self, timeout: float | None = 30.0) -> dict[str, Any]:
        info = self._get_with_fallback(["/model_info", "/get_model_info"], timeout)
        return info if isinstance(info, dict) else {}

    def flush_cache(self, timeout: float = 30.0) -> bool:
        """True when flushed; False when the server refused because requests are running (400)."""
        response = self.session.post(self._url("/flush_cache"), timeout=timeout)
        if response.status_code == 400:
            return False
        self._check("POST", response)
        return True

    def metrics(self, timeout: float = 30.0) -> str:
        response = self.session.get(self._url("/metrics"), timeout=timeout)
        return self._check("GET", response).text

    def generate(
        self,
        text: str | None = None,
        input_ids: Sequence[int] | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Non-streaming ``/generate``; returns ``{text, output_ids, meta_info}``."""
        payload = self._generate_payload(text, input_ids, sampling_params, extra=extra)
        result = self.post_json("/generate", payload, timeout=timeout)
        if isinstance(result, list):  # batch form; we only ever send one prompt
            result = result[0]
        if not isinstance(result, dict):
            raise ServiceHTTPError("POST", self._url("/generate"), 200, f"expected a JSON object, got {result!r}")
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
        result = self.post_json("/v1/chat/completions", payload, timeout=timeout)
        if not isinstance(result, dict):
            raise ServiceHTTPError("POST", self._url("/v1/chat/completions"), 200, f"expected a JSON object, got {result!r}")
        return result

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _generate_payload(
        text: str | None,
        input_ids: Sequence[int] | None,
        sampling_params: Mapping[str, Any] | None,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        if (text is None) == (input_ids is None):
            raise ValueError("pass exactly one of text= or input_ids=")
        payload: dict[str, Any] = {"sampling_params": dict(sampling_params or {}), "stream": False, **extra}
        if text is not None:
            payload["text"] = text
        else:
            payload["input_ids"] = list(input_ids or [])
        return payload
