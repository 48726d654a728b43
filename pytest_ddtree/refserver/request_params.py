"""Request parsing shared by the endpoints: SGLang's sampling params and field checks (a malformed field is a 400, never a crash)."""

from __future__ import annotations

from typing import Any

from .engine import SamplingParams


class BadRequest(Exception):
    """Raised by request parsing; becomes an HTTP 400 with the message."""




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
        stop=stop_list(sp.get("stop")),
        stop_token_ids=int_list(sp.get("stop_token_ids"), "stop_token_ids"),
        ignore_eos=bool_field(sp, "ignore_eos"),
        seed=int(seed or 0),
    )


def finish_reason_openai(fr: dict[str, Any] | None) -> str | None:
    if fr is None:
        return None
    return "length" if fr.get("type") == "length" else str(fr.get("type"))
