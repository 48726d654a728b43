"""``--ddtree-measure-only``: the numbers of any running server, with no gate.

What an SGLang user who knows ``bench_serving`` expects of ``--base-url``: point the harness at a
server, speculative or plain (``python -m sglang.launch_server`` with no ``--speculative-algorithm``),
and get each selected cell's output tok/s, TTFT, TPOT, ITL, E2E and request throughput, with the
acceptance where the server speculates, in the sweep table, results.json/results.md, report.html and
``--ddtree-output-file``. Nothing is compared with a baseline (each cell's verdict is ``measured``),
no control is launched, no bless is proposed, and the verdict line says the session only measured.
A measurement that is broken (errors, wrong token counts) still fails its cell: those numbers are
not numbers of the server.

A plain server has no speculative config to name, so its row is the config ``specnone`` (the
``speculation`` axis of :mod:`pytest_ddtree.axes` at ``none``), which only a plain server runs: SGLang
0.5.23 shows one by ``speculative_algorithm`` null in ``/server_info`` (sglang/srt/arg_groups/fields/
spec.py) and by no ``spec_verify_ct`` in ``meta_info`` (sglang/srt/managers/tokenizer_manager.py,
``_calculate_spec_decoding_metrics`` adds the spec_* keys only where a request verified).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_ddtree.configs import DDTreeConfig

#: The axis and value whose config is a plain server: its name is ``specnone``.
PLAIN_AXIS, PLAIN_VALUE = "speculation", "none"
PLAIN = DDTreeConfig.of({PLAIN_AXIS: PLAIN_VALUE})
#: How a plain server's one field is proven (``service/manager.py`` refuses it otherwise, with the key).
PLAIN_PROOF = ("/server_info's speculative_algorithm is null (a plain server), checked when the session adopts the "
               "server (one that speculates is refused, naming the key)")
#: Why a measure-only cell has no verdict against a baseline (its record's reasons say it).
NOT_JUDGED = "measure-only: measured, not judged against a baseline (--ddtree-measure-only)"


def is_plain(config: DDTreeConfig | None) -> bool:
    """Whether ``config`` is the plain server's row (no speculation to drive, prove or count)."""
    return config is not None and dict(config.extra).get(PLAIN_AXIS) == PLAIN_VALUE


def plain_profile_fields(url: str, info: Mapping[str, object]) -> dict[str, object]:
    """The parts of an external profile (``service/external.py``) that describe the plain server at
    ``url``: the one config ``specnone``, set by no flag (the harness never launches it) and read
    back as no speculation at all (the manager checks ``speculative_algorithm`` null when it adopts the server)."""
    name = PLAIN.name
    model = str(info.get("served_model_name") or info.get("model_path") or "")[:120]
    return {
        "description": f"the plain server already running at {url} ({model or 'model not reported'}, no speculative "
                       "algorithm), read from its /server_info; measured only (--ddtree-measure-only)",
        "matrix": [name],
        "default": name,
        "config_args": {PLAIN_AXIS: {PLAIN_VALUE: ""}},
        # no applied key compares a value with it; it is proven as PLAIN_PROOF says (the config fields' line says so)
        "unverifiable": {PLAIN_AXIS: f"no key holds the value; proven instead: {PLAIN_PROOF}"},
        "copy_probe": False,  # nothing is drafted, so no bound to probe
    }


def verdict_line(gated: str, cells: Sequence[Mapping[str, Any]]) -> str:
    """The session's one line where nothing was judged: how many cells of which configs were
    measured; ``gated``: the line a gated session would show (``finish.verdict_line``), kept in front
    where something failed, was interrupted or never ran (a broken measurement still fails its cell)."""
    configs = sorted({str(c.get("config")) for c in cells})
    measured = (f"{len(cells)} cell(s) of {len(configs)} config(s) measured ({', '.join(configs)})" if cells
                else "no throughput cell was measured")
    what = f"{measured}; nothing was judged against a baseline (--ddtree-measure-only)"
    return f"MEASURED: {what}" if gated.startswith("PASSED") else f"{gated} [measure-only: {what}]"
