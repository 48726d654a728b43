"""``/start_profile`` and ``/stop_profile`` of the reference engine, as SGLang answers them.

Why: ``bench_serving --profile`` (python/sglang/benchmark/serving.py ``async_request_profile``)
and operators call these around a run; an engine that answers 404 makes the harness and its
users believe profiling is not available, and a client mistake (stopping twice) must fail as
it fails on SGLang. The "trace" is the engine's simulated forward passes, since it has no GPU.

Follows sgl-project/sglang (v0.5.23):

* entrypoints/http_server.py ``start_profile_async`` (GET|POST, optional JSON body
  ``ProfileReq``) answers ``Start profiling.\\n``; ``stop_profile_async`` answers ``Stop
  profiling. This will take some time.\\n``; both 200;
* managers/tokenizer_control_mixin.py ``_execute_profile`` raises ``RuntimeError`` when the
  scheduler refuses, which FastAPI turns into a 500 ``Internal Server Error``: starting while a
  profile runs ("Profiling is already in progress. Call /stop_profile first.") and stopping when
  none runs ("Profiling is not in progress. Call /start_profile first.",
  scheduler_components/profiler_manager.py ``_init_profile`` / ``_stop_profile``);
* ``ProfileReq`` (managers/io_struct.py): ``output_dir`` (default ``$SGLANG_TORCH_PROFILER_DIR``
  or ``/tmp``), ``start_step``, ``num_steps``, ``activities`` (default CPU, GPU),
  ``profile_id`` (default the start time), ``profile_prefix``; with ``num_steps`` the profile
  stops by itself when the forward count reaches ``profiler_target_forward_ct`` = forward count
  at the start + num_steps + 1 (so num_steps + 1 passes are recorded), or start_step + num_steps;
  with ``start_step`` it starts at that pass;
* the trace is written on stop as ``{output_dir}/[{prefix}-]{profile_id}-TP-0.trace.json.gz``
  (``_stop_profile``), a Chrome trace (``traceEvents``) as torch's ``export_chrome_trace`` writes;
  here one complete event per simulated forward pass (name ``prefill`` / ``decode``, its wall
  start and duration, batch size and simulated milliseconds in ``args``).

``profile_by_stage`` and the per-activity extras (memory snapshots, RPD) are accepted and
treated as a plain profile. At most :data:`MAX_EVENTS` passes are kept per profile.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_EVENTS = 200_000


class ProfileRequestError(ValueError):
    """A malformed ProfileReq body (SGLang: a validation error, HTTP 400)."""


class ProfileRefused(RuntimeError):
    """The scheduler refused (SGLang: RuntimeError in the tokenizer manager, HTTP 500)."""


def _opt_int(body: Mapping[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():  # bench_serving sends str(num_steps)
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProfileRequestError(f"{key}: Input should be a valid integer")
    return v


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is not None and not isinstance(v, str):
        raise ProfileRequestError(f"{key}: Input should be a valid string")
    return v


@dataclass
class ProfileSettings:
    """The fields of a ProfileReq the engine uses."""

    output_dir: Path
    profile_id: str
    prefix: str = ""
    start_step: int | None = None
    num_steps: int | None = None
    activities: list[str] = field(default_factory=lambda: ["CPU", "GPU"])

    @classmethod
    def parse(cls, body: Mapping[str, Any] | None, env: Mapping[str, str] = os.environ) -> ProfileSettings:
        body = body or {}
        activities = body.get("activities")
        if activities is not None and not (isinstance(activities, list) and all(isinstance(a, str) for a in activities)):
            raise ProfileRequestError("activities: Input should be a valid list of strings")
        for key in ("profile_by_stage", "merge_profiles", "with_stack", "record_shapes", "detailed_annotations"):
            if body.get(key) is not None and not isinstance(body.get(key), bool):
                raise ProfileRequestError(f"{key}: Input should be a valid boolean")
        output_dir = _opt_str(body, "output_dir") or env.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        return cls(
            output_dir=Path(output_dir).expanduser(),
            profile_id=_opt_str(body, "profile_id") or str(time.time()),
            prefix=_opt_str(body, "profile_prefix") or "",
            start_step=_opt_int(body, "start_step"),
            num_steps=_opt_int(body, "num_steps"),
            activities=list(activities) if activities else ["CPU", "GPU"],
        )

    @property
    def trace_path(self) -> Path:
        stem = (self.prefix + "-" if self.prefix else "") + f"{self.profile_id}-TP-0"
        return self.output_dir / f"{stem}.trace.json.gz"


class Profiler:
    """Profile state shared by the HTTP threads (start/stop) and the scheduler (``on_step``)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.lock = threading.Lock()
        self.settings: ProfileSettings | None = None  # set from start until the trace is written
        self.recording = False
        self.start_ct: int | None = None
        self.target_ct: int | None = None
        self.forward_ct = 0
        self.events: list[dict[str, Any]] = []

    def start(self, settings: ProfileSettings) -> None:
        with self.lock:
            if self.settings is not None:
                raise ProfileRefused("Profiling is already in progress. Call /stop_profile first.")
            self.settings = settings
            self.events = []
            ct = self.forward_ct
            self.start_ct = max(settings.start_step, ct + 1) if settings.start_step else None
            if settings.num_steps:
                self.target_ct = self.start_ct + settings.num_steps if self.start_ct else ct + settings.num_steps + 1
            else:
                self.target_ct = None
            self.recording = self.start_ct is None
            if self.recording:
                self.log(f"Profiling starts. Traces will be saved to: {settings.output_dir} "
                         f"(with profile id: {settings.profile_id})")

    def stop(self) -> Path:
        """Write the trace; raises ProfileRefused when no profile runs."""
        with self.lock:
            if self.settings is None:
                raise ProfileRefused("Profiling is not in progress. Call /start_profile first.")
            return self._finish()

    def _finish(self) -> Path:
        settings = self.settings
        assert settings is not None
        events, self.events = self.events, []
        self.settings, self.recording, self.start_ct, self.target_ct = None, False, None, None
        trace = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events,
                 "traceName": str(settings.trace_path), "displayTimeUnit": "ms"}
        settings.output_dir.mkdir(parents=True, exist_ok=True)
        with gzip.open(settings.trace_path, "wt", encoding="utf-8") as fh:
            json.dump(trace, fh)
        self.log(f"Profiling done. Traces are saved to: {settings.output_dir}")
        return settings.trace_path

    def on_step(self, name: str, start: float, end: float, batch_size: int, simulated_s: float) -> None:
        """One forward pass ended (scheduler thread); ``start``/``end`` are time.time() seconds."""
        with self.lock:
            self.forward_ct += 1
            if self.settings is None:
                return
            if not self.recording and self.start_ct is not None and self.forward_ct >= self.start_ct:
                self.recording = True
            if self.recording and len(self.events) < MAX_EVENTS:
                self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 0, "tid": 0,
                                    "ts": round(start * 1e6, 3), "dur": round((end - start) * 1e6, 3),
                                    "args": {"batch_size": batch_size, "simulated_ms": round(simulated_s * 1e3, 6),
                                             "forward_ct": self.forward_ct}})
            if self.target_ct is not None and self.target_ct <= self.forward_ct:
                try:
                    self._finish()
                except OSError as exc:  # the scheduler must live on
                    self.log(f"ERROR:    could not write the profile: {exc}")
