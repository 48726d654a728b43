"""The block drafter: a weaker view of the target's two sources, with seeded training noise.

Why a module of its own: the target (model.py) is what the engine must reproduce exactly; the
drafter is what makes acceptance realistic, and it is tuned on its own (its noise by depth, its
window). Its corpus match is capped (its weights' capacity) and it sees the copied passage well
only inside the draft window, as SGLang's DFLASH draft attends only to the window's KV
(``dflash_worker.py``). It is rolled forward internally to give one distribution per depth, then
perturbed with noise keyed by each drafted token's absolute position in the sequence (model.py's
docstring says why).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_ddtree.refserver.model import (
    COPY_BACKOFF,
    COPY_NGRAM,
    TOP_CANDIDATES,
    Context,
    CopyState,
    MatchState,
    SuffixAutomaton,
    uniform_from,
    uniform_prefix,
)


@dataclass(frozen=True)
class DrafterNoise:
    """How the emulated drafter's training quality falls with depth.

    At depth d (1-based) the model's best guess is, with probability ``hit[d-1]``, the
    drafter's top candidate; with probability ``soft[d-1]`` it is demoted behind one or
    two decoys (a bigger tree can still recover it); otherwise it is missing (no tree
    can). Past the trained depth ``hit_untrained``/``soft_untrained`` apply and decoys
    weigh more: the distributions get flatter and noisier, so a block size beyond the
    trained one adds little acceptance. Decoys are frequent corpus tokens, i.e.
    plausible-looking wrong guesses. ``far_miss``: the extra chance of a hard miss on a
    token copied from a passage outside the draft window (recalled only through the
    window's target hidden states, see :class:`Drafter`). The defaults were calibrated so
    that bs8_b8_k4 accepts ~4.8 tokens per step on the bundled prompts (the campaign saw
    4.8-4.9; the gate's 128-token cells give 4.7-5.2).
    """

    hit: tuple[float, ...] = (0.91, 0.88, 0.85, 0.82, 0.79, 0.76, 0.73)
    soft: tuple[float, ...] = (0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.055)
    hit_untrained: float = 0.45
    soft_untrained: float = 0.10
    decoy: float = 0.05
    decoy_untrained: float = 0.5
    n_decoys: int = 3
    far_miss: float = 0.10


Dist = list[tuple[int, float]]


class Drafter:
    """Block drafter emulation: per-depth top-k distributions for depths 1..L, computed in
    one call (not verified one by one), from what the drafter sees of the sequence.

    What it sees follows SGLang's DFLASH worker (sgl-project/sglang
    python/sglang/srt/speculative/dflash_worker.py, ``_compute_compact_draft_seq_lens`` and
    ``_append_target_hidden_to_draft_kv``): with ``--speculative-draft-window-size W`` the
    draft's own KV table holds only the last ``min(seq_len, W)`` tokens of the sequence
    ("compact cache"), so the draft block attends to those alone; without a window it
    attends to the whole sequence. Here the drafter copies the repeat the target copies, but
    a repeated passage that lies further back than the window is not in the draft's KV: the
    drafter knows it only through the window's target hidden states (the target attended to
    it), so its tokens are missed ``DrafterNoise.far_miss`` more often; and the simulated
    clock prices the draft's attention over ``min(seq_len, W)`` tokens (clock.ClockModel).
    Its corpus knowledge (its weights) is a longest match capped at ``context_cap`` tokens.

    Internally it rolls both views forward on its own best guesses (what a block drafter
    does implicitly), then adds seeded noise keyed by each drafted token's absolute
    position in the sequence (see the module docstring).
    """

    def __init__(
        self,
        sam: SuffixAutomaton,
        trained_depth: int,
        context_cap: int = 12,
        window: int | None = None,
        noise: DrafterNoise | None = None,
        seed: int = 0,
    ) -> None:
        self.sam = sam
        self.trained_depth = trained_depth
        self.cap = context_cap if window is None else max(1, min(context_cap, window))
        self.window = window
        self.noise = noise or DrafterNoise()
        self.seed = seed
        # decoys: the most frequent tokens, i.e. plausible-looking wrong guesses
        self.decoys = [t for t, _ in sam.cands(0)[:64]] or [0]

    def feed(self, m: MatchState, tok: int) -> None:
        m.state, m.length = self.sam.advance(m.state, m.length, tok, self.cap)

    # the engine's inner loop, once per drafted depth of every step: its locals are hoisted for
    # speed (benchmarks/bench_refserver.py times the engine)
    def propose(
        self,
        m: MatchState,
        copy: CopyState,
        ctx: Context,
        salt: int,
        depth: int,
        topk: int,
    ) -> list[Dist]:
        """Distributions (best first, at most ``topk`` entries each) for depths
        1..``depth`` after the sequence ``ctx`` whose drafter states are ``m`` (corpus) and
        ``copy`` (in-context); ``salt`` (a request constant, e.g. a hash of its prompt)
        decorrelates the noise of different requests."""
        sam = self.sam
        seed = self.seed
        decoys = self.decoys
        far_from = None if self.window is None else self.window - COPY_NGRAM
        seq = ctx.seq
        base = len(seq)
        guesses: list[int] = []
        src, clen = copy.src, copy.length
        ctok = -1
        s, n = m.state, m.length
        out: list[Dist] = []
        for d in range(1, depth + 1):
            p = sam.predictive(s)
            cands = sam.cands(p)[:TOP_CANDIDATES]
            total = float(sam.cnt[p]) or 1.0
            trained = d <= self.trained_depth
            weights: dict[int, float] = {t: c / total for t, c in cands}
            best = cands[0][0] if cands else decoys[0]
            far = False
            if src >= 0:
                k = src + 1
                ctok = seq[k] if k < base else guesses[k - base]
                if clen > n:  # the repeat is longer than the corpus evidence: copy
                    best = ctok
                    # the corpus continuations become the back-off: most of the mass is the copy's
                    # (equal weights would leave the choice to token ids)
                    weights = {t: COPY_BACKOFF * w for t, w in weights.items()}
                    weights[ctok] = 1.0
                    # the repeated n-gram (src - COPY_NGRAM + 1 .. src) is not inside the last W
                    # tokens before the drafted one (the last is base + d - 2): seen only
                    # through the window's target hidden states
                    far = far_from is not None and base + d - 2 - src > far_from
                else:  # a shorter repeat is still a plausible alternative
                    weights[ctok] = max(weights.get(ctok, 0.0), 0.25)
            # keyed by the drafted token's absolute position, not by the depth: see the module docstring
            self._mistake(weights, best, d, trained, far, uniform_prefix(seed, ((base + d) * 1_000_003 + salt) << 6))
            ranked = sorted(weights.items(), key=lambda tw: (-tw[1], tw[0]))[:topk]
            z = sum(w for _, w in weights.items()) or 1.0
            out.append([(t, w / z) for t, w in ranked])
            # roll forward on the model's own best guess (trained) or the noisy one
            nxt = best if trained else ranked[0][0]
            s, n = sam.advance(s, n, nxt, self.cap)
            guesses.append(nxt)
            if src >= 0 and ctok == nxt:
                src += 1
                clen += 1
            else:  # where did the last tokens (guesses included) occur before?
                src, clen = ctx.source(guesses, base)
        return out

    def _mistake(self, weights: dict[int, float], best: int, d: int, trained: bool, far: bool, h: int) -> None:
        """Make the drafter wrong at depth ``d`` as a real one is: decoys (frequent wrong tokens) enter
        ``weights`` at low weight, and with the miss rates of ``self.noise`` (by depth while
        ``trained``, flat past it) a soft miss ranks a decoy above ``best`` and a hard miss (or a
        ``far`` copy the window cannot see) drops ``best`` outright. This is what makes acceptance
        fall with depth and lets a wider tree recover a demoted token (:class:`DrafterNoise`);
        ``h`` keys the draws."""
        noise, decoys = self.noise, self.decoys
        nd = len(decoys)
        if trained:
            i = min(d, len(noise.hit)) - 1
            hit, soft, dw = noise.hit[i], noise.soft[i], noise.decoy
        else:
            hit, soft, dw = noise.hit_untrained, noise.soft_untrained, noise.decoy_untrained
        for j in range(noise.n_decoys):
            t = decoys[int(uniform_from(h, 11 + j) * nd)]
            w = dw * uniform_from(h, 31 + j)
            weights[t] = max(weights.get(t, 0.0), w)
        u = uniform_from(h, 7)
        far_missed = far and uniform_from(h, 41) < noise.far_miss
        if u >= hit or far_missed:
            best_w = weights.get(best, 0.0)
            if u >= hit + soft or far_missed:
                # a hard miss: the drafter never learned this continuation
                weights.pop(best, None)
                best_w = 0.5 * dw + 0.1
            n_lead = 1 + (uniform_from(h, 8) < 0.4)
            for j in range(n_lead):
                lead = decoys[int(uniform_from(h, 9 + 10 * j) * nd)]
                if lead != best:
                    weights[lead] = max(weights.get(lead, 0.0), best_w * (1.2 + uniform_from(h, 10 + 10 * j)))
