#!/usr/bin/env python3
"""A tiny stand-in for an SGLang server, for lifecycle tests that need a real process.

It accepts the reference engine's launch flags and fault specs that matter to the lifecycle:
refuse connections for a while, answer 503 while "loading", crash on start, exit after N
generate requests, ignore a config flag, ignore SIGTERM, fork a worker child (process groups).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
    count = {"generate": 0}
    lock = threading.Lock()

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
                self._send(200, info)
            elif self.path in ("/model_info", "/get_model_info"):
                self._send(200, {"model_path": "standin"})
            else:
                self._send(404, {"error": self.path})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path == "/generate":
                with lock:
                    count["generate"] += 1
                    n = count["generate"]
                self._send(200, {"text": "ok", "meta_info": {"completion_tokens": 1}})
                if exit_after is not None and n >= exit_after:
                    print(f"standin: fault exit-after={exit_after}: exiting with {args.exit_code}", flush=True)
                    self.wfile.flush()
                    os._exit(args.exit_code)
            else:
                self._send(404, {"error": self.path})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"standin: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
