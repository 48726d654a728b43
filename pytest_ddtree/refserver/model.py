"""The target and draft models: infini-gram style longest-match models over the corpus.

Why: the engine needs a *deterministic* target whose greedy continuation is a pure
function of the context (so losslessness can be checked token for token), that
answers corpus prompts with the corpus answers (so one model in the world passes the
coding gate), and that costs O(1) amortized per token (so the simulated clock, not
the CPU, sets the pace). A suffix automaton (SAM) over the corpus token stream gives
all three: feeding a token moves the longest-suffix-match state in O(1) amortized,
and the next-token counts of a state are the occurrence counts of its transitions.
Like a real LLM the target also copies from its own context: when the sequence's
latest suffix repeats an earlier passage for longer than its corpus match, the
continuation of that passage wins (:class:`Context`, :func:`follow_copy`).

The drafter (drafter.py) is a weaker view of the same two sources: its corpus match is capped (its
weights' capacity) and it sees the copied passage well only inside the draft window, the
last W tokens of the sequence (all of them with no window), as SGLang's DFLASH draft
attends only to the window's KV (``dflash_worker.py``). It is rolled forward internally
to give one distribution per depth, then perturbed with seeded "training noise" that
grows with depth and jumps past the trained block size. That makes acceptance realistic: high for
the first few positions, decaying with depth, and drafter-bound past the trained depth.
The noise of a drafted token is keyed by the token's absolute position in the sequence,
not by where the drafting step started: a token is hard or easy for every config alike
(deeper only makes it harder), so a bigger tree never loses acceptance to a different
draw of the noise.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from pytest_ddtree.refserver.tokenizer import VOCAB_SIZE, Tokenizer

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
    return _finish(uniform_prefix(*key))


def _finish(x: int) -> float:
    """The final mix of a key's state into [0, 1) (SplitMix64's finaliser)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x / 18446744073709551616.0


def uniform_prefix(*key: int) -> int:
    """The state of :func:`uniform` after ``key``: ``uniform_from(uniform_prefix(*a), b)``
    equals ``uniform(*a, b)``, for many draws that share a key prefix at the cost of one."""
    x = 0x9E3779B97F4A7C15
    for k in key:
        x = (x ^ (k & MASK64)) * 0xBF58476D1CE4E5B9 & MASK64
        x ^= x >> 29
    return x


def uniform_from(x: int, k: int) -> float:
    """``uniform(*prefix, k)`` from the prefix's state ``x`` (see :func:`uniform_prefix`)."""
    x = (x ^ (k & MASK64)) * 0xBF58476D1CE4E5B9 & MASK64
    return _finish(x ^ (x >> 29))


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


#: Shortest repeat of the sequence's own text that the models copy from (tokens).
COPY_NGRAM = 4
#: Earlier occurrences of an n-gram compared when a copy starts (the latest ones).
COPY_CANDIDATES = 16
#: Longest backward match measured when choosing among them (tokens).
COPY_MATCH_CAP = 32
#: Weight of the corpus continuations, against 1 for the copied token, when the drafter copies.
COPY_BACKOFF = 0.25


class Context:
    """One request's token sequence, with the end indices of every ``COPY_NGRAM``-gram.

    Why: in-context copying (what induction heads do in a real model) needs "where did the
    last tokens occur before, and which occurrence shares the longest context?" cheaply:
    appending is O(1) and choosing a source compares at most ``COPY_CANDIDATES`` earlier
    occurrences over at most ``COPY_MATCH_CAP`` tokens.
    """

    __slots__ = ("seq", "ends")

    def __init__(self) -> None:
        self.seq: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self.seq)

    def append(self, tok: int) -> None:
        seq = self.seq
        seq.append(tok)
        n = len(seq)
        if n >= COPY_NGRAM:
            key = tuple(seq[n - COPY_NGRAM :])
            got = self.ends.get(key)
            if got is None:
                self.ends[key] = [n - 1]
            else:
                got.append(n - 1)

    def extend(self, tokens: list[int]) -> None:
        """Append many tokens (a prompt): the same index as appending them one by one."""
        seq = self.seq
        start = len(seq)
        seq.extend(tokens)
        first = max(start, COPY_NGRAM - 1)  # end index of the first new n-gram
        if first >= len(seq):
            return
        add = self.ends.setdefault
        # n-grams ending at first, first + 1, ...: four staggered views of the sequence
        views = [seq[first - COPY_NGRAM + 1 + k :] for k in range(COPY_NGRAM)]
        for i, key in enumerate(zip(*views), first):
            add(key, []).append(i)

    def source(self, tail: list[int], end: int) -> tuple[int, int]:
        """Best earlier occurrence of the sequence ``seq[:end] + tail``'s last ``COPY_NGRAM``
        tokens: ``(index of its last token, shared context length)``, or ``(-1, 0)``.

        Of the latest ``COPY_CANDIDATES`` occurrences (ending before the sequence's last token),
        the one sharing the longest context (up to ``COPY_MATCH_CAP`` tokens) wins, ties to
        the latest. ``tail`` holds tokens past ``end`` that are not in the sequence (a
        drafter's own guesses).
        """
        seq = self.seq
        n_tail = len(tail)
        total = end + n_tail
        if total < COPY_NGRAM:
            return -1, 0
        if not n_tail:
            key = tuple(seq[end - COPY_NGRAM : end])
        elif n_tail >= COPY_NGRAM:
            key = tuple(tail[n_tail - COPY_NGRAM :])
        else:
            key = tuple(seq[end - COPY_NGRAM + n_tail : end] + tail)
        ends = self.ends.get(key)
        if ends is None:
            return -1, 0
        # the sequence's last tokens, newest last: what an earlier occurrence is compared with
        recent = seq[max(0, end - COPY_MATCH_CAP) : end] + tail if n_tail else seq[max(0, end - COPY_MATCH_CAP) : end]
        newest = len(recent) - 1
        last = total - 1
        best, best_len = -1, 0
        seen = 0
        for j in reversed(ends):
            if j >= last:
                continue  # the n-gram itself, or a position the target appended past ``end``
            length = COPY_NGRAM
            limit = min(COPY_MATCH_CAP, j + 1, newest + 1)
            while length < limit and seq[j - length] == recent[newest - length]:
                length += 1
            if length > best_len:
                best, best_len = j, length
            seen += 1
            if seen >= COPY_CANDIDATES:
                break
        return best, best_len


@dataclass
class CopyState:
    """Where a model copies from: ``src`` is the index of the earlier token aligned with the
    sequence's last token (its candidate next token is ``seq[src + 1]``), ``length`` how many
    tokens the repeat spans (at least ``COPY_NGRAM``); ``src == -1``: no repeat."""

    src: int = -1
    length: int = 0


def follow_copy(c: CopyState, ctx: Context, i: int) -> None:
    """Update ``c`` for token ``i`` of ``ctx`` (appended already).

    A repeat that still matches is followed (a copy continues, its source moving with the
    end, so its distance ``i - src`` stays fixed); otherwise the earlier occurrence of the
    last ``COPY_NGRAM`` tokens that shares the longest context starts a new one
    (:meth:`Context.source`).
    """
    seq = ctx.seq
    if c.src >= 0 and seq[c.src + 1] == seq[i]:
        c.src += 1
        c.length += 1
        return
    c.src, c.length = ctx.source([], i + 1)


class TargetModel:
    """Deterministic longest-match next-token model.

    Greedy: the most frequent next token of the longest corpus match (ties: lowest id);
    when the match has no next token, back off to shorter suffixes; at the root this is
    the corpus's most frequent token, so the model is total. With ``ignore_eos`` EOS is
    skipped and the next-best token (backing off if EOS is the only one) is chosen.
    When the sequence's end repeats an earlier passage of the sequence itself for longer
    than the corpus match (:meth:`copied`), the passage's next token wins instead.
    """

    def __init__(self, sam: SuffixAutomaton, eos_id: int) -> None:
        self.sam = sam
        self.eos_id = eos_id
        self._greedy: dict[int, int] = {}
        self._greedy_no_eos: dict[int, int] = {}

    def feed(self, m: MatchState, tok: int) -> None:
        m.state, m.length = self.sam.advance(m.state, m.length, tok)

    def copied(self, m: MatchState, copy: CopyState, ctx: Context, ignore_eos: bool = False) -> int:
        """The token the context's own repeat dictates, or -1: a repeat longer than the
        corpus match wins (the model continues the passage it is repeating)."""
        if copy.length > m.length:
            tok = ctx.seq[copy.src + 1]
            if not (ignore_eos and tok == self.eos_id):
                return tok
        return -1

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

    def sample(self, s: int, temperature: float, u: float, ignore_eos: bool = False, top_p: float = 1.0) -> int:
        """Sample the next token from counts**(1/T) of the longest match with evidence, within the
        nucleus ``top_p``: the likeliest tokens whose probabilities before each sum below top_p, as
        SGLang's sampler keeps them (sglang 0.5.23 sglang/srt/layers/sampler.py:1014, in
        top_p_normalize_probs_torch: ``probs_sum - probs_sort > top_p`` is masked)."""
        sam = self.sam
        p = sam.predictive(s)
        items = [(t, c) for t, c in sam.cands(p) if not (ignore_eos and t == self.eos_id)]
        if not items:
            return self.greedy(s, ignore_eos)
        inv_t = 1.0 / max(temperature, 1e-6)
        top = items[0][1]
        weights = [math.exp(inv_t * (math.log(c) - math.log(top))) for _, c in items]
        if top_p < 1.0:
            order = sorted(range(len(items)), key=lambda i: -weights[i])
            limit, before, kept = top_p * sum(weights), 0.0, []
            for i in order:
                if before > limit:
                    break
                kept.append(i)
                before += weights[i]
            items, weights = [items[i] for i in kept], [weights[i] for i in kept]
        total = sum(weights)
        x = u * total
        for (t, _), w in zip(items, weights):
            x -= w
            if x < 0:
                return t
        return items[-1][0]


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
    tok = Tokenizer.from_texts(corpus.all_text(), VOCAB_SIZE)
    sam = SuffixAutomaton(corpus.token_stream(tok))
    return Models(tok, sam, TargetModel(sam, tok.eos_id), corpus)
