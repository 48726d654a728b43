"""Command line of the reference engine, with SGLang's flag spellings.

Why SGLang's spellings: service profiles map a config to launch flags; the shipped
reference profile uses the same ``config_args`` as a real SGLang deployment, so the
harness code path that starts, verifies and stops a service is the one used in
production. Bad values exit with status 2 and a message (argparse), like a real
launcher refusing its arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from pytest_ddtree.refserver.dialect_rules import DialectError, Resolved
from pytest_ddtree.refserver.dialects import Dialect, DialectDeclarationError, add_speculative_flags, resolve
from pytest_ddtree.refserver.dialects import load as load_dialects
from pytest_ddtree.refserver.dialects import startup_lines as dialect_lines
from pytest_ddtree.refserver.clock import ClockModel
from pytest_ddtree.refserver.engine import VERSION, Engine
from pytest_ddtree.refserver.faults import FAULT_HELP, FaultError, Faults
from pytest_ddtree.refserver.hf_export import export_dir
from pytest_ddtree.refserver.model import CORPUS_DIR, Models, build_models
from pytest_ddtree.refserver.request_state import Request, SamplingParams, SpecConfig
from pytest_ddtree.refserver.server import ServerState, make_server
from pytest_ddtree.suggest import did_you_mean

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


def _engine_version(text: str) -> str:
    """``--engine-version``: what /server_info's ``version`` says; it keeps the ``refserver`` prefix,
    by which the harness knows the engine (``fingerprint.is_reference_engine``)."""
    if not re.fullmatch(r"refserver[A-Za-z0-9._+-]{0,40}", text):
        raise argparse.ArgumentTypeError(f"must start with 'refserver' (e.g. refserver-0.2.0), got {text!r}")
    return text


PROG = "python -m pytest_ddtree.refserver"


def _dialect_of(argv: list[str] | None) -> tuple[Dialect, dict[str, Dialect]]:
    """The ``--dialect`` and the declarations ``--dialects`` adds to the shipped one (they decide
    which speculative flags exist, so they are read first); a bad one exits 2, as argparse does."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--dialect", default="reference")
    pre.add_argument("--dialects", action="append", type=Path, default=[])
    known, _ = pre.parse_known_args(argv)
    fail = argparse.ArgumentParser(prog=PROG).error
    try:
        declared = load_dialects(tuple(known.dialects))
    except DialectDeclarationError as exc:
        fail(f"argument --dialects: {exc}")
    if known.dialect not in declared:
        fail(f"argument --dialect: no dialect {known.dialect!r}; {did_you_mean(known.dialect, declared)}"
             f"declared: {', '.join(declared)} (add one to a file given with --dialects)")
    return declared[known.dialect], declared


def build_parser(dialect: Dialect, declared: dict[str, Dialect]) -> argparse.ArgumentParser:
    faults = "\n".join(f"  {k:<20} {v}" for k, v in FAULT_HELP.items())
    dialects = "\n".join(f"  {k:<20} {d.help}" for k, d in declared.items())
    p = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Reference SGLang-compatible engine with DFlash-style block drafting and DDTree "
            "tree verification over corpus-built models and a simulated accelerator clock."
        ),
        epilog="dialects (--dialect, which build's flags and environment to follow):\n" + dialects
        + "\n\nfaults (--fault, repeatable, comma lists allowed, combinable):\n" + faults,
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    g.add_argument("--port", type=_port, default=30000, help="port (default: %(default)s; 0 picks a free one)")
    g.add_argument("--model-path", "--model", dest="model_path", default=DEFAULT_MODEL_PATH, help="model name reported in /model_info (default: %(default)s)")
    g.add_argument("--tokenizer-path", default=None,
                   help="reported tokenizer path (default: the engine's own tokenizer, exported as a Hugging Face tokenizer directory)")
    g.add_argument("--served-model-name", default=None, help="model name in OpenAI responses (default: the model path)")
    g.add_argument("--context-length", type=_positive_int, default=32768, help="max prompt + output tokens (default: %(default)s)")
    g.add_argument("--max-running-requests", type=_positive_int, default=48, help="continuous-batching batch limit (default: %(default)s)")
    g.add_argument("--decode-log-interval", type=_positive_int, default=40,
                   help="decode batches per log line and per refresh of avg_spec_accept_length (default: %(default)s)")
    g.add_argument("--enable-cache-report", action="store_true",
                   help="report the prefix cache's cached_tokens in OpenAI usage.prompt_tokens_details (as SGLang)")
    g.add_argument("--reasoning-parser", default=None, choices=("qwen3",),
                   help="split a chat's thinking into reasoning_content, as SGLang's --reasoning-parser qwen3 (default: none)")
    g.add_argument("--enable-metrics", action="store_true", help="serve Prometheus text on /metrics (without it /metrics is 404, as in SGLang)")
    g.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR, help="corpus to build the models from (default: the bundled one)")
    # SGLang launch flags the shipped profiles pass: accepted and reported in /server_info, as SGLang
    # reports every server arg; they change nothing in the emulation.
    sg = p.add_argument_group("SGLang launch flags (accepted and reported; no effect on the emulation)")
    sg.add_argument("--tp-size", "--tp", dest="tp_size", type=_positive_int, default=1, help="tensor parallel size (default: %(default)s)")
    sg.add_argument("--trust-remote-code", action="store_true")
    sg.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None)
    sg.add_argument("--attention-backend", default=None)
    sg.add_argument("--mem-fraction-static", type=float, default=None)
    sg.add_argument("--page-size", type=_positive_int, default=1)
    sg.add_argument("--disable-overlap-schedule", action="store_true")
    sg.add_argument("--disable-cuda-graph", action="store_true")
    add_speculative_flags(p, dialect)
    s = p.add_argument_group("drafter")
    s.add_argument("--trained-block-size", type=_positive_int, default=8, help="block size the emulated drafter was trained at (its config's block_size; default: %(default)s)")
    e = p.add_argument_group("emulation")
    e.add_argument("--dialect", choices=list(declared), default="reference", help="which build's flags and environment to follow (default: %(default)s; see below)")
    e.add_argument("--dialects", action="append", type=Path, default=[], metavar="PATH",
                   help="a dialects file (one beside your profiles) whose entries join the shipped pytest_ddtree/refserver/dialects.yaml's")
    e.add_argument("--load-seconds", type=_nonneg_float, default=0.0, help="emulated weight loading; the port stays closed meanwhile (default: %(default)s)")
    e.add_argument("--clock-scale", type=_positive_float, default=1.0, help="simulated seconds per wall second; >1 speeds tests up (default: %(default)s)")
    e.add_argument("--engine-version", type=_engine_version, default=VERSION,
                   help="the version /server_info reports, as SGLang reports its own there (default: %(default)s): "
                        "an engine upgrade between a bless and a judged session, for the build comparison")
    e.add_argument("--seed", "--random-seed", dest="seed", type=int, default=0, help="seed of drafter noise, sampling and faults (default: %(default)s)")
    e.add_argument("--fault", action="append", default=[], metavar="SPEC", help="inject a fault (see below)")
    return p


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Faults]:
    dialect, declared = _dialect_of(argv)
    parser = build_parser(dialect, declared)
    parser.set_defaults(declared_dialect=dialect)
    ns = parser.parse_args(argv)
    try:
        faults = Faults.parse(ns.fault)
    except FaultError as exc:
        parser.error(f"argument --fault: {exc}")
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


def server_args_dict(ns: argparse.Namespace, faults: Faults, resolved: Resolved, spec: SpecConfig, port: int,
                     tokenizer_dir: str | None = None) -> dict[str, Any]:
    """Every server arg as a top-level key, as SGLang's /server_info (http_server.py ``server_info``:
    ``dataclasses.asdict(server_args)``), with the speculative keys named and valued as the dialect's build.
    ``tokenizer_path`` is ``--tokenizer-path`` if given, else the directory the engine exported its own
    tokenizer to (SGLang's default is the model path, which holds the model's tokenizer)."""
    return {
        "model_path": ns.model_path,
        "tokenizer_path": ns.tokenizer_path or tokenizer_dir or ns.model_path,
        "served_model_name": ns.served_model_name or ns.model_path,
        "host": ns.host,
        "port": port,
        "context_length": ns.context_length,
        "max_running_requests": ns.max_running_requests,
        "decode_log_interval": ns.decode_log_interval,
        "enable_metrics": bool(ns.enable_metrics),
        "enable_cache_report": ns.enable_cache_report,
        "reasoning_parser": ns.reasoning_parser,
        "random_seed": ns.seed,
        "seed": ns.seed,
        "tp_size": ns.tp_size,
        "trust_remote_code": ns.trust_remote_code,
        "speculative_draft_model_path": ns.speculative_draft_model_path,
        "attention_backend": ns.attention_backend,
        "mem_fraction_static": ns.mem_fraction_static,
        "page_size": ns.page_size,
        "disable_overlap_schedule": ns.disable_overlap_schedule,
        "disable_cuda_graph": ns.disable_cuda_graph,
        **resolved.server_args,
        "compact_cache": bool(spec.speculative and resolved.window is not None),
        "dialect": ns.dialect,
        "trained_block_size": ns.trained_block_size,
        "load_seconds": ns.load_seconds,
        "clock_scale": ns.clock_scale,
        "fault": list(faults.specs),
        "corpus_dir": str(ns.corpus_dir),
    }


def served_config(resolved: Resolved, topk: int, faults: Faults, trained_block_size: int) -> SpecConfig:
    """What the engine really runs: the resolved config, unless a fault makes it serve another
    block size or budget (serve-*) or drop topk or the window (unused-config) while reporting the
    resolved values in /server_info: a build that accepts a config and serves another."""
    speculative = resolved.algorithm != "NONE"
    block = faults.serve_block_size if speculative and faults.serve_block_size else resolved.block_size
    budget = faults.serve_budget if speculative and faults.serve_budget else resolved.budget
    if speculative and "topk" in faults.unused_config:
        topk = 1
    window = None if "window" in faults.unused_config else resolved.window
    eagle = resolved.server_args.get("speculative_algorithm") in ("EAGLE", "EAGLE3")  # the worker's metrics (spec_gauges.py)
    return SpecConfig(algorithm=resolved.algorithm, block_size=block, budget=budget, topk=topk, window=window,
                      trained_block_size=trained_block_size, worker_steps=block - 1 if eagle else 1,
                      worker_draft_tokens=budget + 1 if eagle else None)


def startup_lines(dialect: Dialect, resolved: Resolved, spec: SpecConfig, faults: Faults, attention_backend: str | None) -> list[str]:
    """The start-up lines in which each build's speculative worker prints the values it runs with.

    A worker prints what it really uses, so the block size and budget are the served ones (a
    serve-* fault shows here, not in /server_info); the window and topk are printed as given,
    because the builds print them even where the worker never uses them (an unused-config fault
    is invisible here, as on those builds).

    The lines are the dialect's ``startup_lines`` (pytest_ddtree/refserver/dialects.yaml); those shipped:

    - upstream DFLASH (sgl-project/sglang python/sglang/srt/speculative/dflash_worker.py
      ``DFlashWorker.__init__``): ``Initialized DFLASH draft runner. attention_backend=%s, model=%s,
      block_size=%s, draft_window_size=%s, compact_cache=%s``; the SubSir fork's worker prints the
      same line (and its window even though one worker version never uses it);
    - PR 27509 v2 (Rancy-Wang/sglang ddtree-v2, the DDTREE v2 worker): ``Initialized DDTREE v2 worker.
      block_size=%s, tree_budget=%s, ...``;
    - the reference dialect: the DFLASH runner line and PR 27509 v1's ``Initialized DDTree worker.
      block_size=%s, tree_budget=%s`` (it has a budget and a topk of its own: ``topk=%s`` is added).
    """
    if not spec.speculative:
        return []
    topk = resolved.topk if "topk" in faults.unused_config else spec.topk
    return dialect_lines(dialect, {"backend": attention_backend or "triton", "block_size": spec.block_size,
                                   "budget": spec.budget, "topk": topk, "window": resolved.window,
                                   "compact": resolved.window is not None})


def _refuse(message: str) -> int:
    """A build refusing its arguments: SGLang raises ValueError in ServerArgs before the port opens."""
    log("ERROR:    Traceback (most recent call last):\n"
        '  File "sglang/srt/server_args.py", in __post_init__\n'
        f"ValueError: {message}")
    return 1


def main(argv: list[str] | None = None) -> int:
    ns, faults = parse_args(argv)
    log(f"refserver {ns.engine_version} starting (dialect {ns.dialect})")
    try:
        resolved = resolve(ns.declared_dialect, ns, os.environ, drafter_block_size=ns.trained_block_size, tp_size=ns.tp_size)
    except DialectError as exc:
        return _refuse(str(exc))
    resolved, spec = _served(ns, faults, resolved)
    if faults.crash_on_start:
        log("ERROR:    Traceback (most recent call last):\n"
            '  File "pytest_ddtree/refserver/cli.py", line 1, in load_model\n'
            "RuntimeError: injected fault crash-on-start: CUDA error: out of memory")
        log("ERROR:    Initialization failed. exiting")
        return 1
    signal.signal(signal.SIGTERM, _handle_term)
    if faults.claim_slow_launch():
        log(f"injected fault slow-launch: this launch runs {faults.slowdown:g}x slower")
    loaded = _load_weights(ns)
    if loaded is None:
        return 1
    models, tokenizer_dir = loaded
    if ns.declared_dialect.topk_capped_by_vocab and spec.speculative:  # PR 27509's ddtree_utils.py: topk = min(tree_budget, V)
        spec = dataclasses.replace(spec, topk=min(spec.budget, models.tokenizer.vocab_size))
    for line in startup_lines(ns.declared_dialect, resolved, spec, faults, ns.attention_backend):
        log(line)

    state = ServerState(server_args={}, faults=faults, seed=ns.seed, context_length=ns.context_length, log=log,
                        version=ns.engine_version)
    try:
        httpd = make_server(state, ns.host, ns.port)
    except OSError as exc:
        log(f"ERROR:    could not bind {ns.host}:{ns.port}: {exc}")
        return 1
    port = int(httpd.server_address[1])
    state.server_args = server_args_dict(ns, faults, resolved, spec, port, tokenizer_dir)
    state.models = models
    args_text = ", ".join(f"{k}={v!r}" for k, v in state.server_args.items())
    log(f"server_args=ServerArgs({args_text})")
    if spec.speculative and spec.window is not None:
        log(f"DFLASH draft window size {spec.window}: compact cache enabled")
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
    log(
        f"Speculative: algorithm={spec.algorithm} block_size={spec.block_size} budget={spec.budget} "
        f"topk={spec.topk} window={spec.window}"
    )
    log(f"INFO:     Uvicorn-compatible server listening on http://{ns.host}:{port}")
    threading.Thread(target=_warm_up, args=(state, engine, faults), name="refserver-warmup", daemon=True).start()
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("Keyboard interrupt; shutting down")
    finally:
        httpd.server_close()
    return 0


def _served(ns: argparse.Namespace, faults: Faults, resolved: Resolved) -> tuple[Resolved, SpecConfig]:
    """The resolved flags as the engine serves them (the topk fault applied) and its spec config."""
    for warning in resolved.warnings:
        log(f"WARNING:  {warning}")
    topk = resolved.topk
    server_args = dict(resolved.server_args)
    if "topk" in faults.ignore_config and resolved.algorithm == "DFLASH" and ns.declared_dialect.ignored_topk_fault:
        topk = 1  # what upstream SGLang silently does to DFLASH
        server_args["speculative_eagle_topk"] = 1
    resolved = dataclasses.replace(resolved, server_args=server_args)
    return resolved, served_config(resolved, topk, faults, ns.trained_block_size)


def _handle_term(signum: int, frame: FrameType | None) -> None:
    log(f"Received signal {signum}; shutting down")
    raise SystemExit(0)


def _load_weights(ns: argparse.Namespace) -> tuple[Models, str | None] | None:
    """The models and the exported tokenizer's folder (None: not exported), or None when
    loading failed (logged as SGLang logs it).

    Weights load before the HTTP server exists: SGLang's launch_server starts uvicorn only after
    the scheduler processes have loaded the model (entrypoints/http_server.py ``launch_server``),
    so connection refused is what a client sees meanwhile.
    """
    t0 = time.monotonic()
    log(f"Load weight begin. model_path={ns.model_path}")
    try:
        models = build_models(ns.corpus_dir)
    except Exception:
        log("ERROR:    " + traceback.format_exc().rstrip())
        log("ERROR:    Initialization failed. exiting")
        return None
    tokenizer_dir: str | None = None
    try:
        tokenizer_dir = str(export_dir(models.tokenizer, models.corpus.digest))
    except OSError as exc:
        log(f"WARNING:  the tokenizer could not be exported for Hugging Face loaders ({exc}); "
            "/model_info's tokenizer_path names the model path instead")
    if ns.load_seconds > 0:
        log(f"Emulated weight loading: {ns.load_seconds:.1f} s")
        time.sleep(ns.load_seconds)
    log(
        f"Load weight end. corpus={models.corpus.digest} tokens={models.sam.n_tokens} "
        f"states={models.sam.n_states} vocab={models.tokenizer.vocab_size} ({time.monotonic() - t0:.2f} s)"
    )
    return models, tokenizer_dir


def _warm_up(state: ServerState, engine: Engine, faults: Faults) -> None:
    """SGLang's ``_execute_server_warmup`` (entrypoints/http_server.py): one short generation
    after the port opens; health answers 503 until it is done (server_status Starting)."""
    assert state.models is not None
    try:
        warm = Request(state.models.tokenizer.encode("The capital city of France is"),
                       SamplingParams(max_new_tokens=8, temperature=0.0), internal=True)
        engine.submit(warm)
        if not warm.done.wait(600):
            raise RuntimeError("the warm-up generation did not finish")
        if faults.slow_start > 0:
            log(f"Warm-up held for {faults.slow_start:.1f} s (fault slow-start)")
            time.sleep(faults.slow_start)
        state.ready.set()
        log("The server is fired up and ready to roll!")
    except Exception:
        log("ERROR:    " + traceback.format_exc().rstrip())
        log("ERROR:    Initialization failed. exiting")
        os._exit(1)
