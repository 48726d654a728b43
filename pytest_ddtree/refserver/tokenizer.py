"""Deterministic, loss-free tokenizer and chat template of the reference engine.

Why this design: the engine's models work on token ids, and the harness checks token
counts (``usage``, ``meta_info``) against the engine's own accounting, so tokenization
must be exact, deterministic and reversible for *any* text, including text the corpus
never saw. A regex splits text into word / number / punctuation / whitespace pieces
(every character is covered by some alternative, so the pieces concatenate back to
the input); a piece found in the corpus vocabulary becomes one token, any other piece
falls back to its UTF-8 bytes (256 byte tokens), so ``decode(encode(s)) == s`` always.

Special tokens (chat roles, end of turn, EOS) are never produced by :meth:`encode`;
only the chat template inserts them, and :meth:`decode` skips them, as
``skip_special_tokens=True`` does in SGLang.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

TOKENIZER_NAME = "refserver-regex-bytes-v1"

#: The pre-tokenizer. Alternatives are tried left to right at each position; the last
#: one (``\s``) and the punctuation class together cover every character, which is what
#: makes the split loss-free.
PIECE_RE = re.compile(
    r" ?[A-Za-z_][A-Za-z0-9_]*"  # identifiers / words, with their leading space
    r"| ?[0-9]+"  # numbers
    r"| ?[^\sA-Za-z0-9_]"  # one punctuation or other non-space character
    r"|\n"  # newlines, one token each
    r"| +(?!\S)| +"  # runs of spaces (indentation); the last one goes with a word
    r"|\s"  # any other whitespace character
)

EOS = "<|eos|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS, SYSTEM, USER, ASSISTANT, END_OF_TURN)
ROLE_TOKENS: Mapping[str, str] = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "user": USER,
    "assistant": ASSISTANT,
    "tool": USER,
}
NUM_BYTES = 256


def split_pieces(text: str) -> list[str]:
    """Split ``text`` into pre-tokenizer pieces; ``"".join(result) == text``."""
    return PIECE_RE.findall(text)


class Tokenizer:
    """Piece vocabulary (from the corpus) + byte fallback + special tokens.

    Ids: specials first (0..4, EOS is 0), then the 256 bytes, then corpus pieces by
    descending frequency (ties by the piece itself), so the vocabulary is a pure
    function of the corpus text.
    """

    def __init__(self, pieces: Sequence[str]) -> None:
        self.id_to_piece: list[str] = list(SPECIAL_TOKENS)
        self.n_special = len(SPECIAL_TOKENS)
        self.byte_offset = self.n_special
        self.id_to_piece.extend(f"<0x{b:02X}>" for b in range(NUM_BYTES))
        self.piece_offset = len(self.id_to_piece)
        self.id_to_piece.extend(pieces)
        self.piece_to_id: dict[str, int] = {
            p: i + self.piece_offset for i, p in enumerate(pieces)
        }
        self.special_to_id: dict[str, int] = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
        self.eos_id = self.special_to_id[EOS]
        self.name = TOKENIZER_NAME

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> Tokenizer:
        """Build the vocabulary from every piece of ``texts``."""
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(split_pieces(text))
        ordered = sorted(counts, key=lambda p: (-counts[p], p))
        return cls(ordered)

    @property
    def vocab_size(self) -> int:
        return len(self.id_to_piece)

    def is_special(self, token_id: int) -> bool:
        return token_id < self.n_special

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (never special tokens)."""
        ids: list[int] = []
        lookup = self.piece_to_id.get
        for piece in PIECE_RE.findall(text):
            tid = lookup(piece)
            if tid is not None:
                ids.append(tid)
            else:
                off = self.byte_offset
                ids.extend(off + b for b in piece.encode("utf-8"))
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; byte tokens are joined and decoded as UTF-8 (replacing
        invalid sequences, which only arbitrary ``input_ids`` can produce)."""
        out: list[str] = []
        pending = bytearray()
        pieces = self.id_to_piece
        byte_lo, byte_hi = self.byte_offset, self.piece_offset
        for tid in ids:
            if byte_lo <= tid < byte_hi:
                pending.append(tid - byte_lo)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if tid < self.n_special and skip_special_tokens:
                continue
            out.append(pieces[tid])
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
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
