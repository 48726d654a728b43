"""A profile's ``config`` and ``proof`` keys: how each config field reaches the build (flags,
environment, what the build fixes and accepts), which configs it runs (``matrix``, ``default``),
and how each field is read back or why it cannot be.

Why apart from :mod:`pytest_ddtree.service.profile`: this is the part of a profile that is the
build's dialect, written per fork and checked field by field against the axes
(:mod:`pytest_ddtree.axes`); the rest of the profile is how the harness runs and times a service.
Every function takes the flat keys (:func:`pytest_ddtree.service.profile_keys.flatten`).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping, TypedDict

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.configs import ConfigError, DDTreeConfig, expand_matrix_entry, parse_config_name
from pytest_ddtree.service.base import ENV_NAME_RULE, is_env_name
from pytest_ddtree.service.profile_keys import Fail
from pytest_ddtree.service.validated_profile import FixedValue, valid_value_template, value_offset
from pytest_ddtree.suggest import did_you_mean

# A fixed value that follows another axis, e.g. ``block_size - 1`` (upstream DFLASH's chain) or
# ``steps + 1``; an applied key may also read a bool axis negated (``not overlap``).
_FIXED_EXPRESSION = re.compile(r"^\s*([a-z][a-z_]*)\s*(?:([+-])\s*(\d+))?\s*$")
_NEGATED = re.compile(r"^\s*not\s+([a-z][a-z_]*)\s*$")


def _axis_key(key: object, section: str, fail: Fail) -> str:
    """``key`` of a per-axis section, checked to be an axis (pytest_ddtree.axes or the profile's ``axes:``)."""
    if not axes_mod.is_axis(key):
        names = [a.name for a in axes_mod.catalogue()]
        raise fail(f"{section}.{key}", f"unknown config field; {did_you_mean(str(key), names)}allowed: {', '.join(names)} "
                                       "(an axis of your own: declare it under axes:)")
    return str(key)


def _int_axis(name: str) -> bool:
    return axes_mod.is_axis(name) and axes_mod.axis(name).type in ("int", "window")

class ConfigFields(TypedDict):
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


def parse_config_fields(raw: Mapping[str, Any], fail: Fail) -> ConfigFields:
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
    return ConfigFields(
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


class ReadBack(TypedDict):
    sources: dict[str, str]
    unverifiable: dict[str, str]


def parse_read_back(raw: Mapping[str, Any], fields: ConfigFields, fail: Fail) -> ReadBack:
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
    return ReadBack(sources=sources, unverifiable=unverifiable)


def _parse_speculative_args(raw: Mapping[str, Any], fail: Fail) -> str:
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


def check_budget_counts_root(raw: Mapping[str, Any], fields: ConfigFields, fail: Fail) -> None:
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


def check_fork_flags(raw: Mapping[str, Any], fail: Fail) -> None:
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


def _parse_config_env(section: Mapping[str, Any], config_args: Mapping[str, Any], fail: Fail) -> dict[str, dict[str, str]]:
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


def _parse_fixed(section: Mapping[str, Any], settable: set[str], fail: Fail) -> dict[str, FixedValue]:
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


def _parse_applied(section: Mapping[str, Any], fail: Fail) -> tuple[dict[str, str], dict[str, int], frozenset[str]]:
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


def _parse_choice_flags(key: str, section: Mapping[Any, Any], fail: Fail) -> dict[Any, str]:
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


def _parse_allowed(section: Mapping[str, Any], settable: set[str], fail: Fail) -> dict[str, tuple[int, ...]]:
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


def _parse_fixed_because(section: Mapping[str, Any], settable: set[str], fail: Fail) -> dict[str, str]:
    fixed_because: dict[str, str] = {}
    for key, reason in section.items():
        if not axes_mod.is_axis(key) or key in settable:
            raise fail(f"fixed_because.{key}", "must name a config field the profile does not set")
        if not isinstance(reason, str) or not reason.strip():
            raise fail(f"fixed_because.{key}", "must say why the build cannot set this field")
        fixed_because[str(key)] = reason.strip()
    return fixed_because


def _parse_sources(section: Mapping[str, Any], fail: Fail) -> dict[str, str]:
    for key, where in section.items():
        if not isinstance(where, str) or not where.strip():
            raise fail(f"sources.{key}", "must say where the build's source defines it (repository, commit, path:line) or 'unverified: why'")
    return {str(k): str(v).strip() for k, v in section.items()}


def _parse_unverifiable(section: Mapping[str, Any], applied: Mapping[str, str], fail: Fail) -> dict[str, str]:
    unverifiable = {str(k): v for k, v in section.items()}
    for key, reason in unverifiable.items():
        _axis_key(key, "unverifiable", fail)
        if not isinstance(reason, str) or not reason.strip():
            raise fail(f"unverifiable.{key}", "must give the reason /server_info cannot show this field (the report prints it)")
        if key in applied.values():
            raise fail(f"unverifiable.{key}", "this field is read back by applied; drop one of the two")
    return unverifiable


def own_matrix(raw: Mapping[str, Any], fail: Fail) -> tuple[tuple[DDTreeConfig, ...] | None, DDTreeConfig | None]:
    """``matrix:`` (entries as in configs.yaml) and ``default:`` of a profile, validated."""
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
