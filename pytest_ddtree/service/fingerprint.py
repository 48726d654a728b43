"""Hardware profile: which baseline folder a session compares against, and the build it judges.

Why: baselines belong to what the user holds fixed (pytest-benchmark's machine id has no GPU in
it, which its users complain about). So the baseline folder is named after a fingerprint of the
setup: GPU model and count (NVML), the target model, tensor parallelism and what of the launch
changes the numbers without being a config axis of the profile: attention backend, page size,
overlap scheduling and data parallelism (:data:`SETUP_KEYS`; a profile that sweeps one as an axis
leaves it to the config's name). The folder name is short and readable (``8xH200-Kimi-K2.6-1a2b3c4d``);
the setup and its hash are recorded inside every baseline file, so a reviewer sees what the
numbers belong to.

The engine version, the drafter (its path and a digest of its files), the speculative algorithm,
the patches, the driver and CUDA are the *build under test* (:func:`build_under_test`), as asv
compares commits on one machine: recorded with every bless, compared in every verdict
(:func:`build_sentence`), never a folder of their own. A folder keyed by the build made every
SGLang upgrade and every new drafter checkpoint "no baseline for this cell", a pass with a warning:
exactly the change a CI gate exists to catch. Folders of that older layout
(``<gpus>-sglang-<version>-<model>-<hash>``, the build in the hash: :func:`legacy_name`) are still
read, with a note, until the next bless writes the new one.

The reference engine runs a simulated accelerator clock, so its numbers do not depend on
the host: it gets the stable name ``refserver`` and the committed baselines gate on any
machine. A profile's ``hardware_profile`` key overrides the name entirely (a fleet of
identical hosts that should share one folder).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

REFERENCE_NAME = "refserver"


class _Gpu(Protocol):
    @property
    def name(self) -> str: ...


class InventoryLike(Protocol):
    """``pytest_ddtree.service.gpu.GpuInventory`` satisfies this."""

    @property
    def gpus(self) -> Sequence[_Gpu]: ...
    @property
    def driver_version(self) -> str | None: ...
    @property
    def cuda_driver_version(self) -> str | None: ...


@dataclass(frozen=True)
class HardwareProfile:
    """A baseline folder name plus the setup it stands for (``details``), the build the session
    found at its first start (``build``: engine version, algorithm, drafter, driver) and the folder
    the older layout named after both (``legacy_name``; None where the names agree)."""

    name: str
    details: dict[str, Any]
    digest: str
    build: dict[str, Any] = field(default_factory=dict)
    legacy_name: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "digest": self.digest, "details": dict(self.details), "build": dict(self.build)}


def sanitize(text: str, max_len: int = 80) -> str:
    """A safe folder name: ``[A-Za-z0-9._-]`` only, no leading dot, bounded length."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    out = re.sub(r"-{2,}", "-", out)
    return out[:max_len].rstrip("-.") or "unknown"


def _short_gpu(name: str) -> str:
    """'NVIDIA H200' -> 'H200'; 'NVIDIA GeForce RTX 4090' -> 'RTX-4090'."""
    for prefix in ("NVIDIA ", "GeForce ", "Tesla "):
        name = name.replace(prefix, "")
    return name.strip()


def _basename(path: Any) -> str | None:
    if not isinstance(path, str) or not path:
        return None
    return path.rstrip("/").rsplit("/", 1)[-1]


def is_reference_engine(server_info: Mapping[str, object]) -> bool:
    version = server_info.get("version")
    return isinstance(version, str) and version.startswith("refserver")


#: /server_info keys (SGLang 0.5.23 server args, resolved at start-up) that change the numbers a
#: gate compares -> the axis (pytest_ddtree.axes) that sweeps them: the stored tree-width hook rejects
#: trtllm_mha, which would verify the tree as a chain; DDTree disables overlap scheduling.
SETUP_KEYS = {
    "attention_backend": "attention_backend",
    "page_size": "page_size",
    "disable_overlap_schedule": "overlap",
    "dp_size": "dp",
}


def fingerprint(
    server_info: Mapping[str, object],
    model_info: Mapping[str, Any] | None = None,
    inventory: InventoryLike | None = None,
    override: str | None = None,
    swept: Sequence[str] = (),
) -> HardwareProfile:
    """The fingerprint of a running service (pure: every fact is passed in).

    ``server_info``/``model_info`` are the service's /server_info and /model_info answers;
    ``inventory`` is :func:`pytest_ddtree.service.gpu.gpu_inventory` (None or no GPUs:
    ``cpu``); ``override`` is the profile's ``hardware_profile`` key; ``swept``: the axes the
    profile sets per config (a :data:`SETUP_KEYS` key they cover stays out: the name carries it).
    """
    model_info = model_info or {}
    gpus = list(inventory.gpus) if inventory is not None else []
    gpu_names = sorted({_short_gpu(g.name) for g in gpus})
    details: dict[str, Any] = {
        "gpu": f"{len(gpus)}x{'+'.join(gpu_names)}" if gpus else "cpu",
        "model": _basename(model_info.get("model_path") or server_info.get("model_path")),
        "tp_size": server_info.get("tp_size") if "tp" not in swept else None,
        # the reference engine's simulated accelerator: its speed is its clock scale, not the host's
        "clock_scale": server_info.get("clock_scale") if is_reference_engine(server_info) else None,
        **{key: server_info.get(key) for key, axis in SETUP_KEYS.items() if axis not in swept},
    }
    details = {k: v for k, v in details.items() if v is not None}
    build = {k: v for k, v in {
        "engine_version": server_info.get("version"),
        "speculative_algorithm": server_info.get("speculative_algorithm"),
        "drafter": server_info.get("speculative_draft_model_path") or None,
        "driver": getattr(inventory, "driver_version", None) if gpus else None,
        "cuda_driver": getattr(inventory, "cuda_driver_version", None) if gpus else None,
    }.items() if v is not None}
    digest = _digest(details)
    if override:
        return HardwareProfile(sanitize(override), details, digest, build)
    if is_reference_engine(server_info):
        return HardwareProfile(REFERENCE_NAME, details, digest, build)
    name = sanitize("-".join([details["gpu"], *([str(details["model"])] if details.get("model") else [])]), max_len=72)
    return HardwareProfile(f"{name}-{digest}", details, digest, build, _legacy_name(details, build))


def _digest(facts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _legacy_name(details: Mapping[str, Any], build: Mapping[str, Any]) -> str:
    """The folder the older layout gave these facts: the build's engine version in the name and the
    engine version, drafter (its last path part), algorithm, driver and CUDA in the hash."""
    old = {**details, **{k: v for k, v in build.items() if k != "drafter"}}
    if build.get("drafter"):
        old["drafter"] = _basename(build["drafter"])
    parts = [details["gpu"], f"sglang-{build.get('engine_version', 'unknown')}"]
    if details.get("model"):
        parts.append(str(details["model"]))
    return sanitize("-".join(parts), max_len=72) + f"-{_digest(old)}"


def setup_differences(blessed: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """What a baseline's recorded fingerprint (its ``details``, as blessed) says of the setup that this
    service's differs in, as ``key X when blessed, Y here``: only the facts both state (an older bless
    that did not record one is no evidence), each value cut short (the file is not trusted).

    Why: a folder shared by a ``hardware_profile`` override (or the reference engine's one name)
    holds numbers of whatever setup blessed them; a regression of every cell against a baseline
    blessed on another engine version or clock is that difference, and the message should say so."""
    out = []
    for key in sorted(set(blessed) & set(here)):
        was, now = blessed[key], here[key]
        if not isinstance(was, (str, int, float, bool)):
            continue
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (was, now))
        if (float(was) != float(now)) if numbers else str(was) != str(now):  # 10 and 10.0 are one clock scale
            out.append(f"{sanitize(str(key), 40)} {str(was)[:60]!r} when blessed, {str(now)[:60]!r} here")
    return out


class _ProfileLike(Protocol):
    @property
    def hardware_profile(self) -> str | None: ...


def installed_engine_version(python: str | None, distribution: str = "sglang") -> str | None:
    """The version of ``distribution`` installed for the service's interpreter (None: unknown)."""
    if not python:
        return None
    import subprocess

    code = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    try:
        proc = subprocess.run([python, "-c", code, distribution], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def local_fingerprint(profile: _ProfileLike | None, server_info: Mapping[str, object]) -> HardwareProfile:
    """:func:`fingerprint` with this machine's NVML inventory and the profile's override.

    NVML is not asked for the reference engine: its clock is simulated, GPUs are irrelevant.
    A service whose /server_info has no ``version`` gets the engine version installed for its
    interpreter (the profile's ``python:``), never the harness's.
    """
    if "version" not in server_info:
        version = installed_engine_version(getattr(profile, "service_python", None))
        if version is not None:
            server_info = {**server_info, "version": version}
    override = getattr(profile, "hardware_profile", None) if profile is not None else None
    inventory: InventoryLike | None = None
    if not override and not is_reference_engine(server_info):
        from pytest_ddtree.service.gpu import gpu_inventory

        inventory = gpu_inventory()
    settable = getattr(profile, "settable_fields", None) if profile is not None else None
    swept = tuple(settable()) if callable(settable) else ()
    return fingerprint(server_info, None, inventory, override, swept)

