"""The ``external`` controller: a service somebody else runs; we never restart it.

Used for shared deployments and for pools given as URLs. ``start`` only proves the URL answers;
whether the running config is the asked one is decided by the manager from /server_info, and a
different config means the tests of that config are *skipped* with the reason (we were not
allowed to change it), not failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from pytest_ddtree.service.plain import plain_profile_fields
from pytest_ddtree.service.base import (
    Capabilities,
    ExitInfo,
    GpuWait,
    Launch,
    LaunchFrom,
    ServiceStartError,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind

if TYPE_CHECKING:
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.service.validated_profile import ServiceProfile

HEALTH_TIMEOUT_S = 5.0
#: The window a config name without a ``_w`` suffix means in the shipped profiles (suites/services/*.yaml).
SHIPPED_DEFAULT_WINDOW = 2048
"""Each reachability poll's deadline (the manager's READY_HEALTH_TIMEOUT_S, SGLang's own 5 s)."""


class _Health(Protocol):
    def health(self, path: str) -> int: ...


class ExternalController(Controller):
    """Checks reachability only; stop/restore are no-ops by design."""

    kind = "external"

    def __init__(self, client: _Health, health_path: str) -> None:
        self.client = client
        self.health_path = health_path
        self._launch: Launch | None = None

    def start(self, launch: Launch) -> None:
        self._launch = launch
        try:
            status = self.client.health(self.health_path)
        except OSError as exc:  # ServiceUnreachable
            raise ServiceStartError(
                f"external service at {launch.url} does not answer {self.health_path}: {type(exc).__name__}: {exc}",
                log_tail="<external service: no log available>",
                config_name=launch.name,
                hint="start the service (the harness never starts an external one) or fix 'url'/'pool' in the profile",
            ) from None
        if status >= 500 and status != 503:
            raise ServiceStartError(
                f"external service at {launch.url} answers {self.health_path} with HTTP {status}",
                log_tail="<external service: no log available>",
                config_name=launch.name,
                hint="check the service's own logs",
            )

    def plan(self, launch: Launch, profile: ServiceProfile, config: DDTreeConfig | None, extra_args: str | None) -> Launch:
        """Nothing to run: the service is somebody else's."""
        return launch

    def close(self) -> None:
        self.close_client()

    def close_client(self) -> None:
        """Close the health client's connections (the manager calls it at session end)."""
        close = getattr(self.client, "close", None)
        if callable(close):
            close()

    def failure(self) -> ExitInfo | None:
        return None

    def stop(self) -> None:
        return None

    def log_tail(self, n: int = 40) -> str:
        return "<external service: no log available>"

    def startup_log(self) -> str | None:
        return None

    def describe(self) -> str:
        return f"external service {self._launch.url if self._launch else ''}".rstrip()


#: How each build's /server_info shows the config it runs (the shipped profiles' ``applied`` maps):
#: (the keys that show block size, budget and topk, each a key or a fixed rule). Upstream DFLASH is
#: a chain: its block size is speculative_num_draft_tokens and topk is forced to 1 (sglang 0.5.23
#: sglang/srt/arg_groups/speculative_hook.py:352-384, _handle_dflash); PR 27509's DDTREE reports
#: its budget as speculative_ddtree_budget and takes topk = min(budget, vocab)
#: (suites/services/sglang-ddtree-pr27509.yaml); the reference engine reports all three.
_READ_BACK: dict[str, dict[str, str]] = {
    "reference": {"block_size": "speculative_dflash_block_size", "budget": "speculative_num_draft_tokens",
                  "topk": "speculative_eagle_topk"},
    "DDTREE": {"block_size": "speculative_num_draft_tokens", "budget": "speculative_ddtree_budget"},
    "DFLASH": {"block_size": "speculative_num_draft_tokens", "topk": "speculative_eagle_topk"},
}
_WINDOW_KEYS = ("speculative_draft_window_size", "speculative_dflash_draft_window_size")


def profile_from_server_info(url: str, info: Mapping[str, object], is_reference: bool,
                             measure_only: bool = False) -> dict[str, object]:
    """The external profile (a YAML document's worth) of the service at ``url``, from what its
    ``/server_info`` says it runs: ``--ddtree-url URL`` gates a running server the way
    bench_serving's ``--base-url`` measures one, with no profile file.

    Every config field is fixed at the value the service runs (the harness cannot change it), so
    the session gates that one config, under the name the running values give it; its read-back
    keys are checked again before it is measured. Raises ValueError, saying what was missing,
    when the answer shows no speculative config this harness can name; a plain server is measured
    (``measure_only``) as the config ``specnone`` (service/plain.py)."""
    algorithm = str(info.get("speculative_algorithm") or "").upper()
    if (not algorithm or algorithm == "NONE") and measure_only:
        return {**_external(url, f"the plain server already running at {url}"), **plain_profile_fields(url, info)}
    if not algorithm or algorithm == "NONE":
        raise ValueError(f"{url}/server_info reports no speculative algorithm (speculative_algorithm: "
                         f"{info.get('speculative_algorithm')!s}): there is no DFlash/DDTree config to gate; "
                         "to measure it without a gate (bench_serving's numbers), add --ddtree-measure-only")
    dialect = "reference" if is_reference else "DDTREE" if algorithm == "DDTREE" else "DFLASH"
    keys = _READ_BACK[dialect]
    values: dict[str, int] = {}
    for field_name, key in keys.items():
        value = info.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{url}/server_info has no usable {key} (got {str(value)[:40]}), which shows the "
                             f"{field_name} of a {algorithm} service; write a profile for this build instead "
                             "(docs/profiles.md)")
        values[field_name] = value
    fixed: dict[str, object] = dict(values)
    if "budget" not in values:  # a chain verifies block_size - 1 drafts
        fixed["budget"] = "block_size - 1"
    if "topk" not in values:  # the tree's own topk
        fixed["topk"] = "budget"
    applied = {key: field_name for field_name, key in keys.items()}
    window_key = next((k for k in _WINDOW_KEYS if k in info), None)
    if window_key is not None:  # the window it runs, read back like the rest: none is a window too
        window = info[window_key]
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"{url}/server_info has an unusable {window_key} (got {str(window)[:40]}): "
                             "a draft window is a positive integer or null (none)")
        fixed["window"] = "none" if window is None else window
        applied[window_key] = "window"
    name = running_config_name(fixed, values, window_key is not None)
    clock = f", clock scale {info['clock_scale']}" if is_reference and "clock_scale" in info else ""
    return {
        **_external(url, f"the service already running at {url} ({algorithm}{clock}), read from its /server_info"),
        # names mean what they mean everywhere (the shipped profiles' and their baselines'): no window
        # suffix is a window of 2048, and a service without a window is named _wnone
        "default_window": SHIPPED_DEFAULT_WINDOW,
        "matrix": [name],
        "default": name,
        "fixed": fixed,
        "fixed_because": {field: f"the service at {url} runs it; the harness never restarts an external service"
                          for field in fixed},
        "applied": applied,
    }


def _external(url: str, description: str) -> dict[str, object]:
    """What every profile of a running service says: where it is, and what it cannot do."""
    where = url.split("://", 1)[-1].rstrip("/")
    return {
        "name": f"external-{where}",
        "description": description,
        "controller": "external",
        "url": url.rstrip("/"),
        "control": "none",  # the non-speculative control needs a launch of its own
        "lossless": "golden",  # nor can the lossless reference be launched here
    }


def running_config_name(fixed: Mapping[str, object], values: Mapping[str, int], window_known: bool) -> str:
    """The name of the config the service runs (``bs8_b8_k4_wnone`` for the engine started with
    ``--speculative-algorithm DFLASH`` alone), in the shipped profiles' convention, so that it finds
    the baselines blessed under that name and never those of another window."""
    block = values["block_size"]
    budget = values.get("budget", block - 1)
    topk = values.get("topk", budget)
    name = f"bs{block}_b{budget}_k{topk}"
    window = fixed.get("window")
    if not window_known or window == SHIPPED_DEFAULT_WINDOW:
        return name
    return f"{name}_wnone" if window == "none" else f"{name}_w{window}"


def _make(context: ControllerContext) -> Controller:
    from pytest_ddtree.service.pool import resolve_instance  # pool reads profiles, which read the kinds

    slot = resolve_instance(context.profile, context.instance)
    return ExternalController(context.health_client(slot.url, HEALTH_TIMEOUT_S), context.profile.health_path)


KIND = ControllerKind(
    name="external",
    capabilities=Capabilities(launch=LaunchFrom.NOTHING, gpu_wait=GpuWait.NONE),
    make=_make,
)
"""``controller: external``: a running service (or a pool of URLs), adopted and never restarted."""
