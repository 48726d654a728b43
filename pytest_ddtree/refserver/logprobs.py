"""Token log-probabilities of the reference engine's target, in SGLang's ``meta_info`` shapes.

Why: clients ask ``/generate`` for ``return_logprob`` / ``top_logprobs_num`` (bench_serving's
``--return-logprob``, evaluation harnesses scoring answers); an engine that silently drops them
makes a client's logprob path look fine in CI and break on a real server.

The distribution: the target (model.py ``TargetModel``) is count-based, so its next-token
distribution is the candidate counts of the longest corpus match with evidence (backing off as
``greedy`` does when ``ignore_eos`` removes the only candidate); when the sequence repeats an
earlier passage of itself for longer than the corpus match (``TargetModel.copied``), the repeated
passage's next token takes :data:`COPY_MASS` of the mass; at temperature T > 0 counts are raised
to 1/T (what ``sample`` draws from; SGLang reports logprobs after temperature scaling unless
``SGLANG_RETURN_ORIGINAL_LOGPROB``, and of the raw logits for greedy requests). Every other token
shares :data:`FLOOR_MASS`, so every logprob is finite. The greedy token is always the most
probable one.

Shapes (sgl-project/sglang v0.5.23 managers/tokenizer_manager.py ``add_logprob_to_meta_info``,
``detokenize_logprob_tokens``; managers/scheduler.py ``_create_generation_req`` for the start;
scheduler_components/logprob_result_processor.py for the input side):

* ``input_token_logprobs``: ``[logprob, token_id, text]`` for the prompt tokens from
  ``logprob_start_len`` on, the first one's logprob ``None`` (``[None] + logprobs[:-1]``);
  ``logprob_start_len`` -1 (the default) means the prompt's length: no input entries;
* ``output_token_logprobs``: one ``[logprob, token_id, text]`` per output token, and
  ``output_token_logprobs_length``;
* with ``top_logprobs_num`` k > 0: ``input_top_logprobs`` (``None`` first, then k entries per
  position) and ``output_top_logprobs`` (k entries per output token), best first;
* with ``token_ids_logprob``: ``input_token_ids_logprobs`` / ``output_token_ids_logprobs``, the
  listed ids' entries per position;
* ``text`` is the token's text with ``return_text_in_logprobs``, else ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pytest_ddtree.refserver.model import Context, CopyState, MatchState, Models, follow_copy

#: Probability the target puts on the token its own repeated passage dictates.
COPY_MASS = 0.9
#: Probability shared by all tokens the target has no evidence for.
FLOOR_MASS = 1e-6

Entry = list[Any]  # [logprob | None, token_id, text | None]


@dataclass(frozen=True)
class LogprobRequest:
    """The logprob fields of a /generate request (io_struct.py ``GenerateReqInput``)."""

    start: int  # first prompt position reported (len(prompt): none)
    top_k: int = 0
    token_ids: tuple[int, ...] | None = None
    with_text: bool = False


class Distribution:
    """The target's next-token distribution at one position (see the module docstring)."""

    def __init__(self, probs: dict[int, float], floor: float) -> None:
        self.probs = probs
        self.floor = floor

    def logprob(self, tok: int) -> float:
        return math.log(self.probs.get(tok, self.floor))

    def top(self, k: int) -> list[tuple[int, float]]:
        """The k most probable (token, logprob), best first (ties: lower id), floor tokens last."""
        ranked = sorted(self.probs.items(), key=lambda tp: (-tp[1], tp[0]))[:k]
        out = [(t, math.log(p)) for t, p in ranked]
        filler = 0
        while len(out) < k:
            if filler not in self.probs:
                out.append((filler, math.log(self.floor)))
            filler += 1
        return out


def distribution(models: Models, m: MatchState, copy: CopyState, ctx: Context, temperature: float,
                 ignore_eos: bool) -> Distribution:
    target, sam = models.target, models.sam
    eos = target.eos_id
    p = sam.predictive(m.state)
    while True:
        items = [(t, c) for t, c in sam.cands(p) if not (ignore_eos and t == eos)]
        if items or p == 0:
            break
        p = sam.predictive(sam.link[p])
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    weights = {t: float(c) ** inv_t for t, c in items}
    total = sum(weights.values()) or 1.0
    corpus = {t: w / total for t, w in weights.items()}
    copied = target.copied(m, copy, ctx, ignore_eos)
    if copied >= 0:
        corpus = {t: (1.0 - COPY_MASS) * q for t, q in corpus.items()}
        corpus[copied] = corpus.get(copied, 0.0) + COPY_MASS
    vocab = models.tokenizer.vocab_size
    floor = FLOOR_MASS / vocab
    probs = {t: (1.0 - FLOOR_MASS) * q + floor for t, q in corpus.items()}
    return Distribution(probs, floor)


@dataclass
class LogprobTracker:
    """Replays one request through the target and accumulates its logprob entries.

    The replay follows the engine's own state updates (engine.py ``_prefill_models`` /
    ``_target_push``), so an output token's distribution is the one it was chosen from. Output
    entries are added incrementally (one stream chunk after another costs only its new tokens).
    """

    models: Models
    prompt: list[int]
    req: LogprobRequest
    temperature: float
    ignore_eos: bool
    match: MatchState = field(default_factory=MatchState)
    copy: CopyState = field(default_factory=CopyState)
    ctx: Context = field(default_factory=Context)
    input_tokens: list[Entry] = field(default_factory=list)
    input_top: list[list[Entry] | None] = field(default_factory=list)
    input_ids: list[list[Entry] | None] = field(default_factory=list)
    output_tokens: list[Entry] = field(default_factory=list)
    output_top: list[list[Entry]] = field(default_factory=list)
    output_ids: list[list[Entry]] = field(default_factory=list)

    def __post_init__(self) -> None:
        target = self.models.target
        start = self.req.start
        for i, tok in enumerate(self.prompt):
            if i == start:
                self.input_tokens.append([None, tok, self._text(tok)])
                self.input_top.append(None)
                self.input_ids.append(None)
            elif i > start:
                self._record(tok, self.input_tokens, self.input_top, self.input_ids)
            self.ctx.append(tok)
            target.feed(self.match, tok)
            if i >= start:
                follow_copy(self.copy, self.ctx, i)
        # the engine chooses the copy source once, at the prompt's end (_prefill_models)
        self.copy.src, self.copy.length = self.ctx.source([], len(self.ctx))

    def _text(self, tok: int) -> str | None:
        return self.models.tokenizer.decode([tok], skip_special_tokens=False) if self.req.with_text else None

    def _record(self, tok: int, tokens: list[Entry], top: list[Any], ids: list[Any]) -> None:
        d = distribution(self.models, self.match, self.copy, self.ctx, self.temperature, self.ignore_eos)
        tokens.append([d.logprob(tok), tok, self._text(tok)])
        if self.req.top_k > 0:
            top.append([[lp, t, self._text(t)] for t, lp in d.top(self.req.top_k)])
        if self.req.token_ids is not None:
            ids.append([[d.logprob(t), t, self._text(t)] for t in self.req.token_ids])

    def extend(self, output_ids: list[int]) -> None:
        """Add the entries of ``output_ids[len(done):]`` (the output so far)."""
        target = self.models.target
        for tok in output_ids[len(self.output_tokens):]:
            self._record(tok, self.output_tokens, self.output_top, self.output_ids)
            self.ctx.append(tok)
            target.feed(self.match, tok)
            follow_copy(self.copy, self.ctx, len(self.ctx) - 1)

    def meta(self) -> dict[str, Any]:
        """The logprob keys of meta_info (cumulative, as SGLang streams them)."""
        out: dict[str, Any] = {
            "input_token_logprobs": list(self.input_tokens),
            "output_token_logprobs": list(self.output_tokens),
            "output_token_logprobs_length": len(self.output_tokens),
        }
        if self.req.top_k > 0:
            out["input_top_logprobs"] = list(self.input_top)
            out["output_top_logprobs"] = list(self.output_top)
        if self.req.token_ids is not None:
            out["input_token_ids_logprobs"] = list(self.input_ids)
            out["output_token_ids_logprobs"] = list(self.output_ids)
        return out
