""""Did you mean": the closest valid names to one a person typed.

Why a module of its own: config names, workload names, profile keys and the matrix's keys are all
typed by hand, and a typo in any of them must come back with the name that was meant (like git's
and pip's "did you mean"), worded the same way everywhere. The ranking is difflib's (the ratio of
matching characters), with ties in the order the choices are listed
(the matrix's order), so ``bs8_b8_k5`` names ``bs8_b8_k4`` first and ``ready_timeout`` names
``ready_timeout_s``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``choices`` nearest to ``word``, nearest first (none when nothing is close)."""
    scored = []
    for index, choice in enumerate(dict.fromkeys(choices)):
        matcher = difflib.SequenceMatcher(None, word, choice)
        if matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6 and matcher.ratio() >= 0.6:
            scored.append((-matcher.ratio(), index, choice))
    return [choice for _, _, choice in sorted(scored)[:n]]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"did you mean 'a' or 'b'? "`` (with the trailing space) or ``""``: for the front of a hint."""
    near = closest(word, choices)
    if not near:
        return ""
    quoted = [repr(name) for name in near]
    return "did you mean " + (" or ".join(quoted) if len(quoted) < 3 else ", ".join(quoted[:-1]) + " or " + quoted[-1]) + "? "
