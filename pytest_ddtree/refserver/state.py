"""What the reference server's handlers share: the engine, its faults, counters, and the memory figures /server_info reports."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.refserver.engine import VERSION, Engine
from pytest_ddtree.refserver.faults import Faults
from pytest_ddtree.refserver.model import Models


@dataclass(frozen=True)
class MemoryModel:
    """Simulated memory figures (GB per GPU) reported in /server_info.

    The draft KV cache holds ``min(window, context_length)`` tokens per running
    request, so a draft window shrinks it (what "compact cache" buys on a GPU).
    """

    weight_gb: float = 15.25
    draft_weight_gb: float = 0.93
    kvcache_gb: float = 14.0
    draft_kv_per_token_gb: float = 0.000012

    def figures(self, window: int | None, context_length: int, max_running: int, spec: bool) -> dict[str, float]:
        held = context_length if window is None else min(window, context_length)
        draft_kv = self.draft_kv_per_token_gb * held * max_running if spec else 0.0
        draft_w = self.draft_weight_gb if spec else 0.0
        total = self.weight_gb + self.kvcache_gb + draft_w + draft_kv
        return {
            "weight_gb": round(self.weight_gb, 3),
            "kvcache_gb": round(self.kvcache_gb, 3),
            "draft_weight_gb": round(draft_w, 3),
            "draft_kvcache_gb": round(draft_kv, 3),
            "total_gb": round(total, 3),
        }


@dataclass
class ServerState:
    """Everything the handlers share; ``engine`` is None while loading."""

    server_args: dict[str, Any]
    faults: Faults
    seed: int
    context_length: int
    log: Callable[[str], None]
    #: /server_info's ``version`` (http_server.py server_info: SGLang's ``__version__``); ``--engine-version``.
    version: str = VERSION
    memory: MemoryModel = field(default_factory=MemoryModel)
    models: Models | None = None
    engine: Engine | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gen_requests_seen: int = 0
    gen_requests_done: int = 0
    chat_requests: int = 0
    answered: dict[str, int] = field(default_factory=dict)  # trickle fault: answers per kind so far
    started: float = field(default_factory=time.time)

    @property
    def model_path(self) -> str:
        return str(self.server_args["model_path"])
