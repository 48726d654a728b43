"""Fault injection: the ways a real deployment breaks, on demand.

Why: the harness claims to catch crashed starts, dying servers, flaky HTTP, hangs,
slow starts, silently ignored configs (reported as asked, served otherwise), broken (lossy) verification kernels and
noisy/slow hardware. Each claim needs a server that misbehaves in exactly that way,
so every fault is a flag of the reference engine, they combine freely, and each one
is used by a test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: Bodies the ``chat-body`` fault sends instead of a chat completion (status 200 each).
CHAT_BODY_KINDS = {
    "message-not-object": "choices[0].message is a string",
    "no-choices": "no 'choices' key",
    "content-not-string": "choices[0].message.content is a list",
    "usage-not-object": "'usage' is a string",
    "error-body": "an SGLang ErrorResponse object with status 200",
    "invalid-utf8": "the JSON body with two bytes that are not UTF-8",
    "truncated-json": "the first half of the JSON body",
    "huge-body": "a 17 MiB body",
    "huge-answer": "a 2,000,000-character answer",
    "think-bomb": "an answer of 40,000 '<think>' tags, then a fence",
    "fence-bomb": "an answer of 50 lines of three backticks, 4,000 spaces and a backtick",
}

#: What the ``trickle`` fault can slow to a byte a second, and the requests each name covers.
TRICKLE_KINDS = {
    "health": "GET /health and /health_generate",
    "server_info": "GET /server_info (and /get_server_info)",
    "generate": "a non-streamed POST /generate (the copy probe's)",
    "stream": "a streamed POST /generate (the load generator's)",
    "chat": "POST /v1/chat/completions",
}

FAULT_HELP = {
    "crash-on-start": "log a traceback and exit with status 1 before opening the port",
    "exit-after=N": "exit (status 1) right after the N-th completed generation request",
    "http500-rate=P": "answer a generation request with HTTP 500 with probability P (seeded)",
    "hang-after=N": "after N completed generation requests stop answering anything (health too)",
    "slow-start=S": "stay in the loading state (health 503) S seconds longer",
    "ignore-config=topk": "silently run DFLASH with topk 1 and report speculative_eagle_topk=1",
    "serve-block-size=N": "report the configured block size (/server_info) but serve block size N (start-up lines print N)",
    "serve-budget=N": "report the configured budget (/server_info) but serve budget N (start-up lines print N)",
    "unused-config=topk": "accept, report and log the configured topk but run topk 1, without the override warning",
    "unused-config=window": "accept, report and log the configured draft window but let the drafter see the whole context",
    "lossy-verify=P": "accept a wrong draft token with probability P (breaks losslessness)",
    "slowdown=F": "multiply every simulated step cost by F",
    "slow-launch=F:PATH": "the first launch that finds no file at PATH creates it and multiplies every step cost by F; "
                          "later launches run at full speed (a launch that drew a slow speed: KV-cache size, "
                          "CUDA-graph capture)",
    "clock-jitter=P": "multiply each step time by a seeded random factor 1 +- P",
    "stall=K:S": "after the K-th /flush_cache, stall the scheduler S seconds of wall time before its next forward pass "
                 "(a host that took the core away during one measured phase; repeatable for several K)",
    "trickle=K:N": "after N answers of K (one of " + ", ".join(sorted(TRICKLE_KINDS)) + ") answer every further K for ever, "
                   "a byte a second (a stream: its first chunk, then an SSE comment a second): a wedged scheduler "
                   "behind a live HTTP server; repeatable for several K",
    "deep-chunk=N": "every N-th streamed /generate sends, in place of its chunks, one chunk nested 200,000 arrays deep "
                    "(a client whose JSON parser recurses dies on it)",
    "verify-ct=F": "report spec_verify_ct times F (rounded; F < 0: negative) and no acceptance histogram: a count no "
                   "config can produce (F = 1/16: 16 tokens a verify)",
    "chat-body=K[+K...]": "answer the n-th chat completion with the malformed or hostile body K[(n-1) % len]: " + ", ".join(sorted(CHAT_BODY_KINDS)),
}


class FaultError(ValueError):
    """A --fault value that does not parse."""


def _slow_launch(value: str) -> tuple[float, str]:
    """``slow-launch``'s ``F:PATH``: the slow launch's factor and its marker file."""
    factor, colon, path = value.partition(":")
    try:
        f = float(factor)
    except ValueError:
        f = 0.0
    if not colon or not path or not f > 0:
        raise FaultError(f"fault 'slow-launch' takes F:PATH (F > 0, the marker file), got {value!r}")
    return f, path


@dataclass
class Faults:
    crash_on_start: bool = False
    exit_after: int | None = None
    http500_rate: float = 0.0
    hang_after: int | None = None
    slow_start: float = 0.0
    ignore_config: set[str] = field(default_factory=set)
    serve_block_size: int | None = None
    serve_budget: int | None = None
    unused_config: set[str] = field(default_factory=set)
    lossy_verify: float = 0.0
    slowdown: float = 1.0
    clock_jitter: float = 0.0
    slow_launch: tuple[float, str] | None = None  # (F, PATH): see claim_slow_launch
    stalls: dict[int, float] = field(default_factory=dict)  # flush number -> wall seconds
    chat_body: list[str] = field(default_factory=list)
    trickle: dict[str, int] = field(default_factory=dict)  # kind -> answers before it trickles
    deep_chunk: int | None = None
    verify_ct: float | None = None
    specs: list[str] = field(default_factory=list)

    # long because: one branch per fault, each parsing its own value: the list of faults reads as one table
    def add(self, spec: str) -> None:
        """Parse one ``name[=value]`` item and record it (later items override)."""
        spec = spec.strip()
        if not spec:
            return
        name, has_value, value = spec.partition("=")
        name = name.strip().lower()
        value = value.strip()

        def number(kind: type[float] | type[int], lo: float, hi: float | None = None) -> float:
            if not has_value or not value:
                raise FaultError(f"fault {name!r} needs a value: {name}=...")
            try:
                x = kind(value)
            except ValueError:
                raise FaultError(f"fault {name!r}: {value!r} is not a valid number") from None
            if x < lo or (hi is not None and x > hi):
                rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise FaultError(f"fault {name!r}: {value} must be {rng}")
            return x

        if name == "crash-on-start":
            if has_value:
                raise FaultError("fault 'crash-on-start' takes no value")
            self.crash_on_start = True
        elif name == "exit-after":
            self.exit_after = int(number(int, 0))
        elif name == "http500-rate":
            self.http500_rate = number(float, 0.0, 1.0)
        elif name == "hang-after":
            self.hang_after = int(number(int, 0))
        elif name == "slow-start":
            self.slow_start = number(float, 0.0)
        elif name == "ignore-config":
            if value not in ("topk",):
                raise FaultError("fault 'ignore-config' supports only: ignore-config=topk")
            self.ignore_config.add(value)
        elif name == "serve-block-size":
            self.serve_block_size = int(number(int, 2))
        elif name == "serve-budget":
            self.serve_budget = int(number(int, 1))
        elif name == "unused-config":
            if value not in ("topk", "window"):
                raise FaultError("fault 'unused-config' supports only: unused-config=topk, unused-config=window")
            self.unused_config.add(value)
        elif name == "lossy-verify":
            self.lossy_verify = number(float, 0.0, 1.0)
        elif name == "slowdown":
            self.slowdown = number(float, 0.0)
            if self.slowdown <= 0:
                raise FaultError("fault 'slowdown': F must be > 0")
        elif name == "slow-launch":
            self.slow_launch = _slow_launch(value)
        elif name == "clock-jitter":
            self.clock_jitter = number(float, 0.0, 1.0)
        elif name == "stall":
            flush, colon, seconds = value.partition(":")
            try:
                k, s = int(flush), float(seconds)
            except ValueError:
                raise FaultError(f"fault 'stall' takes K:S (the K-th /flush_cache, S seconds), got {value!r}") from None
            if not colon or k < 1 or not 0 < s <= 600:
                raise FaultError(f"fault 'stall': K must be >= 1 and S in (0, 600], got {value!r}")
            self.stalls[k] = s
        elif name == "trickle":
            kind, colon, count = value.partition(":")
            if kind not in TRICKLE_KINDS or not colon or not count.isdigit():
                raise FaultError(f"fault 'trickle' takes K:N, K one of {', '.join(sorted(TRICKLE_KINDS))} and N the answers "
                                 f"before it trickles, got {value!r}")
            self.trickle[kind] = int(count)
        elif name == "deep-chunk":
            self.deep_chunk = int(number(int, 1))
        elif name == "verify-ct":
            self.verify_ct = number(float, -1e6, 1e6)
        elif name == "chat-body":
            kinds = [k.strip() for k in value.split("+") if k.strip()]
            bad = [k for k in kinds if k not in CHAT_BODY_KINDS]
            if not kinds or bad:
                raise FaultError(f"fault 'chat-body' takes kinds joined by '+' from: {', '.join(sorted(CHAT_BODY_KINDS))}")
            self.chat_body = kinds
        else:
            known = ", ".join(FAULT_HELP)
            raise FaultError(f"unknown fault {name!r}; known: {known}")
        self.specs.append(spec)

    def claim_slow_launch(self) -> bool:
        """At start-up: whether this launch is the slow one of ``slow-launch`` (it creates the marker
        file, atomically, so of several launches exactly one is), then slowed by its factor."""
        if self.slow_launch is None:
            return False
        factor, path = self.slow_launch
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return False
        self.slowdown *= factor
        return True

    @classmethod
    def parse(cls, values: list[str]) -> Faults:
        """``--fault`` values: repeatable, each may be a comma-separated list."""
        faults = cls()
        for value in values:
            for item in value.split(","):
                faults.add(item)
        return faults
