"""What /server_info says about speculation, read over every scheduler it lists.

Why a module of its own: with decode data parallelism /server_info's ``internal_states`` holds one
entry per dp rank, and the first (bench_serving's read, ``internal_states[0]``) may have served none
of a cell's requests (sglang PR 34743). Every reader of those states goes through here.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypeGuard
from pytest_ddtree.metrics import ACCEPT_LENGTH


def server_accept_length(server_info: Mapping[str, object]) -> float | None:
    """The server's ``avg_spec_accept_length`` over every scheduler in ``internal_states`` (or a
    top-level key of that name).

    Why not ``internal_states[0]`` (bench_serving's read): with decode data parallelism each dp
    rank's scheduler is one entry, the first may have served none of the requests and shows null
    (sglang PR 34743: ``[null, null, 2.90, 3.67, null, 4.64, ...]``). The ranks that report a number
    are combined by :func:`merge_internal_states`.
    """
    states = server_info.get("internal_states")
    if isinstance(states, list) and states:
        value = merge_internal_states(states).get("avg_spec_accept_length")
        if _is_figure(value):
            return float(value)
    value = server_info.get("avg_spec_accept_length")
    if _is_figure(value):
        return float(value)
    return None


def _is_figure(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def merge_internal_states(states: Sequence[object]) -> dict[str, Any]:
    """One state for every scheduler of /server_info's ``internal_states`` (one per dp rank).

    A single entry is returned as it is. With several, a counter is summed over the ranks (requests,
    tokens, busy seconds: the service's total), while a key that is already an average or a ratio
    (``avg_*``, ``*accept_length*``, ``*_rate``, ``*ratio*``) is the mean over the ranks that report a
    number: a rank that served nothing shows null and is left out, as sglang PR 34743 leaves it
    out (it weights by each request's verify count; /server_info has no per-rank count, so this is
    the unweighted mean, and the gated tokens-per-verify comes from the requests themselves).
    Any other key keeps the first rank's value.
    """
    dicts = [s for s in states if isinstance(s, dict)]
    if len(dicts) <= 1:
        return dict(dicts[0]) if dicts else {}
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for d in dicts for k in d):
        numbers = [float(d[key]) for d in dicts if _is_figure(d.get(key))]
        if not numbers:
            out[key] = next((d[key] for d in dicts if d.get(key) is not None), None)
        elif key.startswith("avg_") or ACCEPT_LENGTH in key or key.endswith("_rate") or "ratio" in key:
            out[key] = sum(numbers) / len(numbers)
        else:
            total = sum(numbers)
            out[key] = int(total) if all(isinstance(d.get(key), int) for d in dicts if _is_figure(d.get(key))) else total
    out["dp_ranks"] = len(dicts)
    return out
