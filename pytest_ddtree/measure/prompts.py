"""Throughput prompts: real text, cut to a cell's exact token count (no pytest import).

Why real text: a speculative decoder's acceptance depends on what it drafts for, and what it
drafts follows the prompt; random token ids make acceptance (and with it throughput) a property
of noise. Why exact lengths: a "4k" cell must send 4096 tokens, or cells are not comparable
across sessions and builds. Both together need the served model's own tokenizer, which SGLang
exposes as ``POST /tokenize``; the harness never needs the vocabulary size.

Sources (a workload's ``prompts:`` key, or ``--ddtree-dataset`` for every cell):

* ``coding``: the bundled coding prompts; ``chat``: bundled chat turns; ``documents``: long
  documents of real code and prose (``pytest_ddtree/data/prompts``, enough for the longest
  bundled context);
* a path to a ShareGPT JSON file (bench_serving's format: a list of ``{"conversations":
  [{"from": "human", "value": ...}, ...]}``; the first turn of each conversation with at least
  two turns is a unit, as bench_serving samples it);
* ``random``: random token ids, only with ``vocab_size`` in the service profile (the explicit
  opt-out of real text).

A request's text is the source's units joined from a start unit that differs per request
(so requests share no prefix the server could cache), long enough for the target; it is
tokenized, cut to exactly the target, and sent as ``input_ids``. How the text is tokenized:

1. the service's ``/tokenize`` (alias ``/v1/tokenize``), with ``add_special_tokens: false``;
2. else the profile's ``tokenizer:`` (a local Hugging Face tokenizer; needs ``transformers``,
   the ``[hf]`` extra);
3. else the text itself is sent, sized by a calibration request (one ``/generate`` with
   ``max_new_tokens: 1`` whose ``prompt_tokens`` gives characters per token), and each
   request's server-reported ``prompt_tokens`` must be within 5% of the target, or the cell is
   invalid with the figures.

The results say which source and which method each cell used (:attr:`PromptSet.label`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from pytest_ddtree.service.corpus import BUNDLED, JOINER, bundled_units

RANDOM = "random"
DEFAULT_SOURCE = "documents"
#: How far a text prompt's server-counted length may be from its target.
TEXT_TOLERANCE = 0.05
#: First guess of characters per token when sizing a text before tokenizing it (generous:
#: most tokenizers need fewer characters per token for code; a short text is grown anyway).
CHARS_PER_TOKEN_GUESS = 4.5


class PromptError(ValueError):
    """The prompts cannot be made as asked (unknown source, unreadable file, missing setting)."""


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: token ids (exact) or text (server-counted), and its target length."""

    target_tokens: int
    input_ids: tuple[int, ...] | None = None
    text: str | None = None
    #: the dataset's own label of the request's first conversation (a ShareGPT item's ``category``), or None
    category: str | None = None

    def payload(self) -> dict[str, Any]:
        """The prompt part of a ``/generate`` body."""
        if self.input_ids is not None:
            return {"input_ids": list(self.input_ids)}
        return {"text": self.text or ""}

    @property
    def sent_tokens(self) -> int | None:
        """Tokens sent, where the harness knows them (None for text prompts)."""
        return len(self.input_ids) if self.input_ids is not None else None


@dataclass(frozen=True)
class PromptSet:
    """The prompts of one cell phase, and how they were made."""

    prompts: list[Prompt]
    source: str
    method: str
    tolerance: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``documents via /tokenize`` and the like: what the results and the sweep show."""
        return f"{self.source} via {self.method}"

    @property
    def digest(self) -> str:
        """What exactly was sent (every prompt's token ids, or its text where the harness sends
        text), as 12 hex digits of a SHA-256: acceptance follows the prompts, so a baseline
        blessed on other prompts (an edited bundled text, another tokenizer) must not be
        compared with them, and the source's name alone cannot tell."""
        h = hashlib.sha256()
        for p in self.prompts:
            h.update(repr(p.input_ids if p.input_ids is not None else p.text).encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()[:12]


# --------------------------------------------------------------------------------------
# Source text


@lru_cache(maxsize=16)
def sharegpt_items(path: str) -> tuple[tuple[str, str | None], ...]:
    """First turns of a ShareGPT file's conversations that have at least two turns, each with the
    item's ``category`` where it carries one as a string (SPEED-Bench's and other labelled sets': the
    harness reports acceptance per category)."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PromptError(f"cannot read the prompt dataset {file}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PromptError(f"{file}: not JSON ({exc}); expected bench_serving's ShareGPT format") from None
    items: list[tuple[str, str | None]] = []
    if isinstance(data, list):
        for item in data:
            turns = item.get("conversations") if isinstance(item, dict) else None
            if isinstance(turns, list) and len(turns) >= 2 and isinstance(turns[0], dict):
                value = turns[0].get("value")
                if isinstance(value, str) and value.strip():
                    label = item.get("category")
                    items.append((value, label[:64] if isinstance(label, str) and label.strip() else None))
    if not items:
        raise PromptError(
            f"{file}: no usable conversations; expected bench_serving's ShareGPT format, a JSON list of "
            '{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}'
        )
    return tuple(items)


def sharegpt_units(path: str) -> tuple[str, ...]:
    """First turns of a ShareGPT file's conversations that have at least two turns."""
    return tuple(value for value, _ in sharegpt_items(path))


def categories_of(source: str) -> tuple[str | None, ...]:
    """Each unit's category, aligned with ``units_of(source)``; empty when the source carries none."""
    if source in BUNDLED or not (source.endswith(".json") or "/" in source):
        return ()
    labels = tuple(label for _, label in sharegpt_items(source))
    return labels if any(label is not None for label in labels) else ()


def _category(categories: Sequence[str | None], seed: int, index: int) -> str | None:
    """Request ``index``'s category: its first unit's."""
    return categories[_start_and_step(len(categories), seed, index)[0]] if categories else None


def units_of(source: str) -> tuple[str, ...]:
    if source in BUNDLED:
        return bundled_units(source)
    if source.endswith(".json") or "/" in source:
        return sharegpt_units(source)
    raise PromptError(f"unknown prompt source {source!r} (valid: {', '.join(BUNDLED)}, {RANDOM}, or a ShareGPT .json path)")


def source_name(source: str) -> str:
    """How a source is named in results: bundled names as they are, files as ``sharegpt:NAME``."""
    return source if source in BUNDLED or source == RANDOM else f"sharegpt:{Path(source).name}"


def stable_seed(*parts: object) -> int:
    """A seed that is the same in every process (``hash()`` is salted per process)."""
    return zlib.crc32("\x1f".join(str(p) for p in parts).encode())


def request_text(units: Sequence[str], start: int, step: int, min_chars: int) -> tuple[str, bool]:
    """Units from ``start`` (every ``step``-th, wrapping) until ``min_chars``; (text, wrapped).

    ``wrapped`` says the source was used up and text repeats (the caller notes it).
    """
    n = len(units)
    parts: list[str] = []
    size = 0
    taken = 0
    while size < min_chars:
        unit = units[(start + taken * step) % n]
        parts.append(unit)
        size += len(unit) + len(JOINER)
        taken += 1
    return JOINER.join(parts), taken > n


def _start_and_step(n_units: int, seed: int, index: int) -> tuple[int, int]:
    """Request ``index``'s first unit and stride: distinct first units for the first ``n`` requests,
    a different stride (so a different continuation) for every further round."""
    rounds, position = divmod(index, n_units)
    start = (seed + position * _coprime_stride(n_units)) % n_units
    return start, 1 + rounds


def _coprime_stride(n: int) -> int:
    """A stride near n / golden ratio that visits every unit before repeating."""
    stride = max(1, int(n * 0.618))
    while math.gcd(stride, n) != 1:
        stride += 1
    return stride


# --------------------------------------------------------------------------------------
# Tokenizers


class Encoder(Protocol):
    """Turns texts into the served model's token ids."""

    method: str
    key: str

    def encode(self, texts: Sequence[str]) -> list[list[int]]: ...


class ServiceEncoder:
    """The service's own ``/tokenize`` (``add_special_tokens: false``: the cut is the prompt)."""

    method = "/tokenize"

    def __init__(self, tokenize: Callable[[Sequence[str]], list[list[int]]], key: str) -> None:
        self._tokenize = tokenize
        self.key = f"service:{key}"

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self._tokenize(texts)


class LocalEncoder:
    """A local Hugging Face tokenizer (the profile's ``tokenizer:``), for services without /tokenize."""

    def __init__(self, path: str) -> None:
        try:
            from transformers import AutoTokenizer  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise PromptError(
                f"the profile's tokenizer: {path} needs the transformers package: pip install 'pytest-ddtree[hf]'"
            ) from None
        try:
            self._tok = AutoTokenizer.from_pretrained(path)
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
            raise PromptError(f"cannot load the profile's tokenizer {path}: {type(exc).__name__}: {exc}") from None
        self.method = f"tokenizer {path}"
        self.key = f"local:{path}"

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(self._tok.encode(t, add_special_tokens=False)) for t in texts]


# --------------------------------------------------------------------------------------
# Building a cell's prompts

_CACHE: dict[tuple[Any, ...], list[Prompt]] = {}
_CACHE_LOCK = threading.Lock()


def exact_prompts(encoder: Encoder, source: str, target: int, count: int, seed: int) -> tuple[list[Prompt], list[str]]:
    """``count`` prompts of exactly ``target`` tokens from ``source``; (prompts, notes).

    Cached per (tokenizer, source, target, count, seed) in this process: every repeat and every
    config of a session sends the same prompts, tokenized once.
    """
    key = (encoder.key, source, target, count, seed)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return cached, []
    units = units_of(source)
    notes: list[str] = []
    chars = [int(target * CHARS_PER_TOKEN_GUESS * 1.2) + 64] * count
    ids: list[list[int] | None] = [None] * count
    wrapped = False
    for _ in range(12):
        todo = [i for i in range(count) if ids[i] is None]
        if not todo:
            break
        texts = []
        for i in todo:
            start, step = _start_and_step(len(units), seed, i)
            text, w = request_text(units, start, step, chars[i])
            wrapped = wrapped or w
            texts.append(text)
        for i, text, tokens in zip(todo, texts, encoder.encode(texts)):
            if len(tokens) >= target:
                ids[i] = tokens[:target]
            else:  # grow by what this text says a token costs here, with a margin
                per_token = max(1.0, len(text) / max(1, len(tokens)))
                chars[i] = int(max(chars[i] * 1.5, target * per_token * 1.3)) + 64
    missing = [i for i in range(count) if ids[i] is None]
    if missing:
        raise PromptError(f"could not make {target}-token prompts from {source_name(source)} (the tokenizer "
                          f"returns too few tokens for {len(missing)} texts)")
    if wrapped:
        notes.append(f"{source_name(source)} is shorter than {target} tokens under this tokenizer: its text repeats "
                     "inside a prompt")
    categories = categories_of(source)
    prompts = [Prompt(target, input_ids=tuple(t or ()), category=_category(categories, seed, i)) for i, t in enumerate(ids)]
    with _CACHE_LOCK:
        _CACHE[key] = prompts
    return prompts, notes


def text_prompts(source: str, target: int, count: int, seed: int, chars_per_token: float) -> list[Prompt]:
    """Text prompts of about ``target`` tokens, sized by a measured characters-per-token figure."""
    units, categories = units_of(source), categories_of(source)
    out: list[Prompt] = []
    for i in range(count):
        start, step = _start_and_step(len(units), seed, i)
        want = max(1, round(target * chars_per_token))
        text, _ = request_text(units, start, step, want)
        out.append(Prompt(target, text=text[:want], category=_category(categories, seed, i)))
    return out


def random_prompts(vocab_size: int, target: int, count: int, seed: int) -> list[Prompt]:
    """Seeded random ids from the middle of the vocabulary (special tokens sit at either end)."""
    if vocab_size < 2:
        raise PromptError(f"vocab_size {vocab_size} is too small for random prompts")
    lo = max(1, vocab_size // 8)
    hi = max(lo + 1, vocab_size // 2)
    out = []
    for i in range(count):
        rng = random.Random(stable_seed("random", seed, i))
        out.append(Prompt(target, input_ids=tuple(rng.randrange(lo, hi) for _ in range(target))))
    return out


@dataclass
class PromptMaker:
    """Makes every cell's prompts for one service: picks the tokenizer once, then builds sets.

    ``tokenize``: the service's ``/tokenize`` (raising :class:`LookupError` when the service has
    none); ``count_prompt_tokens``: sends a text once and returns the server's ``prompt_tokens``
    (the calibration of the text fallback); ``tokenizer_path`` / ``vocab_size``: the profile's;
    ``dataset``: ``--ddtree-dataset``, which replaces every cell's source except ``random``.
    """

    tokenize: Callable[[Sequence[str]], list[list[int]]]
    count_prompt_tokens: Callable[[str], int]
    service_key: str
    tokenizer_path: str | None = None
    vocab_size: int | None = None
    dataset: str | None = None
    _encoder: Encoder | None = field(default=None, init=False)
    _resolved: bool = field(default=False, init=False)
    _chars_per_token: dict[str, float] = field(default_factory=dict, init=False)

    def source_for(self, workload_source: str | None) -> str:
        source = workload_source or DEFAULT_SOURCE
        if self.dataset and source != RANDOM:
            return self.dataset
        return source

    def encoder(self) -> Encoder | None:
        """The service's /tokenize when it has one, else the profile's tokenizer, else None (text)."""
        if not self._resolved:
            try:
                self.tokenize(["probe"])
                self._encoder = ServiceEncoder(self.tokenize, self.service_key)
            except LookupError:
                self._encoder = LocalEncoder(self.tokenizer_path) if self.tokenizer_path else None
            self._resolved = True
        return self._encoder

    def build(self, workload_source: str | None, target: int, count: int, seed: int) -> PromptSet:
        source = self.source_for(workload_source)
        name = source_name(source)
        if source == RANDOM:
            if not self.vocab_size:
                raise PromptError("prompts: random needs vocab_size in the service profile (SGLang reports no vocabulary "
                                  "size); or use real text: prompts: documents, coding, chat or a ShareGPT file")
            return PromptSet(random_prompts(self.vocab_size, target, count, seed), name, f"random ids (vocab_size {self.vocab_size})")
        units_of(source)  # a bad source fails before any request
        encoder = self.encoder()
        if encoder is not None:
            prompts, notes = exact_prompts(encoder, source, target, count, seed)
            return PromptSet(prompts, name, encoder.method, 0.0, tuple(notes))
        ratio = self._calibrate(source)
        return PromptSet(text_prompts(source, target, count, seed, ratio), name, "text (server-counted, ±5%)", TEXT_TOLERANCE,
                         (f"no /tokenize and no profile tokenizer: text prompts sized at {ratio:.2f} characters per token",))

    def _calibrate(self, source: str) -> float:
        """Characters per token of ``source`` as the server counts them (one short request)."""
        if source not in self._chars_per_token:
            sample, _ = request_text(units_of(source), 0, 1, 4000)
            tokens = self.count_prompt_tokens(sample)
            if tokens < 1:
                raise PromptError(f"the service counted {tokens} prompt tokens for a {len(sample)}-character text")
            self._chars_per_token[source] = len(sample) / tokens
        return self._chars_per_token[source]
