"""Deterministic tokenizer and chat template of the reference engine, exactly as a Hugging Face
``tokenizer.json`` describes it (:mod:`.hf_export` writes that file).

Why this design: the engine's models work on token ids, and the harness checks token counts
(``usage``, ``meta_info``) against the engine's own accounting, so tokenization must be exact,
deterministic and reversible for *any* text, including text the corpus never saw. And SGLang's
clients (its own ``bench_serving``, anything that loads ``/model_info``'s ``tokenizer_path``)
tokenize with a Hugging Face loader, so the engine's tokenization must be one such a loader
reproduces id for id. The algorithm is therefore the one of a ``tokenizers`` BPE model with
``ignore_merges``, no merges and ``byte_fallback`` (Llama-style byte tokens ``<0xXX>``), behind a
``Split`` pre-tokenizer:

1. special tokens written in the text (``<|eos|>``, the role markers) are matched first, as a
   Hugging Face tokenizer matches its added special tokens;
2. a regex splits the rest into word / number / punctuation / whitespace pieces (every character
   is covered by some alternative, so the pieces concatenate back to the input);
3. a piece in the vocabulary is one token; any other piece is taken character by character: a
   character that is itself a vocabulary piece is that token, any other falls back to its UTF-8
   bytes (256 byte tokens), so ``decode(encode(s)) == s`` always (specials kept).

The vocabulary is the corpus pieces, padded to :data:`VOCAB_SIZE` (the vocabulary size of Kimi K2,
the campaign's model) with reserved tokens, each a space and one CJK-range character: ids a real
tokenizer sends are then valid, and a reserved id decodes to text that encodes back to itself
(a space + one non-word character is always one piece), so random ids survive a text round trip.

``\\s`` is spelled out as Python's own set of 29 whitespace characters, because Oniguruma (the
regex engine of ``tokenizers``) has a slightly different ``\\s``; both engines then split alike.
Decoding follows the ``ByteFallback`` + ``Fuse`` decoders: a run of byte tokens becomes its UTF-8
text, or one U+FFFD per byte when the run is not valid UTF-8.
"""

from __future__ import annotations

import bisect
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

TOKENIZER_NAME = "refserver-bpe-bytefallback-v2"

#: Total ids, reserved padding included: Kimi K2's vocabulary size (a real tokenizer's ids fit).
VOCAB_SIZE = 163840

#: Python's ``\s`` for str patterns (29 characters), spelled out: see the module docstring.
_WS_CLASS = "\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

#: The pre-tokenizer. Alternatives are tried left to right at each position; the last one and the
#: punctuation class together cover every character, which is what makes the split loss-free.
PIECE_PATTERN = (
    r" ?[A-Za-z_][A-Za-z0-9_]*"  # identifiers / words, with their leading space
    r"| ?[0-9]+"  # numbers
    r"| ?[^" + _WS_CLASS + r"A-Za-z0-9_]"  # one punctuation or other non-space character
    r"|\n"  # newlines, one token each
    r"| +(?![^" + _WS_CLASS + r"])| +"  # runs of spaces (indentation); the last one goes with a word
    r"|[" + _WS_CLASS + r"]"  # any other whitespace character
)
PIECE_RE = re.compile(PIECE_PATTERN)

EOS = "<|eos|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS, SYSTEM, USER, ASSISTANT, END_OF_TURN)
SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS))
ROLE_TOKENS: Mapping[str, str] = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "user": USER,
    "assistant": ASSISTANT,
    "tool": USER,
}
NUM_BYTES = 256
#: Reserved tokens are " " + one character from here on (CJK Unified Ideographs and up).
RESERVED_FIRST_CODEPOINT = 0x4E00


def split_pieces(text: str) -> list[str]:
    """Split ``text`` into pre-tokenizer pieces; ``"".join(result) == text``."""
    return PIECE_RE.findall(text)


class ReservedRange:
    """Reserved ids ``first_id..first_id+count-1`` <-> pieces " " + chr(cp), computed, not stored.

    Code points run up from :data:`RESERVED_FIRST_CODEPOINT`, skipping surrogates and the code
    points whose " " + chr(cp) is already a corpus piece. Computing instead of materializing keeps
    the engine's start-up fast (160 000 strings and dict entries would cost ~0.15 s of CPU).
    """

    def __init__(self, first_id: int, count: int, taken: Iterable[str]) -> None:
        self.first_id = first_id
        self.count = count
        taken_cps = {ord(p[1]) for p in taken if len(p) == 2 and p[0] == " " and ord(p[1]) >= RESERVED_FIRST_CODEPOINT}
        self.skips = sorted(taken_cps | set(range(0xD800, 0xE000)))
        last = self._cp(count - 1) if count else RESERVED_FIRST_CODEPOINT
        if last > sys.maxunicode:
            raise ValueError(f"cannot reserve {count} tokens")

    def _cp(self, k: int) -> int:
        """The code point of the k-th reserved token (a fixed point over the skipped ones)."""
        cp = RESERVED_FIRST_CODEPOINT + k
        while True:
            nxt = RESERVED_FIRST_CODEPOINT + k + bisect.bisect_right(self.skips, cp)
            if nxt == cp:
                return cp
            cp = nxt

    def piece(self, token_id: int) -> str:
        return " " + chr(self._cp(token_id - self.first_id))

    def token_id(self, piece: str) -> int | None:
        """The id of a reserved piece, None for anything else."""
        if len(piece) != 2 or piece[0] != " ":
            return None
        cp = ord(piece[1])
        if cp < RESERVED_FIRST_CODEPOINT:
            return None
        i = bisect.bisect_left(self.skips, cp)
        if i < len(self.skips) and self.skips[i] == cp:
            return None
        k = cp - RESERVED_FIRST_CODEPOINT - i
        return self.first_id + k if k < self.count else None


class Tokenizer:
    """Special tokens + byte tokens + corpus pieces + reserved padding.

    Ids: specials first (0..4, EOS is 0), then the 256 bytes, then corpus pieces by descending
    frequency (ties by the piece itself), so the vocabulary is a pure function of the corpus text;
    then reserved pieces up to ``vocab_size`` (none when ``vocab_size`` is None).
    """

    def __init__(self, pieces: Sequence[str], vocab_size: int | None = None) -> None:
        self.id_to_piece: list[str] = list(SPECIAL_TOKENS)
        self.n_special = len(SPECIAL_TOKENS)
        self.byte_offset = self.n_special
        self.id_to_piece.extend(f"<0x{b:02X}>" for b in range(NUM_BYTES))
        self.piece_offset = len(self.id_to_piece)
        self.id_to_piece.extend(pieces)
        self.reserved_offset = len(self.id_to_piece)
        size = self.reserved_offset if vocab_size is None else vocab_size
        if size < self.reserved_offset:
            raise ValueError(f"vocab_size {vocab_size} is smaller than the corpus vocabulary ({self.reserved_offset})")
        self.reserved = ReservedRange(self.reserved_offset, size - self.reserved_offset, pieces)
        self.piece_to_id: dict[str, int] = {p: i + self.piece_offset for i, p in enumerate(pieces)}
        self.special_to_id: dict[str, int] = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
        self.eos_id = self.special_to_id[EOS]
        self.name = TOKENIZER_NAME

    @classmethod
    def from_texts(cls, texts: Iterable[str], vocab_size: int | None = None) -> Tokenizer:
        """Build the vocabulary from every piece of ``texts``."""
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(split_pieces(text))
        ordered = sorted(counts, key=lambda p: (-counts[p], p))
        return cls(ordered, vocab_size)

    @property
    def vocab_size(self) -> int:
        return self.reserved_offset + self.reserved.count

    def piece(self, token_id: int) -> str:
        """The vocabulary string of ``token_id`` (``0 <= token_id < vocab_size``)."""
        if token_id < self.reserved_offset:
            return self.id_to_piece[token_id]
        return self.reserved.piece(token_id)

    def vocabulary(self) -> Iterator[str]:
        """Every vocabulary string, in id order."""
        yield from self.id_to_piece
        for tid in range(self.reserved_offset, self.vocab_size):
            yield self.reserved.piece(tid)

    def is_special(self, token_id: int) -> bool:
        return token_id < self.n_special

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in it are matched (as Hugging Face does)."""
        if "<|" not in text:
            return self._encode_ordinary(text)
        ids: list[int] = []
        at = 0
        for m in SPECIAL_RE.finditer(text):
            ids.extend(self._encode_ordinary(text[at : m.start()]))
            ids.append(self.special_to_id[m.group()])
            at = m.end()
        ids.extend(self._encode_ordinary(text[at:]))
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = []
        lookup = self.piece_to_id.get
        reserved = self.reserved.token_id
        off = self.byte_offset
        for piece in PIECE_RE.findall(text):
            tid = lookup(piece)
            if tid is None and len(piece) == 2:
                tid = reserved(piece)
            if tid is not None:
                ids.append(tid)
                continue
            for ch in piece:  # BPE.merge_word with byte_fallback: known character, else its bytes
                cid = lookup(ch)
                if cid is not None:
                    ids.append(cid)
                else:
                    ids.extend(off + b for b in ch.encode("utf-8", "surrogatepass"))
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; a run of byte tokens is decoded as UTF-8, or one U+FFFD per byte when
        invalid (the ``ByteFallback`` decoder; only arbitrary ``input_ids`` produce that).
        Skipped special tokens do not break a byte run (they are removed before decoding)."""
        out: list[str] = []
        pending = bytearray()
        pieces = self.id_to_piece
        byte_lo, byte_hi = self.byte_offset, self.piece_offset
        n_special, n_stored = self.n_special, self.reserved_offset
        for tid in ids:
            if byte_lo <= tid < byte_hi:
                pending.append(tid - byte_lo)
                continue
            if tid < n_special and skip_special_tokens:
                continue
            if pending:
                out.append(_bytes_text(pending))
                pending.clear()
            out.append(pieces[tid] if tid < n_stored else self.reserved.piece(tid))
        if pending:
            out.append(_bytes_text(pending))
        return "".join(out)

    # -- chat template ---------------------------------------------------------------

    def render_turn(self, role: str, content: str) -> list[int]:
        """One finished chat turn: ``<|role|>`` + ``"\\n" + content`` + ``<|end|>``."""
        role_tok = ROLE_TOKENS.get(role, USER)
        return [
            self.special_to_id[role_tok],
            *self.encode("\n" + content),
            self.special_to_id[END_OF_TURN],
        ]

    def generation_prompt(self) -> list[int]:
        """The assistant header that asks the model to answer."""
        return [self.special_to_id[ASSISTANT], *self.encode("\n")]

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """Token ids of a chat prompt ending in the assistant header.

        Each turn is encoded on its own, so a user message has the same ids wherever it
        appears, which is what lets a corpus pair be reproduced whatever the system
        prompt is: the longest corpus match of the prompt's tail covers the user turn.
        """
        ids: list[int] = []
        for role, content in messages:
            ids.extend(self.render_turn(role, content))
        ids.extend(self.generation_prompt())
        return ids

    def render_pair(self, prompt: str, response: str) -> list[int]:
        """A corpus chat pair, as the target model is "trained" on it."""
        return [
            *self.render_turn("user", prompt),
            *self.generation_prompt(),
            *self.encode(response),
            self.eos_id,
        ]


def _bytes_text(run: bytearray) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)
