"""A plain server: SGLang started with no ``--speculative-algorithm``, whose one config is ``specnone``.

``--ddtree-measure-only`` measures any running server (``gates/measure_only.py``); a plain one has
no speculative config to name, so its row is the config ``specnone`` (the ``speculation`` axis of
:mod:`pytest_ddtree.axes` at ``none``), which only a plain server runs. SGLang 0.5.23 shows one by
``speculative_algorithm`` null in ``/server_info`` (sglang/srt/arg_groups/fields/spec.py) and by no
``spec_verify_ct`` in ``meta_info`` (sglang/srt/managers/tokenizer_manager.py,
``_calculate_spec_decoding_metrics`` adds the spec_* keys only where a request verified). Here, with
the service: the profile, the manager, the external controller and the selection read it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_ddtree.configs import DDTreeConfig

#: The axis and value whose config is a plain server: its name is ``specnone``.
PLAIN_AXIS, PLAIN_VALUE = "speculation", "none"
PLAIN = DDTreeConfig.of({PLAIN_AXIS: PLAIN_VALUE})
#: How a plain server's one field is proven (``service/manager.py`` refuses it otherwise, with the key).
PLAIN_PROOF = ("/server_info's speculative_algorithm is null (a plain server), checked when the session adopts the "
               "server (one that speculates is refused, naming the key)")


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
