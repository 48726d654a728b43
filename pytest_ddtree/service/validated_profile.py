"""The validated service profile: how a config reaches the service (flags, environment, URL,
command) and which configs its build can express.

:mod:`pytest_ddtree.service.profile` reads and validates the YAML file into a
:class:`ServiceProfile` (and re-exports these names); this module holds what the profile is.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_ddtree import axes as axes_mod
from pytest_ddtree.configs import CORE_FIELDS, DDTreeConfig
from pytest_ddtree.service.plain import PLAIN_AXIS, PLAIN_PROOF, is_plain
from pytest_ddtree.service.fleet import FleetKeys
from pytest_ddtree.service.base import Capabilities, LaunchFrom
from pytest_ddtree.service.ssh import SSHTarget

#: The DDTree axes every profile speaks of (a profile may map any other axis of pytest_ddtree.axes too).
CONFIG_FIELDS = CORE_FIELDS
LOSSLESS_MODES = ("instance", "golden")


class ProfileError(ValueError):
    """A service profile is invalid; the message names file, key and problem."""


class SelectionError(ProfileError):
    """The selected configs ask for something the profile's build cannot do (a usage error)."""


# A value template: ``{value}``, or ``{value+1}`` / ``{value-1}`` where a build counts differently
# (e.g. the SubSir fork's SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS counts the root: budget + 1).
_VALUE_PLACEHOLDER = re.compile(r"\{value(?:([+-])(\d+))?\}")


def render_value(template: str, value: object) -> str:
    """Fill ``{value}`` / ``{value+N}`` / ``{value-N}`` in a flag or environment template (an offset
    only for a number; a bool is written true / false)."""

    def fill(match: re.Match[str]) -> str:
        sign, amount = match.group(1), match.group(2)
        if isinstance(value, bool):
            return "true" if value else "false"
        if sign is None or not isinstance(value, int):
            return str(value)
        return str(value + int(amount) if sign == "+" else value - int(amount))

    return _VALUE_PLACEHOLDER.sub(fill, template)


def value_offset(template: str) -> int:
    """What a template adds to the field's value: 1 for ``{value+1}``, 0 for ``{value}``."""
    match = _VALUE_PLACEHOLDER.search(template)
    if match is None or match.group(1) is None:
        return 0
    return int(match.group(2)) * (1 if match.group(1) == "+" else -1)


def valid_value_template(template: object) -> bool:
    if not isinstance(template, str) or not _VALUE_PLACEHOLDER.search(template):
        return False
    rest = _VALUE_PLACEHOLDER.sub("", template)
    return "{" not in rest and "}" not in rest


#: A profile's ``control_launches`` when it does not set them: one, at the process's start. What more launches
#: buy (every config 5% slower caught 95% of the time, at 2 or more at the start) costs an 18-config sweep
#: 9-11% of its GPU time each on the seed's box (docs/benchmarks.md, "The bill"); a team that wants it sets them.
DEFAULT_CONTROL_LAUNCHES = 1
#: The most launches of the control the launch policy takes in a judged process (``control_max_launches``):
#: further launches at its end only while the uniform shift is inconclusive (gates/throughput/launches.py);
#: by default none (with one start launch no number of further ones catches every config 5% slower 95% of the time).
DEFAULT_CONTROL_MAX_LAUNCHES = 1
#: How far a cell's repeats may spread (robust spread: scaled MAD / median of output tok/s) and still
#: agree (``max_repeat_spread``): 12%. Past it a cell gets extra repeats, then is inconclusive. One
#: bound for stopping and for agreeing: a tighter stopping bound would spend extra repeats on noise the
#: gate's tolerances already absorb (a bless's interval is tightened by the gate's half-width instead).
DEFAULT_MAX_REPEAT_SPREAD = 0.12
#: A bless asks more of a cell than a judged run (``bless_max_half_width``): the 95% t-interval of its
#: output tok/s (mean of log values, not robust: two slow repeats of three widen it) within +-5%,
#: after the extra repeats.
DEFAULT_BLESS_MAX_HALF_WIDTH = 0.05
#: Launches of the control in a bless (``bless_control_launches``), half at its start and half at its end.
DEFAULT_BLESS_CONTROL_LAUNCHES = 2
#: A process that will measure fewer configs than this measures no control (``control_min_configs``): the
#: uniform shift is the configs' median against the control, which one or two configs do not make, and the
#: control's launch and non-speculative cells would double a one-config gate's GPU time.
DEFAULT_CONTROL_MIN_CONFIGS = 3
#: The control measures the first this many throughput cells of the matrix (``control_cells``; the matrices
#: list their short-context cells first): the fewest that state a uniform shift (three judged cells).
DEFAULT_CONTROL_CELLS = 3


@dataclass(frozen=True)
class FixedValue:
    """What a build always uses for a field it cannot set: a number, another field's value plus
    an offset, or None (derived by the build in a way the harness cannot predict)."""

    number: int | None = None
    follows: str | None = None
    offset: int = 0
    #: the window the build always runs is none (the drafter sees the whole context), not unknown
    none: bool = False

    def value_for(self, values: Mapping[str, Any]) -> int | None:
        if self.follows is not None:
            base = values.get(self.follows)
            return None if not isinstance(base, int) or isinstance(base, bool) else base + self.offset
        return self.number

    def describe(self) -> str:
        if self.follows is not None:
            if not self.offset:
                return f"= {self.follows}"
            return f"= {self.follows} {'+' if self.offset > 0 else '-'} {abs(self.offset)}"
        if self.none:
            return "always none"
        return "derived by the build" if self.number is None else f"always {self.number}"


@dataclass(frozen=True)
class ServiceProfile:
    """A validated service profile. ``source`` and ``text`` keep the file for the repro package."""

    name: str
    controller: str
    command: str | None
    url: str
    port: int | str
    default_window: int | None
    config_args: Mapping[str, str]
    applied: Mapping[str, str]
    capabilities: Capabilities
    """What the ``controller:`` can do, as the validator found its kind (service/kinds.py): asked
    by everything that would otherwise branch on the controller's name."""
    #: axis -> value -> the flags for it, for a choice or bool axis mapped value by value
    #: (``overlap: {on: "", off: --disable-overlap-schedule}``): its values are the ones it accepts.
    config_choices: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)
    #: Flags every config's launch gets before its config_args and the plain launch (the control,
    #: the lossless reference) does not: the algorithm and the drafter (SGLang serves plainly
    #: only where no --speculative-algorithm is given).
    speculative_args: str = ""
    #: /server_info keys that show a bool axis negated (``disable_overlap_schedule: not overlap``)
    applied_negated: frozenset[str] = frozenset()
    #: the axes the profile's ``axes:`` declares (beyond those pytest_ddtree.axes ships)
    declared_axes: tuple[axes_mod.Axis, ...] = ()
    config_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    fixed: Mapping[str, FixedValue] = field(default_factory=dict)
    unverifiable: Mapping[str, str] = field(default_factory=dict)
    #: field -> the values this build accepts for it (e.g. topk in (4, 8, 16)); others are refused.
    allowed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    #: field -> why the build cannot set it (printed where a config is left out for that field).
    fixed_because: Mapping[str, str] = field(default_factory=dict)
    #: /server_info key -> what it shows beyond the field's value (``budget + 1``: it counts the root).
    applied_offset: Mapping[str, int] = field(default_factory=dict)
    #: The build's own sweep and default (``matrix:`` / ``default:``), replacing the projection of
    #: configs.yaml's (see pytest_ddtree.selection).
    own_matrix: tuple[DDTreeConfig, ...] | None = None
    own_default: DDTreeConfig | None = None
    #: flag / environment variable / /server_info key -> where in the build's source it was read
    #: (repository, commit or branch, path:line), or "unverified: ..." (the report and package cite it).
    sources: Mapping[str, str] = field(default_factory=dict)
    health_path: str = "/health_generate"
    ready_timeout_s: float = 900.0
    #: Each generation request as a whole (connect, every byte, a stream's last event): /generate,
    #: chat, /tokenize. SGLang's bench_serving allows 6 h (sglang 0.5.23 sglang/benchmark/serving.py:81);
    #: a gate that waits that long on one request is hung, and the longest honest cell request
    #: (16k context, 1,024 tokens on a slow build) is minutes.
    request_timeout_s: float = 600.0
    #: A stream with no new token for this long has stalled (SSE comments and keep-alives do not
    #: count): the request fails and its cell stops; before the first token (the prefill, queueing
    #: behind the cell's other requests) ``first_token_timeout_s`` (``http.Stall``).
    stall_timeout_s: float = 30.0
    first_token_timeout_s: float = 120.0
    #: Each control call as a whole (/server_info, /model_info, /metrics, /flush_cache): 30 s, as
    #: SGLang's own test launcher (sglang 0.5.23 sglang/test/test_utils.py:1147, ClientTimeout(total=30)).
    info_timeout_s: float = 30.0
    #: The copy probe as a whole (its few short requests after readiness).
    probe_timeout_s: float = 300.0
    #: One repeat of a throughput cell as a whole (warm-up, measured loop, /server_info).
    cell_timeout_s: float = 3600.0
    gpu_release_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    #: A build-independent workload run on the service's host before the first launch and after the
    #: last stop (pytest_ddtree/service/calibration.py): its figures let the history tell a slower
    #: build from a slower day. None: no probe (the embedded engine's default: its speed is its clock model's).
    calibration_command: str | None = None
    #: The calibration command as a whole, start to exit.
    calibration_timeout_s: float = 120.0
    env: Mapping[str, str] = field(default_factory=dict)
    pool: int | tuple[str, ...] = 1
    #: Two sessions on one machine take turns on an instance (a file lock) unless this is false:
    #: only for a service that shares nothing between sessions (the embedded engine, one process
    #: per session on a free port of the CPU); a GPU service shares its GPUs even with port auto.
    instance_lock: bool = True
    coding_min_pass: int | None = None
    #: After readiness, a few short greedy requests whose continuation the drafter can copy prove the
    #: block size (or budget) by the acceptance histogram (pytest_ddtree.service.proof); false for a service
    #: that must get no requests but the tests' own (one that counts or bills them).
    copy_probe: bool = True
    unit: str | None = None
    dropin_dir: str | None = None
    lossless: str = "golden"
    lossless_args: str | None = None
    #: The throughput gate's control (pytest_ddtree/gates/throughput/control.py): None = the lossless_args launch,
    #: "none" = no control, else the name of a config to measure as the control.
    control: str | None = None
    #: Launches of the control per process, half at its start and half at its end (gates/throughput/control.py):
    #: each averages away more of one launch's own speed shift, at the cost of one restart and the
    #: control's cells; the uniform shift's standard error shrinks with them (docs/benchmarks.md).
    control_launches: int = DEFAULT_CONTROL_LAUNCHES
    #: At most this many launches of the control in a judged process: after its ``control_launches``
    #: the launch policy takes further ones at its end, a few at a time, only while the session's
    #: uniform shift is inconclusive (gates/throughput/launches.py); = control_launches: never.
    control_max_launches: int = DEFAULT_CONTROL_MAX_LAUNCHES
    #: Launches of the control in a bless, half at its start and half at its end: each later session's
    #: uniform shift carries the blessed sessions' share of one launch's shift (1 for an external service).
    bless_control_launches: int = DEFAULT_BLESS_CONTROL_LAUNCHES
    #: A process that will measure fewer configs than this measures no control (the summary says why).
    control_min_configs: int = DEFAULT_CONTROL_MIN_CONFIGS
    #: The control measures the matrix's first this many throughput cells (None: every one).
    control_cells: int | None = DEFAULT_CONTROL_CELLS
    #: Configs the session-end check flags are launched once more at the end of their process and
    #: judged on both launches (session_check.relaunch_candidates); false for a service that cannot be relaunched.
    relaunch_flagged: bool = True
    hardware_profile: str | None = None
    max_context: int | None = None
    #: How far a cell's repeats may spread (robust spread of output tok/s) and still count: past it
    #: the cell is inconclusive. A host shared with other work (a CI box, a CPU lane) spreads more.
    max_repeat_spread: float = DEFAULT_MAX_REPEAT_SPREAD
    #: The widest 95% interval of a cell's output tok/s a bless takes into a baseline.
    bless_max_half_width: float = DEFAULT_BLESS_MAX_HALF_WIDTH
    slo: dict[str, Any] | None = None  # the service's latency SLO (slo.slo_from_mapping; the matrix's and --ddtree-slo beat it)
    tokenizer: str | None = None  # local HF tokenizer dir, only for a service without /tokenize
    vocab_size: int | None = None  # only for cells with prompts: random (SGLang reports none)
    draft_model_path: str | None = None
    patches: Mapping[str, Any] | None = None
    python: str | None = None  # the service's interpreter (env/ snapshot, versions); see service_python
    description: str = ""
    #: The engine dialect that speaks this build's flags (a ``dialects.yaml`` entry beside the
    #: shipped profiles, refserver/dialects.py): the reference engine stands in for the build with
    #: it. None: no stand-in (the build is only run as itself).
    dialect: str | None = None
    fleet: FleetKeys = field(default_factory=FleetKeys)
    controller_keys: object = None
    """The controller's own profile keys as its kind's ``check_profile`` parsed them (slurm: ``SlurmKeys``)."""
    source: Path | None = None
    text: str = ""

    def tokenizer_path(self) -> str | None:
        """``tokenizer:`` with a relative path taken from the profile's folder (as written
        otherwise: a name the tokenizer library resolves)."""
        if not self.tokenizer:
            return None
        path = Path(os.path.expanduser(self.tokenizer))
        if not path.is_absolute() and self.source is not None and (self.source.parent / path).exists():
            return str(self.source.parent / path)
        return str(path)

    # -- rendering -------------------------------------------------------------------------
    def fields(self) -> tuple[str, ...]:
        """The axes this profile speaks of: DDTree's four, then every other it maps, fixes or reads back."""
        named = {*self.config_args, *self.config_choices, *self.config_env, *self.fixed, *self.applied.values(),
                 *self.unverifiable, *self.fixed_because}
        return (*CONFIG_FIELDS, *axes_mod.order(n for n in named if n not in CONFIG_FIELDS))

    def render_config_args(self, config: DDTreeConfig) -> list[str]:
        """The launch flags for ``config``: ``speculative_args``, then each axis's flags (an axis whose
        value is None, left out or no window, is omitted)."""
        values = config.field_values(self.default_window)
        args: list[str] = shlex.split(self.speculative_args)
        for field_name in self.fields():
            value = values.get(field_name)
            if value is None:
                continue
            if field_name in self.config_choices:
                args.extend(shlex.split(self.config_choices[field_name].get(value, "")))
                continue
            template = self.config_args.get(field_name)
            if template is not None:
                args.extend(shlex.split(render_value(template, value)))
        return args

    def render_env(self, config: DDTreeConfig | None) -> dict[str, str]:
        """The launch environment: the profile's ``env`` plus ``config_env`` for ``config``
        (a field whose value is None sets nothing)."""
        env = dict(self.env)
        if config is None:
            return env
        values = config.field_values(self.default_window)
        for field_name in self.fields():
            value = values.get(field_name)
            if value is None:
                continue
            for variable, template in self.config_env.get(field_name, {}).items():
                env[variable] = render_value(template, value)
        return env

    # -- what the build can set ------------------------------------------------------------
    def settable_fields(self) -> tuple[str, ...]:
        """Fields that reach the service through a launch flag or an environment variable."""
        return tuple(f for f in self.fields() if f in self.config_args or f in self.config_env or f in self.config_choices)

    def fixed_field(self, field_name: str) -> FixedValue | None:
        """How the build decides a field the profile cannot set (None: the profile sets it).
        A field the profile neither sets nor lists under ``fixed`` is derived by the build."""
        if field_name in self.settable_fields():
            return None
        return self.fixed.get(field_name, FixedValue())

    def how_fields_reach_the_service(self) -> dict[str, str]:
        """field -> one line: the flag, the variable, or what the build uses instead."""
        out: dict[str, str] = {}
        plain = self.own_matrix is not None and all(is_plain(c) for c in self.own_matrix)
        for name in self.fields():
            if plain and name in CONFIG_FIELDS:
                continue  # a plain server (service/plain.py) drafts nothing: DDTree's fields do not exist there
            if name in self.config_choices:
                how = "flags " + ", ".join(f"{axes_mod.axis(name).format(v)}: {f or '(none)'}"
                                           for v, f in self.config_choices[name].items())
            elif name in self.config_args:
                how = f"flag {self.config_args[name]}"
            elif name in self.config_env:
                how = "env " + ", ".join(f"{k}={v}" for k, v in self.config_env[name].items())
            elif name not in CONFIG_FIELDS and name not in self.fixed:
                how = "not settable: this build has no flag for it (the profile maps none)"
            else:
                fixed = self.fixed_field(name)
                assert fixed is not None
                how = f"not settable: {fixed.describe()}"
            checks = [key for key, f in self.applied.items() if f == name]
            if checks:
                how += "; read back as /server_info " + ", ".join(checks)
            elif plain and name == PLAIN_AXIS:
                how = f"no flag (a server started without --speculative-algorithm); proven: {PLAIN_PROOF}"
            elif name in self.unverifiable:
                how += f"; unverifiable: {self.unverifiable[name]}"
            out[name] = how
        return out

    def launch_identity(self, config: DDTreeConfig) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What a launch of ``config`` really is: the command (port left out) and its environment."""
        env = self.render_env(config)
        command = self.render_command(config, None) if self.command else shlex.join(self.render_config_args(config))
        return command, tuple(sorted(env.items()))

    def why_not(self, config: DDTreeConfig) -> list[tuple[str, str]]:
        """(field, reason) for each field this build cannot run as ``config`` names it: a fixed field
        the build decides otherwise, or a value outside the field's ``allowed`` list. Empty: the
        build can run the config (it may still share its launch with another config)."""
        values = config.field_values(self.default_window)
        given = set(config.set_axes())
        out: list[tuple[str, str]] = []
        for name in (*self.fields(), *axes_mod.order(given - set(self.fields()))):
            shown = axes_mod.axis(name).format(values.get(name)) if name in given else values.get(name)
            fixed = self.fixed_field(name)
            if fixed is None:
                allowed = self.allowed.get(name) or (tuple(self.config_choices[name]) if name in self.config_choices else None)
                if allowed is not None and name in given and values[name] not in allowed:
                    out.append((name, f"{name}={shown}, but this build accepts {name} "
                                      f"{', '.join(axes_mod.axis(name).format(v) for v in allowed)} only "
                                      f"({'allowed' if name in self.allowed else 'config_args'}.{name} in the profile)"))
                continue
            if name not in given and name != "window":
                continue  # left out of the name: whatever the build uses
            if name not in CONFIG_FIELDS and name not in self.fixed:
                out.append((name, f"{name}={shown}, but this build has no flag for {name} (the profile maps none: "
                                  f"config_args.{name} or config_env.{name})"))
                continue
            expected = fixed.value_for(values)
            if (expected is not None or fixed.none) and values[name] != expected:
                because = f"; {self.fixed_because[name]}" if name in self.fixed_because else ""
                out.append((name, f"{name}={values[name]}, but this build cannot set {name}: "
                                  f"it is {fixed.describe()} ({'none' if fixed.none else expected} here{because})"))
        return out

    def projection(self, config: DDTreeConfig) -> DDTreeConfig | None:
        """The config this build runs for ``config``: each fixed field replaced by the value the
        build uses (``bs8_b8_k4`` -> ``bs8_b7_k1`` on a chain build); None where no such config
        exists (a settable field's value is not allowed, or a derived value cannot be known)."""
        values = config.field_values(self.default_window)
        changed: dict[str, int] = {}
        for name in self.fields():
            fixed = self.fixed_field(name)
            if fixed is None or name == "window" or (name not in CONFIG_FIELDS and name not in self.fixed):
                continue
            expected = fixed.value_for({**values, **changed})
            if expected is not None and (name in config.set_axes() or name in CONFIG_FIELDS):
                changed[name] = expected
        try:
            projected = config.replaced(changed) if changed else config
        except ValueError:  # e.g. a budget of 0 on a block size of 1
            return None
        return None if self.why_not(projected) else projected

    def check_selection(self, configs: Iterable[DDTreeConfig]) -> None:
        """Refuse, before anything starts, configs this build would mislabel.

        A config whose fixed field differs from what the build always uses would be recorded
        under a name it did not run; two different configs with the same launch (command and
        environment) would record one service's numbers under two names. Both raise
        SelectionError naming the fields the profile cannot set.
        """
        configs = list(configs)
        problems: list[str] = []
        for config in configs:
            problems.extend(f"{config.name} asks {reason}" for _, reason in self.why_not(config))
        by_launch: dict[tuple[str, tuple[tuple[str, str], ...]], list[DDTreeConfig]] = {}
        for config in configs:
            by_launch.setdefault(self.launch_identity(config), []).append(config)
        for group in by_launch.values():
            distinct = {tuple(sorted(c.field_values(self.default_window).items(), key=lambda kv: kv[0])): c for c in group}
            if len(distinct) < 2:
                continue
            differing = [
                name for name in {n: None for c in distinct.values() for n in c.field_values(self.default_window)}
                if len({c.field_values(self.default_window).get(name) for c in distinct.values()}) > 1
            ]
            how = self.how_fields_reach_the_service()
            names = ", ".join(c.name for c in distinct.values())
            problems.append(
                f"{names} would run the same launch (command and environment): this profile cannot set "
                f"{', '.join(differing)} ({'; '.join(f + ': ' + how.get(f, 'not mapped') for f in differing)}); "
                "select one of them, or map the field in config_args / config_env if your build can set it"
            )
        if problems:
            raise SelectionError(
                f"service profile {self.source or self.name} cannot run the selected configs as named:\n  - "
                + "\n  - ".join(problems)
            )

    def render_command(self, config: DDTreeConfig | None, port: int | None, extra_args: str | None = None) -> str:
        """The full launch command; ``config=None`` with ``extra_args`` launches e.g. a no-speculation instance."""
        if self.command is None:
            raise ProfileError(f"{self._where('command')}: the {self.controller} controller needs a 'command'")
        if config is not None:
            config_args = shlex.join(self.render_config_args(config))
        else:
            config_args = ""
        if extra_args:
            config_args = f"{config_args} {extra_args}".strip()
        port_text: object = "" if port is None else port
        host_text = self.node
        if self.capabilities.placed_by_scheduler:  # the job's own node and port, known once it runs (slurm.py)
            port_text, host_text = "${DDTREE_PORT}", "${DDTREE_HOST}"
        return self.command.format(
            port=port_text,
            config_args=config_args,
            python=shlex.quote(self.launch_python),
            host=host_text,
        ).strip()

    @property
    def launch_python(self) -> str:
        """What ``{python}`` stands for: the profile's ``python:`` (the service's interpreter), else
        this interpreter here, or ``python3`` on a remote host: our own path means nothing there."""
        if self.python:
            return os.path.expanduser(self.python)
        return "python3" if self.host else sys.executable

    @property
    def service_python(self) -> str | None:
        """The interpreter the service runs under: ``python:``, else the first word of ``command``
        when that is a Python (``{python}`` is this one); None when neither says.

        Why: the package's env/ and the versions it records must be the service's, not those of
        the harness, which often lives in another virtual environment.
        """
        return resolve_service_python(self.python, self.command)

    def render_calibration_command(self) -> str | None:
        """The ``calibration_command`` filled as the launch command is (``{python}``, ``{host}``); None: no probe."""
        if not self.calibration_command:
            return None
        return self.calibration_command.format(python=shlex.quote(self.launch_python), host=self.node).strip()

    def render_url(self, port: int | None) -> str:
        return self.url.format(port="" if port is None else port, host=self.node).rstrip("/")

    @property
    def host(self) -> str | None:
        """``user@node[:port]`` where the service runs (systemd/command over ssh), None: here."""
        return self.fleet.host

    @property
    def node(self) -> str:
        """The service's host name for URLs and ``{host}`` (127.0.0.1 for a local service)."""
        return SSHTarget.parse(self.fleet.host).url_host if self.fleet.host else "127.0.0.1"

    def for_instance(self, index: int) -> ServiceProfile:
        """The profile of pool instance ``index``: a host pool's entry applied (host, url, unit...)."""
        if not self.fleet.hosts:
            return self
        entry = self.fleet.hosts[index % len(self.fleet.hosts)]
        over = dict(entry.overrides)
        fleet = dataclasses.replace(
            self.fleet, host=entry.host, ssh_options=over.pop("ssh_options", self.fleet.ssh_options),
            lock_path=over.pop("lock_path", self.fleet.lock_path),
        )
        if "env" in over:
            over["env"] = {**self.env, **over["env"]}
        return dataclasses.replace(self, fleet=fleet, **over)

    def expected_applied(self, config: DDTreeConfig) -> dict[str, object]:
        """server_info key -> the value the config must show there after a restart."""
        values = config.field_values(self.default_window)
        out: dict[str, object] = {}
        for key, field_name in self.applied.items():
            value = values.get(field_name)
            if value is None and field_name != "window" and field_name not in config.set_axes():
                continue  # an axis the name leaves out: the build's own, nothing to expect
            if key in self.applied_negated:
                out[key] = not value
            elif isinstance(value, int) and not isinstance(value, bool):
                out[key] = value + self.applied_offset.get(key, 0)
            else:
                out[key] = value
        return out

    @property
    def pool_size(self) -> int:
        return self.pool if isinstance(self.pool, int) else len(self.pool)

    def launches_itself(self) -> bool:
        """Whether the harness launches this profile's service (not an external one, nor a pool of URLs):
        only then can it launch the plain reference too; else the lossless gate reads golden transcripts,
        even under a bless, and says how to write them."""
        launches = bool(self.command) or self.capabilities.launch is LaunchFrom.OWN_TEMPLATES
        return self.capabilities.relaunch and not isinstance(self.pool, tuple) and launches

    def reference_launch_problem(self) -> str | None:
        """Why this profile cannot launch its non-speculative reference (None: it can)."""
        if not self.launches_itself():
            return (f"profile {self.name} cannot launch the non-speculative reference (it has no launch command: an "
                    "external service or a pool of URLs); compare against golden transcripts (lossless: golden) "
                    "blessed with a profile that launches this deployment")
        if self.lossless_args is None:
            return (f"profile {self.name} has no lossless_args: the non-speculative reference needs the launch arguments "
                    "that turn speculation off, or lossless_args: '' where the command without speculative_args and "
                    "config_args does not speculate (SGLang: --speculative-algorithm and the drafter in speculative_args, "
                    "not in the command)")
        return None

    def _where(self, key: str) -> str:
        return f"{self.source or self.name}: {key}"


def resolve_service_python(python: str | None, command: str | None) -> str | None:
    """``python:`` if given, else the first word of ``command`` when it names a Python."""
    if python:
        return os.path.expanduser(python)
    try:
        words = shlex.split(command or "")
    except ValueError:
        return None
    if not words:
        return None
    first = words[0]
    if first == "{python}":
        return sys.executable
    if re.fullmatch(r"python[0-9.]*", os.path.basename(first)):
        return shutil.which(first) or first
    return None
