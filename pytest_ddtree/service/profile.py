"""Service profiles: how to launch, reach and check one deployment of the service.

A profile is a small YAML file (docs/profiles.md lists every key, from
:mod:`pytest_ddtree.service.profile_keys`). It is validated strictly because its mistakes are
expensive: a typo in a key would otherwise silently fall back to a default and a ten-minute GPU
restart would test the wrong thing. Every error names the file, the line, the key (as written:
flat or grouped) and the problem. This module reads the launch, the controller, the gates' keys
and the time limits; :mod:`pytest_ddtree.service.profile_config` the build's config mapping and
:mod:`pytest_ddtree.service.profile_control` the control's keys.
"""

from __future__ import annotations

import dataclasses
import os
import re
import string
from pathlib import Path
from typing import Any, Callable, Mapping

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.service import kinds
from pytest_ddtree.service.base import ENV_NAME_RULE, LaunchFrom, is_env_name
from pytest_ddtree.service.fleet import is_host_pool, parse_fleet_keys
from pytest_ddtree.service.installed import DIALECTS_FILE
from pytest_ddtree.service.profile_config import (
    check_budget_counts_root, check_fork_flags, own_matrix, parse_config_fields, parse_read_back,
)
from pytest_ddtree.service.profile_control import ControlKeys, noise_bounds, parse_control
from pytest_ddtree.service.profile_keys import Fail, check_key_types, flatten
from pytest_ddtree.service.protocol import ControllerKind
from pytest_ddtree.service.validated_profile import (
    CONFIG_FIELDS,
    LOSSLESS_MODES,
    FixedValue,
    ProfileError,
    SelectionError,
    ServiceProfile,
    render_value,
    resolve_service_python,
)
from pytest_ddtree.suggest import did_you_mean
from pytest_ddtree.yamlfile import YAMLFileError, key_lines, read_yaml

__all__ = [
    "CONFIG_FIELDS",
    "LOSSLESS_MODES",
    "FixedValue",
    "ProfileError",
    "SelectionError",
    "ServiceProfile",
    "load_profile",
    "parse_profile",
    "render_value",
    "resolve_service_python",
]

# ``${NAME}``, ``${NAME:-default}`` (default when unset or empty), ``${NAME-default}`` (when unset),
# and ``$${`` for a literal ``${``: the shell's forms, so a profile reads like the launch it writes.
_ENV_REFERENCE = re.compile(r"\$(\$\{)|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def _expand_environment(value: Any, key: str, fail: Callable[[str, str], ProfileError],
                       environ: Mapping[str, str] | None = None) -> Any:
    """``value`` (a profile's YAML, any depth) with every ``${NAME}`` in its strings replaced from
    the harness's environment.

    Why: a shipped profile names what differs per machine (the model's folder, the service's
    interpreter) without being edited (``--model-path ${DDTREE_SGLANG_MODEL:-/models/tiny}``). A
    variable that is unset and has no default is an error naming the key, before anything runs:
    a launch with an empty model path would fail minutes later, and say less.
    """
    env = os.environ if environ is None else environ

    def fill(match: re.Match[str]) -> str:
        if match.group(1):
            return "${"
        name, form, default = match.group(2), match.group(3), match.group(4)
        found = env.get(name)
        if form == ":-" and not found or form == "-" and found is None:
            return default or ""
        if found is None:
            raise fail(key, f"${{{name}}} is not set in the environment: set it, or give a default "
                            f"(${{{name}:-value}}); a literal ${{ is written $${{")
        return found

    if isinstance(value, str):
        return _ENV_REFERENCE.sub(fill, value)
    if isinstance(value, Mapping):
        return {k: _expand_environment(v, f"{key}.{k}" if key else str(k), fail, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_environment(v, f"{key}[{i}]", fail, env) for i, v in enumerate(value)]
    return value


def _template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def parse_profile(raw: Any, source: Path | None = None, text: str = "") -> ServiceProfile:
    """Validate a parsed YAML document (``text``: the file, for the lines of errors) into a ServiceProfile.

    The grouped keys are first taken out of their groups (``profile_keys.flatten``); each section
    is then checked by a function of its own, in the order a reader meets the keys; a key the
    document leaves out takes the default written once, on :class:`ServiceProfile`.
    """
    where = str(source) if source else "<profile>"
    spelled: dict[str, str] = {}
    fail = _failure(where, key_lines(text) if text else {}, spelled)
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: a service profile must be a YAML mapping (see docs/profiles.md)")
    raw, grouped = flatten(_expand_environment(raw, "", fail), fail)
    spelled.update(grouped)
    check_key_types(raw, fail)
    declared = _declared_axes(raw, where, spelled)
    controller = raw["controller"]
    kind = _controller_kind(raw, fail)
    port = _parse_port(raw, fail)
    pool = _parse_pool(raw.get("pool", 1), fail)
    controller_keys = _check_launch(raw, kind, port, pool, fail)
    fields = parse_config_fields(raw, fail)
    matrix, default = own_matrix(raw, fail)
    read_back = parse_read_back(raw, fields, fail)
    check_budget_counts_root(raw, fields, fail)
    check_fork_flags(raw, fail)
    behaviour = _parse_behaviour(raw, kind, pool, fail)
    fleet = parse_fleet_keys(raw, kind.name, kind.capabilities, fail,
                             remote_kinds=tuple(k.name for k in kinds.kinds_that(lambda can: can.remote_hosts)))
    window = _parse_window(raw, fail)
    return ServiceProfile(
        name=raw["name"],
        controller=controller,
        capabilities=kind.capabilities,
        command=raw.get("command"),
        url=raw["url"],
        port=port,
        default_window=window,
        **fields,
        **read_back,
        own_matrix=matrix,
        own_default=default,
        **behaviour,
        env=_parse_env(raw.get("env") or {}, fail),
        pool=pool,
        # A slurm job is each worker's own allocation: nothing on this machine to take turns on.
        instance_lock=bool(raw.get("instance_lock", not kind.capabilities.placed_by_scheduler)),
        **noise_bounds(raw, fail),
        **_parse_calibration(raw, kind, fail),
        **_as_written(raw),
        fleet=fleet,
        controller_keys=controller_keys,
        source=source,
        text=text,
        declared_axes=declared,
    )


def _declared_axes(raw: Mapping[str, Any], where: str, spelled: Mapping[str, str]) -> tuple[axes_mod.Axis, ...]:
    """The profile's own axes, with an axis error as a profile error that names the key as written."""
    try:
        return axes_mod.declare(raw.get("axes"), f"{where}: {spelled.get('axes', 'axes')}")
    except axes_mod.AxisError as exc:
        raise ProfileError(str(exc)) from None


def _parse_port(raw: Mapping[str, Any], fail: Fail) -> int | str:
    """``port``: a TCP port, or ``auto`` (a free one per launch); the key's type is already checked."""
    port: int | str = raw.get("port", "auto")
    if isinstance(port, str) and port != "auto":
        raise fail("port", f"must be an integer or 'auto', got {port!r}")
    if isinstance(port, int) and not 0 < port < 65536:
        raise fail("port", f"must be a TCP port 1-65535, got {port}")
    return port


def _parse_window(raw: Mapping[str, Any], fail: Fail) -> int | None:
    """``default_window``: the context a config without a window runs at; null for none."""
    window: int | None = raw.get("default_window", 2048)
    if window is not None and window < 1:
        raise fail("default_window", f"must be positive or null, got {window}")
    return window


def _as_written(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The keys taken as the document writes them: their types are checked (``check_key_types``)
    and no other key constrains them, so there is nothing more to validate here."""
    return {
        "coding_min_pass": raw.get("coding_min_pass"),
        "unit": raw.get("unit"),
        "dropin_dir": raw.get("dropin_dir"),
        "hardware_profile": raw.get("hardware_profile"),
        "max_context": raw.get("max_context"),
        "slo": raw.get("slo"),
        "tokenizer": raw.get("tokenizer"),
        "vocab_size": raw.get("vocab_size"),
        "draft_model_path": raw.get("draft_model_path"),
        "patches": raw.get("patches"),
        "python": raw.get("python"),
        "description": raw.get("description", _DEFAULTS["description"]),
        "dialect": raw.get("dialect"),
    }


def _failure(where: str, lines: Mapping[str, int], spelled: Mapping[str, str]) -> Fail:
    """The profile's ``fail(key, problem)``: the error names the file, the key's line and the key as
    the profile spells it (``spelled``: flat name -> grouped, filled once the groups are read)."""

    def fail(key: str, problem: str) -> ProfileError:
        head = re.split(r"[.\[]", key, maxsplit=1)[0]
        shown = spelled.get(head, head) + key[len(head):]
        line = next((lines[k] for k in _enclosing(shown) if k in lines), None)
        return ProfileError(f"{where}{'' if line is None else f':{line}'}: {shown}: {problem}")

    return fail


def _enclosing(key: str) -> list[str]:
    """``key`` and the keys around it, innermost first (``config.args.budget``, ``config.args``, ``config``)."""
    parts = re.split(r"(?=[.\[])", key)
    return ["".join(parts[:n]) for n in range(len(parts), 0, -1)]


#: The defaults of the profile's optional keys, as :class:`ServiceProfile` declares them.
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ServiceProfile) if f.default is not dataclasses.MISSING}


def _parse_pool(pool_raw: Any, fail: Fail) -> int | tuple[str, ...]:
    """``pool:``: a number of instances, a list of service URLs, or a fleet's hosts (one instance each)."""
    if is_host_pool(pool_raw):
        return len(pool_raw)  # the hosts are fleet.hosts; one instance per host
    if isinstance(pool_raw, list):
        if not pool_raw or not all(isinstance(u, str) and u.startswith("http") for u in pool_raw):
            raise fail("pool", "a list pool must hold service URLs like http://127.0.0.1:30000")
        return tuple(u.rstrip("/") for u in pool_raw)
    if pool_raw < 1:
        raise fail("pool", f"must be at least 1, got {pool_raw}")
    return int(pool_raw)


def _controller_kind(raw: Mapping[str, Any], fail: Fail) -> ControllerKind:
    """The one place a profile's ``controller:`` name is mapped to the module that runs it
    (service/kinds.py); a key owned by another controller is refused, naming its owner."""
    controller = raw["controller"]
    try:
        kind = kinds.kind_named(controller)
    except KeyError:
        hint = did_you_mean(str(controller), kinds.names()).strip()
        raise fail("controller", f"must be one of {', '.join(kinds.names())}, got {controller!r}"
                                 + (f"; {hint}" if hint else "")) from None
    for key, owner in kinds.owned_keys().items():
        if owner is not kind and raw.get(key) is not None:
            raise fail(key, f"{owner.keys_meaning} belong to controller: {owner.name} (this profile's controller is {controller})")
    return kind


def _check_launch(raw: Mapping[str, Any], kind: ControllerKind, port: int | str, pool: int | tuple[str, ...], fail: Fail) -> object:
    """The launch command, the controller's own keys and the URL fit together; returns the
    controller's own keys as its kind parsed them."""
    command = raw.get("command")
    controller = kind.name
    relaunch = kind.capabilities.relaunch
    if kind.capabilities.launch is LaunchFrom.PROFILE_COMMAND:
        if not command:
            raise fail("command", f"the {controller} controller needs a launch command")
        fields = _template_fields(command)
        bad = fields - {"port", "config_args", "python", "host"}
        if bad:
            raise fail("command", f"unknown placeholder(s) {sorted(bad)} (allowed: {{port}}, {{config_args}}, {{python}}, {{host}})")
        if "config_args" not in fields:
            raise fail("command", "must contain {config_args}: otherwise no config reaches the service")
        if "port" not in fields and not (isinstance(port, int) and pool == 1):
            raise fail("command", "must contain {port} (needed for port: auto and for pools of several instances)")
    controller_keys = kind.check_profile(raw, fail)
    url = raw["url"]
    url_fields = _template_fields(url)
    if url_fields - {"port", "host"}:
        raise fail("url", f"unknown placeholder(s) {sorted(url_fields - {'port', 'host'})}")
    if not url.startswith(("http://", "https://")):
        raise fail("url", f"must start with http:// or https://, got {url!r}")
    if port == "auto" and "port" not in url_fields and not isinstance(pool, tuple) and relaunch:
        raise fail("url", "must contain {port} when port is 'auto'")
    if relaunch and "config_args" not in raw:
        raise fail("config_args", "missing required key: how each config field reaches the launch ({} when the build "
                                  "sets none by flags)")
    return controller_keys




def _parse_env(section: Mapping[str, Any], fail: Fail) -> dict[str, str]:
    """``env:`` the launch environment; every name a shell identifier."""
    for name in section:
        if not is_env_name(name):
            raise fail(f"env.{name}", ENV_NAME_RULE)
    return {str(k): str(v) for k, v in section.items()}


class _Behaviour(ControlKeys):
    lossless: str
    lossless_args: str | None
    relaunch_flagged: bool
    health_path: str
    ready_timeout_s: float
    request_timeout_s: float
    stall_timeout_s: float
    first_token_timeout_s: float
    info_timeout_s: float
    probe_timeout_s: float
    cell_timeout_s: float
    gpu_release_timeout_s: float
    stop_timeout_s: float
    copy_probe: bool


#: The profile's time limits, in seconds (docs/profiles.md, "Time limits").
_TIME_LIMITS = ("ready_timeout_s", "request_timeout_s", "stall_timeout_s", "first_token_timeout_s", "info_timeout_s",
                "probe_timeout_s", "cell_timeout_s", "gpu_release_timeout_s", "stop_timeout_s")


def _seconds(raw: Mapping[str, Any], key: str) -> float:
    return float(raw.get(key, _DEFAULTS[key]))


def _check_plain_launch(raw: Mapping[str, Any], fail: Fail) -> None:
    """The plain launch (the command without config_args, plus ``lossless_args``) must not name an
    algorithm the command passes: SGLang takes the last --speculative-algorithm, and without one in
    ``lossless_args`` the control and the lossless reference would speculate too."""
    spelled = re.compile(r"(^|\s)--speculative-algorithm(\s|=|$)")
    lossless_args = raw.get("lossless_args")
    if lossless_args is not None and spelled.search(str(raw.get("command") or "")) and not spelled.search(lossless_args):
        raise fail("lossless_args", "the plain launch (the command without config_args, plus lossless_args) would "
                                    "speculate: the command passes --speculative-algorithm. Move it and the drafter "
                                    "(--speculative-draft-model-path) into speculative_args, which only the configs' "
                                    "launches get")


def _parse_behaviour(raw: Mapping[str, Any], kind: ControllerKind, pool: int | tuple[str, ...], fail: Fail) -> _Behaviour:
    """How the harness treats the service: the lossless check, the control, relaunches,
    readiness and the time limits (the :class:`ServiceProfile` keyword arguments of the same names)."""
    # "" is an answer: the command without config_args is already non-speculative (a profile whose
    # config_args switch speculation on; SGLang 0.5.23 has no flag that turns it off).
    lossless = raw.get("lossless", "instance" if raw.get("lossless_args") is not None else _DEFAULTS["lossless"])
    if lossless not in LOSSLESS_MODES:
        raise fail("lossless", f"must be one of {', '.join(LOSSLESS_MODES)}, got {lossless!r}")
    if lossless == "instance" and raw.get("lossless_args") is None:
        raise fail("lossless_args", "lossless: instance needs the launch args of the non-speculative instance, or '' where "
                                    "the command without speculative_args and config_args does not speculate (SGLang: "
                                    "--speculative-algorithm in speculative_args, not in the command)")
    _check_plain_launch(raw, fail)
    relaunchable = kind.capabilities.relaunch and not isinstance(pool, tuple)
    relaunch_flagged = raw.get("relaunch_flagged", relaunchable)
    if relaunch_flagged and not relaunchable:
        raise fail("relaunch_flagged", "an external service or a pool of URLs cannot be relaunched: leave it out "
                                       "(configs are then judged on their one launch)")
    health_path = raw.get("health_path", _DEFAULTS["health_path"])
    if not health_path.startswith("/"):
        raise fail("health_path", f"must start with '/', got {health_path!r}")
    for key in _TIME_LIMITS:
        if key in raw and not 0 < raw[key] < float("inf"):
            raise fail(key, f"must be positive (seconds), got {raw[key]}")
    return _Behaviour(
        lossless=lossless, lossless_args=raw.get("lossless_args"), **parse_control(raw, relaunchable, fail),
        relaunch_flagged=bool(relaunch_flagged), health_path=health_path,
        ready_timeout_s=_seconds(raw, "ready_timeout_s"), request_timeout_s=_seconds(raw, "request_timeout_s"),
        stall_timeout_s=_seconds(raw, "stall_timeout_s"), first_token_timeout_s=_seconds(raw, "first_token_timeout_s"),
        info_timeout_s=_seconds(raw, "info_timeout_s"), probe_timeout_s=_seconds(raw, "probe_timeout_s"),
        cell_timeout_s=_seconds(raw, "cell_timeout_s"), gpu_release_timeout_s=_seconds(raw, "gpu_release_timeout_s"),
        stop_timeout_s=_seconds(raw, "stop_timeout_s"),
        copy_probe=bool(raw.get("copy_probe", _DEFAULTS["copy_probe"])),
    )


def _parse_calibration(raw: Mapping[str, Any], kind: ControllerKind, fail: Fail) -> dict[str, Any]:
    """``calibration_command`` (placeholders as the launch command's ``{python}`` and ``{host}``) and
    ``calibration_timeout_s``; refused where no moment without the session's server exists on a
    known host: somebody else's service holds the accelerators all along, and a scheduler's node is
    not known before its job runs."""
    command = raw.get("calibration_command")
    timeout = raw.get("calibration_timeout_s", _DEFAULTS["calibration_timeout_s"])
    if not 0 < timeout < float("inf"):
        raise fail("calibration_timeout_s", f"must be positive (seconds), got {timeout}")
    if command is None:
        return {"calibration_command": None, "calibration_timeout_s": float(timeout)}
    if not command.strip():
        raise fail("calibration_command", "is empty: give the probe's command line, or leave the key out")
    try:
        bad = _template_fields(command) - {"python", "host"}
    except ValueError as exc:
        raise fail("calibration_command", f"is not a template ({exc}); a literal brace is written {{{{ or }}}}") from None
    if bad:
        raise fail("calibration_command", f"unknown placeholder(s) {sorted(bad)} (allowed: {{python}}, {{host}})")
    if not kind.capabilities.relaunch or kind.capabilities.placed_by_scheduler:
        raise fail("calibration_command", f"the {kind.name} controller has no moment when the session's own server "
                                          "does not hold the accelerators on a known host (somebody else's service, "
                                          "or a node its scheduler picks at launch): leave the key out")
    return {"calibration_command": command, "calibration_timeout_s": float(timeout)}


def load_profile(path: Path) -> ServiceProfile:
    """Read and validate a profile file; YAML syntax errors report the line."""
    try:
        raw, text = read_yaml(path)
    except YAMLFileError as exc:
        raise ProfileError(str(exc) if exc.syntax else f"cannot read service profile {path}: {exc.problem}; "
                           f"{shipped_profiles_hint()}") from None
    return parse_profile(raw, source=path, text=text)


def shipped_profiles_hint() -> str:
    """The shipped profiles a path may name (suites/services of a checkout, beside this package)."""
    folder = Path(__file__).resolve().parents[2] / "suites" / "services"
    names = ", ".join(sorted(p.name for p in folder.glob("*.yaml") if p.name != DIALECTS_FILE)) if folder.is_dir() else ""
    return f"the shipped profiles are in {folder}: {names}" if names else "give a service profile's path (docs/profiles.md)"
