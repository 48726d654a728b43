"""Unified diffs and a strict pure-Python diff applier.

The applier needs no ``patch`` binary and is deliberately strict: no fuzz and no offsets,
because it is used to *prove* that a diff and a full copy agree, not to coax a diff onto a
drifting tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NO_NEWLINE = "\\ No newline at end of file"


class DiffError(Exception):
    """A unified diff is malformed or does not apply exactly (message names the hunk)."""


def _split_lines(text: str) -> list[str]:
    """Split on '\\n' only, keeping ends (str.splitlines would also split on \\r, \\f, ...)."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def unified_diff(old: str | None, new: str, target: str, context: int = 3) -> str:
    """A git-style unified diff (``a/<target>`` -> ``b/<target>``, no timestamps).

    ``old`` None means the file is new (``--- /dev/null``).  Deterministic output and the
    ``\\ No newline at end of file`` marker make it apply with ``patch -p1`` from
    site-packages as well as with :func:`apply_unified_diff`.
    """
    import difflib

    a = _split_lines(old or "")
    b = _split_lines(new)
    fromfile = "/dev/null" if old is None else f"a/{target}"
    out: list[str] = []
    for line in difflib.unified_diff(a, b, fromfile=fromfile, tofile=f"b/{target}", n=context):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + _NO_NEWLINE + "\n")
    return "".join(out)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class _Hunk:
    old_start: int
    old_len: int
    new_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (tag, text incl. newline or not)


def _parse_diff(diff: str) -> list[_Hunk]:
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    hunks: list[_Hunk] = []
    i = 0
    while i < len(lines) and not lines[i].startswith("@@"):
        if lines[i] and not lines[i].startswith(("---", "+++", "diff ", "index ", "new file", "deleted file")):
            raise DiffError(f"line {i + 1}: unexpected text before the first hunk: {lines[i][:60]!r}")
        i += 1
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            raise DiffError(f"line {i + 1}: expected a hunk header '@@ -a,b +c,d @@', got {lines[i][:60]!r}")
        h = _Hunk(
            int(m.group(1)),
            int(m.group(2)) if m.group(2) is not None else 1,
            int(m.group(4)) if m.group(4) is not None else 1,
        )
        header_line = i + 1
        i += 1
        n_old = n_new = 0
        while i < len(lines) and (n_old < h.old_len or n_new < h.new_len or lines[i].startswith("\\")):
            line = lines[i]
            if line.startswith("\\"):
                if not h.lines:
                    raise DiffError(f"line {i + 1}: 'No newline' marker without a preceding line")
                tag, text = h.lines[-1]
                h.lines[-1] = (tag, text[:-1] if text.endswith("\n") else text)
                i += 1
                continue
            tag = line[:1]
            if tag not in (" ", "-", "+"):
                if line == "":
                    tag = " "  # some tools strip the space of empty context lines
                else:
                    raise DiffError(f"line {i + 1}: hunk at line {header_line} has a bad line {line[:60]!r}")
            h.lines.append((tag, line[1:] + "\n"))
            if tag in (" ", "-"):
                n_old += 1
            if tag in (" ", "+"):
                n_new += 1
            i += 1
        if n_old != h.old_len or n_new != h.new_len:
            raise DiffError(
                f"hunk at line {header_line} is truncated or miscounted: header says -{h.old_len} +{h.new_len}, "
                f"body has -{n_old} +{n_new}"
            )
        hunks.append(h)
    return hunks


def apply_unified_diff(original: str, diff: str) -> str:
    """Apply ``diff`` to ``original`` exactly (no fuzz, no offset); raise DiffError otherwise."""
    src = _split_lines(original)
    out: list[str] = []
    pos = 0  # index into src of the next line not yet copied
    for n, h in enumerate(_parse_diff(diff), 1):
        start = h.old_start - 1 if h.old_len > 0 else h.old_start
        if start < pos:
            raise DiffError(f"hunk {n} (@@ -{h.old_start}) overlaps the previous hunk")
        if start > len(src):
            raise DiffError(f"hunk {n} starts at line {h.old_start} but the file has {len(src)} lines")
        out.extend(src[pos:start])
        pos = start
        for tag, text in h.lines:
            if tag in (" ", "-"):
                if pos >= len(src) or src[pos] != text:
                    got = src[pos] if pos < len(src) else "<end of file>"
                    raise DiffError(
                        f"hunk {n} (@@ -{h.old_start},{h.old_len}) does not match line {pos + 1}: "
                        f"expected {text!r}, found {got!r}"
                    )
                pos += 1
            if tag in (" ", "+"):
                out.append(text)
    out.extend(src[pos:])
    return "".join(out)


def reverse_unified_diff(diff: str) -> str:
    """The inverse diff (old and new swapped), used to rebuild the pristine text from a full copy."""
    out: list[str] = []
    for line in diff.split("\n"):
        m = _HUNK.match(line)
        if line.startswith("--- "):
            out.append("+++ " + line[4:])
        elif line.startswith("+++ "):
            out.append("--- " + line[4:])
        elif m:
            old = m.group(1) + ("," + m.group(2) if m.group(2) is not None else "")
            new = m.group(3) + ("," + m.group(4) if m.group(4) is not None else "")
            out.append(f"@@ -{new} +{old} @@" + line[m.end():])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        elif line.startswith("+"):
            out.append("-" + line[1:])
        else:
            out.append(line)
    # header lines were swapped in place; put '---' before '+++' again
    for i in range(len(out) - 1):
        if out[i].startswith("+++ ") and out[i + 1].startswith("--- "):
            out[i], out[i + 1] = out[i + 1], out[i]
    return "\n".join(out)
