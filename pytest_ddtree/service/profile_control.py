"""A profile's ``control`` keys and its noise bounds (``max_repeat_spread``, ``bless_max_half_width``):
how the throughput gate's control is launched, how often, over which cells, and how far a cell's
repeats may spread.

Why apart from :mod:`pytest_ddtree.service.profile`: these keys are the gate's budget of GPU time
and noise (docs/gpu-box.md, "Choosing what the control costs"), checked against each other and
against whether the service can be relaunched at all; their defaults are
:class:`~pytest_ddtree.service.validated_profile.ServiceProfile`'s (``DEFAULT_*`` there).
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

from pytest_ddtree.configs import ConfigError, parse_config_name
from pytest_ddtree.service.profile_keys import Fail
from pytest_ddtree.service.validated_profile import (
    DEFAULT_BLESS_CONTROL_LAUNCHES,
    DEFAULT_BLESS_MAX_HALF_WIDTH,
    DEFAULT_CONTROL_CELLS,
    DEFAULT_CONTROL_LAUNCHES,
    DEFAULT_CONTROL_MAX_LAUNCHES,
    DEFAULT_CONTROL_MIN_CONFIGS,
    DEFAULT_MAX_REPEAT_SPREAD,
)

#: The most launches of the control a profile may ask for per process (each one is a restart).
MAX_CONTROL_LAUNCHES = 16


class NoiseBounds(TypedDict):
    max_repeat_spread: float
    bless_max_half_width: float


def noise_bounds(raw: Mapping[str, Any], fail: Fail) -> NoiseBounds:
    """``max_repeat_spread`` and ``bless_max_half_width`` of a profile's flat keys, checked."""
    spread = raw.get("max_repeat_spread", DEFAULT_MAX_REPEAT_SPREAD)
    if not 0 < spread <= 10:
        raise fail("max_repeat_spread", f"must be a fraction above 0 (0.12 is 12%), got {spread}")
    half_width = raw.get("bless_max_half_width", DEFAULT_BLESS_MAX_HALF_WIDTH)
    if not 0 < half_width <= 10:
        raise fail("bless_max_half_width", f"must be a fraction above 0 (0.05 is +-5%), got {half_width}")
    return {"max_repeat_spread": float(spread), "bless_max_half_width": float(half_width)}


class ControlKeys(TypedDict):
    """The profile's keys of the throughput control (``ServiceProfile``'s fields of the same names)."""

    control: str | None
    control_launches: int
    control_max_launches: int
    bless_control_launches: int
    control_min_configs: int
    control_cells: int | None


def parse_control(raw: Mapping[str, Any], relaunchable: bool, fail: Fail) -> ControlKeys:
    """The control keys of a profile's flat keys, checked; ``relaunchable``: the service can be
    relaunched (not an external service, nor a pool of URLs), else the control is launched once."""
    control = raw.get("control")
    if control is not None and control != "none":
        try:
            parse_config_name(control)
        except ConfigError as exc:
            raise fail("control", f"must be 'none' or a config name to measure as the session's control ({exc})") from None
    # With control: none the control's launch keys are unused (still checked for their range): a
    # profile copied from reference.yaml, which sets them, needs only control: none.
    relaunchable = relaunchable or control == "none"
    launches = _parse_control_launches(raw, relaunchable, fail)
    max_launches, bless_launches = _parse_more_launches(raw, launches, relaunchable, fail)
    least, cells = raw.get("control_min_configs", DEFAULT_CONTROL_MIN_CONFIGS), raw.get("control_cells", DEFAULT_CONTROL_CELLS)
    if not 1 <= least:
        raise fail("control_min_configs", f"must be a whole number >= 1 (1: every process measures a control), got {least}")
    if cells is not None and not 3 <= cells:
        raise fail("control_cells", f"must be a whole number >= 3 (a uniform shift needs three judged cells) or null "
                                    f"(every cell), got {cells}")
    return ControlKeys(control=control, control_launches=launches, control_max_launches=max_launches,
                       bless_control_launches=bless_launches, control_min_configs=int(least),
                       control_cells=None if cells is None else int(cells))


def _parse_control_launches(raw: Mapping[str, Any], relaunchable: bool, fail: Fail) -> int:
    """``control_launches``: how many launches of the control each process measures (half at its
    start, half at its end; gates/throughput/control.py), each one more restart of the service."""
    if "control_launches" not in raw:
        return DEFAULT_CONTROL_LAUNCHES
    n = raw["control_launches"]
    if not 1 <= n <= MAX_CONTROL_LAUNCHES:
        raise fail("control_launches", f"must be a whole number from 1 to {MAX_CONTROL_LAUNCHES} (launches of the "
                                       f"control per process, half at its start and half at its end), got {n}")
    if n > 1 and not relaunchable:
        raise fail("control_launches", "an external service or a pool of URLs cannot be relaunched, so its control "
                                       "cannot be launched more than once: leave control_launches out")
    return int(n)


def _parse_more_launches(raw: Mapping[str, Any], launches: int, relaunchable: bool, fail: Fail) -> tuple[int, int]:
    """``control_max_launches`` (the launch policy's cap in a judged process, at least
    ``control_launches``) and ``bless_control_launches``; a service that cannot be relaunched keeps
    its one launch of the control for both."""
    out = []
    for key, default, least in (("control_max_launches", max(launches, DEFAULT_CONTROL_MAX_LAUNCHES), launches),
                                ("bless_control_launches", DEFAULT_BLESS_CONTROL_LAUNCHES, 1)):
        if key not in raw:
            out.append(default if relaunchable else launches if key == "control_max_launches" else 1)
            continue
        n = raw[key]
        if not least <= n <= MAX_CONTROL_LAUNCHES:
            raise fail(key, f"must be a whole number from {least} to {MAX_CONTROL_LAUNCHES}"
                            f"{' (control_launches is ' + str(launches) + ')' if key == 'control_max_launches' else ''}, got {n}")
        if n > (launches if key == "control_max_launches" else 1) and not relaunchable:
            raise fail(key, "an external service or a pool of URLs cannot be relaunched, so its control cannot be "
                            f"launched more than once: leave {key} out")
        out.append(int(n))
    return out[0], out[1]
