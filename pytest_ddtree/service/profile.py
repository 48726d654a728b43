"""Service profiles: how to launch, reach and check one deployment of the service.

A profile is a small YAML file (docs/profiles.md lists every key). It is validated strictly because
its mistakes are expensive: a typo in a key would otherwise silently fall back to a default and a
ten-minute GPU restart would test the wrong thing. Every error names the file, the key and the
problem.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import string
from pathlib import Path
from typing import Any, Callable, Mapping, TypedDict

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.configs import ConfigError, DDTreeConfig, parse_config_name
from pytest_ddtree.service import kinds
from pytest_ddtree.service.base import ENV_NAME_RULE, LaunchFrom, is_env_name
from pytest_ddtree.service.protocol import ControllerKind
from pytest_ddtree.service.fleet import FLEET_KEY_TYPES, is_host_pool, parse_fleet_keys
from pytest_ddtree.service.validated_profile import (
    ControlKeys, control_scope,
    CONFIG_FIELDS,
    LOSSLESS_MODES,
    FixedValue,
    ProfileError,
    SelectionError,
    ServiceProfile,
    render_value,
    resolve_service_python,
    valid_value_template,
    value_offset,
    noise_bounds,
)
from pytest_ddtree.suggest import did_you_mean
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

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
    "url_fields_of",
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


# A fixed value that follows another axis, e.g. ``block_size - 1`` (upstream DFLASH's chain) or
# ``steps + 1``; an applied key may also read a bool axis negated (``not overlap``).
_FIXED_EXPRESSION = re.compile(r"^\s*([a-z][a-z_]*)\s*(?:([+-])\s*(\d+))?\s*$")
_NEGATED = re.compile(r"^\s*not\s+([a-z][a-z_]*)\s*$")


def _axis_key(key: object, section: str, fail: Callable[[str, str], ProfileError]) -> str:
    """``key`` of a per-axis section, checked to be an axis (pytest_ddtree.axes or the profile's ``axes:``)."""
    if not axes_mod.is_axis(key):
        names = [a.name for a in axes_mod.catalogue()]
        raise fail(f"{section}.{key}", f"unknown config field; {did_you_mean(str(key), names)}allowed: {', '.join(names)} "
                                       "(an axis of your own: declare it under axes:)")
    return str(key)


def _int_axis(name: str) -> bool:
    return axes_mod.is_axis(name) and axes_mod.axis(name).type in ("int", "window")


_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    # key: (accepted types, required)
    "name": (str, True),
    "axes": ((list, type(None)), False),
    "controller": (str, True),
    "command": (str, False),
    "unit": (str, False),
    "dropin_dir": (str, False),
    "url": (str, True),
    "port": ((int, str), False),
    "default_window": ((int, type(None)), False),
    "config_args": (dict, False),  # required where the harness launches the service (_check_launch)
    "speculative_args": ((str, type(None)), False),
    "config_env": ((dict, type(None)), False),
    "fixed": ((dict, type(None)), False),
    "applied": (dict, False),
    "unverifiable": ((dict, type(None)), False),
    "allowed": ((dict, type(None)), False),
    "fixed_because": ((dict, type(None)), False),
    "matrix": ((list, type(None)), False),
    "default": ((str, type(None)), False),
    "sources": ((dict, type(None)), False),
    "fork_flags": ((dict, type(None)), False),
    "budget_counts_root": ((bool, type(None)), False),
    "health_path": (str, False),
    "ready_timeout_s": ((int, float), False),
    "request_timeout_s": ((int, float), False),
    "stall_timeout_s": ((int, float), False),
    "first_token_timeout_s": ((int, float), False),
    "info_timeout_s": ((int, float), False),
    "probe_timeout_s": ((int, float), False),
    "cell_timeout_s": ((int, float), False),
    "gpu_release_timeout_s": ((int, float), False),
    "stop_timeout_s": ((int, float), False),
    "env": ((dict, type(None)), False),
    "pool": ((int, list), False),
    "instance_lock": (bool, False),
    "coding_min_pass": ((int, type(None)), False),
    "copy_probe": (bool, False),
    "lossless": (str, False),
    "lossless_args": ((str, type(None)), False),
    "control": ((str, type(None)), False),
    "control_launches": (int, False),
    "control_max_launches": (int, False),
    "bless_control_launches": (int, False),
    "control_min_configs": (int, False), "control_cells": ((int, type(None)), False),
    "relaunch_flagged": (bool, False),
    "hardware_profile": ((str, type(None)), False),
    "max_context": ((int, type(None)), False),
    "max_repeat_spread": ((int, float), False),
    "bless_max_half_width": ((int, float), False),
    "slo": ((dict, type(None)), False),
    "tokenizer": ((str, type(None)), False),
    "vocab_size": ((int, type(None)), False),
    "draft_model_path": ((str, type(None)), False),
    "patches": ((dict, type(None)), False),
    "python": ((str, type(None)), False),
    "calibration_command": ((str, type(None)), False),
    "calibration_timeout_s": ((int, float), False),
    "description": (str, False),
    "dialect": ((str, type(None)), False),
    **FLEET_KEY_TYPES,
}


def url_fields_of(url: object) -> set[str]:
    return _template_fields(url) if isinstance(url, str) else set()


def _template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def parse_profile(raw: Any, source: Path | None = None, text: str = "") -> ServiceProfile:
    """Validate a parsed YAML document into a ServiceProfile.

    Each section is checked by a function of its own, in the order a reader meets the keys; a
    key the document leaves out takes the default written once, on :class:`ServiceProfile`.
    """
    where = str(source) if source else "<profile>"

    def fail(key: str, problem: str) -> ProfileError:
        return ProfileError(f"{where}: {key}: {problem}")

    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: a service profile must be a YAML mapping (see docs/profiles.md)")
    raw = _expand_environment(raw, "", fail)
    _check_key_types(raw, fail)
    try:
        declared = axes_mod.declare(raw.get("axes"), f"{where}: axes")
    except axes_mod.AxisError as exc:
        raise ProfileError(str(exc)) from None
    controller = raw["controller"]
    kind = _controller_kind(raw, fail)
    port = raw.get("port", "auto")
    if isinstance(port, str) and port != "auto":
        raise fail("port", f"must be an integer or 'auto', got {port!r}")
    if isinstance(port, int) and not 0 < port < 65536:
        raise fail("port", f"must be a TCP port 1-65535, got {port}")
    pool = _parse_pool(raw.get("pool", 1), fail)
    controller_keys = _check_launch(raw, kind, port, pool, fail)
    fields = _parse_config_fields(raw, fail)
    own_matrix, own_default = _own_matrix(raw, fail)
    read_back = _parse_read_back(raw, fields, fail)
    _check_budget_counts_root(raw, fields, fail)
    _check_fork_flags(raw, fail)
    behaviour = _parse_behaviour(raw, kind, pool, fail)
    fleet = parse_fleet_keys(raw, kind.name, kind.capabilities, fail,
                             remote_kinds=tuple(k.name for k in kinds.kinds_that(lambda can: can.remote_hosts)))
    window = raw.get("default_window", 2048)
    if window is not None and window < 1:
        raise fail("default_window", f"must be positive or null, got {window}")
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
        own_matrix=own_matrix,
        own_default=own_default,
        **behaviour,
        env=_parse_env(raw.get("env") or {}, fail),
        pool=pool,
        # A slurm job is each worker's own allocation: nothing on this machine to take turns on.
        instance_lock=bool(raw.get("instance_lock", not kind.capabilities.placed_by_scheduler)),
        coding_min_pass=raw.get("coding_min_pass"),
        unit=raw.get("unit"),
        dropin_dir=raw.get("dropin_dir"),
        hardware_profile=raw.get("hardware_profile"),
        max_context=raw.get("max_context"),
        **noise_bounds(raw, fail),
        slo=raw.get("slo"),
        tokenizer=raw.get("tokenizer"),
        vocab_size=raw.get("vocab_size"),
        draft_model_path=raw.get("draft_model_path"),
        patches=raw.get("patches"),
        python=raw.get("python"),
        **_parse_calibration(raw, kind, fail),
        description=raw.get("description", _DEFAULTS["description"]),
        dialect=raw.get("dialect"),
        fleet=fleet,
        controller_keys=controller_keys,
        source=source,
        text=text,
        declared_axes=declared,
    )


_Fail = Callable[[str, str], ProfileError]
#: The defaults of the profile's optional keys, as :class:`ServiceProfile` declares them.
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ServiceProfile) if f.default is not dataclasses.MISSING}


def _check_key_types(raw: Mapping[str, Any], fail: _Fail) -> None:
    """Every key is known, every required one is there, each has its type (a bool is no int)."""
    known = {**_KEYS, **kinds.key_types()}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise fail(unknown[0], f"unknown key; {did_you_mean(unknown[0], sorted(known))}allowed: {', '.join(sorted(known))}")
    for key, (types, required) in known.items():
        if key not in raw:
            if required:
                raise fail(key, "missing required key")
            continue
        value = raw[key]
        takes_bool = types is bool or (isinstance(types, tuple) and bool in types)
        if (isinstance(value, bool) and not takes_bool) or not isinstance(value, types):
            names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
            raise fail(key, f"expected {names}, got {type(value).__name__} {value!r}")


def _parse_pool(pool_raw: Any, fail: _Fail) -> int | tuple[str, ...]:
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


def _controller_kind(raw: Mapping[str, Any], fail: _Fail) -> ControllerKind:
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


def _check_launch(raw: Mapping[str, Any], kind: ControllerKind, port: int | str, pool: int | tuple[str, ...], fail: _Fail) -> object:
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


class _ConfigFields(TypedDict):
    config_args: dict[str, str]
    speculative_args: str
    config_choices: dict[str, dict[Any, str]]
    applied_negated: frozenset[str]
    config_env: dict[str, dict[str, str]]
    fixed: dict[str, FixedValue]
    applied: dict[str, str]
    applied_offset: dict[str, int]
    allowed: dict[str, tuple[Any, ...]]
    fixed_because: dict[str, str]


def _parse_config_fields(raw: Mapping[str, Any], fail: _Fail) -> _ConfigFields:
    """How each config field reaches the service, what the build fixes, where it is read
    back: config_args, config_env, fixed, applied, allowed and fixed_because."""
    config_args: dict[str, str] = {}
    choices: dict[str, dict[Any, str]] = {}
    for key, template in (raw.get("config_args") or {}).items():  # an external service's launch is not ours: none
        key = _axis_key(key, "config_args", fail)
        if isinstance(template, Mapping):
            choices[key] = _parse_choice_flags(key, template, fail)
            continue
        if not valid_value_template(template):
            raise fail(f"config_args.{key}", f"must be a flag template containing {{value}} (or {{value+N}}), or for a "
                                             f"choice or bool axis a mapping of each value to its flags, got {template!r}")
        if value_offset(template) and not _int_axis(key):
            raise fail(f"config_args.{key}", f"{{value+N}} adds to a number; {key} is a {axes_mod.axis(key).type} axis")
        config_args[key] = str(template)
    config_env = _parse_config_env(raw.get("config_env") or {}, {**config_args, **choices}, fail)
    settable = set(config_args) | set(config_env) | set(choices)
    fixed = _parse_fixed(raw.get("fixed") or {}, settable, fail)
    applied, applied_offset, negated = _parse_applied(raw.get("applied") or {}, fail)
    return _ConfigFields(
        config_args=config_args,
        speculative_args=_parse_speculative_args(raw, fail),
        config_choices=choices,
        applied_negated=negated,
        config_env=config_env,
        fixed=fixed,
        applied=applied,
        applied_offset=applied_offset,
        allowed=_parse_allowed(raw.get("allowed") or {}, settable, fail),
        fixed_because=_parse_fixed_because(raw.get("fixed_because") or {}, settable, fail),
    )


class _ReadBack(TypedDict):
    sources: dict[str, str]
    unverifiable: dict[str, str]


def _parse_read_back(raw: Mapping[str, Any], fields: _ConfigFields, fail: _Fail) -> _ReadBack:
    """Where the build's source defines each key (sources), and each field the profile sets is
    either read back from /server_info (applied) or said to be unverifiable, with why."""
    sources = _parse_sources(raw.get("sources") or {}, fail)
    applied = fields["applied"]
    unverifiable = _parse_unverifiable(raw.get("unverifiable") or {}, applied, fail)
    for key in (*fields["config_args"], *fields["config_choices"], *fields["config_env"]):
        if key not in applied.values() and key not in unverifiable:
            section = "config_env" if key in fields["config_env"] else "config_args"
            raise fail(f"{section}.{key}", f"the profile sets {key} but never checks it: name the /server_info key that shows "
                                         f"it under applied, or say why it cannot be checked under unverifiable")
    return _ReadBack(sources=sources, unverifiable=unverifiable)


def _parse_speculative_args(raw: Mapping[str, Any], fail: _Fail) -> str:
    """``speculative_args``: the flags every config's launch gets and the plain launch (the control,
    the lossless reference) does not: the algorithm and the drafter. SGLang 0.5.23 has no flag that
    turns speculation off, so the command itself must be the plain server."""
    text = raw.get("speculative_args") or ""
    try:
        shlex.split(text)
    except ValueError as exc:
        raise fail("speculative_args", f"must be shell words (flags), got {text!r}: {exc}") from None
    if "{" in text:
        raise fail("speculative_args", "takes no placeholders: a value that differs per config belongs in config_args")
    if text and raw.get("config_args") is None:
        raise fail("speculative_args", "only a profile whose launches the harness makes (with config_args) says this")
    return str(text)


def _check_budget_counts_root(raw: Mapping[str, Any], fields: _ConfigFields, fail: _Fail) -> None:
    """Whether the build's budget flag (or variable) counts the root node too (SubSir's tree verify)
    or not (DDTree's budget): a declaration the mapping is checked against at load (every shipped
    profile says it; a user's may not, unchecked): true -> the template is ``{value+1}`` and an
    applied key ``budget + 1``; false -> ``{value}`` and ``budget``. So bN is N non-root nodes."""
    counts = raw.get("budget_counts_root")
    templates = [fields["config_args"]["budget"]] if "budget" in fields["config_args"] else []
    templates += list(fields["config_env"].get("budget", {}).values())
    if not templates:
        if counts is not None:
            raise fail("budget_counts_root", "only a profile that sets the budget (config_args / config_env) says this")
        return
    if counts is None:  # undeclared (every shipped profile declares it: tests/test_profiles.py)
        return
    want = 1 if counts else 0
    for template in templates:
        if value_offset(template) != want:
            raise fail("budget_counts_root", f"is {str(counts).lower()}, so the budget's template must use "
                                             f"{'{value+1}' if counts else '{value}'}, got {template!r}")
    for key, field_name in fields["applied"].items():
        if field_name == "budget" and fields["applied_offset"].get(key, 0) != want:
            raise fail(f"applied.{key}", f"budget_counts_root is {str(counts).lower()}: read it back as "
                                         f"{'budget + 1' if counts else 'budget'}")


def _check_fork_flags(raw: Mapping[str, Any], fail: _Fail) -> None:
    """``fork_flags: {--flag: why}``: flags of the command or a config_args template (one never
    passed needs no excuse) that SGLang 0.5.23 lacks, each with its fork or PR. For
    tests/test_shipped_profiles.py: it strips exactly these before 0.5.23's parser reads a line."""
    section = raw.get("fork_flags") or {}
    templates = [t for v in (raw.get("config_args") or {}).values() for t in (v.values() if isinstance(v, Mapping) else [v])]
    passed = " ".join([str(raw.get("command") or ""), str(raw.get("speculative_args") or ""), *map(str, templates)]).split()
    for flag, why in section.items():
        if not isinstance(flag, str) or not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
            raise fail(f"fork_flags.{flag}", "must be a launch flag spelled --like-this")
        if flag not in passed:
            raise fail(f"fork_flags.{flag}", "is not passed by the command, speculative_args or any config_args template: drop it")
        if not isinstance(why, str) or not why.strip():
            raise fail(f"fork_flags.{flag}", "must say which fork or PR adds the flag (released SGLang's parser refuses it)")


def _parse_config_env(section: Mapping[str, Any], config_args: Mapping[str, Any], fail: _Fail) -> dict[str, dict[str, str]]:
    config_env: dict[str, dict[str, str]] = {}
    for key, variables in section.items():
        key = _axis_key(key, "config_env", fail)
        if not isinstance(variables, Mapping) or not variables:
            raise fail(f"config_env.{key}", f"must map environment variables to templates, e.g. {{SGLANG_X: \"{{value}}\"}}, got {variables!r}")
        if key in config_args:
            raise fail(f"config_env.{key}", "this field is already set by config_args; a field reaches the service one way")
        for variable, template in variables.items():
            if not valid_value_template(template):
                raise fail(f"config_env.{key}.{variable}", f"must be a template containing {{value}} (or {{value+N}}), got {template!r}")
        for variable in variables:
            if not is_env_name(variable):
                raise fail(f"config_env.{key}.{variable}", ENV_NAME_RULE)
        config_env[key] = {str(k): str(v) for k, v in variables.items()}
    return config_env



def _parse_env(section: Mapping[str, Any], fail: _Fail) -> dict[str, str]:
    """``env:`` the launch environment; every name a shell identifier."""
    for name in section:
        if not is_env_name(name):
            raise fail(f"env.{name}", ENV_NAME_RULE)
    return {str(k): str(v) for k, v in section.items()}


def _parse_fixed(section: Mapping[str, Any], settable: set[str], fail: _Fail) -> dict[str, FixedValue]:
    fixed: dict[str, FixedValue] = {}
    for key, value in section.items():
        key = _axis_key(key, "fixed", fail)
        if key in settable:
            raise fail(f"fixed.{key}", "the profile also sets this field (config_args / config_env); a fixed field is one the build cannot set")
        if value is None:
            fixed[key] = FixedValue()
        elif key == "window" and value == "none":  # a build that runs without a draft window, always
            fixed[key] = FixedValue(none=True)
        elif isinstance(value, int) and not isinstance(value, bool):
            fixed[key] = FixedValue(number=value)
        elif (isinstance(value, str) and (match := _FIXED_EXPRESSION.match(value)) and match.group(1) != key
              and _int_axis(match.group(1))):
            amount = int(match.group(3) or 0)
            fixed[key] = FixedValue(follows=match.group(1), offset=-amount if match.group(2) == "-" else amount)
        else:
            raise fail(f"fixed.{key}", f"must be the value the build always uses (an integer), another field "
                                       f"with an offset (e.g. 'block_size - 1'), 'none' (window only: no window), or null (derived by the build), got {value!r}")
    return fixed


def _parse_applied(section: Mapping[str, Any], fail: _Fail) -> tuple[dict[str, str], dict[str, int], frozenset[str]]:
    applied: dict[str, str] = {}
    applied_offset: dict[str, int] = {}
    negated: set[str] = set()
    for key, field_name in section.items():
        match = _FIXED_EXPRESSION.match(field_name) if isinstance(field_name, str) else None
        if match is not None and not axes_mod.is_axis(match.group(1)):
            match = None
        negation = _NEGATED.match(field_name) if isinstance(field_name, str) else None
        if axes_mod.is_axis(field_name):
            applied[str(key)] = str(field_name)
        elif negation is not None and axes_mod.is_axis(negation.group(1)) and axes_mod.axis(negation.group(1)).type == "bool":
            applied[str(key)] = negation.group(1)  # "not overlap": /server_info's disable_overlap_schedule
            negated.add(str(key))
        elif match is not None and _int_axis(match.group(1)):  # "budget + 1": the key counts differently (e.g. the root node too)
            applied[str(key)] = match.group(1)
            amount = int(match.group(3) or 0)
            if amount:
                applied_offset[str(key)] = -amount if match.group(2) == "-" else amount
        else:
            raise fail(f"applied.{key}", f"must name a config field (an axis: {', '.join(a.name for a in axes_mod.catalogue())}), "
                                         f"optionally with an offset such as 'budget + 1' (or 'not overlap' for a bool "
                                         f"axis), got {field_name!r}")
    return applied, applied_offset, frozenset(negated)


def _parse_choice_flags(key: str, section: Mapping[Any, Any], fail: _Fail) -> dict[Any, str]:
    """``config_args.<axis>: {value: flags}``: a choice or bool axis mapped value by value; the
    values listed are the ones the build accepts (``overlap: {on: "", off: --disable-overlap-schedule}``)."""
    axis = axes_mod.axis(key)
    if axis.type not in ("choice", "bool") or not section:
        raise fail(f"config_args.{key}", f"a mapping of values to flags is for a choice or bool axis with at least one "
                                         f"value; {key} is a {axis.type} axis: write a template with {{value}}")
    out: dict[Any, str] = {}
    for value, flags in section.items():
        try:
            checked = axis.check(value)
        except axes_mod.AxisError as exc:
            raise fail(f"config_args.{key}.{value}", str(exc)) from None
        if not isinstance(flags, str) or "{" in flags:
            raise fail(f"config_args.{key}.{value}", f"must be the flags for this value as text ('' for none), got {flags!r}")
        out[checked] = flags
    return out


def _parse_allowed(section: Mapping[str, Any], settable: set[str], fail: _Fail) -> dict[str, tuple[int, ...]]:
    allowed: dict[str, tuple[Any, ...]] = {}
    for key, values in section.items():
        if key not in settable:
            raise fail(f"allowed.{key}", "only a field the profile sets (config_args / config_env) has allowed values")
        if not isinstance(values, list) or not values:
            raise fail(f"allowed.{key}", f"must list the values the build accepts, e.g. [4, 8, 16], got {values!r}")
        try:
            allowed[str(key)] = tuple(axes_mod.axis(key).check(v) for v in values)
        except axes_mod.AxisError as exc:
            raise fail(f"allowed.{key}", f"must list values the build accepts: {exc}") from None
    return allowed


def _parse_fixed_because(section: Mapping[str, Any], settable: set[str], fail: _Fail) -> dict[str, str]:
    fixed_because: dict[str, str] = {}
    for key, reason in section.items():
        if not axes_mod.is_axis(key) or key in settable:
            raise fail(f"fixed_because.{key}", "must name a config field the profile does not set")
        if not isinstance(reason, str) or not reason.strip():
            raise fail(f"fixed_because.{key}", "must say why the build cannot set this field")
        fixed_because[str(key)] = reason.strip()
    return fixed_because


def _parse_sources(section: Mapping[str, Any], fail: _Fail) -> dict[str, str]:
    for key, where in section.items():
        if not isinstance(where, str) or not where.strip():
            raise fail(f"sources.{key}", "must say where the build's source defines it (repository, commit, path:line) or 'unverified: why'")
    return {str(k): str(v).strip() for k, v in section.items()}


def _parse_unverifiable(section: Mapping[str, Any], applied: Mapping[str, str], fail: _Fail) -> dict[str, str]:
    unverifiable = {str(k): v for k, v in section.items()}
    for key, reason in unverifiable.items():
        _axis_key(key, "unverifiable", fail)
        if not isinstance(reason, str) or not reason.strip():
            raise fail(f"unverifiable.{key}", "must give the reason /server_info cannot show this field (the report prints it)")
        if key in applied.values():
            raise fail(f"unverifiable.{key}", "this field is read back by applied; drop one of the two")
    return unverifiable


class _Behaviour(ControlKeys):
    lossless: str
    lossless_args: str | None
    control: str | None
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


#: The most launches of the control a profile may ask for per process (each one is a restart).
MAX_CONTROL_LAUNCHES = 16


def _parse_control_launches(raw: Mapping[str, Any], relaunchable: bool, fail: _Fail) -> int:
    """``control_launches``: how many launches of the control each process measures (half at its
    start, half at its end; gates/throughput/control.py), each one more restart of the service.
    ``relaunchable``: the service can be relaunched, or no control is launched at all."""
    if "control_launches" not in raw:
        return int(_DEFAULTS["control_launches"])
    n = raw["control_launches"]
    if not 1 <= n <= MAX_CONTROL_LAUNCHES:
        raise fail("control_launches", f"must be a whole number from 1 to {MAX_CONTROL_LAUNCHES} (launches of the "
                                       f"control per process, half at its start and half at its end), got {n}")
    if n > 1 and not relaunchable:
        raise fail("control_launches", "an external service or a pool of URLs cannot be relaunched, so its control "
                                       "cannot be launched more than once: leave control_launches out")
    return int(n)


def _parse_more_launches(raw: Mapping[str, Any], launches: int, relaunchable: bool, fail: _Fail) -> tuple[int, int]:
    """``control_max_launches`` (the launch policy's cap in a judged process, at least
    ``control_launches``) and ``bless_control_launches``; a service that cannot be relaunched keeps
    its one launch of the control for both."""
    out = []
    for key, default, least in (("control_max_launches", max(launches, int(_DEFAULTS["control_max_launches"])), launches),
                                ("bless_control_launches", int(_DEFAULTS["bless_control_launches"]), 1)):
        if key not in raw:
            out.append(default if relaunchable else launches if key == "control_max_launches" else 1)
            continue
        n = raw[key]
        if not least <= n <= MAX_CONTROL_LAUNCHES:
            raise fail(key, f"must be a whole number from {least} to {MAX_CONTROL_LAUNCHES}"
                            f"{' (control_launches is ' + str(launches) + ')' if key == 'control_max_launches' else ''}, got {n}")
        if n > (launches if key == "control_max_launches" else 1) and not relaunchable:
            raise fail(key, "an external service or a pool of URLs cannot be relaunched, so its control cannot be "
                            f"launched more than once: leave {key} out")
        out.append(int(n))
    return out[0], out[1]


def _check_plain_launch(raw: Mapping[str, Any], fail: _Fail) -> None:
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


def _parse_behaviour(raw: Mapping[str, Any], kind: ControllerKind, pool: int | tuple[str, ...], fail: _Fail) -> _Behaviour:
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
    control = raw.get("control")
    if control is not None and control != "none":
        try:
            parse_config_name(control)
        except ConfigError as exc:
            raise fail("control", f"must be 'none' or a config name to measure as the session's control ({exc})") from None
    relaunchable = kind.capabilities.relaunch and not isinstance(pool, tuple)
    # With control: none the control's launch keys are unused (still checked for their range): a
    # profile copied from reference.yaml, which sets them, needs only control: none.
    unused = control == "none"
    control_launches = _parse_control_launches(raw, relaunchable or unused, fail)
    control_max_launches, bless_control_launches = _parse_more_launches(raw, control_launches, relaunchable or unused, fail)
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
        lossless=lossless, lossless_args=raw.get("lossless_args"), control=control,
        control_launches=control_launches, control_max_launches=control_max_launches, **control_scope(raw, fail),
        bless_control_launches=bless_control_launches, relaunch_flagged=bool(relaunch_flagged), health_path=health_path,
        ready_timeout_s=_seconds(raw, "ready_timeout_s"), request_timeout_s=_seconds(raw, "request_timeout_s"),
        stall_timeout_s=_seconds(raw, "stall_timeout_s"), first_token_timeout_s=_seconds(raw, "first_token_timeout_s"),
        info_timeout_s=_seconds(raw, "info_timeout_s"), probe_timeout_s=_seconds(raw, "probe_timeout_s"),
        cell_timeout_s=_seconds(raw, "cell_timeout_s"), gpu_release_timeout_s=_seconds(raw, "gpu_release_timeout_s"),
        stop_timeout_s=_seconds(raw, "stop_timeout_s"),
        copy_probe=bool(raw.get("copy_probe", _DEFAULTS["copy_probe"])),
    )


def _parse_calibration(raw: Mapping[str, Any], kind: ControllerKind, fail: _Fail) -> dict[str, Any]:
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


def _own_matrix(raw: Mapping[str, Any], fail: Any) -> tuple[tuple[DDTreeConfig, ...] | None, DDTreeConfig | None]:
    """``matrix:`` (entries as in configs.yaml) and ``default:`` of a profile, validated."""
    from pytest_ddtree.configs import ConfigError, expand_matrix_entry, parse_config_name

    configs: list[DDTreeConfig] = []
    entries = raw.get("matrix")
    try:
        for index, entry in enumerate(entries or []):
            for config in expand_matrix_entry(entry, f"matrix[{index}]"):
                if config not in configs:
                    configs.append(config)
        default = parse_config_name(raw["default"]) if raw.get("default") else None
    except ConfigError as exc:
        raise fail("matrix" if "matrix[" in str(exc) else "default", str(exc)) from None
    if entries is not None and not configs:
        raise fail("matrix", "lists no config; leave the key out to use the projection of configs.yaml's matrix")
    if default is not None and configs and default not in configs:
        configs.insert(0, default)
    return (tuple(configs) if entries is not None else None), default


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
    names = ", ".join(sorted(p.name for p in folder.glob("*.yaml"))) if folder.is_dir() else ""
    return f"the shipped profiles are in {folder}: {names}" if names else "give a service profile's path (docs/profiles.md)"
