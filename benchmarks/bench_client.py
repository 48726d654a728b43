#!/usr/bin/env python3
"""The plugin's load generator and SGLang 0.5.23's own bench_serving, side by side (prints figures).

Why: users already run ``python -m sglang.benchmark.serving`` (bench_serving); the gate's numbers
come from ``pytest_ddtree.measure.load``. Both are measured against the truth on two servers, with the
client CPU each spends per 1000 output tokens:

* ``metronome``: a server of known speed (started by this script): every request gets its first
  token 20 ms after it arrives and then one token every 10 ms in its own chunk, whatever the
  concurrency: 100 tok/s per request. Truth: the tokens it sent / the time it had a request in
  flight (aggregate), and each request's (tokens - 1) / (last send - first send) from its own
  clock (per request);
* ``refserver``: the embedded reference engine (bs8_b8_k4, ``--clock-scale 1``). Truth: its exact
  accounting, output tokens / simulated busy seconds / clock scale (aggregate only: the engine
  reports no per-request decode time). ``late s``: seconds the engine fell behind its simulated
  clock (its CPU starved by the client on a small machine): the truth then overstates what the
  engine could deliver, and the ratio measures the machine.

bench_serving runs through its three SGLang backends (``sglang`` with ``--dataset-name random-ids
--tokenize-prompt``, ``sglang-oai`` and ``sglang-oai-chat`` with ``random-ids`` as text, since
bench_serving refuses ``--tokenize-prompt`` for them), with the tokenizer it finds through
``/model_info``, from a throwaway venv: ``pip install --no-deps sglang==0.5.23`` plus the few
pure-Python packages its client imports (``bench_serving_shim.py``, which also holds the shim that
keeps torch out). The plugin's client sends random ids too. Each client runs in its own process;
its CPU is that process's CPU over the measured run (imports and data set excluded). Neither
client warms up (``--warmup-requests 0``; a cell without warm-up requests), so the truth covers
exactly the measured requests.

Usage: python benchmarks/bench_client.py [--venv DIR] [--concurrency 1 32] [--output-tokens 128]
       [--input-tokens 256] [--requests-per-client 8] [--servers metronome,refserver]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_serving_shim import PACKAGES, SGLANG  # noqa: E402
from pytest_ddtree.metrics import OUTPUT_THROUGHPUT  # noqa: E402
from pytest_ddtree.service.pool import free_port  # noqa: E402

SHIM = REPO / "benchmarks" / "bench_serving_shim.py"
DEFAULT_VENV = Path(tempfile.gettempdir()) / "pytest-ddtree-bench-serving-0.5.23"
BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")
TTFT_S = 0.020
ITL_S = 0.010
REFSERVER_ARGS = ("--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "8", "--speculative-eagle-topk", "4")


# -- the bench_serving environment -----------------------------------------------------------------


def ensure_venv(venv: Path) -> Path:
    """A venv with bench_serving's client and nothing GPU; built once (a few minutes)."""
    python = venv / "bin" / "python"
    probe = "import importlib.util as u, sys; sys.exit(0 if all(map(u.find_spec, ['sglang', 'transformers', 'aiohttp'])) else 1)"
    if python.is_file() and subprocess.run([str(python), "-c", probe]).returncode == 0:
        return python
    print(f"building {venv}: pip install --no-deps {SGLANG}; pip install {' '.join(PACKAGES)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", SGLANG], check=True)
    subprocess.run([*pip, *PACKAGES], check=True)
    return python


# -- the metronome: a server of known speed ----------------------------------------------------------


class Metronome:
    """Counters shared by the handler threads (the truth of the metronome)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.busy_since = 0.0
        self.busy_s = 0.0
        self.tokens = 0
        self.rates: list[float] = []  # per request: (tokens - 1) / (last send - first send)

    def begin(self) -> None:
        with self.lock:
            if self.in_flight == 0:
                self.busy_since = time.monotonic()
            self.in_flight += 1

    def end(self, tokens: int, first: float, last: float) -> None:
        with self.lock:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy_s += time.monotonic() - self.busy_since
            self.tokens += tokens
            if tokens > 1 and last > first:
                self.rates.append((tokens - 1) / (last - first))

    def state(self) -> dict[str, Any]:
        with self.lock:
            busy = self.busy_s + (time.monotonic() - self.busy_since if self.in_flight else 0.0)
            return {"total_output_tokens": self.tokens, "busy_seconds": busy, "rates": list(self.rates)}


def serve_metronome(port: int) -> None:
    """Serve SGLang's /generate and OpenAI streams at exactly TTFT_S + ITL_S per token (blocking)."""
    from pytest_ddtree.refserver.hf_export import export_dir
    from pytest_ddtree.refserver.model import build_models

    models = build_models()
    tok = models.tokenizer
    tokenizer_path = str(export_dir(tok, models.corpus.digest))
    out_id = tok.reserved_offset  # every output token is one reserved token (a space + one character)
    out_text = tok.decode([out_id])
    meter = Metronome()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        prompt_tokens = 0

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def send_json(self, obj: Any, status: int = 200) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                self.send_json({})
            elif path == "/v1/models":
                self.send_json({"object": "list", "data": [{"id": "metronome", "object": "model"}]})
            elif path in ("/model_info", "/get_model_info"):
                self.send_json({"model_path": "metronome", "tokenizer_path": tokenizer_path, "is_generation": True})
            elif path in ("/server_info", "/get_server_info"):
                self.send_json({"internal_states": [meter.state()]})
            else:
                self.send_json({"error": "not found"}, 404)

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?")[0]
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw) if raw.strip() else {}
            if path == "/flush_cache":
                self.send_json({})
            elif path in ("/tokenize", "/v1/tokenize"):
                ids = tok.encode(body["prompt"])
                self.send_json({"tokens": ids, "count": len(ids), "max_model_len": 1 << 20})
            elif path == "/generate":
                n = int((body.get("sampling_params") or {}).get("max_new_tokens", 128))
                self.prompt_tokens = len(body.get("input_ids") or tok.encode(body.get("text") or ""))
                self.stream(n, "sglang", bool(body.get("stream")))
            elif path in ("/v1/completions", "/v1/chat/completions"):
                n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self.stream(n, "chat" if "chat" in path else "completion", bool(body.get("stream")), usage)
            else:
                self.send_json({"error": "not found"}, 404)

        def stream(self, n: int, shape: str, stream: bool, usage: bool = False) -> None:
            arrival = time.monotonic()
            meter.begin()
            first = last = arrival
            try:
                if not stream:
                    for k in range(n):
                        self.wait(arrival + TTFT_S + k * ITL_S)
                    first, last = arrival + TTFT_S, time.monotonic()
                    self.send_json(self.final(n, shape))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for k in range(n):
                    self.wait(arrival + TTFT_S + k * ITL_S)
                    self.event(self.chunk(k + 1, n, shape))
                    last = time.monotonic()
                    if k == 0:
                        first = last
                if usage:
                    self.event({"choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}})
                self.event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
            finally:
                meter.end(n, first, last)

        @staticmethod
        def wait(deadline: float) -> None:
            while (delay := deadline - time.monotonic()) > 0:
                time.sleep(delay)

        def event(self, payload: Any) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            body = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(body):X}\r\n".encode() + body + b"\r\n")
            self.wfile.flush()

        def chunk(self, done: int, n: int, shape: str) -> dict[str, Any]:
            finish = "length" if done == n else None
            if shape == "sglang":
                meta: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": done, "cached_tokens": 0,
                                        "finish_reason": {"type": "length", "length": n} if finish else None}
                return {"text": out_text * done, "output_ids": [out_id] * done, "meta_info": meta}
            key = "delta" if shape == "chat" else None
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if key:
                choice["delta"] = {"content": out_text}
            else:
                choice["text"] = out_text
            return {"id": "m", "object": "chunk", "model": "metronome", "choices": [choice]}

        def final(self, n: int, shape: str) -> dict[str, Any]:
            if shape == "sglang":
                return {"text": out_text * n, "output_ids": [out_id] * n,
                        "meta_info": {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "finish_reason": {"type": "length", "length": n}}}
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            if shape == "chat":
                choice["message"] = {"role": "assistant", "content": out_text * n}
            else:
                choice["text"] = out_text * n
            return {"choices": [choice], "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}}

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    Server(("127.0.0.1", port), Handler).serve_forever()


# -- servers ---------------------------------------------------------------------------------------------


@contextmanager
def server(kind: str, clock_scale: float) -> Iterator[str]:
    port = free_port()
    if kind == "metronome":
        cmd = [sys.executable, __file__, "--serve-metronome", str(port)]
    else:
        cmd = [sys.executable, "-m", "pytest_ddtree.refserver", "--port", str(port), "--clock-scale", str(clock_scale),
               *REFSERVER_ARGS]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"{kind} did not start:\n{log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def truth_state(url: str) -> dict[str, Any]:
    state: dict[str, Any] = requests.get(url + "/server_info", timeout=10).json()["internal_states"][0]
    if "clock_scale" not in state:
        info = requests.get(url + "/server_info", timeout=10).json()
        state["clock_scale"] = info.get("clock_scale")
    return state


def truth(before: dict[str, Any], after: dict[str, Any]) -> tuple[float, float | None, float]:
    """(aggregate output tok/s, mean per-request decode tok/s or None, seconds the engine fell
    behind its clock) over a client's run."""
    tokens = after["total_output_tokens"] - before["total_output_tokens"]
    if "busy_seconds" in after:  # metronome
        rates = after["rates"][len(before["rates"]):]
        return tokens / (after["busy_seconds"] - before["busy_seconds"]), sum(rates) / len(rates) if rates else None, 0.0
    busy = (after["simulated_busy_seconds"] - before["simulated_busy_seconds"]) / float(after["clock_scale"])
    late = after["clock_overrun_seconds"] - before["clock_overrun_seconds"]
    return tokens / busy, None, late


# -- the clients -----------------------------------------------------------------------------------------


def run_ours(url: str, concurrency: int, requests_n: int, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The plugin's load generator, in this (child) process; CPU over run_cell."""
    from pytest_ddtree.measure import load
    from pytest_ddtree.service.client import SGLangClient

    cell = load.Cell("bench", concurrency, input_tokens, output_tokens, requests_n, 0, "random")
    with SGLangClient(url) as client:
        maker = load.prompt_maker(client, vocab_size=163840)  # random ids, as bench_serving's random-ids
        t0 = time.process_time()
        res = load.run_cell(client, cell, prompts=maker)
        cpu = time.process_time() - t0
    m = res.metrics()
    return {OUTPUT_THROUGHPUT: m[OUTPUT_THROUGHPUT], "mean_tpot_ms": m["mean_tpot_ms"],
            "total_output_tokens": m["total_output_tokens"], "cpu_s": cpu, "valid": res.valid}


def run_bench_serving(python: Path, url: str, backend: str, concurrency: int, requests_n: int, input_tokens: int,
                      output_tokens: int) -> dict[str, Any]:
    host, port = url.rsplit(":", 1)
    with tempfile.TemporaryDirectory() as tmp:
        out, cpu_file = Path(tmp) / "result.jsonl", Path(tmp) / "cpu"
        cmd = [str(python), str(SHIM), "--backend", backend, "--host", host.split("//")[1], "--port", port,
               "--dataset-name", "random-ids", "--num-prompts", str(requests_n), "--random-input-len", str(input_tokens),
               "--random-output-len", str(output_tokens), "--random-range-ratio", "1", "--max-concurrency", str(concurrency),
               "--warmup-requests", "0", "--output-file", str(out), "--disable-tqdm"]
        if backend == "sglang":
            cmd.append("--tokenize-prompt")
        env = dict(os.environ, BENCH_CPU_FILE=str(cpu_file), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"bench_serving {backend} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        result = json.loads(out.read_text().splitlines()[-1])
        return {OUTPUT_THROUGHPUT: result[OUTPUT_THROUGHPUT], "mean_tpot_ms": result["mean_tpot_ms"],
                "total_output_tokens": result["total_output_tokens"], "cpu_s": float(cpu_file.read_text()), "valid": True}


def measure(python: Path, kind: str, url: str, client: str, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    n = args.requests_per_client * max(1, concurrency // 4) if concurrency > 1 else args.requests_per_client
    before = truth_state(url)
    if client == "pytest-ddtree":
        cmd = [sys.executable, __file__, "--run-ours", url, str(concurrency), str(n), str(args.input_tokens), str(args.output_tokens)]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"our client failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        got = run_bench_serving(python, url, client.split(":", 1)[1], concurrency, n, args.input_tokens, args.output_tokens)
    aggregate, per_request, late = truth(before, truth_state(url))
    got.update(server=kind, client=client, concurrency=concurrency, requests=n, truth=aggregate, truth_per_request=per_request,
               engine_late_s=late)
    return got


def report(rows: list[dict[str, Any]]) -> None:
    head = (f"{'server':<10} {'conc':>4}  {'client':<28} {'out tok/s':>10} {'truth':>10} {'ratio':>6}  "
            f"{'tok/s/req':>9} {'truth/req':>9}  {'cpu s/1k tok':>12} {'late s':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        per_req = 1000.0 / r["mean_tpot_ms"] if r.get("mean_tpot_ms") else float("nan")
        truth_req = r["truth_per_request"]
        print(f"{r['server']:<10} {r['concurrency']:>4}  {r['client']:<28} {r[OUTPUT_THROUGHPUT]:>10.1f} {r['truth']:>10.1f} "
              f"{r[OUTPUT_THROUGHPUT] / r['truth']:>6.3f}  {per_req:>9.1f} "
              f"{(f'{truth_req:.1f}' if truth_req else '-'):>9}  {1000.0 * r['cpu_s'] / max(1, r['total_output_tokens']):>12.4f}"
              f" {r['engine_late_s']:>6.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="throwaway venv for bench_serving (built if missing)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--input-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--requests-per-client", type=int, default=8, help="requests at concurrency 1 (x concurrency/4 above)")
    p.add_argument("--servers", default="metronome,refserver")
    p.add_argument("--clock-scale", type=float, default=1.0, help="the reference engine's (default 1: least engine CPU per wall second)")
    p.add_argument("--clients", default="pytest-ddtree," + ",".join(f"bench_serving:{b}" for b in BACKENDS))
    p.add_argument("--serve-metronome", type=int, help=argparse.SUPPRESS)
    p.add_argument("--run-ours", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_metronome:
        serve_metronome(args.serve_metronome)
        return
    if args.run_ours:
        url, c, n, i, o = args.run_ours
        print(json.dumps(run_ours(url, int(c), int(n), int(i), int(o))))
        return
    python = ensure_venv(args.venv)
    rows: list[dict[str, Any]] = []
    for kind in args.servers.split(","):
        with server(kind, args.clock_scale) as url:
            for c in args.concurrency:
                for client in args.clients.split(","):
                    row = measure(python, kind, url, client, c, args)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print()
    report(rows)
    print(f"\n(measured on {os.cpu_count()} cores at load average {os.getloadavg()[0]:.1f}; truth: the metronome's own "
          "clock, the reference engine's exact accounting)")


if __name__ == "__main__":
    main()
