"""Every key a service profile may give, declared once: its group, type, default and what it is for.

Why one declaration: the validator's type check, the grouped spelling (``deadlines: {ready_s:
900}``), the did-you-mean of an unknown key and the table of docs/profiles.md all read this list,
so a key added here is checked, accepted both ways and documented at once, and the docs cannot
name a key the validator refuses (tests/test_profile_keys.py compares the page with
:func:`keys_table`; ``python -m pytest_ddtree.service.profile_keys docs/profiles.md`` rewrites it).

A profile writes each key flat (``ready_timeout_s: 900``) or inside its group (``deadlines:
{ready_s: 900}``); :func:`flatten` turns the grouped form into the flat one the validator reads.
``name``, ``description``, ``controller`` and a controller's own keys (``slurm:``) have no group.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pytest_ddtree.service import kinds
from pytest_ddtree.service.fleet import COMMAND_TEMPLATES, FleetKeys
from pytest_ddtree.service.validated_profile import ProfileError, ServiceProfile
from pytest_ddtree.suggest import did_you_mean

Types = type | tuple[type, ...]
_NONE = type(None)
_SECONDS = (int, float)


@dataclass(frozen=True)
class Group:
    name: str
    help: str


@dataclass(frozen=True)
class Key:
    """One profile key. ``inner``: its name inside its group (default: ``name``); ``default``: the
    default in words where it depends on other keys (else :class:`ServiceProfile`'s field of the
    same name, or :class:`FleetKeys`', holds it)."""

    name: str
    group: str | None
    types: Types
    help: str
    required: bool = False
    inner: str = ""
    default: str = ""

    @property
    def grouped(self) -> str:
        return f"{self.group}.{self.inner or self.name}" if self.group else self.name


GROUPS = (
    Group("launch", "how the service is started and reached"),
    Group("config", "how each config field reaches this build, and which configs it runs"),
    Group("proof", "how the harness proves a launch runs the config it names"),
    Group("control", "the throughput gate's control: which launch, how often, over which cells"),
    Group("gates", "what the gates compare against, and how much noise a cell may carry"),
    Group("deadlines", "time limits, each on a request or a phase as a whole (see Time limits)"),
    Group("calibration", "the probe of the machine's day (see Calibration probe)"),
    Group("fleet", "instances, remote hosts over ssh, and the command controller's templates (see Fleet)"),
    Group("model", "what the harness is told about the model beyond the launch"),
)

KEYS = (
    Key("name", None, str, "the profile's name (results, the package, the sweep's title)", required=True),
    Key("description", None, str, "one line on what this build is"),
    Key("dialect", None, (str, _NONE), "the reference engine's stand-in for this build: a dialect of "
        "pytest_ddtree/refserver/dialects.yaml (see Reference engine); null: none"),
    Key("controller", None, str, "what runs the service: process, systemd, external, command, slurm (see Controllers)",
        required=True),
    # launch
    Key("command", "launch", str, "the plain server's launch; placeholders {port}, {config_args}, {python}, {host}",
        default="required for process, systemd and slurm"),
    Key("speculative_args", "launch", (str, _NONE), "flags every config's launch gets and the plain launch never does: "
        "the algorithm and the drafter"),
    Key("lossless_args", "launch", (str, _NONE), "the plain launch: these args after the command without "
        "speculative_args and config_args (\"\" for SGLang); null: no plain launch"),
    Key("python", "launch", (str, _NONE), "the service's interpreter ({python}, the package's env/, versions); "
        "default: the command's Python"),
    Key("env", "launch", (dict, _NONE), "the launch's environment; names must be shell identifiers"),
    Key("url", "launch", str, "where the service answers; placeholders {port}, {host}", required=True),
    Key("port", "launch", (int, str), "a TCP port, or auto (a free port per instance); a fixed port that already "
        "answers before a launch is refused", default="`auto`"),
    Key("health_path", "launch", str, "readiness: the path that answers 200 once the service serves"),
    Key("unit", "launch", str, "systemd only: the unit the harness writes a drop-in for (its ExecStart)"),
    Key("dropin_dir", "launch", str, "systemd only: the drop-in folder (default: the unit's own)"),
    # config
    Key("axes", "config", (list, _NONE), "axes of the profile's own ({name, token, type, values}; see Axes)"),
    Key("default_window", "config", (int, _NONE), "the window of a config name without _w", default="`2048`"),
    Key("config_args", "config", dict, "axis: its launch flag template ({value}, {value+1}), or for a choice or bool "
        "axis {value: flags}; a field whose value is none is omitted", inner="args",
        default="required where the harness launches the service"),
    Key("config_env", "config", (dict, _NONE), "axis: {VARIABLE: template}, fields set by environment variables",
        inner="env"),
    Key("fixed", "config", (dict, _NONE), "axis the build cannot set: a number, e.g. 'block_size - 1', 'none' "
        "(window), or null (derived)"),
    Key("fixed_because", "config", (dict, _NONE), "axis: why the build cannot set it (printed where a config is "
        "left out)"),
    Key("allowed", "config", (dict, _NONE), "axis: the values the build accepts, e.g. {topk: [4, 8, 16]}"),
    Key("matrix", "config", (list, _NONE), "the build's own sweep (entries as in configs.yaml); default: the "
        "projection of configs.yaml's"),
    Key("default", "config", (str, _NONE), "the build's default config; default: configs.yaml's, projected"),
    Key("budget_counts_root", "config", (bool, _NONE), "does the budget flag count the root node? true: budget "
        "\"{value+1}\", applied \"budget + 1\"", default="`null` (not declared)"),
    Key("fork_flags", "config", (dict, _NONE), "--flag: the fork or PR that adds it (flags released SGLang's parser "
        "refuses)", default="`{}`"),
    # proof
    Key("applied", "proof", dict, "/server_info key: the axis it must show after a restart ('budget + 1', "
        "'not overlap')", default="`{}`"),
    Key("unverifiable", "proof", (dict, _NONE), "axis: why /server_info cannot show a field the profile sets "
        "(printed)"),
    Key("sources", "proof", (dict, _NONE), "flag, variable or applied key: the repository, commit and path:line "
        "it was read from"),
    Key("copy_probe", "proof", bool, "after readiness, a few short copy requests prove the block size or budget "
        "(false: no extra requests)"),
    # control
    Key("control", "control", (str, _NONE), "null: the lossless_args launch; none: no control (the keys below "
        "unused); or a config name", inner="config"),
    Key("control_launches", "control", int, "launches of the control per process, the odd one at its start "
        "(1-16; each one more restart)", inner="launches"),
    Key("control_max_launches", "control", int, "the launch policy's cap: further launches at the process's end "
        "while the uniform shift is inconclusive", inner="max_launches", default="`1` (at least launches)"),
    Key("bless_control_launches", "control", int, "launches of the control in a bless, half at each end",
        inner="bless_launches", default="`2` (`1` where the service cannot be relaunched)"),
    Key("control_min_configs", "control", int, "a process that will measure fewer configs measures no control",
        inner="min_configs"),
    Key("control_cells", "control", (int, _NONE), "the control measures the matrix's first this many throughput "
        "cells (>= 3; null: every cell)", inner="cells"),
    # gates
    Key("lossless", "gates", str, "golden (transcripts in baselines/) or instance (measure the lossless_args "
        "launch each session)", default="`instance` with lossless_args, else `golden`"),
    Key("coding_min_pass", "gates", (int, _NONE), "the coding gate's floor without a baseline (null: every problem)"),
    Key("max_context", "gates", (int, _NONE), "throughput cells with longer prompts are skipped, saying so"),
    Key("slo", "gates", (dict, _NONE), "the latency SLO, e.g. {ttft_ms: 500, tpot_ms: 50, percentile: 99}: goodput "
        "and the sustainable rate"),
    Key("max_repeat_spread", "gates", _SECONDS, "a cell's repeats agree within this robust spread of output tok/s "
        "(past it: extra repeats, then inconclusive)"),
    Key("bless_max_half_width", "gates", _SECONDS, "a bless takes a cell only when the 95% interval of its output "
        "tok/s is within this fraction"),
    Key("relaunch_flagged", "gates", bool, "relaunch configs the session check flags and judge them on all launches",
        default="`true` where the controller can relaunch"),
    Key("hardware_profile", "gates", (str, _NONE), "the baseline folder's name; default: a fingerprint of the GPUs "
        "and the engine"),
    # deadlines
    Key("ready_timeout_s", "deadlines", _SECONDS, "readiness as a whole (start to a 200 from health_path); each poll "
        "5 s", inner="ready_s"),
    Key("request_timeout_s", "deadlines", _SECONDS, "each generation request as a whole (/generate, chat, "
        "/tokenize, a stream to its last event)", inner="request_s"),
    Key("stall_timeout_s", "deadlines", _SECONDS, "a stream with no new token for this long has stalled: its cell "
        "stops", inner="stall_s"),
    Key("first_token_timeout_s", "deadlines", _SECONDS, "the same before a stream's first token (its prefill, "
        "queued behind the cell's other requests)", inner="first_token_s"),
    Key("info_timeout_s", "deadlines", _SECONDS, "each control call as a whole: /server_info, /model_info, "
        "/metrics, /flush_cache", inner="info_s"),
    Key("probe_timeout_s", "deadlines", _SECONDS, "the copy probe as a whole", inner="probe_s"),
    Key("cell_timeout_s", "deadlines", _SECONDS, "one repeat of a throughput cell as a whole (warm-up, measured "
        "loop, /server_info)", inner="cell_s"),
    Key("gpu_release_timeout_s", "deadlines", _SECONDS, "the wait for the last launch's GPU memory before the next "
        "start", inner="gpu_release_s"),
    Key("stop_timeout_s", "deadlines", _SECONDS, "SIGTERM, then SIGKILL of the process group after this long",
        inner="stop_s"),
    # calibration
    Key("calibration_command", "calibration", (str, _NONE), "a build-independent probe run on the service's host "
        "before the first launch and after the last stop", inner="command"),
    Key("calibration_timeout_s", "calibration", _SECONDS, "the calibration command as a whole, start to exit",
        inner="timeout_s"),
    # fleet
    Key("pool", "fleet", (int, list), "instances for xdist workers (ports auto), a list of URLs, or of hosts"),
    Key("instance_lock", "fleet", bool, "sessions on this machine take turns per instance (false only where nothing "
        "is shared)", default="`true` (`false` for slurm)"),
    Key("host", "fleet", (str, _NONE), "user@node[:port]: the systemd, command or slurm controller acts there over "
        "ssh"),
    Key("ssh_options", "fleet", (str, list, _NONE), "ssh's own options, as a string or a list of words",
        default="`null`"),
    Key("sudo", "fleet", bool, "run systemctl and the drop-in's writes under sudo on the host"),
    Key("lock_path", "fleet", (str, _NONE), "the instance lock's file on a remote host"),
    Key("command_timeout_s", "fleet", _SECONDS, "each remote or template command as a whole"),
    Key("connect_timeout_s", "fleet", _SECONDS, "ssh's connection to a host"),
    *(Key(name, "fleet", (str, _NONE), f"controller: command only: the {name} command template", default="`null`")
      for name in COMMAND_TEMPLATES),
    # model
    Key("tokenizer", "model", (str, _NONE), "a local HF tokenizer folder, only for a service without /tokenize "
        "([hf] extra)"),
    Key("vocab_size", "model", (int, _NONE), "only for cells with prompts: random (SGLang reports no vocabulary "
        "size)"),
    Key("draft_model_path", "model", (str, _NONE), "the drafter's folder, for the reproduction package's drafter/ "
        "metadata"),
    Key("patches", "model", (dict, _NONE), "the build's patches, for the reproduction package's patches/"),
)

_GROUP_NAMES = tuple(group.name for group in GROUPS)
_BY_GROUPED = {(key.group, key.inner or key.name): key for key in KEYS if key.group}

Fail = Callable[[str, str], ProfileError]


def _declared() -> dict[str, tuple[Types, bool]]:
    """Every flat key -> (its types, whether it is required): this declaration's and the registered
    controllers' own (``slurm:``)."""
    return {**{key.name: (key.types, key.required) for key in KEYS}, **kinds.key_types()}


def flatten(raw: Mapping[str, Any], fail: Fail) -> tuple[dict[str, Any], dict[str, str]]:
    """The flat keys of ``raw``, each group's keys taken out of it; and flat name -> the grouped
    spelling used (for messages: the user reads the key as written). ``control:`` is the group
    when it is a mapping, else the flat key (``control: none``)."""
    flat: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, value in raw.items():
        if name not in _GROUP_NAMES or (name == "control" and not isinstance(value, Mapping)):
            flat[name] = value
            continue
        if value is not None and not isinstance(value, Mapping):
            raise fail(name, f"is a group of keys: write them under it ({name}: {{...}}), got {value!r}")
        for inner, item in (value or {}).items():
            key = _BY_GROUPED.get((name, inner))
            if key is None:
                raise fail(f"{name}.{inner}", _unknown_in_group(name, str(inner)))
            if key.name in raw:
                raise fail(f"{name}.{inner}", f"given twice: as {name}.{inner} and as {key.name}; keep one of them")
            flat[key.name], spelled[key.name] = item, f"{name}.{inner}"
    return flat, spelled


def _unknown_in_group(group: str, inner: str) -> str:
    members = [key.inner or key.name for key in KEYS if key.group == group]
    elsewhere = [key.grouped for key in KEYS if inner in (key.name, key.inner)]  # a flat name, or another group's
    hint = f"it is {' or '.join(elsewhere)}; " if elsewhere else did_you_mean(inner, members)
    return f"unknown key in {group}; {hint}{group} holds: {', '.join(members)}"


def check_key_types(flat: Mapping[str, Any], fail: Fail) -> None:
    """Every key is known, every required one is there, each has its type (a bool is no int)."""
    known = _declared()
    unknown = sorted(set(flat) - set(known))
    if unknown:
        word = unknown[0]
        grouped = [key.grouped for key in KEYS if key.inner == word]
        hint = f"it is {' or '.join(grouped)} in the grouped form; " if grouped else did_you_mean(word, [*known, *_GROUP_NAMES])
        raise fail(word, f"unknown key; {hint}allowed: {', '.join(sorted(known))} (or grouped: "
                         f"{', '.join(_GROUP_NAMES)}; docs/profiles.md)")
    for name, (types, required) in known.items():
        if name not in flat:
            if required:
                inside = next((key.grouped for key in KEYS if key.name == name and key.group), None)
                raise fail(name, "missing required key" + (f" (grouped: {inside})" if inside else ""))
            continue
        value = flat[name]
        takes_bool = types is bool or (isinstance(types, tuple) and bool in types)
        if (isinstance(value, bool) and not takes_bool) or not isinstance(value, types):
            raise fail(name, f"expected {_type_names(types)}, got {type(value).__name__} {value!r}")


def _type_names(types: Types) -> str:
    return types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)


# -- the table of docs/profiles.md ----------------------------------------------------------------

_BEGIN = "<!-- profile keys: generated from pytest_ddtree/service/profile_keys.py; do not edit -->"
_END = "<!-- end of the generated profile keys -->"
_WORDS = {"str": "text", "int": "integer", "float": "number", "bool": "true/false", "dict": "mapping",
          "list": "list", "NoneType": "null"}


def _type_words(types: Types) -> str:
    names = [_WORDS[t.__name__] for t in ((types,) if isinstance(types, type) else types)]
    return "number" if names[:2] == ["integer", "number"] and len(names) == 2 else " or ".join(names)


def _default_words(key: Key) -> str:
    if key.default:
        return key.default
    if key.required:
        return "required"
    for cls in (ServiceProfile, FleetKeys):
        found = {f.name: f for f in dataclasses.fields(cls)}.get(key.name)
        if found is not None and found.default is not dataclasses.MISSING:
            return f"`{_yaml_word(found.default)}`"
        if found is not None and found.default_factory is not dataclasses.MISSING:
            return f"`{_yaml_word(found.default_factory())}`"
    return "`null`"


def _yaml_word(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return f'"{value}"' if not value or value.startswith("/") else value
    if isinstance(value, Mapping):
        return "{}"
    return str(value)


def keys_table() -> str:
    """The markdown of every key, one table per group (the block docs/profiles.md carries)."""
    lines = [_BEGIN, "", "| key | type | default | what it is for |", "|---|---|---|---|"]
    lines += [_row(key, key.name) for key in KEYS if key.group is None]
    shipped = kinds.kinds_that(lambda can: True)  # a kind registered from outside the package is not this page's
    for owner in (kind for kind in shipped if kind.make.__module__.startswith("pytest_ddtree.")):
        lines += [f"| `{name}` | {_type_words(types[0])} | `null` | controller: {owner.name} only: its "
                  f"{owner.keys_meaning} (see its page) |" for name, types in owner.profile_keys.items()]
    for group in GROUPS:
        lines += ["", f"**`{group.name}:`** {group.help}.", "",
                  "| grouped | flat | type | default | what it is for |", "|---|---|---|---|---|"]
        lines += [_row(key, key.inner or key.name, flat=True) for key in KEYS if key.group == group.name]
    return "\n".join([*lines, "", _END])


def _row(key: Key, shown: str, flat: bool = False) -> str:
    cells = [f"`{shown}`", *([f"`{key.name}`"] if flat else []), _type_words(key.types), _default_words(key),
             key.help.replace("|", "\\|")]
    return "| " + " | ".join(cells) + " |"


def replace_table(page: str) -> str:
    """``page`` with its generated block replaced by :func:`keys_table` (ValueError: no block)."""
    match = re.search(re.escape(_BEGIN) + r".*?" + re.escape(_END), page, re.S)
    if match is None:
        raise ValueError(f"the page has no generated block (from {_BEGIN!r} to {_END!r})")
    return page[:match.start()] + keys_table() + page[match.end():]


if __name__ == "__main__":  # python -m pytest_ddtree.service.profile_keys docs/profiles.md
    target = Path(sys.argv[1])
    target.write_text(replace_table(target.read_text()))
