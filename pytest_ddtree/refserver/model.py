"""The target and draft models: infini-gram style longest-match models over the corpus.

Why: the engine needs a *deterministic* target whose greedy continuation is a pure
function of the context (so losslessness can be checked token for token), that
answers corpus prompts with the corpus answers (so one model in the world passes the
coding gate), and that costs O(1) amortized per token (so the simulated clock, not
the CPU, sets the pace). A suffix automaton (SAM) over the corpus token stream gives
all three: feeding a token moves the longest-suffix-match state in O(1) amortized,
and the next-token counts of a state are the occurrence counts of its transitions.

The drafter is a weaker view of the same automaton (its match length is capped and
it only sees the draft window), rolled forward internally to give one distribution
per depth, then perturbed with seeded "training noise" that grows with depth and
jumps past the trained block size. That makes acceptance realistic: high for the
first few positions, decaying with depth, and drafter-bound past the trained depth.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .tokenizer import Tokenizer

CORPUS_DIR = Path(__file__).with_name("corpus")
MASK64 = (1 << 64) - 1
#: Candidates kept per automaton state; more than any topk a config asks for.
TOP_CANDIDATES = 8


def uniform(*key: int) -> float:
    """A uniform float in [0, 1) that is a pure function of ``key`` (splitmix64).

    Keyed noise instead of a shared RNG stream makes every random choice independent
    of request order and batch composition: two configs see the same noise at the
    same position, and temperature sampling is identical under any config.
    """
    x = 0x9E3779B97F4A7C15
    for k in key:
        x = (x ^ (k & MASK64)) * 0xBF58476D1CE4E5B9 & MASK64
        x ^= x >> 29
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x / 18446744073709551616.0


# ----------------------------------------------------------------------------------
# corpus
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The texts and chat pairs the models are built from, in a fixed order."""

    texts: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    digest: str

    @classmethod
    def load(cls, directory: Path = CORPUS_DIR) -> Corpus:
        """Read ``*.txt`` (plain documents) and ``*.jsonl`` (``{"prompt", "response"}``
        lines) from ``directory``, sorted by file name so the build is reproducible."""
        texts: list[str] = []
        pairs: list[tuple[str, str]] = []
        h = hashlib.sha256()
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".txt", ".jsonl"):
                continue
            raw = path.read_text(encoding="utf-8")
            h.update(path.name.encode() + b"\0" + raw.encode() + b"\0")
            if path.suffix == ".txt":
                texts.append(raw)
                continue
            for lineno, line in enumerate(raw.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    pairs.append((str(obj["prompt"]), str(obj["response"])))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path.name}:{lineno}: bad chat pair: {exc}") from exc
        return cls(tuple(texts), tuple(pairs), h.hexdigest()[:16])

    def all_text(self) -> list[str]:
        return [*self.texts, *(p for pair in self.pairs for p in pair)]

    def token_stream(self, tok: Tokenizer) -> list[int]:
        """Documents end with EOS; chat pairs are rendered with the chat template."""
        stream: list[int] = []
        for text in self.texts:
            stream.extend(tok.encode(text))
            stream.append(tok.eos_id)
        for prompt, response in self.pairs:
            stream.extend(tok.render_pair(prompt, response))
        return stream


# ----------------------------------------------------------------------------------
# suffix automaton
# ----------------------------------------------------------------------------------


class SuffixAutomaton:
    """Suffix automaton of a token stream with per-state occurrence counts.

    State 0 is the root (the empty match). ``cands(s)`` lists the next tokens of state
    ``s`` with their counts, best first (ties: lower token id), computed lazily: most
    states are never visited by a prompt.
    """

    def __init__(self, stream: list[int]) -> None:
        trans: list[dict[int, int]] = [{}]
        link = [-1]
        length = [0]
        cnt = [0]
        last = 0
        for c in stream:
            cur = len(length)
            trans.append({})
            length.append(length[last] + 1)
            link.append(0)
            cnt.append(1)
            p = last
            while p != -1 and c not in trans[p]:
                trans[p][c] = cur
                p = link[p]
            if p != -1:
                q = trans[p][c]
                if length[p] + 1 == length[q]:
                    link[cur] = q
                else:
                    clone = len(length)
                    trans.append(dict(trans[q]))
                    length.append(length[p] + 1)
                    link.append(link[q])
                    cnt.append(0)
                    while p != -1 and trans[p].get(c) == q:
                        trans[p][c] = clone
                        p = link[p]
                    link[q] = clone
                    link[cur] = clone
            last = cur
        # occurrence counts: push counts up the suffix-link tree, longest states first
        order = sorted(range(1, len(length)), key=length.__getitem__, reverse=True)
        for s in order:
            cnt[link[s]] += cnt[s]
        self.trans = trans
        self.link = link
        self.length = length
        self.cnt = cnt
        self._cands: dict[int, list[tuple[int, int]]] = {}
        self.n_tokens = len(stream)

    @property
    def n_states(self) -> int:
        return len(self.length)

    def cands(self, s: int) -> list[tuple[int, int]]:
        """Next tokens of state ``s`` as ``(token, count)``, best first."""
        got = self._cands.get(s)
        if got is None:
            cnt = self.cnt
            items = [(t, cnt[nxt]) for t, nxt in self.trans[s].items()]
            items.sort(key=lambda tc: (-tc[1], tc[0]))
            got = items
            self._cands[s] = got
        return got

    def advance(self, s: int, n: int, tok: int, cap: int = 0) -> tuple[int, int]:
        """Longest-match state after appending ``tok`` to a context whose longest
        corpus match is state ``s`` of length ``n``; ``cap`` > 0 limits the match
        length (a model that only looks ``cap`` tokens back)."""
        trans, link, length = self.trans, self.link, self.length
        while s and tok not in trans[s]:
            s = link[s]
            n = length[s]
        nxt = trans[s].get(tok)
        if nxt is None:
            return 0, 0
        s, n = nxt, n + 1
        if cap and n > cap:
            n = cap
            while length[link[s]] >= cap:
                s = link[s]
        return s, n

    def predictive(self, s: int) -> int:
        """The nearest state on ``s``'s suffix path that has a next token: the longest
        context with any evidence (the infini-gram back-off)."""
        trans, link = self.trans, self.link
        while s and not trans[s]:
            s = link[s]
        return s


# ----------------------------------------------------------------------------------
# target
# ----------------------------------------------------------------------------------


@dataclass
class MatchState:
    """Incremental longest-match state of one sequence (O(1) per appended token)."""

    state: int = 0
    length: int = 0


class TargetModel:
    """Deterministic longest-match next-token model.

    Greedy: the most frequent next token of the longest corpus match (ties: lowest id);
    when the match has no next token, back off to shorter suffixes; at the root this is
    the corpus's most frequent token, so the model is total. With ``ignore_eos`` EOS is
    skipped and the next-best token (backing off if EOS is the only one) is chosen.
    """

    def __init__(self, sam: SuffixAutomaton, eos_id: int) -> None:
        self.sam = sam
        self.eos_id = eos_id
        self._greedy: dict[int, int] = {}
        self._greedy_no_eos: dict[int, int] = {}

    def feed(self, m: MatchState, tok: int) -> None:
        m.state, m.length = self.sam.advance(m.state, m.length, tok)

    def greedy(self, s: int, ignore_eos: bool = False) -> int:
        cache = self._greedy_no_eos if ignore_eos else self._greedy
        got = cache.get(s)
        if got is not None:
            return got
        sam = self.sam
        p = sam.predictive(s)
        while True:
            tok = -1
            for t, _ in sam.cands(p):
                if not (ignore_eos and t == self.eos_id):
                    tok = t
                    break
            if tok >= 0 or p == 0:
                break
            p = sam.predictive(sam.link[p])
        if tok < 0:  # only possible for a corpus made of EOS alone
            tok = 0
        cache[s] = tok
        return tok

    def sample(self, s: int, temperature: float, u: float, ignore_eos: bool = False) -> int:
        """Sample the next token from counts**(1/T) of the longest match with evidence."""
        sam = self.sam
        p = sam.predictive(s)
        items = [(t, c) for t, c in sam.cands(p) if not (ignore_eos and t == self.eos_id)]
        if not items:
            return self.greedy(s, ignore_eos)
        inv_t = 1.0 / max(temperature, 1e-6)
        top = items[0][1]
        weights = [math.exp(inv_t * (math.log(c) - math.log(top))) for _, c in items]
        total = sum(weights)
        x = u * total
        for (t, _), w in zip(items, weights):
            x -= w
            if x < 0:
                return t
        return items[-1][0]


# ----------------------------------------------------------------------------------
# drafter
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrafterNoise:
    """How the emulated drafter's training quality falls with depth.

    At depth d (1-based) the model's best guess is, with probability ``hit[d-1]``, the
    drafter's top candidate; with probability ``soft[d-1]`` it is demoted behind one or
    two decoys (a bigger tree can still recover it); otherwise it is missing (no tree
    can). Past the trained depth ``hit_untrained``/``soft_untrained`` apply and decoys
    weigh more: the distributions get flatter and noisier, so a block size beyond the
    trained one adds little acceptance. Decoys are frequent corpus tokens, i.e.
    plausible-looking wrong guesses. The defaults were calibrated so that bs8_b8_k4
    accepts ~4.8 tokens per step on the bundled prompts (the campaign saw 4.8-4.9).
    """

    hit: tuple[float, ...] = (0.91, 0.88, 0.85, 0.82, 0.79, 0.76, 0.73)
    soft: tuple[float, ...] = (0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.055)
    hit_untrained: float = 0.45
    soft_untrained: float = 0.10
    decoy: float = 0.05
    decoy_untrained: float = 0.5
    n_decoys: int = 3


Dist = list[tuple[int, float]]


class Drafter:
    """Block drafter emulation: per-depth top-k distributions for depths 1..L from the
    last ``window`` tokens, computed in one call (not verified one by one).

    Internally it rolls a capped-context longest-match model forward on its own best
    guesses (what a block drafter does implicitly), then adds seeded noise.
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
        self.noise = noise or DrafterNoise()
        self.seed = seed
        # decoys: the most frequent tokens, i.e. plausible-looking wrong guesses
        self.decoys = [t for t, _ in sam.cands(0)[:64]] or [0]

    def feed(self, m: MatchState, tok: int) -> None:
        m.state, m.length = self.sam.advance(m.state, m.length, tok, self.cap)

    def propose(
        self, m: MatchState, position: int, salt: int, depth: int, topk: int
    ) -> list[Dist]:
        """Distributions (best first, at most ``topk`` entries each) for depths
        1..``depth`` after a context of ``position`` tokens whose drafter state is ``m``;
        ``salt`` (e.g. the last token) decorrelates the noise of different requests."""
        sam = self.sam
        noise = self.noise
        seed = self.seed
        decoys = self.decoys
        nd = len(decoys)
        s, n = m.state, m.length
        out: list[Dist] = []
        for d in range(1, depth + 1):
            p = sam.predictive(s)
            cands = sam.cands(p)[:TOP_CANDIDATES]
            total = float(sam.cnt[p]) or 1.0
            trained = d <= self.trained_depth
            weights: dict[int, float] = {t: c / total for t, c in cands}
            best = cands[0][0] if cands else decoys[0]
            if trained:
                i = min(d, len(noise.hit)) - 1
                hit, soft, dw = noise.hit[i], noise.soft[i], noise.decoy
            else:
                hit, soft, dw = noise.hit_untrained, noise.soft_untrained, noise.decoy_untrained
            key = ((position * 1_000_003 + salt) << 6) + d
            for j in range(noise.n_decoys):
                t = decoys[int(uniform(seed, key, 11 + j) * nd)]
                w = dw * uniform(seed, key, 31 + j)
                weights[t] = max(weights.get(t, 0.0), w)
            u = uniform(seed, key, 7)
            if u >= hit:
                best_w = weights.get(best, 0.0)
                if u >= hit + soft:
                    # a hard miss: the drafter never learned this continuation
                    weights.pop(best, None)
                    best_w = 0.5 * dw + 0.1
                n_lead = 1 + (uniform(seed, key, 8) < 0.4)
                for j in range(n_lead):
                    lead = decoys[int(uniform(seed, key, 9 + 10 * j) * nd)]
                    if lead != best:
                        weights[lead] = max(weights.get(lead, 0.0), best_w * (1.2 + uniform(seed, key, 10 + 10 * j)))
            ranked = sorted(weights.items(), key=lambda tw: (-tw[1], tw[0]))[:topk]
            z = sum(w for _, w in weights.items()) or 1.0
            out.append([(t, w / z) for t, w in ranked])
            # roll forward on the model's own best guess (trained) or the noisy one
            nxt = best if trained else ranked[0][0]
            s, n = sam.advance(s, n, nxt, self.cap)
        return out


# ----------------------------------------------------------------------------------
# the bundle built at start-up
# ----------------------------------------------------------------------------------


@dataclass
class Models:
    tokenizer: Tokenizer
    sam: SuffixAutomaton
    target: TargetModel
    corpus: Corpus


def build_models(directory: Path = CORPUS_DIR) -> Models:
    """Tokenizer + automaton + target, from the corpus (about a second, cold)."""
    corpus = Corpus.load(directory)
    tok = Tokenizer.from_texts(corpus.all_text())
    sam = SuffixAutomaton(corpus.token_stream(tok))
    return Models(tok, sam, TargetModel(sam, tok.eos_id), corpus)
