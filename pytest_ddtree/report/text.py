"""The sweep table and the campaign's conclusions, from throughput records (no pytest).

Why pure functions over a list of records: the same records are appended to the results
directory as they are measured (crash-safe), merged from xdist workers by the main process,
and rendered three ways (terminal, Markdown, JSON). Rendering from the records alone means
a results directory can be re-rendered later and every view says the same thing.

A *throughput record* is the dict built by ``gates.throughput.cells.throughput_record`` (the suite
records it through ``ddtree_recorder.record(RecordKind.THROUGHPUT, config, record)``), read here
through ``records.cells.normalize``. Records wrapped by the recorder as
``{"kind", "config", "data": {...}}`` are accepted too.

Recommendations follow the campaign's questions: which config gives the best aggregate
throughput at the highest concurrency, which the best single-request speed, which the best
acceptance, and whether acceptance is *drafter-bound* (stops growing with budget or block
size, so a bigger tree only costs compute).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from pytest_ddtree.metrics import ACCEPT_LENGTH, MEDIAN_TTFT_MS, OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT, REQUEST_GOODPUT
from pytest_ddtree.measure import stats
from pytest_ddtree.configs import config_or_none, name_sort_key
# Re-exported: the HTML report reads them here.
from pytest_ddtree.metrics import TOKENS_PER_VERIFY as TOKENS_PER_VERIFY
from pytest_ddtree.metrics import tokens_per_verify as tokens_per_verify
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.cells import normalize
from pytest_ddtree.records.shapes import RawRecord, ThroughputRecord
from pytest_ddtree.records.launch_shapes import NoEffectFinding
from pytest_ddtree.records.words import ATTENTION, THROUGHPUT_KINDS, RecordKind, Status

#: Acceptance counts as "no longer growing" when a step up in budget or block size raises it
#: by less than this fraction (the campaign: block 8 -> 16 gave 4.9 -> 5.2, +6%).
DRAFTER_BOUND_GAIN = 0.08
#: How the drafter-bound recommendation begins (report.html shows that sentence beside its acceptance chart).
DRAFTER_BOUND_LINE = "Acceptance is drafter-bound"

#: Metrics copied into the JSON results per cell: every result key of SGLang's bench_serving
#: (sglang/benchmark/serving.py ``benchmark()``'s ``result``), then ours (``ddtree_``).
#: ``accept_length`` is bench_serving's: the server's avg_spec_accept_length, information only.
JSON_KEYS = (
    "duration", "completed", "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
    "total_output_tokens", "total_output_tokens_retokenized",
    "request_throughput", "input_throughput", OUTPUT_THROUGHPUT, "total_throughput",
    *(f"{stat}_{dist}_ms" for dist in ("ttft", "tpot", "itl", "e2e_latency")
      for stat in ("mean", "median", "std", "p90", "p95", "p99")),
    "max_itl_ms", "concurrency", "max_concurrency", ACCEPT_LENGTH, "max_output_tokens_per_s", "max_concurrent_requests",
    TOKENS_PER_VERIFY, "ddtree_failed", "ddtree_server_input_tokens", "ddtree_spec_verify_ct",
    "ddtree_mean_request_accept_length", PER_REQUEST_OUTPUT_THROUGHPUT,
    "request_rate", "ddtree_max_send_lag_ms", "ddtree_late_requests",
    REQUEST_GOODPUT, "slo_attainment", "slo_attainment_ttft", "slo_attainment_tpot", "slo_attainment_e2el",
)
#: Counts: integers in results.json, as bench_serving's BenchmarkMetrics types them (a cell's
#: value is the median repeat's, rounded).
COUNT_KEYS = ("completed", "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
              "total_output_tokens", "total_output_tokens_retokenized", "max_concurrent_requests",
              "max_concurrency", "ddtree_failed", "ddtree_server_input_tokens", "ddtree_spec_verify_ct",
              "ddtree_late_requests")
#: bench_serving's per-result arguments for a closed-loop cell of this harness: every request
#: is sent as soon as a slot of the cell's concurrency frees (bench_serving's request_rate inf
#: with max_concurrency C), prompts cut to exactly context_tokens and outputs forced to
#: output_tokens (its random dataset with range ratio 0). An open-loop cell's are its own: its
#: request_rate and its max_concurrency (None when uncapped, as bench_serving writes it).
BENCH_BACKEND = "sglang"
#: bench_serving's backend for /v1/chat/completions (serving.py ASYNC_REQUEST_FUNCS): a chat cell's
BENCH_CHAT_BACKEND = "sglang-oai-chat"


def _f(v: Any, digits: int = 1) -> str:
    return f"{float(v):.{digits}f}" if stats.is_number(v) else "-"


def _ctx(tokens: Any) -> str:
    if not stats.is_number(tokens):
        return "-"
    t = int(tokens)
    return f"{t // 1024}k" if t >= 1024 and t % 1024 == 0 else str(t)


def table_rows(records: Iterable[RawRecord]) -> list[list[str]]:
    rows: list[list[str]] = []
    for rec in normalize(records):
        m, w, spread = rec["metrics"], rec["workload"], rec["output_throughput_spread"]
        tps = _f(m.get(OUTPUT_THROUGHPUT))
        if spread is not None and stats.is_number(spread["rel_half_width"]) and rec["measurement_status"] != Status.INVALID:
            tps += f" ±{spread['rel_half_width'] * 100:.0f}%"
        change = rec["change"].get(OUTPUT_THROUGHPUT)
        rows.append([
            rec["config"], rec["cell"], f"{w['request_rate']:g}/s" if "request_rate" in w else str(w["concurrency"]),
            _ctx(w["context_tokens"]),
            w["prompts"] or "-", tps, _f(tokens_per_verify(m), 2), _f(m.get(MEDIAN_TTFT_MS)), _f(m.get("median_tpot_ms")),
            _f(m.get("median_itl_ms")), _f(m.get("request_throughput"), 2), stats.fmt_pct(change), status_text(rec),
        ])
    return rows


HEADERS = ["config", "cell", "conc", "ctx", "prompts", "out tok/s", "accept", "TTFT p50 ms", "TPOT p50 ms", "ITL p50 ms",
           "req/s", "vs baseline", "status"]

#: The gated metrics as the table's columns name them, for the status column.
SHORT_LABELS = {OUTPUT_THROUGHPUT: "tok/s", TOKENS_PER_VERIFY: "accept", MEDIAN_TTFT_MS: "TTFT p50"}
#: Metric verdicts that say the metric moved (a flagged one that did not reproduce is a pass).
_MOVED = (Status.REGRESSION, Status.IMPROVED, Status.FLAGGED)


def status_text(record: RawRecord) -> str:
    """A cell's status as a person reads it: the word, then which gated metric moved which way.

    Why not the word alone: a cell is "improved" when any gated metric improved, so
    ``c1_long -2.0% improved`` (its acceptance up 9.5% while tok/s fell within the noise) reads as
    if tok/s improved. Each metric that moved is named with its change, and with its own word
    where that differs from the cell's (``regression: tok/s -11.3%; accept +9.5% improved``)."""
    status = str(record.get("status") or "-")
    verdict = record.get("verdict")
    metrics = verdict.get("metrics") if isinstance(verdict, Mapping) else None
    moved: list[str] = []
    for key, metric in (metrics or {}).items():
        if not isinstance(metric, Mapping) or metric.get("status") not in _MOVED:
            continue
        word = str(metric.get("status"))
        change = stats.fmt_pct(metric.get("change"))
        moved.append(f"{SHORT_LABELS.get(key, key)} {change}" + ("" if word == status else f" {word}"))
    return f"{status}: {'; '.join(moved)}" if moved else status


def render_sweep_table(records: Iterable[RawRecord], tablefmt: str = "simple",
                       predicted_rows: Sequence[list[str]] = ()) -> str:
    """The sweep table (per config and cell): tok/s, acceptance, TTFT p50, change, status;
    ``predicted_rows`` (the adaptive sweep's, status ``predicted``) follow the measured ones."""
    recs = normalize(records)
    rows, headers = table_rows(recs), HEADERS
    if not rows and not predicted_rows:
        return "no throughput results"
    if any(r.get("host") for r in recs):  # a fleet sweep: say which host measured each row
        rows = [row[:1] + [str(r.get("host") or "-")] + row[1:] for row, r in zip(rows, recs)]
        headers = HEADERS[:1] + ["host"] + HEADERS[1:]
        predicted_rows = [row[:1] + ["-"] + row[1:] for row in predicted_rows]
    return tabulate([*rows, *predicted_rows], headers=headers, tablefmt=tablefmt, disable_numparse=True)


def _valid(records: Iterable[RawRecord]) -> list[ThroughputRecord]:
    return [r for r in normalize(records) if r["measurement_status"] != Status.INVALID
            and stats.is_number(r["metrics"].get(OUTPUT_THROUGHPUT))]


def recommendations(records: Iterable[RawRecord]) -> list[str]:
    """The campaign's conclusions, as sentences, from the cells where two or more configs were
    measured validly and conclusively (nothing is "best" among one)."""
    recs = [r for r in _valid(records) if r["status"] != Status.INCONCLUSIVE]
    out: list[str] = []
    by_cell: dict[tuple[int, int], list[ThroughputRecord]] = defaultdict(list)
    for r in recs:  # closed-loop cells: an open-loop cell's load is its rate (frontier.py answers for those)
        if "request_rate" not in r["workload"]:
            by_cell[(r["workload"]["concurrency"], r["workload"]["context_tokens"])].append(r)
    # A recommendation compares configs: a cell that one config alone measured (or that only one
    # config measured conclusively) recommends nothing.
    by_cell = defaultdict(list, {k: v for k, v in by_cell.items() if len({r["config"] for r in v}) > 1})
    recs = [r for cell in by_cell.values() for r in cell]
    if not recs:
        return out
    top_c = max(c for c, _ in by_cell)
    low_c = min(c for c, _ in by_cell)

    def best(cands: list[ThroughputRecord], key: str) -> tuple[ThroughputRecord, ThroughputRecord | None]:
        ordered = sorted(cands, key=lambda r: -(r["metrics"].get(key) or 0.0))
        return ordered[0], (ordered[-1] if len(ordered) > 1 else None)

    def tps(r: ThroughputRecord) -> float:
        return r["metrics"].get(OUTPUT_THROUGHPUT) or 0.0

    winners: dict[tuple[int, int], str] = {}
    aggregate: list[str] = []
    single: list[str] = []
    for (c, ctx) in sorted(by_cell):
        if c not in (top_c, low_c):
            continue
        cands = by_cell[(c, ctx)]
        if c == top_c:
            winner, worst = best(cands, OUTPUT_THROUGHPUT)
            winners[(c, ctx)] = str(winner["config"])
            margin = f" ({stats.fmt_pct(tps(winner) / tps(worst) - 1)} over the slowest, {worst['config']})" if worst and tps(worst) else ""
            aggregate.append(f"Best aggregate throughput at concurrency {c}, context {_ctx(ctx)}: "
                             f"{winner['config']} with {tps(winner):.1f} output tok/s{margin}.")
        else:
            # chosen by the figure it prints: per request where every config has it, else aggregate
            per_request = all(stats.is_number(r["metrics"].get(PER_REQUEST_OUTPUT_THROUGHPUT)) for r in cands)
            key, unit = (PER_REQUEST_OUTPUT_THROUGHPUT, "tok/s per request") if per_request else (OUTPUT_THROUGHPUT, "tok/s")
            winner, worst = best(cands, key)
            winners[(c, ctx)] = str(winner["config"])
            top, low = float(winner["metrics"].get(key) or 0.0), float((worst or winner)["metrics"].get(key) or 0.0)
            margin = f" ({stats.fmt_pct(top / low - 1)} over the slowest, {worst['config']})" if worst and low else ""
            single.append(f"Best single-request speed (concurrency {c}, context {_ctx(ctx)}): "
                          f"{winner['config']} with {top:.1f} {unit}{margin}.")
    out.extend(aggregate)
    out.extend(single)
    crossover = sorted({(ctx, winners.get((top_c, ctx)), winners.get((low_c, ctx))) for (_, ctx) in winners})
    for ctx, hi, lo in crossover:
        if hi and lo and hi != lo:
            out.append(f"Crossover at context {_ctx(ctx)}: {hi} wins at concurrency {top_c}, {lo} at concurrency {low_c} "
                       "(small trees win when verify compute is the bottleneck).")
    accept = _config_accept(recs)
    if accept:
        name, value = max(accept.items(), key=lambda kv: kv[1])
        out.append(f"Best acceptance: {name} with {value:.2f} accepted tokens per verify step (median over its cells).")
    out.extend(drafter_bound(accept, by_depth=_config_depth(recs)))
    return out


def _config_depth(recs: Sequence[Mapping[str, object]]) -> dict[str, list[float]]:
    """Per config, the share of verifies that accepted at least d drafts (d = 1, 2, ...), from the
    server's acceptance histograms summed over the config's cells (configs without them left out).
    ``recs``: throughput records; the histograms checked here."""
    from pytest_ddtree.service import proof

    hists: dict[str, list[int]] = {}
    for r in recs:
        hist = r.get("accept_histogram")
        if isinstance(hist, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in hist):
            hists[str(r["config"])] = proof.add_histograms(hists.get(str(r["config"]), []), hist)
    return {name: proof.acceptance_by_depth(h) for name, h in hists.items() if sum(h)}


def _share(shares: Sequence[float], depth: int) -> float:
    return shares[depth - 1] if 0 < depth <= len(shares) else 0.0


def _depth_evidence(name: str, by_depth: Mapping[str, Sequence[float]], from_depth: int | None = None) -> str | None:
    """Where the drafter stops being right in ``name``, from the server's histograms."""
    shares = by_depth.get(name)
    config = config_or_none(name)
    shape = config.tree_shape() if config is not None else None
    if not shares or shape is None:
        return None
    bound = min(shape[0] - 1, shape[1])
    if from_depth is not None:
        return (f"the server's acceptance histograms show why: in {name} {_share(shares, from_depth):.0%} of verifies "
                f"accepted {from_depth} or more drafts, though its tree allows {bound}")
    half = next((d for d, share in enumerate(shares, 1) if share < 0.5), None)
    where = f"half of its verifies stop before depth {half}" if half is not None else "most verifies go deep"
    return (f"the server's acceptance histograms show why: in {name} {where}, and {_share(shares, bound):.0%} reach "
            f"its bound of {bound} drafts")


def _config_accept(recs: Sequence[Mapping[str, object]]) -> dict[str, float]:
    """Per config, its median acceptance over its cells (``recs``: throughput records, or dicts with a
    config and its metrics: the HTML report's charts build those from its cells)."""
    per: dict[str, list[float]] = defaultdict(list)
    for r in recs:
        metrics = r.get("metrics")
        v = tokens_per_verify(metrics) if isinstance(metrics, Mapping) else None
        if stats.is_number(v):
            per[str(r["config"])].append(float(v))
    return {k: stats.median(v) for k, v in per.items() if v}


def drafter_bound(accept: Mapping[str, float], min_gain: float = DRAFTER_BOUND_GAIN,
                  by_depth: Mapping[str, Sequence[float]] | None = None) -> list[str]:
    """The "acceptance is drafter-bound" diagnosis.

    For configs that differ only in budget (same block size, topk, window), and for configs
    that differ in block size at the largest budget, look at the last step up: when it
    raises acceptance by less than ``min_gain``, more tree (or a longer block) buys no
    acceptance; the drafter's predictions are the limit. ``by_depth`` (per config, the share
    of verifies that accepted at least d drafts, from the server's histograms) adds where the
    drafter stops being right: the server's own data for the finding.
    """
    by_depth = by_depth or {}
    parsed = {n: c for n in accept if (c := config_or_none(n)) and c.tree_shape() is not None}
    out: list[str] = []
    groups: dict[tuple[int, int, int], list[tuple[int, str]]] = defaultdict(list)
    for name, c in parsed.items():
        bs, budget, topk = c.tree_shape() or (0, 0, 0)
        groups[(bs, topk, c.sort_key()[3])].append((budget, name))
    findings: list[str] = []
    flat_steps: list[tuple[float, int, int, str, str, float, float]] = []
    for _group, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        members.sort()
        (b1, n1), (b2, n2) = members[-2], members[-1]
        a1, a2 = accept[n1], accept[n2]
        if a1 > 0 and (a2 - a1) / a1 < min_gain:
            flat_steps.append(((a2 - a1) / a1, b1, b2, n1, n2, a1, a2))
    if flat_steps:
        gain, b1, b2, n1, n2, a1, a2 = max(flat_steps)
        others = f" (and {len(flat_steps) - 1} more config families)" if len(flat_steps) > 1 else ""
        findings.append(f"the last budget step raised acceptance by at most {gain:+.0%}, e.g. budget {b1} -> {b2} "
                        f"({n1} -> {n2}) only {a1:.2f} -> {a2:.2f}{others}")
        if (why := _depth_evidence(n2, by_depth)) is not None:
            findings.append(why)
    by_bs: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for name, c in parsed.items():
        by_bs[(c.tree_shape() or (0, 0, 0))[0]].append((accept[name], name))
    if len(by_bs) >= 2:
        sizes = sorted(by_bs)
        lo_best = max(by_bs[sizes[0]])
        hi_best = max(by_bs[sizes[-1]])
        if lo_best[0] > 0 and (hi_best[0] - lo_best[0]) / lo_best[0] < min_gain:
            findings.append(f"block size {sizes[0]} -> {sizes[-1]} raised the best acceptance only "
                            f"{lo_best[0]:.2f} ({lo_best[1]}) -> {hi_best[0]:.2f} ({hi_best[1]})")
            if (why := _depth_evidence(hi_best[1], by_depth, from_depth=sizes[0])) is not None:
                findings.append(why)
    if findings:
        out.append(f"{DRAFTER_BOUND_LINE}: " + "; ".join(findings)
                   + ". A bigger tree or block costs verify compute without accepting more; "
                     "a better drafter, not a bigger budget, is what would help.")
    return out


def render_markdown(records: Iterable[RawRecord], title: str = "Throughput sweep") -> str:
    """Markdown: the sweep table, the recommendations, and the failing cells' messages."""
    recs = normalize(records)
    parts = [f"## {title}", "", render_sweep_table(recs, tablefmt="github"), ""]
    advice = recommendations(recs)
    if advice:
        parts += ["### Recommendations", "", *(f"- {a}" for a in advice), ""]
    bad = [r for r in recs if r.get("status") in ATTENTION]
    if bad:
        parts += ["### Cells that need attention", ""]
        for r in bad:
            parts.append(f"- **{r['config']} {r['cell']}**: {status_text(r)}" + (f": {d}" if (d := "; ".join(reasons(r))) else ""))
        parts.append("")
    return "\n".join(parts)


def unjudged_lines(records: Iterable[ThroughputRecord]) -> list[str]:
    """One line per cell whose gated metrics were recorded but not judged (an open-loop cell at the
    SLO's edge: ``gates/throughput/baseline.py``), with why: its table row says pass, this says of what."""
    out = []
    for r in records:
        found = r.get("not_judged")
        for why in sorted(set(found.values())) if isinstance(found, Mapping) else []:
            out.append(f"{r['config']} {r['cell']}: {why}")
    return out


def reasons(record: RawRecord) -> list[str]:
    """Why a cell has its status, in the words of its test's message (``CellVerdict.message``):
    the verdict's reasons, each metric's message, then any problem not said yet."""
    found = record.get("verdict")
    verdict: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    out = [str(x) for x in verdict.get("reasons") or []]
    if record.get("status") != Status.INVALID:  # an invalid measurement's metrics say nothing
        out += [str(m["message"]) for m in (verdict.get("metrics") or {}).values() if isinstance(m, Mapping) and m.get("message")]
    problems = record.get("problems")
    out += [str(p) for p in (problems if isinstance(problems, list) else []) if str(p) not in out]
    return out


def results_json(records: Iterable[RawRecord]) -> dict[str, Any]:
    """JSON-ready results: one entry per cell with bench_serving keys, plus recommendations."""
    recs = normalize(records)
    cells = []
    for r in recs:
        m = r.get("metrics") or {}
        entry: dict[str, Any] = {
            "config": r.get("config"),
            "cell": r.get("cell"),
            **{k: (r.get("workload") or {}).get(k) for k in ("context_tokens", "output_tokens", "requests")},
            "status": r.get("status"),
            "measurement_status": r.get("measurement_status"),
            "repeats": r.get("repeats"),
        }
        entry.update(bench_serving_arguments(r))
        entry.update({k: m.get(k) for k in JSON_KEYS if k in m})
        for key in COUNT_KEYS:
            if stats.is_number(entry.get(key)):
                entry[key] = int(round(float(entry[key])))
        entry["change_vs_baseline"] = r.get("change") or {}
        entry["samples"] = r.get("samples") or {}
        entry["problems"] = r.get("problems") or []
        # What the HTML report draws: the gate's verdict, the workload asked for, the baseline.
        for key in ("verdict", "workload", "baseline", "hardware_profile", "host", "accept_histogram", "acceptance_by_depth",
                    "slo", "acceptance_by_category", "not_judged", "build"):
            if r.get(key) is not None:
                entry[key] = r.get(key)
        cells.append(entry)
    return {"throughput": cells, "recommendations": recommendations(recs)}


def bench_serving_arguments(record: ThroughputRecord) -> dict[str, Any]:
    """The argument and information keys bench_serving writes into each result, for one cell."""
    workload = record.get("workload") or {}
    source = str(workload.get("prompts") or "").split(" via ", 1)[0]
    return {
        "tag": None,
        "backend": BENCH_CHAT_BACKEND if workload.get("api") == "chat" else BENCH_BACKEND,
        "ddtree_api": workload.get("api", "generate"),  # which endpoint, and a chat cell's thinking (None: not sent)
        "ddtree_thinking": workload.get("thinking"),
        "dataset_name": "sharegpt" if source.endswith(".json") else source or None,
        "request_rate": workload.get("request_rate", float("inf")),
        "max_concurrency": workload["max_concurrency"] if "max_concurrency" in workload else workload.get("concurrency"),
        "sharegpt_output_len": None,
        "random_input_len": workload.get("context_tokens"),
        "random_output_len": workload.get("output_tokens"),
        "random_range_ratio": 0.0,
        "server_info": record.get("server_info"),
    }


def plot_png(records: Iterable[RawRecord], path: Path) -> bool:
    """Output tok/s against concurrency, one line per config and context; needs ``[plot]``.

    Returns False (and writes nothing) when matplotlib is not installed or there is nothing
    to plot, so callers can treat the plot as optional.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for r in _valid(records):
        w = r["workload"]
        series[(r["config"], w["context_tokens"])].append((w["concurrency"], r["metrics"].get(OUTPUT_THROUGHPUT) or 0.0))
    series = {k: v for k, v in series.items() if len(v) > 1}  # a line needs two concurrencies
    if not series:
        return False
    contexts = sorted({ctx for _, ctx in series})
    configs = sorted({cfg for cfg, _ in series}, key=name_sort_key)
    colors = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.5 * len(contexts) + 3, 5), squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        for i, config in enumerate(configs):
            points = sorted(series.get((config, ctx), []))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colors(i % 20),
                        linestyle="-" if i < 20 else "--", label=config)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tok/s")
        ax.set_title(f"context {_ctx(ctx)}")
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize="small")
    fig.suptitle("Output throughput against concurrency")
    fig.tight_layout(rect=(0, 0, 1 - 2.5 / (5.5 * len(contexts) + 3), 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


@dataclass
class SessionSummary:
    """What the main process writes at session end (see ``finish.py``)."""

    json: dict[str, Any]
    markdown: str
    sections: list[tuple[str, str]] = field(default_factory=list)
    plot_error: str | None = None


def _launch_words(record: RawRecord) -> tuple[str, str]:
    """(what was launched, how it went) of a launch record, in words."""
    found = record.get("launch")
    launch: Mapping[str, object] = found if isinstance(found, Mapping) else {}
    outcome = str(launch.get("outcome") or "-")
    ready = launch.get("ready_s")
    how = f"{outcome} after {float(ready):.1f} s" if outcome == "ready" and isinstance(ready, (int, float)) else outcome
    return str(launch.get("config") or record.get("config") or "-"), how


def _other_records_markdown(records: Sequence[RawRecord]) -> str:
    """The service's launches, in words (the gates are in the correctness table; the rest of
    each record is in results.json)."""
    rows = [[config, how] for r in records if r.get("kind") == RecordKind.LAUNCH for config, how in [_launch_words(r)]]
    if not rows:
        return ""
    return tabulate(rows, headers=["launched", "outcome"], tablefmt="github", disable_numparse=True)


def gate_rows(records: Sequence[RawRecord], failed_tests: Sequence[Mapping[str, str]] = ()) -> list[list[str]]:
    """One row per config: the correctness gates next to each other, then its failed tests.

    Why: the sweep table answers "how fast"; this answers "is it still right" for the same
    configs at a glance, so a fast config that broke losslessness or a coding problem is not
    read as the winner.
    """
    by_config: dict[str, dict[str, str]] = {}
    for r in records:
        config = str(r.get("config"))
        row = by_config.setdefault(config, {})
        kind = r.get("kind")
        if kind == RecordKind.CODING:
            passed, total, problem_set = r.get("passed"), r.get("total"), r.get("set")
            row["coding"] = (f"{passed}/{total}" + (f" ({problem_set})" if problem_set else "")
                             if stats.is_number(passed) and stats.is_number(total) else str(r.get("status") or "-"))
        elif kind == RecordKind.LOSSLESS:
            diverged = r.get("diverged")
            shown = len(diverged) if isinstance(diverged, list) else 0
            row["lossless"] = "identical" if r.get("passed") else f"{shown}/{r.get('compared')} diverged"
        elif kind == RecordKind.HEALTH:
            row["health"] = "ok" if r.get("passed", True) else "FAILED"
    failures: dict[str, int] = {}
    for failed in failed_tests:
        nodeid = str(failed.get("nodeid", ""))
        for config in by_config:
            if f"[{config}]" in nodeid or f"-{config}]" in nodeid or f"[{config}-" in nodeid:
                failures[config] = failures.get(config, 0) + 1
    rows = []
    for config in sorted(by_config, key=name_sort_key):
        row = by_config[config]
        if not ({"coding", "lossless", "health"} & set(row)):
            continue
        rows.append([config, row.get("health", "-"), row.get("coding", "-"), row.get("lossless", "-"), str(failures.get(config, 0))])
    return rows


GATE_HEADERS = ["config", "health", "coding passed", "lossless", "failed tests"]


proof_fields = ("block_size", "budget", "topk", "window")


def applied_columns(applied: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The applied table's columns: DDTree's four, then every other axis a launch's evidence names
    (steps, a tree width, the attention backend...), in catalogue order."""
    from pytest_ddtree import axes as axes_mod

    more = {name for fields in applied.values() for name in fields if name not in proof_fields}
    return [*proof_fields, *axes_mod.order(more)]


def applied_by_evidence(records: Sequence[RawRecord], no_effect: Sequence[NoEffectFinding] = ()
                        ) -> dict[str, dict[str, dict[str, str]]]:
    """Per launched config, each field's evidence (the last ready launch's ``applied_evidence``):
    reported, proven by behaviour, not proven or not settable; a field that showed no effect in an
    A/B says so beside its status, never as proof that it applied."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for r in records_mod.launch_records(records):
        launch = r["launch"]
        if launch["outcome"] != "ready" or "applied_evidence" not in launch:
            continue
        out[launch["config"]] = {name: {"status": ev["status"], "detail": ev["detail"]}
                                 for name, ev in launch["applied_evidence"]["fields"].items()}
    for finding in no_effect:
        for config in finding["configs"]:
            entry = out.get(config, {}).get(finding["field"])
            if entry is not None and "shows no effect" not in entry["status"]:
                entry["status"] += "; shows no effect on this build"
                entry["detail"] += "; " + finding["message"]
    return dict(sorted(out.items(), key=lambda kv: name_sort_key(kv[0])))


def session_summary(records: Sequence[RawRecord], failed_tests: Sequence[Mapping[str, str]] = (),
                    results_dir: Path | None = None, default_window: int | None = None) -> SessionSummary:
    """Render the session's records: results.json, results.md and the terminal sections.

    ``records`` are every record of the session (all kinds, as read back from the JSON
    lines); the rest is the session's context: its failed tests (the gates' table), its results
    folder (the plot goes there; none, no plot) and the profile's default window (a config
    without a window runs at it, for the no-effect findings).
    """
    throughput = normalize(records)
    others = [dict(r) for r in records if r.get("kind", RecordKind.THROUGHPUT) not in THROUGHPUT_KINDS]
    payload = results_json(throughput)
    payload["throughput_repeats"] = [dict(r) for r in records if r.get("kind") == RecordKind.THROUGHPUT_REPEAT]
    payload["records"] = others
    payload["failed_tests"] = [dict(f) for f in failed_tests]
    md_parts = ["# pytest-ddtree results", ""]
    if throughput:
        md_parts.append(render_markdown(throughput))
    launches = _other_records_markdown(others)
    if launches:
        md_parts += ["## Service launches", "", launches, ""]
    sections: list[tuple[str, str]] = []
    gates = gate_rows(records, failed_tests)
    if gates:
        sections.append(("ddtree correctness gates", tabulate(gates, headers=GATE_HEADERS, disable_numparse=True)))
        md_parts += ["## Correctness gates", "", tabulate(gates, headers=GATE_HEADERS, tablefmt="github", disable_numparse=True), ""]
    predicted = _adaptive_prediction(records, payload)
    _what_to_deploy(throughput, records, payload, md_parts)
    if throughput or predicted:
        text = render_sweep_table(throughput, predicted_rows=predicted)
        advice = payload["recommendations"]
        if advice:
            text += "\n\nRecommendations:\n" + "\n".join(f"  - {a}" for a in advice)
        sections.append(("ddtree throughput sweep", text))
    not_judged = unjudged_lines(throughput)
    if not_judged:
        sections.append(("ddtree recorded, not judged", "\n".join(not_judged)))
        md_parts += ["## Recorded, not judged", "", *(f"- {line}" for line in not_judged), ""]
    _field_evidence(records, throughput, default_window, payload, sections, md_parts)
    summary = SessionSummary(json=payload, markdown="\n".join(md_parts))
    if throughput and results_dir is not None:
        try:
            path = results_dir / "throughput.png"
            if plot_png(throughput, path):
                sections.append(("ddtree plot", f"wrote {path}"))
        except Exception as exc:  # the plot is optional; never lose the results over it
            summary.plot_error = f"plotting failed: {type(exc).__name__}: {exc}"
    summary.sections = sections
    return summary


def _adaptive_prediction(records: Sequence[RawRecord], payload: dict[str, Any]) -> list[list[str]]:
    """An adaptive sweep's predicted cells, as sweep-table rows and in results.json: beside the
    measured ones, never among them (they are never gated); its summary joins the recommendations."""
    from pytest_ddtree.adaptive import sweep as adaptive

    sweep = records_mod.adaptive_outcome(records)
    if not sweep:
        return []
    payload["predicted"] = sweep.get("predicted") or []
    payload["adaptive_sweep"] = {k: v for k, v in sweep.items() if k != "predicted"}
    payload["recommendations"] = [*payload["recommendations"], *adaptive.summary_lines(sweep)]
    return adaptive.predicted_table_rows(sweep, len(HEADERS), _ctx)


def _what_to_deploy(throughput: list[ThroughputRecord], records: Sequence[RawRecord], payload: dict[str, Any],
                    md_parts: list[str]) -> None:
    """The deployment answer (for SLO S at load L deploy C; the rates; the frontier): in results.json,
    among the recommendations, and as its own heading in results.md when it has sentences."""
    from pytest_ddtree.report import frontier

    deployment = frontier.deployment(throughput, records)
    if deployment:
        payload["deployment"] = deployment
        payload["recommendations"] = [*payload["recommendations"], *deployment["sentences"]]
        if deployment["sentences"]:  # a heading with nothing under it says nothing
            md_parts += ["## What to deploy", "", *(f"- {line}" for line in deployment["sentences"]), ""]


def _field_evidence(records: Sequence[RawRecord], throughput: list[ThroughputRecord], default_window: int | None,
                    payload: dict[str, Any], sections: list[tuple[str, str]], md_parts: list[str]) -> None:
    """Whether each config's fields took effect: the fields the measurements show had none, and the
    applied-by-evidence table (each field's status per config), in all three outputs."""
    from pytest_ddtree.service import proof

    no_effect = payload["no_effect"] = proof.no_effect(throughput, default_window)
    if no_effect:
        lines = [f["message"] for f in no_effect]
        sections.append(("ddtree config fields without effect", "\n".join(lines)))
        md_parts += ["## Config fields without effect", "", *(f"- {line}" for line in lines), ""]
    payload["applied"] = applied_by_evidence(records, no_effect)
    if payload["applied"]:
        columns = applied_columns(payload["applied"])
        rows = [[config, *(str(fields.get(f, {}).get("status", "-")) for f in columns)]
                for config, fields in payload["applied"].items()]
        table = tabulate(rows, headers=["config", *columns], disable_numparse=True)
        sections.append(("ddtree applied, by evidence", table))
        md_parts += ["## Applied, by evidence", "",
                     tabulate(rows, headers=["config", *columns], tablefmt="github", disable_numparse=True), ""]
