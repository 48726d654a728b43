"""The build under test: what a bless records beside its numbers and every verdict compares.

Why: the baseline folder stands for what the user holds fixed (GPUs, target model, the
deployment's setup: ``fingerprint.py``); the engine version, the drafter, the speculative
algorithm, the patches, the driver and CUDA are what a CI gate is run *because* they changed. So
they are never a reason to look elsewhere for a baseline: each bless records them
(``fingerprint.build`` in the baseline file), and each judged cell says what it was blessed on and
what it is judged on ("blessed on sglang 0.5.23 with drafter /models/A (sha256:1a2b...); judged on
sglang 0.5.24 with drafter /models/B (sha256:3c4d...)"), so a cell whose acceptance fell names the
change that made it fall.

The drafter's content digest is cheap and bounded: its ``config.json`` and
``model.safetensors.index.json`` (each read up to :data:`MAX_READ` bytes), the names and sizes of
its weight files (at most :data:`MAX_ENTRIES` directory entries looked at) and
:data:`SAMPLES` slices of :data:`SAMPLE_BYTES` spread over each of the first :data:`MAX_SAMPLED_FILES`
weight files: a checkpoint retrained in place has the same names, sizes and config, and different
values nearly everywhere, so the slices see it without reading gigabytes. A path this machine
cannot read (a remote host's, a hub id) is said so, not guessed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

#: The build's facts, in the order a sentence names them.
BUILD_KEYS = ("engine_version", "speculative_algorithm", "drafter", "drafter_digest", "patches", "driver", "cuda_driver")
MAX_READ = 4 * 1024 * 1024
MAX_ENTRIES = 10_000
SAMPLES = 16
SAMPLE_BYTES = 64 * 1024
MAX_SAMPLED_FILES = 64
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SHOWN = 80  # characters of one recorded value a sentence shows (the file is not trusted)


def _short(value: Any) -> str:
    """A recorded value cut to :data:`_SHOWN` characters, keeping its end: two drafter paths differ
    in their last parts."""
    text = str(value)
    return text if len(text) <= _SHOWN else "..." + text[-(_SHOWN - 3):]


class _ProfileLike(Protocol):
    @property
    def draft_model_path(self) -> str | None: ...
    @property
    def patches(self) -> Any: ...


def drafter_digest(path: str) -> str:
    """``sha256:<16 hex>`` of the drafter's config, safetensors index and weight file names and
    sizes at ``path``; ``unread: <why>`` where this machine cannot read it."""
    folder = Path(path).expanduser()
    try:
        if not folder.exists():
            return "unread: no such path on this machine"
        digest = hashlib.sha256()
        if folder.is_file():
            digest.update(f"{folder.name}\0{folder.stat().st_size}\n".encode())
            _sample(folder, folder.stat().st_size, digest)
            return "sha256:" + digest.hexdigest()[:16]
        for name in ("config.json", "model.safetensors.index.json"):
            part = folder / name
            if part.is_file():
                with part.open("rb") as handle:
                    digest.update(name.encode() + b"\0" + handle.read(MAX_READ) + b"\n")
        weights: list[tuple[str, int]] = []
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_ENTRIES:
                    break
                if entry.name.endswith(_WEIGHT_SUFFIXES) and entry.is_file():
                    weights.append((entry.name, entry.stat().st_size))
        for i, (name, size) in enumerate(sorted(weights)):
            digest.update(f"{name}\0{size}\n".encode())
            if i < MAX_SAMPLED_FILES:
                _sample(folder / name, size, digest)
        return "sha256:" + digest.hexdigest()[:16]
    except OSError as exc:
        return f"unread: {type(exc).__name__}: {exc.strerror or exc}"


def _sample(path: Path, size: int, digest: Any) -> None:
    """:data:`SAMPLES` slices of :data:`SAMPLE_BYTES` at even offsets of ``path`` (all of a small file)."""
    with path.open("rb") as handle:
        step = max(size // SAMPLES, 1)
        for offset in range(0, size, step)[:SAMPLES]:
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_BYTES))


def patches_digest(patches: Any) -> str | None:
    """A digest of the profile's ``patches:`` section as written (None: it has none). The patched
    files themselves are collected and diffed by ``--ddtree-package``; here the section is what
    says which ones the deployment runs."""
    if not patches:
        return None
    return "sha256:" + hashlib.sha256(json.dumps(patches, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_under_test(server_info: Mapping[str, object], profile: _ProfileLike | None = None,
                     session_build: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The build a running service is: its engine version and algorithm from ``/server_info``, its
    drafter (the server arg, else the profile's ``draft_model_path`` where it speculates) with the
    drafter's digest, the profile's patches, and the driver and CUDA the session found
    (``session_build``: ``HardwareProfile.build``)."""
    session_build = session_build or {}
    algorithm = server_info.get("speculative_algorithm")
    drafter = server_info.get("speculative_draft_model_path")
    if "speculative_draft_model_path" not in server_info and algorithm not in (None, "NONE"):
        drafter = getattr(profile, "draft_model_path", None)
    facts: dict[str, Any] = {
        "engine_version": server_info.get("version") or session_build.get("engine_version"),
        "speculative_algorithm": algorithm,
        "drafter": str(drafter) if drafter else None,
        "drafter_digest": drafter_digest(str(drafter)) if drafter else None,
        "patches": patches_digest(getattr(profile, "patches", None)),
        "driver": session_build.get("driver"),
        "cuda_driver": session_build.get("cuda_driver"),
    }
    return {k: v for k, v in facts.items() if v is not None}


def blessed_build(recorded: object) -> dict[str, Any]:
    """The build a baseline file's ``fingerprint`` section says it was blessed on: its ``build``,
    or, in a file of the older layout, the build's facts its ``details`` held (the drafter's last
    path part only, no digest)."""
    if not isinstance(recorded, Mapping):
        return {}
    build = recorded.get("build")
    source = build if isinstance(build, Mapping) else recorded.get("details")
    if not isinstance(source, Mapping):
        return {}
    return {k: source[k] for k in BUILD_KEYS if isinstance(source.get(k), (str, int, float, bool))}


def _same(key: str, was: Any, now: Any) -> bool:
    if key == "drafter" and "/" not in str(was):  # the older layout kept the last path part only
        return str(was) == str(now).rstrip("/").rsplit("/", 1)[-1]
    return str(was) == str(now)


def build_changes(blessed: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """Each build fact both state and that differs, as ``key 'was' when blessed, 'now' here``
    (values cut short; a fact the bless did not record is no evidence)."""
    return [f"{key} {_short(blessed[key])!r} when blessed, {_short(here[key])!r} here"
            for key in BUILD_KEYS if key in blessed and key in here and not _same(key, blessed[key], here[key])]


def describe(build: Mapping[str, Any]) -> str:
    """``sglang 0.5.23 (DFLASH) with drafter /models/A (sha256:...)``, from what ``build`` states."""
    version = _short(build.get("engine_version", "an engine of unrecorded version"))
    text = version if version.startswith(("refserver", "an engine")) else f"sglang {version}"
    if build.get("speculative_algorithm"):
        text += f" ({_short(build['speculative_algorithm'])})"
    if build.get("drafter"):
        text += f" with drafter {_short(build['drafter'])}"
        if build.get("drafter_digest"):
            text += f" ({_short(build['drafter_digest'])})"
    if build.get("patches"):
        text += f", patches {_short(build['patches'])}"
    return text


def build_sentence(blessed: Mapping[str, Any], here: Mapping[str, Any]) -> str:
    """What a verdict says of the build: ``blessed on X; judged on Y (changed: ...)``, or that it is
    the build that was blessed; empty where the baseline recorded no build."""
    if not blessed:
        return ""
    changes = build_changes(blessed, here)
    if not changes:
        return f"judged on the build it was blessed on: {describe(here)}"
    return f"blessed on {describe(blessed)}; judged on {describe(here)} (changed: {'; '.join(changes)})"
