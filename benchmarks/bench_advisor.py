"""Adaptive-sweep quality over the whole matrix, simulated on the refserver's own cost model.

Why simulated: a full 18-config sweep on the reference engine takes minutes of two shared
cores per run; the truth here is what that engine would measure. Each config's accept length
comes from the refserver's real drafter, DDTree build and verify (run in-process on corpus
prompts, no clock), and each cell's tok/s from its ClockModel (decode step = fixed + verify
width x batch + draft + context; prefill per wave) for a closed loop of ``concurrency``
requests; measurements get 1.5% multiplicative noise. The advisor then measures N configs
and predicts the rest; we print the Done-when figures per N over several noise seeds.

Run: .venv/bin/python benchmarks/bench_advisor.py [--engine-truth]
     .venv/bin/python benchmarks/bench_advisor.py --end-to-end [N ...] [--truth FULL_SWEEP_DIR | --parallel]   (default N = 6)
(``--end-to-end``: the real plugin, no simulation: a full 18-config sweep of the shipped matrix
on the reference engine, then ``--ddtree-max-restarts N`` sessions, compared; tens of minutes;
``--parallel`` runs them all at once, for a machine with a core or two per session.)
(``--engine-truth``, about a minute: every cell's truth and accept length from the engine's own
scheduler driven as a closed loop on a fake clock, instead of the closed form.)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT
from pytest_ddtree.adaptive.advisor import CellPoint, ConfigPoint, Measurement, Planner
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.refserver.clock import ClockModel, StepClock
from pytest_ddtree.refserver.engine import Engine
from pytest_ddtree.refserver.request_state import Request, SamplingParams, SpecConfig
from pytest_ddtree.refserver.model import build_models

ROOT = Path(__file__).resolve().parents[1]


class _FakeTime:
    """A clock whose sleep advances it: the engine's pacing costs no wall time."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, d: float) -> None:
        self.t += d


def accept_lengths(configs: list[ConfigPoint], windows: dict[str, int | None], prompts: int = 12) -> dict[str, float]:
    models = build_models()
    tok = models.tokenizer
    pairs = models.corpus.pairs[:prompts]
    out: dict[str, float] = {}
    for c in configs:
        ft = _FakeTime()
        spec = SpecConfig(block_size=c.block_size, budget=c.budget, topk=c.topk, window=windows[c.name])
        eng = Engine(models, spec, step_clock=StepClock(1.0, now=ft.now, sleep=ft.sleep))
        toks = steps = 0
        for prompt, _ in pairs:
            r = Request(tok.render_chat([("user", prompt)]), SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True))
            eng._prefill([r])
            while r.finish_reason is None:
                eng._decode([r])
            toks += len(r.output_ids) - 1
            steps += r.verify_ct
        out[c.name] = toks / steps
    return out


def true_tok_s(c: ConfigPoint, w: CellPoint, acc: float, clock: ClockModel, per_request_s: float = 0.0,
               window: int | None = None) -> float:
    n = w.concurrency
    context = w.context_tokens + w.output_tokens / 2
    step = (
        clock.decode_fixed
        + per_request_s * n
        + clock.per_verify_token * n * (c.budget + 1)
        + clock.per_draft_token * n * c.block_size
        + clock.per_context_token * n * context
        + clock.per_draft_context_token * n * (context if window is None else min(context, window))
    )
    wave = clock.prefill_fixed + clock.prefill_per_token * n * w.context_tokens + (w.output_tokens / acc) * step
    return n * w.output_tokens / wave


def engine_tok_s(models: object, c: ConfigPoint, w: CellPoint, window: int | None, requests: int) -> tuple[float, float]:
    """The refserver's own scheduler (continuous batching, prefill passes, decode passes priced
    by ClockModel) driven synchronously as a closed loop of ``w.concurrency`` requests on a fake
    clock: the cross-check that the closed-form truth above is what the engine would measure."""
    from pytest_ddtree.refserver.model import Models

    assert isinstance(models, Models)
    ft = _FakeTime()
    spec = SpecConfig(block_size=c.block_size, budget=c.budget, topk=c.topk, window=window)
    eng = Engine(models, spec, step_clock=StepClock(1.0, now=ft.now, sleep=ft.sleep))
    stream = models.corpus.token_stream(models.tokenizer)
    issued = 0

    def new() -> Request:
        nonlocal issued
        start = (issued * 7919) % max(1, len(stream) - w.context_tokens)
        issued += 1
        ids = stream[start : start + w.context_tokens]
        return Request(ids, SamplingParams(max_new_tokens=w.output_tokens, temperature=0.0, ignore_eos=True))

    for _ in range(w.concurrency):
        eng.waiting.append(new())
    warm = w.concurrency
    done = tokens = 0
    t0 = 0.0
    while done < warm + requests:
        admit: list[Request] = []
        while eng.waiting and len(eng.running) + len(admit) < eng.max_running:
            admit.append(eng.waiting.popleft())
        before = {id(r): r for r in eng.running + admit}
        if admit:
            eng._prefill(admit)
        else:
            eng._decode(list(eng.running))
        for r in before.values():
            if r.finish_reason is not None and r not in eng.running:
                done += 1
                if done == warm:
                    t0 = eng.acct.simulated_busy_seconds
                elif done > warm:
                    tokens += len(r.output_ids)
                eng.waiting.append(new())
    a = eng.acct
    return tokens / (a.simulated_busy_seconds - t0), a.total_decode_tokens / max(1, a.total_verify_steps)


def run(n_restarts: int, configs: list[ConfigPoint], cells: list[CellPoint], truth: dict[tuple[str, str], float],
        acc: dict[tuple[str, str], float], default: str, seed: int, noise: float = 0.015, tolerance: float = 0.03) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    planner = Planner(configs, cells, n_restarts, default=default, seed=seed)
    while (name := planner.next_config()) is not None:
        for w in cells:
            planner.record(Measurement(name, w.name, truth[(name, w.name)] * (1 + rng.normal(0, noise)),
                                       acc[(name, w.name)] * (1 + rng.normal(0, noise))))
    recs = planner.recommendations()
    within3 = sum(
        truth[(r.config, r.cell)] >= (1 - tolerance) * max(truth[(c.name, r.cell)] for c in configs) for r in recs
    ) / len(cells)
    preds = planner.predictions()
    errs = [abs(p.tok_s / truth[key] - 1) for key, p in preds.items()]
    cover = [p.low <= truth[key] <= p.high for key, p in preds.items()]
    return {
        "restarts": planner.restarts_spent,
        "within": within3,
        "mae": statistics.median(errs) if errs else 0.0,
        "coverage": sum(cover) / len(cover) if cover else 1.0,
    }


def _session(out: Path, *args: str) -> dict[str, object]:
    """One real pytest session of the throughput suite on the reference engine; its results.json."""
    import json
    import subprocess
    import time

    begin = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "suites" / "test_throughput.py"), "--ddtree-config=all",
           f"--ddtree-results={out}", f"--ddtree-baselines={out.parent / 'baselines'}", "-p", "no:cacheprovider",
           "-q", "-n", "0", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(f"  {' '.join(args) or 'full sweep'}: exit {proc.returncode} in {time.monotonic() - begin:.0f} s", flush=True)
    payload: dict[str, object] = json.loads((out / "results.json").read_text())
    return payload


def end_to_end(ns: list[int]) -> int:
    """The real plugin on the reference engine: one full sweep (18 restarts, the truth of this
    machine at this time), then one adaptive session per N; each N's picks, predictions and
    intervals against that full sweep, and against the committed baselines (a quiet machine)."""
    import tempfile

    import yaml

    work = Path(tempfile.mkdtemp(prefix="bench-advisor-e2e-"))
    sessions: dict[int, dict[str, object]] = {}
    if "--truth" in sys.argv:  # an earlier run's full sweep (its folder), to compare other N with
        import json

        full = json.loads((Path(sys.argv[sys.argv.index("--truth") + 1]) / "results.json").read_text())
    elif "--parallel" in sys.argv:  # a machine with cores to spare: the full sweep beside every N
        from concurrent.futures import ThreadPoolExecutor

        print(f"end to end on the reference engine (sessions under {work}), all sessions at once:", flush=True)
        pool = ThreadPoolExecutor(max_workers=len(ns) + 1)
        running = {n: pool.submit(_session, work / f"n{n}", "--ddtree-max-restarts", str(n)) for n in ns}
        full = _session(work / "full")
        sessions = {n: future.result() for n, future in running.items()}
    else:
        print(f"end to end on the reference engine (sessions under {work}); full sweep first:", flush=True)
        full = _session(work / "full")
    truth = {(r["config"], r["cell"]): float(r[OUTPUT_THROUGHPUT]) for r in full["throughput"]
             if r.get(OUTPUT_THROUGHPUT)}

    def committed(config: str, cell: str) -> float | None:
        path = ROOT / "baselines" / "refserver" / f"{config}.yaml"
        gates = (yaml.safe_load(path.read_text()).get("metrics") or {}).get(cell, {}).get("gates", {}) if path.exists() else {}
        value = (gates.get(OUTPUT_THROUGHPUT) or {}).get("median")
        return float(value) if value else None

    cells = sorted({cell for _, cell in truth})
    configs = sorted({config for config, _ in truth})
    rows = []
    for n in ns:
        payload = sessions.get(n) or _session(work / f"n{n}", "--ddtree-max-restarts", str(n))
        sweep: dict = payload["adaptive_sweep"]  # type: ignore[assignment,type-arg]
        predicted: list = payload["predicted"]  # type: ignore[assignment,type-arg]
        for name, source in (("same-machine full sweep", truth.get),
                             ("committed baselines", lambda key: committed(*key))):
            values = {(c, w): source((c, w)) for c in configs for w in cells}
            picks = {r["cell"]: r["config"] for r in sweep["recommendations"]}
            within = [(values[(picks[w], w)] or 0) >= 0.97 * max(v for (c, x), v in values.items() if x == w and v)
                      for w in cells if w in picks]
            errs = [abs(p[OUTPUT_THROUGHPUT] / values[(p["config"], p["cell"])] - 1) for p in predicted if values.get((p["config"], p["cell"]))]
            inside = [p["output_throughput_interval"][0] <= values[(p["config"], p["cell"])] <= p["output_throughput_interval"][1]
                      for p in predicted if values.get((p["config"], p["cell"]))]
            rows.append(f"| {n} | {sweep['restarts']} | {name} | {sum(within)}/{len(within)} ({sum(within) / max(1, len(within)):.0%}) | "
                        f"{statistics.median(errs) if errs else 0:.1%} | {sum(inside) / max(1, len(inside)):.0%} |")
    print("| N | restarts (service launches) | truth | cells within 3% of the best | median abs error (predicted) | true value inside interval |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


def main() -> int:
    if "--end-to-end" in sys.argv:
        ns = [int(a) for a in sys.argv[sys.argv.index("--end-to-end") + 1:] if a.isdigit()] or [6]
        return end_to_end(ns)
    matrix = load_matrix(ROOT / "suites" / "configs.yaml")
    configs = [ConfigPoint.of(c) for c in matrix.configs]
    windows = {c.name: (c.window if isinstance(c.window, int) else (2048 if c.window is not None else None)) for c in matrix.configs}
    cells = [CellPoint.of(w) for w in matrix.cells]
    acc = accept_lengths(configs, windows)
    clock = ClockModel()
    truth = {(c.name, w.name): true_tok_s(c, w, acc[c.name], clock, window=windows[c.name]) for c in configs for w in cells}
    cell_acc = {(c.name, w.name): acc[c.name] for c in configs for w in cells}
    if "--engine-truth" in sys.argv:
        # every cell from the engine's own scheduler (minutes); window twins are runs of their own
        # (the drafter sees the window, and the draft's attention is priced over it)
        models = build_models()
        by_run: dict[tuple[tuple[int, int, int], int | None], dict[str, tuple[float, float]]] = {}
        for c in configs:
            key = (c.shape, windows[c.name])
            if key not in by_run:
                by_run[key] = {w.name: engine_tok_s(models, c, w, windows[c.name], max(4, 2 * w.concurrency)) for w in cells}
                print(f"  engine truth: {c.name} done", flush=True)
            for w in cells:
                truth[(c.name, w.name)], cell_acc[(c.name, w.name)] = by_run[key][w.name]
        print("truth: every cell measured by the engine's own scheduler (fake clock)")
        if "--dump" in sys.argv:
            import json

            Path(sys.argv[sys.argv.index("--dump") + 1]).write_text(json.dumps({f"{c}|{w}": v for (c, w), v in truth.items()}))
    print(f"{len(configs)} configs x {len(cells)} cells; accept lengths "
          + ", ".join(f"{n}={a:.2f}" for n, a in sorted(acc.items())[:6]) + ", ...")
    print("| N | restarts used | cells within 3% of best | median abs error (predicted) | true value inside interval |")
    print("|---|---|---|---|---|")
    for n in (4, 6, 9):
        rows = [run(n, configs, cells, truth, cell_acc, matrix.default.name, seed) for seed in range(5)]
        mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        worst = min(r["within"] for r in rows)
        print(f"| {n} | {mean['restarts']:.1f} | {mean['within']:.0%} (worst seed {worst:.0%}) | "
              f"{mean['mae']:.1%} | {mean['coverage']:.0%} |")
    names = () if "--engine-truth" in sys.argv else ("bs8_b4_k4", "bs8_b16_k6", "bs16_b32_k8")
    if names:
        print("\nCross-check: closed form vs the engine's own scheduler (closed loop, fake clock):")
    models = build_models()
    errs = []
    for name in names:
        c = next(x for x in configs if x.name == name)
        for w in cells[:3] + cells[4:5]:
            got, _ = engine_tok_s(models, c, w, windows[name], requests=2 * w.concurrency)
            errs.append(abs(truth[(name, w.name)] / got - 1))
            print(f"  {name:12} {w.name:10} engine {got:8.1f} tok/s   closed form {truth[(name, w.name)]:8.1f}")
    if errs:
        print(f"  median |closed form / engine - 1| = {statistics.median(errs):.1%}, max {max(errs):.1%}")
    # A different cost shape, outside the model's family: topk 6 acceptance peaks at budget 8
    # then falls (a wider tree of worse candidates), and every request adds 3 ms to a step.
    odd_acc = {c.name: acc[c.name] * (1 - 0.04 * max(0, c.budget - 8) if c.topk == 6 else 1.0) for c in configs}
    odd = {(c.name, w.name): true_tok_s(c, w, odd_acc[c.name], clock, per_request_s=0.003, window=windows[c.name])
           for c in configs for w in cells}
    print("\nDifferent cost shape (topk-6 acceptance peaks then falls, 3 ms per-request step overhead), within 5%:")
    print("| N | restarts used | cells within 5% of best | median abs error (predicted) | true value inside interval |")
    print("|---|---|---|---|---|")
    for n in (6, 8):
        rows = [run(n, configs, cells, odd, {(c.name, w.name): odd_acc[c.name] for c in configs for w in cells}, matrix.default.name, seed, tolerance=0.05) for seed in range(5)]
        mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        worst = min(r["within"] for r in rows)
        print(f"| {n} | {mean['restarts']:.1f} | {mean['within']:.0%} (worst seed {worst:.0%}) | "
              f"{mean['mae']:.1%} | {mean['coverage']:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
