"""``--ddtree-measure-only``: the numbers of any running server, with no gate.

What an SGLang user who knows ``bench_serving`` expects of ``--base-url``: point the harness at a
server, speculative or plain (``python -m sglang.launch_server`` with no ``--speculative-algorithm``),
and get each selected cell's output tok/s, TTFT, TPOT, ITL, E2E and request throughput, with the
acceptance where the server speculates, in the sweep table, results.json/results.md, report.html and
``--ddtree-output-file``. Nothing is compared with a baseline (each cell's verdict is ``measured``),
no control is launched, no bless is proposed, and the verdict line says the session only measured.
A measurement that is broken (errors, wrong token counts) still fails its cell: those numbers are
not numbers of the server.

A plain server's row is the config ``specnone`` (:mod:`pytest_ddtree.service.plain`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Why a measure-only cell has no verdict against a baseline (its record's reasons say it).
NOT_JUDGED = "measure-only: measured, not judged against a baseline (--ddtree-measure-only)"


def verdict_line(gated: str, cells: Sequence[Mapping[str, Any]]) -> str:
    """The session's one line where nothing was judged: how many cells of which configs were
    measured; ``gated``: the line a gated session would show (``finish.verdict_line``), kept in front
    where something failed, was interrupted or never ran (a broken measurement still fails its cell)."""
    configs = sorted({str(c.get("config")) for c in cells})
    measured = (f"{len(cells)} cell(s) of {len(configs)} config(s) measured ({', '.join(configs)})" if cells
                else "no throughput cell was measured")
    what = f"{measured}; nothing was judged against a baseline (--ddtree-measure-only)"
    return f"MEASURED: {what}" if gated.startswith("PASSED") else f"{gated} [measure-only: {what}]"
