"""Request parsing shared by the endpoints: SGLang's sampling params and field checks (a malformed field is a 400, never a crash)."""

from __future__ import annotations

import json
from typing import Any

from pytest_ddtree.refserver.request_state import SamplingParams


class BadRequest(Exception):
    """Raised by request parsing; becomes an HTTP 400 with the message, in the body shape of the
    SGLang handler the endpoint follows (server.py ``Handler.send_bad_request``): the OpenAI
    endpoints' ``ErrorResponse``; on SGLang's own endpoints (``/generate``, ``/tokenize``, ...) a
    body that is not a JSON object is FastAPI's validation error, the same ``ErrorResponse``
    (sglang 0.5.23 sglang/srt/entrypoints/http_server.py:634-691)."""


class ContractError(BadRequest):
    """A ``/generate`` body the JSON contract refuses (an unknown sampling field, a wrong type):
    400 ``{"error": "<the contract's text>"}``, streamed or not (sglang 0.5.23
    sglang/srt/entrypoints/http_server.py:937-939, sglang/srt/entrypoints/api_contract.py:12-18)."""


class InvalidRequest(BadRequest):
    """A ValueError of SGLang's tokenizer manager (sampling params out of range, a prompt over the
    context): 400 ``{"error": {"message": ...}}`` (sglang 0.5.23 sglang/srt/entrypoints/
    http_server.py:988-990, 2246-2250); in a stream a ``data: {"error": {...}}`` event, then
    ``data: [DONE]``, with status 200 (http_server.py:957-975)."""


#: The sampling fields /generate's contract knows (sglang 0.5.23 sglang/api/v1/api_types.py:1256, :108, the
#: generated decoder; its "unknown field" text lists them in this order).
CONTRACT_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)


def check_sampling_contract(sp: Any) -> None:
    """``/generate``'s sampling params against the JSON contract: unknown fields and integer
    fields given as something else are ContractErrors, with the decoder's own words."""
    if sp is None:
        return
    if not isinstance(sp, dict):
        raise ContractError(f"invalid type: {_json_kind(sp)}, expected struct SamplingParams")
    for key in sp:
        if key not in CONTRACT_SAMPLING_FIELDS:
            listed = ", ".join(f"`{name}`" for name in CONTRACT_SAMPLING_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
    for key in ("max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed"):
        value = sp.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ContractError(f"invalid type: {_json_kind(value)}, expected i64")
    for key in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
        value = sp.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ContractError(f"invalid type: {_json_kind(value)}, expected f32")


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)[:60]}"
    return "sequence" if isinstance(value, list) else "map"


def verify_sampling(sp: dict[str, Any]) -> None:
    """sglang 0.5.23 sglang/srt/sampling/sampling_params.py:252-295 ``SamplingParams.verify``, for
    the fields the engine reads or SGLang range-checks: InvalidRequest with SGLang's message."""
    def number(key: str, default: float) -> float:
        value = sp.get(key)
        return default if value is None else value

    temperature = number("temperature", 1.0)
    if not (temperature >= 0 and temperature != float("inf")):
        raise InvalidRequest(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = number("top_p", 1.0)
    if not 0 < top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {top_p}.")
    min_p = number("min_p", 0.0)
    if not 0 <= min_p <= 1:
        raise InvalidRequest(f"min_p must be in [0, 1], got {min_p}.")
    top_k = number("top_k", -1)
    if top_k < 1 and top_k != -1:
        raise InvalidRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    max_new_tokens = sp.get("max_new_tokens")
    if max_new_tokens is not None and max_new_tokens < 0:
        raise InvalidRequest(f"max_new_tokens must be at least 0, got {max_new_tokens}.")



def number_field(obj: dict[str, Any], key: str, default: float, kind: type = float, lo: float | None = None) -> Any:
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


def stop_list(v: Any, key: str = "stop") -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return [s for s in v if s]
    raise BadRequest(f"{key} must be a string or a list of strings")


def int_list(v: Any, key: str) -> list[int]:
    if v is None:
        return []
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    raise BadRequest(f"{key} must be a list of integers")


def bool_field(obj: dict[str, Any], key: str, default: bool = False) -> bool:
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
        max_new_tokens=number_field(sp, max_key, default_max, int, 0),
        temperature=number_field(sp, "temperature", 1.0, float, 0.0),
        top_p=_top_p(sp),
        stop=stop_list(sp.get("stop")),
        stop_token_ids=int_list(sp.get("stop_token_ids"), "stop_token_ids"),
        ignore_eos=bool_field(sp, "ignore_eos"),
        seed=int(seed or 0),
    )


def _top_p(sp: dict[str, Any]) -> float:
    """SGLang's top_p: 1.0 by default, within (0, 1] (sampling_params.py verify: 'top_p must be in (0, 1]')."""
    value = float(number_field(sp, "top_p", 1.0, float, 0.0))
    if not 0.0 < value <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {value}.")
    return value


def finish_reason_openai(fr: dict[str, Any] | None) -> str | None:
    if fr is None:
        return None
    return "length" if fr.get("type") == "length" else str(fr.get("type"))
