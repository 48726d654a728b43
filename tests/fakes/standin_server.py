#!/usr/bin/env python3
"""A tiny stand-in for an SGLang server: a real process that answers like upstream SGLang.

Lifecycle: it accepts the reference engine's launch flags and fault specs that matter to the
lifecycle: refuse connections for a while, answer 503 while "loading", crash on start, exit
after N generate requests, ignore a config flag, ignore SIGTERM, fork a worker child.

Serving, as upstream SGLang does it where the harness depends on it (and unlike our own engine,
so the harness cannot lean on the engine's conveniences): no ``vocab_size`` anywhere
(``/model_info`` has exactly SGLang's keys); ``POST /tokenize`` (alias ``/v1/tokenize``);
streamed ``/generate`` with cumulative ``completion_tokens`` and ``spec_verify_ct`` /
``spec_accept_length`` on the finished chunk only; ``internal_states[0].avg_spec_accept_length``
absent after ``/flush_cache`` until decode batches ran and refreshed only every 40 of them;
``/flush_cache`` 400 while requests run. Each request's first token comes from prefill, then
each verify step accepts 2 and 5 tokens in turn (``--fault spec-off``: no spec fields at all,
a service whose speculation silently did not engage).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ACCEPT_CYCLE = (2, 5)  # tokens accepted per verify step, in turn
DECODE_LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
STEP_S = 0.002
PIECE = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[int]:
    """Word pieces with their leading space, hashed to ids (deterministic, no vocabulary size)."""
    return [100 + zlib.crc32(p.encode()) % 50000 for p in PIECE.findall(text)]


def verify_steps(completion_tokens: int) -> int:
    """Verify steps for an output: the first token comes from prefill, then ACCEPT_CYCLE."""
    steps, done = 0, 1
    while done < completion_tokens:
        done += ACCEPT_CYCLE[steps % len(ACCEPT_CYCLE)]
        steps += 1
    return steps


# --cost-shape odd: a throughput surface outside the advisor's model family (the adaptive sweep's
# test): topk-6 acceptance peaks at budget 12 and then falls (a wider tree of worse candidates),
# and every running request adds a fixed cost to each step besides its verify width.
def odd_accept(block_size: int, budget: int, topk: int) -> float:
    """Mean tokens per verify step (bonus included) of a config under the odd cost shape."""

    accept = 1 + 3.4 * (1 - math.exp(-budget / 6.0)) * (1.04 if block_size >= 16 else 1.0)
    if topk == 6:
        accept = (1 + 3.4 * (1 - math.exp(-min(budget, 12) / 6.0))) * 1.06 * (1 - 0.08 * max(0, budget - 12) / 4)
    elif topk == 8:
        accept *= 0.97
    return accept


def odd_step_s(block_size: int, budget: int, running: int) -> float:
    """Seconds per decode step with ``running`` requests: fixed + per request (overhead + verify + draft)."""
    return 0.004 + running * (0.0012 + 0.00010 * (budget + 1) + 0.00002 * block_size)


def odd_steps(block_size: int, budget: int, topk: int, output_tokens: int) -> int:
    """Verify steps of one request under the odd shape: the first token from prefill, then the
    whole tokens of the accumulated fractional acceptance (what the stream below does)."""
    done, steps, carry = 1, 0, 0.0
    while done < output_tokens:
        carry += odd_accept(block_size, budget, topk)
        whole = int(carry)
        carry -= whole
        done += min(max(1, whole), output_tokens - done)
        steps += 1
    return steps


def odd_tok_s(block_size: int, budget: int, topk: int, concurrency: int, output_tokens: int) -> float:
    """The closed loop's output tok/s under the odd shape (prefill and HTTP cost nothing here)."""
    steps = odd_steps(block_size, budget, topk, output_tokens)
    return concurrency * output_tokens / (steps * odd_step_s(block_size, budget, concurrency))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--speculative-algorithm", default="DFLASH")
    ap.add_argument("--speculative-dflash-block-size", type=int)
    ap.add_argument("--speculative-num-draft-tokens", type=int)
    ap.add_argument("--speculative-eagle-topk", type=int)
    ap.add_argument("--speculative-draft-window-size", type=int)
    ap.add_argument("--load-seconds", type=float, default=0.0, help="answer 503 this long")
    ap.add_argument("--listen-delay", type=float, default=0.0, help="refuse connections this long")
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--exit-code", type=int, default=3)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--spawn-child", action="store_true", help="fork a sleeping worker in our group")
    ap.add_argument("--cost-shape", choices=("odd",), default=None,
                    help="odd: acceptance and step time from odd_accept / odd_step_s (per config, per batch)")
    args = ap.parse_args()

    faults: dict[str, str] = {}
    for spec in args.fault:
        for item in spec.split(","):
            key, _, value = item.partition("=")
            faults[key.strip()] = value.strip()

    print(f"standin: starting with {sys.argv[1:]}", flush=True)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN) if %r else None; time.sleep(600)" % args.ignore_sigterm])
        print(f"standin: worker child pid {child.pid}", flush=True)
    if "crash-on-start" in faults:
        time.sleep(0.3)
        print("standin: RuntimeError: simulated crash while loading weights", flush=True)
        sys.exit(args.exit_code)
    if args.listen_delay:
        time.sleep(args.listen_delay)
    load = args.load_seconds + float(faults.get("slow-start", 0) or 0)
    ready_at = time.monotonic() + load

    info = {
        "speculative_algorithm": args.speculative_algorithm,
        "speculative_dflash_block_size": args.speculative_dflash_block_size,
        "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
        "speculative_eagle_topk": args.speculative_eagle_topk,
        "speculative_draft_window_size": args.speculative_draft_window_size,
        "port": args.port,
        "pid": os.getpid(),
    }
    ignored = faults.get("ignore-config")
    if ignored == "topk":
        info["speculative_eagle_topk"] = 1
    elif ignored:
        info[f"speculative_{ignored}"] = None
    exit_after = int(faults["exit-after"]) if "exit-after" in faults else None
    spec_on = "spec-off" not in faults
    count = {"generate": 0, "running": 0, "batches": 0, "tokens": 0, "verify": 0}
    shown: dict[str, float] = {}  # the lagging avg_spec_accept_length, as SGLang's scheduler logs it
    lock = threading.Lock()

    def decode_batch(tokens: int) -> None:
        with lock:
            count["batches"] += 1
            count["tokens"] += tokens
            count["verify"] += 1
            if spec_on and count["batches"] % DECODE_LOG_INTERVAL == 0:
                shown["avg_spec_accept_length"] = count["tokens"] / count["verify"]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            print("standin: " + fmt % a, flush=True)

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            loading = time.monotonic() < ready_at
            if self.path in ("/health", "/health_generate"):
                self._send(503 if loading else 200, {"loading": loading})
            elif self.path in ("/server_info", "/get_server_info"):
                with lock:
                    self._send(200, {**info, "version": "0.0.0-standin", "internal_states": [dict(shown)]})
            elif self.path in ("/model_info", "/get_model_info"):
                self._send(200, {"model_path": "standin", "tokenizer_path": "standin", "is_generation": True,
                                 "preferred_sampling_params": None, "weight_version": "default",
                                 "has_image_understanding": False, "has_audio_understanding": False,
                                 "model_type": "standin", "architectures": ["StandInForCausalLM"]})
            else:
                self._send(404, {"error": self.path})

        def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
            """A non-streamed answer: the whole output at once, spec fields in meta_info when
            speculating (SGLang's non-streamed /generate carries them as the finished chunk does)."""
            prompt_tokens = len(body["input_ids"]) if "input_ids" in body else len(tokenize(body.get("text") or ""))
            want = int((body.get("sampling_params") or {}).get("max_new_tokens", 128))
            done, steps = 1, 0
            while done < want:
                k = min(ACCEPT_CYCLE[steps % len(ACCEPT_CYCLE)] if spec_on else 1, want - done)
                done += k
                steps += 1
                decode_batch(k)
            meta: dict[str, Any] = {"id": "standin", "prompt_tokens": prompt_tokens, "completion_tokens": done,
                                    "finish_reason": {"type": "length", "length": want}}
            if spec_on:
                meta.update(spec_verify_ct=steps, spec_accept_length=done / steps if steps else 0.0)
            return {"text": "x" * done, "output_ids": [7] * done, "meta_info": meta}

        def _stream(self, body: dict[str, Any]) -> None:
            prompt_tokens = len(body["input_ids"]) if "input_ids" in body else len(tokenize(body.get("text") or ""))
            want = int((body.get("sampling_params") or {}).get("max_new_tokens", 128))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.close_connection = True  # HTTP/1.0 stream: the end of the body is the end of the connection
            done, steps, carry, deadline = 1, 0, 0.0, time.monotonic()
            shape = (args.speculative_dflash_block_size or 8, args.speculative_num_draft_tokens or 8,
                     args.speculative_eagle_topk or 4)
            while True:
                finished = done >= want
                meta = {"id": "standin", "prompt_tokens": prompt_tokens, "completion_tokens": done,
                        "finish_reason": {"type": "length", "length": want} if finished else None}
                if finished and spec_on:  # SGLang puts spec fields on the finished chunk only
                    meta.update(spec_verify_ct=steps, spec_accept_length=done / steps if steps else 0.0)
                chunk = {"text": "x" * done, "output_ids": [7] * done, "meta_info": meta}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if finished:
                    break
                if args.cost_shape == "odd":  # fractional acceptance carried over, step cost by batch
                    with lock:
                        running = count["running"]
                    # paced against deadlines (like the reference engine's StepClock): sleep
                    # overshoot on a loaded box must not add up over a request's steps
                    deadline = max(deadline, time.monotonic() - 0.05) + odd_step_s(shape[0], shape[1], running)
                    time.sleep(max(0.0, deadline - time.monotonic()))
                    carry += odd_accept(*shape)
                    whole = int(carry)
                    carry -= whole
                    k = min(max(1, whole), want - done)
                else:
                    time.sleep(STEP_S)
                    k = min(ACCEPT_CYCLE[steps % len(ACCEPT_CYCLE)] if spec_on else 1, want - done)
                done += k
                steps += 1
                decode_batch(k)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            if self.path in ("/tokenize", "/v1/tokenize"):
                prompt = body.get("prompt")
                if isinstance(prompt, list):
                    ids = [tokenize(p) for p in prompt]
                    self._send(200, {"tokens": ids, "count": [len(i) for i in ids], "max_model_len": 1 << 20})
                else:
                    ids1 = tokenize(str(prompt))
                    self._send(200, {"tokens": ids1, "count": len(ids1), "max_model_len": 1 << 20})
            elif self.path == "/flush_cache":
                with lock:
                    busy = count["running"] > 0
                    if not busy:
                        shown.clear()
                        count.update(batches=0, tokens=0, verify=0)
                self._send(400 if busy else 200, {"flushed": not busy})
            elif self.path == "/generate":
                with lock:
                    count["generate"] += 1
                    n = count["generate"]
                    count["running"] += 1
                try:
                    if body.get("stream"):
                        self._stream(body)
                    else:
                        self._send(200, self._answer(body))
                finally:
                    with lock:
                        count["running"] -= 1
                if exit_after is not None and n >= exit_after:
                    print(f"standin: fault exit-after={exit_after}: exiting with {args.exit_code}", flush=True)
                    self.wfile.flush()
                    os._exit(args.exit_code)
            else:
                self._send(404, {"error": self.path})

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256  # concurrency-32 clients reconnect per request (HTTP/1.0 streams)

    server = Server((args.host, args.port), Handler)
    print(f"standin: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
