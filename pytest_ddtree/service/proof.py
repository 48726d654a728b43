"""What a running service proves about the config it serves, beyond ``/server_info`` (no pytest).

Why: ``/server_info`` echoes the server args, and a build can accept a flag, echo it and serve
something else (a worker that never reads it, an environment variable that lost to a default).
A running SGLang also reveals what it really does, and this module reads those signals:

* the finished response's ``meta_info.spec_correct_drafts_histogram`` (the one name SGLang 0.5.23
  sends, sglang/srt/managers/tokenizer_manager.py:3193-3201; builds before the 2026-05 rename
  send ``spec_accept_histogram``, still read here for them): index k counts the verifies that
  accepted exactly k drafted tokens (python/sglang/srt/managers/schedule_batch.py
  ``Req.update_spec_correct_drafts_histogram``, sent by tokenizer_manager.py's spec-decoding
  meta). No verify can accept more than ``min(block_size - 1, budget)`` drafts, so an index above
  that bound means the config did not apply; and on a prompt whose continuation the drafter can
  copy (a passage the prompt repeats), the verifies reach the bound: that proves the served block
  size (or the budget, when it is the smaller) from below;
* the start-up lines in which the speculative worker prints its effective values
  (``Initialized DFLASH draft runner. ... block_size=, draft_window_size=, compact_cache=``,
  ``Initialized DDTREE v2 worker. block_size=, tree_budget=``, ``Initialized DDTree worker.
  block_size=, tree_budget=``) and the override warning ``DFLASH only supports
  speculative_eagle_topk == 1; overriding speculative_eagle_topk=N to 1``;
* ``/metrics`` (with ``--enable-metrics``): ``sglang:spec_num_draft_tokens``, the worker's
  ``speculative_num_draft_tokens`` (upstream DFLASH: the block size, sglang 0.5.23
  sglang/srt/speculative/dflash_worker_v2.py:524). SGLang 0.5.23 publishes it at 0 from start-up
  (sglang/srt/observability/metrics_collector.py:131) and sets the worker's value only at every
  ``decode_log_interval``-th (default 40) decode batch (scheduler_components/metrics_reporter.py:
  933-934, 1017-1020, 1098); prefill and idle reports republish whatever it holds (:805-897,
  1476-1532). So a zero, absent or idle (stale) reading is no evidence; only a non-zero value
  read while a request decodes is the served worker's, and it fails the config when it
  contradicts the block size (:func:`judge`'s ``metrics_text`` is that reading).

Never evidence: ``spec_num_proposed_drafts`` / ``spec_accept_rate`` are verify_ct x
(num_draft_tokens - 1), arithmetic on the config, not a measurement.

Everything read here comes from the service and is hostile: sizes are bounded before anything
is parsed, and a malformed histogram is an invalid response, never a crash.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.records.launch_shapes import FieldEvidenceData, NoEffectFinding, ProbeData, ProofData
from pytest_ddtree.records.words import Status
from pytest_ddtree.service.corpus import bundled_units

#: The histogram keys, newest first: 0.5.23 sends only the first; older builds (and PR 27509's
#: branches, cut before the 2026-05 rename) the second, which is read for them.
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")
#: Longest histogram accepted: far beyond any block size (a drafter block of 1024 tokens).
MAX_HISTOGRAM_LENGTH = 1024
#: Largest count in one bucket (a request verifies at most once per output token).
MAX_HISTOGRAM_COUNT = 10**9
#: Most bytes of a log or of /metrics text that are parsed.
MAX_TEXT_BYTES = 4 * 1024 * 1024

REPORTED = "reported"
PROVEN = "proven by behaviour"
NOT_PROVEN = "not proven"
NOT_SETTABLE = "not settable"


class HistogramError(ValueError):
    """A response's acceptance histogram is not a list of non-negative counts of sane size."""


def histogram_of(meta: Any, verify_ct: int | None = None) -> list[int] | None:
    """The acceptance histogram of one finished response's ``meta_info`` (None: none sent).

    Raises HistogramError when it is malformed: not a list, too long, a count that is not a
    non-negative integer, the two names disagreeing, or counts that do not sum to the response's
    ``spec_verify_ct`` (every verify adds one to one bucket, schedule_batch.py).
    """
    if not isinstance(meta, Mapping):
        return None
    found: list[list[int]] = []
    for key in HISTOGRAM_KEYS:
        raw = meta.get(key)
        if raw is None:
            continue
        if not isinstance(raw, list):
            raise HistogramError(f"meta_info.{key} is not a list: {str(raw)[:80]}")
        if len(raw) > MAX_HISTOGRAM_LENGTH:
            raise HistogramError(f"meta_info.{key} has {len(raw)} buckets (more than {MAX_HISTOGRAM_LENGTH})")
        counts: list[int] = []
        for i, value in enumerate(raw):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HISTOGRAM_COUNT:
                raise HistogramError(f"meta_info.{key}[{i}] is not a count: {str(value)[:40]}")
            counts.append(value)
        found.append(counts)
    if not found:
        return None
    if len(found) == 2 and found[0] != found[1]:
        raise HistogramError(f"meta_info.{HISTOGRAM_KEYS[0]} {found[0][:16]} and its alias {HISTOGRAM_KEYS[1]} "
                             f"{found[1][:16]} disagree")
    hist = found[0]
    if verify_ct is not None and sum(hist) != verify_ct:
        raise HistogramError(f"meta_info.{HISTOGRAM_KEYS[0]} counts {sum(hist)} verifies, spec_verify_ct says {verify_ct}")
    return hist


def add_histograms(total: Sequence[int], more: Sequence[int]) -> list[int]:
    """Bucket-wise sum (the longer length wins)."""
    out = list(total) + [0] * max(0, len(more) - len(total))
    for i, n in enumerate(more):
        out[i] += n
    return out


def max_index(hist: Sequence[int]) -> int | None:
    """The most drafts any verify accepted (None: no verify)."""
    for i in range(len(hist) - 1, -1, -1):
        if hist[i]:
            return i
    return None


def acceptance_by_depth(hist: Sequence[int]) -> list[float]:
    """``out[d - 1]``: the share of verifies that accepted at least d drafts, d = 1..max index.

    Why: the accept length averages away where a drafter stops being right; the share that
    reaches each depth shows it (a drafter trained at block size 8 falls off past depth 7,
    whatever the tree).
    """
    total = sum(hist)
    top = max_index(hist)
    if not total or top is None:
        return []
    out: list[float] = []
    tail = total
    for d in range(1, top + 1):
        tail -= hist[d - 1]
        out.append(tail / total)
    return out


def accept_bound(values: Mapping[str, Any]) -> int | None:
    """The most drafts one verify can accept under ``values``: min(block_size - 1, budget), and for
    an EAGLE-style drafter min(steps, budget): EAGLE drafts ``steps`` tokens deep, so no path of its
    tree is longer (a chain's budget is block_size - 1; an unknown budget leaves the depth's bound)."""
    depths = [v - 1 for v in (values.get("block_size"),) if isinstance(v, int)]
    depths += [v for v in (values.get("steps"),) if isinstance(v, int)]
    # PR 32053's verify budget: the target verifies that many tokens of the block, the root among them
    # (the profile's reading, unverified), so at most verify_budget - 1 drafts
    depths += [v - 1 for v in (values.get("verify_budget"),) if isinstance(v, int)]
    if not depths:
        return None
    bound = min(depths)
    budget = values.get("budget")
    if isinstance(budget, int):
        bound = min(bound, budget)
    return bound


def bound_violation(hist: Sequence[int], bound: int | None, what: str = "a verify") -> str | None:
    """The evidence sentence when ``hist`` has a verify above ``bound``, else None."""
    top = max_index(hist)
    if bound is None or top is None or top <= bound:
        return None
    above = sum(hist[bound + 1:])
    return (f"{above} of {sum(hist)} verifies of {what} accepted more than {bound} drafts (up to {top}; histogram "
            f"{format_histogram(hist)}): more than min(block_size - 1, budget) = {bound} allows, so the service "
            "serves a larger block size or budget than it reports")


def format_histogram(hist: Sequence[int], limit: int = 40) -> str:
    """``[3, 0, 5, ...]``, cut to ``limit`` buckets."""
    shown = ", ".join(str(n) for n in hist[:limit])
    return f"[{shown}{', ...' if len(hist) > limit else ''}]"


# --------------------------------------------------------------------------------------
# The copy probe


#: Requests and tokens of the copy probe: a few short requests, stopped at the first that
#: reaches the bound (on the reference engine one request of 48 tokens usually does).
PROBE_REQUESTS = 4
PROBE_TOKENS = 48
#: Verifies the probe needs before a pile-up below the bound counts as a ceiling.
CEILING_MIN_VERIFIES = 8


def probe_prompts(count: int = PROBE_REQUESTS) -> list[str]:
    """Prompts whose continuation the drafter can copy: a real passage, repeated, then cut.

    A model asked to repeat a passage it has just seen twice continues it verbatim, and a
    drafter conditioned on the same context predicts that continuation far ahead; so the
    verifies accept as many drafts as the served tree allows.
    """
    units = [u for u in bundled_units("documents") if len(u) >= 200] or list(bundled_units("documents"))
    out: list[str] = []
    for i in range(count):
        passage = units[i % len(units)][:600]
        out.append(f"Repeat the passage below exactly.\n\n{passage}\n\nAgain:\n\n{passage}\n\nAgain:\n\n"
                   f"{passage[: len(passage) // 3]}")
    return out


@dataclass
class ProbeResult:
    """What the copy probe saw: the summed histogram, each request's, and its errors."""

    bound: int | None
    histogram: list[int] = field(default_factory=list)
    per_request: list[list[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # invalid responses: the config fails on them
    failed_requests: list[str] = field(default_factory=list)  # transport or HTTP errors: no evidence
    requests: int = 0
    #: answers whose meta_info has no spec_* key at all: no verify ran for them
    no_spec: int = 0

    @property
    def reached(self) -> bool:
        top = max_index(self.histogram)
        return self.bound is not None and top is not None and top >= self.bound

    def ceiling(self) -> int | None:
        """A pile-up below the bound: more than half the verifies accepted exactly their maximum
        count (at least 1), after enough verifies. On a copyable prompt that is the served tree's
        limit, or the drafter's: a ceiling below the bound means a smaller block size or budget is
        served, or a drafter trained for fewer drafts than the block allows."""
        top = max_index(self.histogram)
        if self.bound is None or top is None or top < 1 or top >= self.bound or sum(self.histogram) < CEILING_MIN_VERIFIES:
            return None
        return top if 2 * self.histogram[top] > sum(self.histogram) else None

    def as_dict(self) -> ProbeData:
        return {"bound": self.bound, "histogram": list(self.histogram), "requests": self.requests,
                "reached": self.reached, "errors": list(self.errors), "failed_requests": list(self.failed_requests)}


def run_copy_probe(generate: Callable[[str, Mapping[str, Any]], Any], bound: int | None,
                   max_requests: int = PROBE_REQUESTS, max_new_tokens: int = PROBE_TOKENS) -> ProbeResult:
    """Send up to ``max_requests`` greedy copy prompts (non-streaming), stopping at the first
    that reaches ``bound``. ``generate(text, sampling_params)`` returns the response object;
    any exception it raises is recorded as an error of the probe, as is a malformed histogram."""
    result = ProbeResult(bound=bound)
    for text in probe_prompts(max_requests):
        result.requests += 1
        try:
            answer = generate(text, {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True})
        except Exception as exc:  # noqa: BLE001 - a failed request proves nothing either way
            result.failed_requests.append(f"probe request {result.requests}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        meta = answer.get("meta_info") if isinstance(answer, Mapping) else None
        verify_ct = meta.get("spec_verify_ct") if isinstance(meta, Mapping) else None
        impossible = impossible_verify(meta, bound)
        if impossible is not None:
            result.errors.append(f"probe request {result.requests}: {impossible}")
        try:
            hist = histogram_of(meta, verify_ct if isinstance(verify_ct, int) and not isinstance(verify_ct, bool) else None)
        except HistogramError as exc:
            result.errors.append(f"probe request {result.requests}: invalid response: {exc}")
            break
        if impossible is not None:
            # a histogram that adds up is evidence of its own (which depth the verifies reached)
            if hist is not None:
                result.per_request.append(hist)
                result.histogram = add_histograms(result.histogram, hist)
            break
        if hist is None:
            if not (isinstance(meta, Mapping) and any(str(key).startswith("spec_") for key in meta)):
                result.no_spec += 1
            break  # this build sends no histogram: nothing more to learn from more requests
        result.per_request.append(hist)
        result.histogram = add_histograms(result.histogram, hist)
        if result.reached or bound_violation(result.histogram, bound):
            break
    return result


def impossible_verify(meta: Any, bound: int | None) -> str | None:
    """Why an answer's ``spec_verify_ct`` cannot be true (value and bound), or None: not a count, or
    more tokens per verify than ``bound`` drafts + the bonus allow (the prefill token besides)."""
    verify, tokens = (meta.get(k) if isinstance(meta, Mapping) else None for k in ("spec_verify_ct", "completion_tokens"))
    if verify is None:
        return None
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        return f"meta_info.spec_verify_ct is {str(verify)[:40]}: not a count of at least 0"
    if bound is not None and verify and isinstance(tokens, int) and tokens > (bound + 1) * verify + 1:
        return (f"{tokens} completion tokens in {verify} verifies is {tokens / verify:.2f} tokens per verify, above the "
                f"config's maximum of {bound + 1} (min(block_size - 1, steps, budget) + 1)")
    return None


# --------------------------------------------------------------------------------------
# Start-up lines and /metrics


_STARTUP_MARKERS = {
    "Initialized DFLASH draft runner": "dflash",
    "Initialized DDTREE v2 worker": "ddtree-v2",
    "Initialized DDTree worker": "ddtree-v1",
}
_KEY_VALUE = re.compile(r"\b([a-z_]+)=([^,\s]+)")
_TOPK_OVERRIDE = re.compile(r"overriding speculative_eagle_topk=(\d+) to (\d+)")


@dataclass
class StartupValues:
    """The effective values a service's start-up lines printed (None: not printed)."""

    lines: list[str] = field(default_factory=list)
    block_size: int | None = None
    budget: int | None = None
    topk: int | None = None
    window: int | None = None
    window_printed: bool = False
    topk_override: tuple[int, int] | None = None  # (asked, used)

    @property
    def found(self) -> bool:
        return bool(self.lines) or self.topk_override is not None


def _int_value(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) < 10 else None


def parse_startup_log(text: str) -> StartupValues:
    """The worker's start-up lines and the topk override warning, from a (bounded) log text.
    The last start-up in the text wins (a log file may hold an earlier launch)."""
    out = StartupValues()
    for line in text[-MAX_TEXT_BYTES:].splitlines():
        if len(line) > 4096:
            continue
        override = _TOPK_OVERRIDE.search(line)
        if override:
            out.topk_override = (int(override.group(1)[:9]), int(override.group(2)[:9]))
        kind = next((k for marker, k in _STARTUP_MARKERS.items() if marker in line), None)
        if kind is None:
            continue
        out.lines.append(line.strip()[:400])
        values = dict(_KEY_VALUE.findall(line.split(kind == "dflash" and "runner" or "worker", 1)[-1]))
        if (block := _int_value(values.get("block_size", ""))) is not None:
            out.block_size = block
        if (budget := _int_value(values.get("tree_budget", ""))) is not None:
            out.budget = budget
        if (topk := _int_value(values.get("topk", ""))) is not None:
            out.topk = topk
        if "draft_window_size" in values:
            out.window_printed = True
            out.window = _int_value(values["draft_window_size"])
    return out


def metric_value(text: str, name: str) -> float | None:
    """The value of a Prometheus sample ``name`` (any labels) in bounded /metrics text."""
    for line in text[:MAX_TEXT_BYTES].splitlines():
        if not line.startswith(name) or len(line) > 4096:
            continue
        rest = line[len(name):]
        if rest and rest[0] not in " {":
            continue  # another metric whose name starts the same
        value = rest.rsplit("}", 1)[-1].split()
        try:
            return float(value[0]) if value else None
        except ValueError:
            return None
    return None


# --------------------------------------------------------------------------------------
# The verdict per field


@dataclass
class FieldEvidence:
    status: str  # REPORTED, PROVEN, NOT_PROVEN or NOT_SETTABLE
    detail: str

    def as_dict(self) -> FieldEvidenceData:
        return {"status": self.status, "detail": self.detail}


@dataclass
class Proof:
    """Per config field, the strongest evidence the service gave; and what contradicted it."""

    fields: dict[str, FieldEvidence] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    #: observations that point at a problem but prove none (shown beside the failures, if any)
    notes: list[str] = field(default_factory=list)
    probe: ProbeResult | None = None
    startup: StartupValues | None = None
    metric_block_size: float | None = None

    def summary(self) -> str:
        """``block_size proven by behaviour, budget reported, ...`` (one line for tables)."""
        return ", ".join(f"{name} {ev.status}" for name, ev in self.fields.items())

    def as_dict(self) -> ProofData:
        return {
            "fields": {name: ev.as_dict() for name, ev in self.fields.items()},
            "failures": list(self.failures),
            "notes": list(self.notes),
            "probe": self.probe.as_dict() if self.probe is not None else None,
            "startup_lines": list(self.startup.lines) if self.startup is not None else [],
            "spec_num_draft_tokens": self.metric_block_size,
        }


def judge(values: Mapping[str, Any], *, settable: Iterable[str], reported: Iterable[str],
          probe: ProbeResult | None, startup: StartupValues | None, metrics_text: str | None) -> Proof:
    """Weigh the signals for one config's field ``values`` (block_size, budget, topk, window).

    ``metrics_text``: /metrics read while a request decoded (None: not read then); its
    ``sglang:spec_num_draft_tokens`` counts only when non-zero.

    ``settable``: the fields the profile sets; ``reported``: those its ``applied`` keys read back
    from /server_info (already checked equal). A signal that contradicts the config is a failure
    with its evidence; one that confirms it makes the field "proven by behaviour".
    """
    settable, reported = set(settable), set(reported)
    proof = Proof(probe=probe, startup=startup)
    proven: dict[str, list[str]] = {name: [] for name in values}
    block, budget = values.get("block_size"), values.get("budget")
    bound = accept_bound(values)
    if probe is not None:
        _probe_evidence(proof, proven, probe, values, bound)
    if startup is not None:
        _startup_evidence(proof, proven, startup, values)
    if metrics_text is not None:
        _gauge_evidence(proof, proven, metrics_text, block, budget)
    _field_verdicts(proof, proven, values, settable, reported)
    return proof


def _probe_evidence(proof: Proof, proven: dict[str, list[str]], probe: ProbeResult, values: Mapping[str, Any],
                    bound: int | None) -> None:
    """The copy probe's accept-length histogram against min(block_size - 1, budget): past the bound
    is a failure (the config did not run as asked), reaching it proves the fields that set it, and
    piling up below it is a note (a smaller setting served, or a drafter trained for fewer drafts)."""
    block, budget = values.get("block_size"), values.get("budget")
    proof.failures.extend(probe.errors)
    if probe.no_spec:  # SGLang puts spec_verify_ct on every answer it verified (tokenizer_manager.py:3148-3172)
        proof.failures.append("the server does not speculate: the copy probe's answer carries no spec_* key in "
                              "its meta_info (no spec_verify_ct: no verify ran)")
    if (violation := bound_violation(probe.histogram, bound, "the copy probe")) is not None:
        if budget is not None and bound == budget and max_index(probe.histogram) == budget + 1:
            violation += (f"; exactly one more than the budget {budget}: the build's budget flag does not count the "
                          "root node, and the profile maps it as if it did (set budget_counts_root: false, "
                          "budget to {value} and its applied key to 'budget')")
        proof.failures.append(violation)
    elif (ceiling := probe.ceiling()) is not None:
        # Not a failure on its own: a drafter trained at a smaller block size piles up the same
        # way (a DFlash drafter trained at 8 run at block size 16 stops at 7 drafts).
        proof.notes.append(
            f"the copy probe's verifies pile up at {ceiling} accepted drafts ({probe.histogram[ceiling]} of "
            f"{sum(probe.histogram)}; histogram {format_histogram(probe.histogram)}) and never exceed it, while "
            f"min(block_size - 1, budget) = {bound}: a smaller block size or budget is served, or the drafter "
            f"was trained for no more than {ceiling} drafts"
            + (f"; exactly one less than the budget {budget}: the build's budget flag may count the root node while "
               "the profile maps it as the non-root count (then set budget_counts_root: true, budget to {value+1} "
               "and its applied key to 'budget + 1')" if budget is not None and bound == budget and ceiling == budget - 1
               else ""))
    elif probe.reached and bound is not None:
        how = f"the copy probe reached the bound of {bound} accepted drafts (histogram {format_histogram(probe.histogram)})"
        if block is not None and bound == block - 1:
            proven["block_size"].append(how)
        if values.get("steps") is not None and bound == values["steps"]:
            proven["steps"].append(how)
        if budget is not None and bound == budget:
            proven["budget"].append(how)


def _startup_evidence(proof: Proof, proven: dict[str, list[str]], startup: StartupValues, values: Mapping[str, Any]) -> None:
    """The sizes the server's start-up lines print: one unlike the config's is a failure (quoting the
    line), one equal to it proves the field; a topk the build overrode is a failure too."""
    block, budget, topk, window = (values.get(k) for k in ("block_size", "budget", "topk", "window"))
    for name, want, got in (("block_size", block, startup.block_size), ("budget", budget, startup.budget),
                            ("topk", topk, startup.topk)):
        if got is None or want is None:
            continue
        if got != want:
            proof.failures.append(f"the start-up line says {name}={got}, the config asks {want}: {_first(startup.lines)}")
        elif name != "topk":  # a worker prints the block size and budget it builds its buffers for
            proven[name].append(f"the start-up line says {name}={got}")
    if startup.window_printed and startup.window != window:
        proof.failures.append(f"the start-up line says draft_window_size={startup.window}, the config asks {window}: "
                              f"{_first(startup.lines)}")
    if startup.topk_override is not None and topk is not None and startup.topk_override[0] == topk != startup.topk_override[1]:
        proof.failures.append(f"the build overrode topk: 'overriding speculative_eagle_topk={topk} to "
                              f"{startup.topk_override[1]}' in its log, so the config's topk {topk} never ran")


def _field_verdicts(proof: Proof, proven: dict[str, list[str]], values: Mapping[str, Any], settable: set[str],
                    reported: set[str]) -> None:
    """Each field's status from the evidence gathered: proven by behaviour, reported by
    /server_info only, not proven, or fixed by the build; the probe's notes stand beside the sizes
    they may explain when behaviour did not prove them."""
    for name in values:
        if name not in settable and name not in reported:  # fixed but read back (--ddtree-url's every field): shown
            ev = FieldEvidence(NOT_SETTABLE, "fixed by the build")
            if proven[name]:
                ev.detail += "; " + "; ".join(proven[name])
        elif proven[name]:
            ev = FieldEvidence(PROVEN, "; ".join(proven[name]))
        elif name in reported:
            ev = FieldEvidence(REPORTED, "/server_info shows it; no behaviour of the service shows it")
        else:
            ev = FieldEvidence(NOT_PROVEN, "neither /server_info nor any behaviour of the service shows it")
        if name in ("block_size", "budget") and ev.status != PROVEN and proof.notes:
            ev.detail += "; " + "; ".join(proof.notes)
        proof.fields[name] = ev


def _gauge_evidence(proof: Proof, proven: dict[str, list[str]], metrics_text: str, block: int | None,
                    budget: int | None) -> None:
    """``sglang:spec_num_draft_tokens`` of /metrics read while a request decoded (module docstring):
    0 or absent is not set yet, a decode-log interval away, and no evidence. It is the worker's
    ``speculative_num_draft_tokens``, the block size on upstream DFLASH and PR 27509's DDTree worker
    (a DFlashWorkerV2); a tree build whose flag of that name is the tree's node count (budget + 1,
    the SubSir port, PR 31069) may publish that instead, unverified: that value is no evidence either."""
    metric = metric_value(metrics_text, "sglang:spec_num_draft_tokens")
    proof.metric_block_size = metric
    if not metric or block is None:
        return
    if budget is not None and metric == budget + 1 != block:
        proof.notes.append(f"/metrics sglang:spec_num_draft_tokens is {metric:g} while a request decodes: the tree's node "
                           f"count (budget + 1), not the block size {block}; a tree build may publish that there (no evidence)")
        return
    if metric != block:
        proof.failures.append(f"/metrics sglang:spec_num_draft_tokens is {metric:g} while a request decodes, "
                              f"the config's block size is {block}")
    else:
        proven["block_size"].append(f"/metrics sglang:spec_num_draft_tokens is {metric:g} while a request decodes")


def _first(lines: Sequence[str]) -> str:
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------------------
# Fields no signal shows: an A/B over the session's configs


#: Fields no build shows by behaviour (no histogram bound, no start-up value that a worker
#: must honour): only configs that differ in them alone can say whether they had any effect.
def _a_b_fields() -> tuple[str, ...]:
    """The axes an A/B of greedy acceptance may find without effect: topk, the window, and every
    speculative axis of the catalogue beyond DDTree's four (a tree width, steps, the tree algorithm);
    not block size or budget (the copy probe proves those), nor a non-speculative axis (a backend,
    page size, overlap: greedy acceptance must not move with them, so equal acceptance proves nothing)."""
    from pytest_ddtree import axes as axes_mod

    extra = [a.name for a in axes_mod.catalogue() if a.speculative and a.name not in ("block_size", "budget", "topk", "window")]
    return ("topk", "window", *extra)



def _acceptance_key(record: Mapping[str, object]) -> tuple[str, Any] | None:
    """What greedy acceptance a cell measured: its repeats' distinct histograms where the server
    sent them (a cell's repeat count varies with its noise, so sums would not compare), else its
    tokens per verify step (rounded to 9 digits); None when it measured none."""
    repeats = record.get("repeat_histograms")
    if isinstance(repeats, list) and repeats and all(isinstance(h, list) for h in repeats):
        return ("histograms", tuple(sorted({tuple(h) for h in repeats})))
    from pytest_ddtree.metrics import TOKENS_PER_VERIFY, tokens_per_verify

    metrics = record.get("metrics")
    value = tokens_per_verify(metrics) if isinstance(metrics, Mapping) else None  # the requests' own ratio
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (TOKENS_PER_VERIFY, round(float(value), 9))
    return None


def _could_matter(name: str, a: Mapping[str, Any], b: Mapping[str, Any], context: int | None) -> bool:
    """Whether the two values of ``name`` could change a greedy result at all: topk only binds
    below the budget (a depth holds at most budget nodes); a window only past its length; any other
    speculative axis always may."""
    if name == "topk":
        budget = a.get("budget")
        ta, tb = a.get("topk"), b.get("topk")
        if budget is None or ta is None or tb is None:
            return False
        return bool(min(ta, budget) != min(tb, budget))
    if name == "window":
        if context is None:
            return False
        windows = [w for w in (a.get("window"), b.get("window")) if w is not None]
        return bool(windows) and context > min(windows)
    return name not in ("block_size", "budget")


def _workload(record: Mapping[str, object]) -> Mapping[str, object]:
    workload = record.get("workload")
    return workload if isinstance(workload, Mapping) else {}


def no_effect(records: Iterable[Mapping[str, object]], default_window: int | None) -> list[NoEffectFinding]:
    """Fields that showed no effect: configs differing only in topk (or only in the window) whose
    cells measured identical greedy acceptance on the same prompts, in every cell where the field
    could matter. Each finding names the field, the configs, the cells and the evidence; it is a
    report ("topk shows no effect on this build"), never proof that the field applied, and not a
    failure: a build may ignore a knob on purpose (upstream DFLASH forces topk to 1).
    ``default_window`` resolves config names without a window suffix (None: such configs are not
    compared on the window). ``records``: throughput records (``records.cells.normalize``'s), read key by
    key (only the acceptance, the config, the cell and its workload)."""
    from pytest_ddtree.configs import DEFAULT_WINDOW, config_or_none

    cells: dict[str, dict[str, Mapping[str, object]]] = {}
    values: dict[str, dict[str, Any]] = {}
    for r in records:
        name = str(r.get("config"))
        config = config_or_none(name)
        if config is None or r.get("measurement_status") == Status.INVALID or _acceptance_key(r) is None:
            continue
        if config.window is DEFAULT_WINDOW and default_window is None:
            values[name] = {**config.field_values(None), "window": -1}  # unknown: never compared on it
        else:
            values[name] = config.field_values(default_window)
        cells.setdefault(name, {})[str(r.get("cell"))] = r
    findings: list[NoEffectFinding] = []
    names = sorted(values)
    for field_name in _a_b_fields():
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                va, vb = values[a], values[b]
                if va.get(field_name) == vb.get(field_name) or any(va.get(f) != vb.get(f) for f in {*va, *vb} if f != field_name):
                    continue
                if field_name == "window" and -1 in (va["window"], vb["window"]):
                    continue
                compared: list[str] = []
                identical = True
                for cell in sorted(set(cells[a]) & set(cells[b])):
                    ra, rb = cells[a][cell], cells[b][cell]
                    if _workload(ra).get("prompts") != _workload(rb).get("prompts"):
                        continue  # not the same prompts: nothing to compare
                    context = _workload(ra).get("context_tokens")
                    context = int(context) if isinstance(context, int) and not isinstance(context, bool) else None
                    if not _could_matter(field_name, va, vb, context):
                        continue
                    compared.append(cell)
                    if _acceptance_key(ra) != _acceptance_key(rb):
                        identical = False
                        break
                if compared and identical:
                    shown = "/".join(str(v.get(field_name)) if v.get(field_name) is not None else "none" for v in (va, vb))
                    findings.append({
                        "field": field_name,
                        "configs": [a, b],
                        "cells": compared,
                        "message": (f"{field_name} shows no effect on this build: {a} and {b} ({field_name} {shown}) "
                                    f"measured identical greedy acceptance on the same prompts in {', '.join(compared)}"),
                    })
    return findings
