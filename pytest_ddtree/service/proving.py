"""Proving that a ready launch serves its config (the manager asks it after readiness; no pytest import).

A restart that "works" can still test the wrong thing (upstream SGLang forces topk=1 for DFLASH),
so a launch of this session is checked twice: /server_info's applied keys against the config
(``readiness.verify_applied``), then what the service's behaviour shows (``proof.judge``: the copy
probe's acceptance, the start-up lines where the controller reads the log, and
``sglang:spec_num_draft_tokens`` read while a request decodes, where /metrics is on). An adopted
external service is not ours to probe before its /server_info matched the config; a plain server
drafts nothing to prove.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Mapping

from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.records.launch_shapes import LaunchEntry
from pytest_ddtree.service import http as http_mod
from pytest_ddtree.service import proof as proof_mod
from pytest_ddtree.service.base import AppliedDiff, ConfigNotServed, ExternalConfigMismatch, ServiceStartError
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.external import HEALTH_TIMEOUT_S
from pytest_ddtree.service.plain import is_plain
from pytest_ddtree.service.profile import ServiceProfile
from pytest_ddtree.service.proof import Proof
from pytest_ddtree.service.protocol import Controller
from pytest_ddtree.service.readiness import applied_diff, not_speculating, verify_applied

PROBE_TIMEOUT_S = 120.0
"""Each copy probe request's deadline as a whole (the probe as a whole: ``probe_timeout_s``)."""
#: Unfinished stream chunks of the gauge's request read before /metrics is: the request decodes then.
GAUGE_CHUNKS = 2


def proof_values(profile: ServiceProfile, config: DDTreeConfig) -> dict[str, int | None]:
    """The config's field values the service must show: a field the build derives in a way the
    profile cannot predict (``fixed: null``) is unknown (None), never the config's name."""
    values = config.field_values(profile.default_window)
    out: dict[str, int | None] = {}
    for name, value in values.items():
        fixed = profile.fixed_field(name)
        derived = None if fixed is None else fixed.value_for(values)
        # a field the name leaves out takes what the build derives (NGRAM's b7_k4: block_size = budget + 1)
        out[name] = value if fixed is None or (derived is not None and value is not None) else derived
    return out


def check_served(profile: ServiceProfile, controller: Controller, client: SGLangClient, config: DDTreeConfig | None,
                 label: str, begin: float, *, external: bool, record: LaunchEntry | None,
                 say: Callable[[str], None]) -> tuple[dict[str, object], Proof | None]:
    """The ready service's /server_info (asked through ``client``, the launch's), and (for a
    service this session launched) the proof that it serves ``config``: the applied fields,
    then the behaviour's evidence."""
    try:
        server_info: dict[str, object] = client.server_info()
    except Exception as exc:  # noqa: BLE001 - any failure here means "not usable"
        raise ServiceStartError(
            f"health answered but /server_info failed: {type(exc).__name__}: {exc}",
            log_tail=controller.log_tail(),
            elapsed=time.monotonic() - begin,
            config_name=label,
            hint="the applied-config check needs /server_info (or /get_server_info)",
        ) from None
    if config is not None and not external:
        silent = not_speculating(server_info, profile.applied)
        verify_applied(config.name, profile.expected_applied(config), server_info, not_speculating=silent)
        if silent:  # every applied key matched (or none is read back), and still nothing speculates
            raise ConfigNotServed(config.name, [f"the server does not speculate: {silent}"], controller.log_tail())
    # An external service is not ours to probe before its config is checked (the manager's _start_once).
    proof = prove(profile, controller, client, config, server_info, say) if config is not None and not external else None
    if proof is not None and record is not None:
        record["applied_evidence"] = proof.as_dict()
        if proof.failures:
            raise ConfigNotServed(config.name if config is not None else label, [*proof.failures, *proof.notes],
                                  controller.log_tail())
    return server_info, proof


def prove(profile: ServiceProfile, controller: Controller, client: Any, config: DDTreeConfig, server_info: Mapping[str, object],
          say: Callable[[str], None]) -> Proof:
    """After readiness: the copy probe, the start-up lines (where the controller reads the
    log) and ``sglang:spec_num_draft_tokens`` read while a request decodes (where /metrics is
    on), weighed per field."""
    values = proof_values(profile, config)
    bound = proof_mod.accept_bound(values)

    http = getattr(client, "http", None)

    def generate(text: str, sampling: Mapping[str, Any]) -> Any:
        if http is None:  # a client without the bounded HTTP layer (a stand-in)
            return client.generate(text=text, sampling_params=sampling, timeout=PROBE_TIMEOUT_S)
        payload = {"text": text, "sampling_params": dict(sampling), "stream": False}
        return http.post_json("/generate", payload, PROBE_TIMEOUT_S, max_bytes=proof_mod.MAX_TEXT_BYTES)

    deadline = http_mod.Deadline.after(profile.probe_timeout_s, "copy probe", "probe_timeout_s")
    with http_mod.phase(deadline):  # the probe's requests and the gauge's stream end by probe_timeout_s
        probe = proof_mod.run_copy_probe(generate, bound) if profile.copy_probe else None
        if probe is not None and deadline.expired:
            raise ServiceStartError(f"{deadline.describe()} passed after {probe.requests} probe requests: "
                                    + ("; ".join(probe.failed_requests[-2:]) or "the service answered too slowly"),
                                    log_tail=controller.log_tail(), config_name=config.name, hint=deadline.advice())
        metrics_text = _metrics_while_decoding(http) if server_info.get("enable_metrics") is True else None
    startup_text = controller.startup_log()
    startup = proof_mod.parse_startup_log(startup_text) if startup_text else None
    result = proof_mod.judge(values, settable=profile.settable_fields(), reported=set(profile.applied.values()),
                             probe=probe, startup=startup, metrics_text=metrics_text)
    say(f"{config.name}: {result.summary()}")
    return result


def check_external_config(profile: ServiceProfile, url: str, server_info: Mapping[str, object], config: DDTreeConfig) -> None:
    """An adopted service's /server_info against ``config`` (a plain server: it still does not speculate)."""
    silent = not_speculating(server_info, profile.applied)
    if is_plain(config):  # the plain server's one read-back: it still does not speculate
        if silent is None:
            raise ExternalConfigMismatch(config.name, url, [AppliedDiff(
                "speculative_algorithm", None, str(server_info.get("speculative_algorithm"))[:40])])
        return
    diffs = applied_diff(profile.expected_applied(config), server_info)
    if diffs:
        raise ExternalConfigMismatch(config.name, url, diffs, not_speculating=silent)
    if silent:
        raise ConfigNotServed(config.name, [f"the server does not speculate: {silent}"],
                              "<external service: no log available>")


def _metrics_while_decoding(http: Any) -> str | None:
    """/metrics read while one streaming copy-probe request decodes (after GAUGE_CHUNKS unfinished
    chunks), the only reading of ``sglang:spec_num_draft_tokens`` that is evidence (proof.py: SGLang
    sets it every decode_log_interval decode batches and republishes what it holds at idle). None
    where it cannot be read so: no bounded HTTP layer, an error, or the request finished first.
    Everything read is bounded; closing the connection aborts the request, as SGLang does."""
    if http is None:
        return None
    sampling = {"max_new_tokens": proof_mod.PROBE_TOKENS, "temperature": 0.0, "ignore_eos": True}
    body = json.dumps({"text": proof_mod.probe_prompts(1)[0], "sampling_params": sampling, "stream": True}).encode()
    conn = http.connect(PROBE_TIMEOUT_S)
    watch = http_mod.RequestWatch(http.deadline(PROBE_TIMEOUT_S))  # the stream as a whole, not each read
    try:
        watch.begin(conn)
        conn.request("POST", http.path("/generate"), body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        unfinished = 0
        for _ in range(4 * GAUGE_CHUNKS + 8):  # data lines and the blank lines between them
            line = resp.readline(proof_mod.MAX_TEXT_BYTES)
            if not line or not line.startswith(b"data:"):
                if not line:
                    return None
                continue
            chunk = json.loads(line[5:].strip() or b"null") if line[5:].strip() != b"[DONE]" else None
            meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
            if not isinstance(meta, dict) or meta.get("finish_reason") is not None:
                return None  # an error, the end, or a finished request: not decoding any more
            unfinished += 1
            if unfinished >= GAUGE_CHUNKS:
                text: str = http.call("GET", "/metrics", None, HEALTH_TIMEOUT_S,
                                      max_bytes=proof_mod.MAX_TEXT_BYTES).raise_for_status().text
                return text
        return None
    except Exception:  # noqa: BLE001 - no reading while decoding: no signal from the gauge
        return None
    finally:
        watch.end()
        conn.close()
