"""Command line of the reference engine, with SGLang's flag spellings.

Why SGLang's spellings: service profiles map a config to launch flags; the shipped
reference profile uses the same ``config_args`` as a real SGLang deployment, so the
harness code path that starts, verifies and stops a service is the one used in
production. Bad values exit with status 2 and a message (argparse), like a real
launcher refusing its arguments.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from .engine import VERSION, ClockModel, Engine, SpecConfig
from .faults import FAULT_HELP, FaultError, Faults
from .model import CORPUS_DIR, build_models
from .server import ServerState, make_server

DEFAULT_MODEL_PATH = "refserver/tiny-infinigram"


def _int_in(low: int, high: int | None = None, what: str = "int") -> Callable[[str], int]:
    """An argparse ``type=``: an int in ``low..high``, refused with a message that says so."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} value: {text!r}") from None
        if v < low or (high is not None and v > high):
            bounds = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {v}")
        return v

    return parse


_positive_int = _int_in(1)
_port = _int_in(0, 65535, "port")


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def _positive_float(text: str) -> float:
    v = _nonneg_float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _algorithm(text: str) -> str:
    v = text.strip().upper()
    if v not in ("DFLASH", "NONE"):
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from DFLASH, NONE)")
    return v


def _window(text: str) -> int | None:
    if text.strip().lower() in ("none", "null", ""):
        return None
    return _positive_int(text)


def build_parser() -> argparse.ArgumentParser:
    faults = "\n".join(f"  {k:<20} {v}" for k, v in FAULT_HELP.items())
    p = argparse.ArgumentParser(
        prog="python -m pytest_ddtree.refserver",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Reference SGLang-compatible engine with DFlash-style block drafting and DDTree "
            "tree verification over corpus-built models and a simulated accelerator clock."
        ),
        epilog="faults (--fault, repeatable, comma lists allowed, combinable):\n" + faults,
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    g.add_argument("--port", type=_port, default=30000, help="port (default: %(default)s; 0 picks a free one)")
    g.add_argument("--model-path", default=DEFAULT_MODEL_PATH, help="model name reported in /model_info (default: %(default)s)")
    g.add_argument("--tokenizer-path", default=None, help="reported tokenizer path (default: the model path)")
    g.add_argument("--served-model-name", default=None, help="model name in OpenAI responses (default: the model path)")
    g.add_argument("--context-length", type=_positive_int, default=32768, help="max prompt + output tokens (default: %(default)s)")
    g.add_argument("--max-running-requests", type=_positive_int, default=48, help="continuous-batching batch limit (default: %(default)s)")
    g.add_argument("--decode-log-interval", type=_positive_int, default=40, help="log a decode line every N steps (default: %(default)s)")
    g.add_argument("--enable-metrics", action="store_true", help="accepted for SGLang compatibility; /metrics is always on")
    g.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR, help="corpus to build the models from (default: the bundled one)")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", type=_algorithm, default="DFLASH", help="DFLASH (DDTree verification) or NONE (default: %(default)s)")
    s.add_argument("--speculative-dflash-block-size", type=_positive_int, default=8, help="drafter block size; the tree depth is block_size - 1 (default: %(default)s)")
    s.add_argument("--speculative-num-draft-tokens", type=_positive_int, default=8, help="DDTree budget: non-root tree nodes verified per step (default: %(default)s)")
    s.add_argument("--speculative-eagle-topk", type=_positive_int, default=4, help="candidates per depth (default: %(default)s)")
    s.add_argument("--speculative-draft-window-size", "--speculative-dflash-draft-window-size", dest="speculative_draft_window_size", type=_window, default=None, help="drafter sees only the last W tokens (compact cache); absent = no window")
    s.add_argument("--speculative-num-steps", type=_positive_int, default=1, help="accepted for SGLang compatibility (DFLASH uses 1)")
    s.add_argument("--trained-block-size", type=_positive_int, default=8, help="block size the emulated drafter was trained at (default: %(default)s)")
    e = p.add_argument_group("emulation")
    e.add_argument("--load-seconds", type=_nonneg_float, default=0.0, help="emulated weight loading; health answers 503 meanwhile (default: %(default)s)")
    e.add_argument("--clock-scale", type=_positive_float, default=1.0, help="simulated seconds per wall second; >1 speeds tests up (default: %(default)s)")
    e.add_argument("--seed", "--random-seed", dest="seed", type=int, default=0, help="seed of drafter noise, sampling and faults (default: %(default)s)")
    e.add_argument("--fault", action="append", default=[], metavar="SPEC", help="inject a fault (see below)")
    return p


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Faults]:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        faults = Faults.parse(ns.fault)
    except FaultError as exc:
        parser.error(f"argument --fault: {exc}")
    if ns.speculative_dflash_block_size < 2:
        parser.error("argument --speculative-dflash-block-size: must be >= 2 (depth = block_size - 1)")
    if ns.trained_block_size < 2:
        parser.error("argument --trained-block-size: must be >= 2")
    if not ns.corpus_dir.is_dir():
        parser.error(f"argument --corpus-dir: not a directory: {ns.corpus_dir}")
    return ns, faults


def log(msg: str) -> None:
    """SGLang-like log line on stderr (the harness shows the tail on failures)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}] {msg}\n" if not msg.startswith(("INFO:", "ERROR:", "WARNING:")) else msg + "\n")
    sys.stderr.flush()


def server_args_dict(ns: argparse.Namespace, faults: Faults, spec: SpecConfig, port: int) -> dict[str, Any]:
    speculative = spec.speculative
    return {
        "model_path": ns.model_path,
        "tokenizer_path": ns.tokenizer_path or ns.model_path,
        "served_model_name": ns.served_model_name or ns.model_path,
        "host": ns.host,
        "port": port,
        "context_length": ns.context_length,
        "max_running_requests": ns.max_running_requests,
        "decode_log_interval": ns.decode_log_interval,
        "enable_metrics": True,
        "random_seed": ns.seed,
        "seed": ns.seed,
        "speculative_algorithm": spec.algorithm,
        "speculative_dflash_block_size": spec.block_size if speculative else None,
        "speculative_num_draft_tokens": spec.budget if speculative else None,
        "speculative_eagle_topk": spec.topk if speculative else None,
        "speculative_num_steps": 1 if speculative else None,
        "speculative_draft_window_size": spec.window if speculative else None,
        "speculative_dflash_draft_window_size": spec.window if speculative else None,
        "compact_cache": bool(speculative and spec.window is not None),
        "trained_block_size": ns.trained_block_size,
        "load_seconds": ns.load_seconds,
        "clock_scale": ns.clock_scale,
        "fault": list(faults.specs),
        "corpus_dir": str(ns.corpus_dir),
    }


def main(argv: list[str] | None = None) -> int:
    ns, faults = parse_args(argv)
    topk = ns.speculative_eagle_topk
    if "topk" in faults.ignore_config and ns.speculative_algorithm == "DFLASH":
        topk = 1  # what upstream SGLang silently does to DFLASH
    spec = SpecConfig(
        algorithm=ns.speculative_algorithm,
        block_size=ns.speculative_dflash_block_size,
        budget=ns.speculative_num_draft_tokens,
        topk=topk,
        window=ns.speculative_draft_window_size,
        trained_block_size=ns.trained_block_size,
    )
    log(f"refserver {VERSION} starting")
    if faults.crash_on_start:
        log("ERROR:    Traceback (most recent call last):\n"
            '  File "pytest_ddtree/refserver/cli.py", line 1, in load_model\n'
            "RuntimeError: injected fault crash-on-start: CUDA error: out of memory")
        log("ERROR:    Initialization failed. exiting")
        return 1

    state = ServerState(server_args={}, faults=faults, seed=ns.seed, context_length=ns.context_length, log=log)
    try:
        httpd = make_server(state, ns.host, ns.port)
    except OSError as exc:
        log(f"ERROR:    could not bind {ns.host}:{ns.port}: {exc}")
        return 1
    port = int(httpd.server_address[1])
    state.server_args = server_args_dict(ns, faults, spec, port)
    args_text = ", ".join(f"{k}={v!r}" for k, v in state.server_args.items())
    log(f"server_args=ServerArgs({args_text})")
    if spec.speculative and spec.window is not None:
        log(f"DFLASH draft window size {spec.window}: compact cache enabled")
    log(f"INFO:     Uvicorn-compatible server listening on http://{ns.host}:{port}")

    def handle_term(signum: int, frame: FrameType | None) -> None:
        log(f"Received signal {signum}; shutting down")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, handle_term)

    def load() -> None:
        try:
            t0 = time.monotonic()
            log(f"Load weight begin. model_path={ns.model_path}")
            models = build_models(ns.corpus_dir)
            state.models = models
            log(
                f"Load weight end. corpus={models.corpus.digest} tokens={models.sam.n_tokens} "
                f"states={models.sam.n_states} vocab={models.tokenizer.vocab_size} "
                f"({time.monotonic() - t0:.2f} s)"
            )
            wait = ns.load_seconds + faults.slow_start
            if wait > 0:
                log(f"Emulated weight loading: {wait:.1f} s")
                time.sleep(wait)
            engine = Engine(
                models,
                spec,
                max_running_requests=ns.max_running_requests,
                clock=ClockModel(),
                clock_scale=ns.clock_scale,
                seed=ns.seed,
                faults=faults,
                log=log,
                decode_log_interval=ns.decode_log_interval,
            )
            engine.start()
            state.engine = engine
            mem = state.server_args
            log(
                f"Speculative: algorithm={spec.algorithm} block_size={mem['speculative_dflash_block_size']} "
                f"num_draft_tokens={mem['speculative_num_draft_tokens']} topk={mem['speculative_eagle_topk']} "
                f"window={mem['speculative_draft_window_size']}"
            )
            state.ready.set()
            log("The server is fired up and ready to roll!")
        except Exception:
            log("ERROR:    " + traceback.format_exc().rstrip())
            log("ERROR:    Initialization failed. exiting")
            import os

            os._exit(1)

    threading.Thread(target=load, name="refserver-load", daemon=True).start()
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("Keyboard interrupt; shutting down")
    finally:
        httpd.server_close()
    return 0
