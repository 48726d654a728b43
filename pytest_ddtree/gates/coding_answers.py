"""The coding gate's answers: a chat completion checked field by field, and the code extracted from it.

Why a module of its own: the answer is the service's, so hostile; reading it (bounded, linear, each
field checked) is a job apart from the problems (:mod:`pytest_ddtree.gates.coding_problems`) and the
gate that runs and judges the code (:mod:`pytest_ddtree.gates.coding`).

Extraction (:func:`extract_code`)
    1. ``<think>...</think>`` blocks are removed; text up to a lone ``</think>`` too (models
       whose chat template opens the think block); a ``<think>`` that is never closed only
       loses its tag, so a draft fence inside an unfinished thought can still be used.
    2. Fences are lines starting (up to 3 spaces of indent) with at least three backticks
       or tildes, with an optional info string; a fence is closed by a line of the same
       character at least as long; an unterminated last fence (the answer ran into
       ``max_tokens``) runs to the end of the text.
    3. The answer's code is the last fence whose info string is ``python``/``py``/
       ``python3``; else the last fence of any kind; else the whole (think-stripped) text.
    Empty code gives the ``no_code`` verdict.  Chat models scoring 0 has usually been an
    extraction bug elsewhere, hence the tests on messy shapes in ``tests/test_coding.py``.
    Every step is linear in the answer (no backtracking pattern runs over model output), and
    an answer over :data:`MAX_ANSWER_CHARS` is refused before it (:class:`AnswerTooLarge`).

Invalid responses (:func:`answer_of`)
    A chat completion is the service's, so hostile: each field is checked before use, and a
    malformed one is that problem's ``error`` "invalid response: ..." naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "AnswerTooLarge",
    "InvalidAnswer",
    "MAX_ANSWER_CHARS",
    "answer_of",
    "extract_code",
]

_THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)  # a literal: one try per position, linear
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_PY_INFOS = {"python", "py", "python3", "py3"}

#: Longest answer the gate extracts code from.  The service is asked for at most
#: ``--ddtree-coding-max-tokens`` tokens (a few KB); an answer far beyond that is not an
#: answer to judge, and the extraction (linear, but still a pass over the text) must not
#: be handed megabytes of hostile text.
MAX_ANSWER_CHARS = 1_000_000


class AnswerTooLarge(ValueError):
    """The answer is longer than :data:`MAX_ANSWER_CHARS`; the message says by how much."""


@dataclass(frozen=True)
class Fence:
    info: str
    body: str
    closed: bool


def strip_think(text: str) -> str:
    """Remove reasoning blocks (see the module docstring for the rules).

    Linear in the length of ``text``: the tags are found by one scan of a literal pattern
    (a lazy ``<think>.*?</think>`` rescans the rest of the text from every unclosed
    ``<think>``, quadratic in a reply of repeated tags).
    """
    kept: list[str] = []
    pos = 0
    opened: int | None = None
    for tag in _THINK_TAG.finditer(text):
        closing = tag.group(0)[1] == "/"
        if opened is None and not closing:
            opened = tag.start()
        elif opened is not None and closing:
            kept.append(text[pos:opened])  # the block <think>...</think> goes
            pos, opened = tag.end(), None
    kept.append(text[pos:])
    text = "".join(kept)
    last_close = None
    for last_close in _THINK_CLOSE.finditer(text):
        pass
    if last_close is not None:  # a lone </think>: the template opened the block, drop up to it
        text = text[last_close.end():]
    return re.sub(r"<think>", "", text, flags=re.IGNORECASE)


def _fence_open(line: str) -> tuple[str, str] | None:
    """(fence, info) when ``line`` opens a fence, else None.  Plain string operations: the
    regex this replaces backtracked cubically on a line of three backticks, spaces and a
    backtick."""
    indent = len(line) - len(line.lstrip(" "))
    if indent > 3:
        return None
    rest = line[indent:]
    char = rest[:1]
    if char not in ("`", "~"):
        return None
    run = len(rest) - len(rest.lstrip(char))
    if run < 3:
        return None
    info = rest[run:]
    if "`" in info:  # CommonMark: a backtick fence's info has no backtick (kept for tildes too)
        return None
    return rest[:run], info.strip(" \t")


def find_fences(text: str) -> list[Fence]:
    """Fenced blocks in document order (CommonMark-like: ``` or ~~~, closing at least as long).
    One pass over the lines: linear in the length of ``text``."""
    fences: list[Fence] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _fence_open(lines[i])
        if opening is None:
            i += 1
            continue
        fence, raw_info = opening
        words = raw_info.split()
        info = words[0].lower() if words else ""
        body: list[str] = []
        j = i + 1
        closed = False
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped and stripped[0] == fence[0] and len(stripped) >= len(fence) and not stripped.strip(fence[0]) and len(lines[j]) - len(lines[j].lstrip(" ")) <= 3:
                closed = True
                break
            body.append(lines[j])
            j += 1
        fences.append(Fence(info=info, body="\n".join(body) + ("\n" if body else ""), closed=closed))
        i = j + 1
    return fences


def check_answer_size(answer: str) -> None:
    """Raise :class:`AnswerTooLarge` for an answer the gate will not extract code from."""
    if len(answer) > MAX_ANSWER_CHARS:
        raise AnswerTooLarge(
            f"the answer has {len(answer):,} characters, more than the {MAX_ANSWER_CHARS:,} the gate extracts code from "
            "(far more than max_tokens allows: the service ignored the limit or sent junk); no code was run"
        )


def extract_code(answer: str) -> str:
    """The code in a chat answer: last python fence, else last fence, else the raw text.
    Raises :class:`AnswerTooLarge` beyond :data:`MAX_ANSWER_CHARS`; linear below it."""
    check_answer_size(answer or "")
    text = strip_think(answer or "")
    fences = find_fences(text)
    python = [f for f in fences if f.info in _PY_INFOS]
    chosen = python[-1] if python else (fences[-1] if fences else None)
    code = chosen.body if chosen is not None else text.strip() + "\n"
    return code if code.strip() else ""


class InvalidAnswer(ValueError):
    """A chat completion that is not the OpenAI shape; the message names the field."""


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def answer_of(response: object) -> tuple[str, int | None, str | None]:
    """(text, completion tokens, finish reason) of a chat completion (SGLang follows OpenAI:
    ``python/sglang/srt/entrypoints/openai/protocol.py``, ``ChatCompletionResponse``).

    Everything is checked before use, since the body is the service's: a 200 carrying an
    error object, a missing or empty ``choices``, a ``choices[0].message`` that is not an
    object, a ``content`` that is not a string, ``usage`` or ``finish_reason`` of the wrong
    type raise :class:`InvalidAnswer` naming the field; an answer over
    :data:`MAX_ANSWER_CHARS` does too.  ``content: null`` is an empty answer (``no_code``).
    """
    if not isinstance(response, Mapping):
        raise InvalidAnswer(f"the body is a JSON {_kind(response)}, not an object")
    if response.get("object") == "error" or "error" in response:
        error = response.get("error")
        detail = response.get("message") if response.get("object") == "error" else (error.get("message") if isinstance(error, Mapping) else error)
        raise InvalidAnswer(f"a success status with an error body: {str(detail)[:300] if detail is not None else 'no message'}")
    choices = response.get("choices")
    if not isinstance(choices, list):
        raise InvalidAnswer("'choices' is missing" if choices is None else f"'choices' is a {_kind(choices)}, not a list")
    if not choices:
        raise InvalidAnswer("'choices' is empty")
    first = choices[0]
    if not isinstance(first, Mapping):
        raise InvalidAnswer(f"'choices[0]' is a {_kind(first)}, not an object")
    message = first.get("message")
    if not isinstance(message, Mapping):
        raise InvalidAnswer("'choices[0].message' is missing" if message is None else f"'choices[0].message' is a {_kind(message)}, not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidAnswer(f"'choices[0].message.content' is a {_kind(content)}, not a string")
    text = content or ""
    try:
        check_answer_size(text)
    except AnswerTooLarge as exc:
        raise InvalidAnswer(f"'choices[0].message.content': {exc}") from None
    finish = first.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise InvalidAnswer(f"'choices[0].finish_reason' is a {_kind(finish)}, not a string")
    usage = response.get("usage")
    if usage is not None and not isinstance(usage, Mapping):
        raise InvalidAnswer(f"'usage' is a {_kind(usage)}, not an object")
    tokens = usage.get("completion_tokens") if usage is not None else None
    if tokens is not None and (type(tokens) is not int or tokens < 0):
        raise InvalidAnswer(f"'usage.completion_tokens' is {_short_repr(tokens)}, not a count")
    return text, tokens, finish


def _short_repr(value: object) -> str:
    return f"a {_kind(value)}" if not isinstance(value, (int, float, str)) else repr(value)[:40]
