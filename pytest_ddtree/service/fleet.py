"""The profile keys of remote hosts, host pools and the command controller.

Kept apart from profile.py so the schema of a single local service stays readable: everything
here is about *where* the service runs (``host``, ``ssh_options``, ``pool: [hosts]``) and
*how* an arbitrary scheduler is driven (``start``/``stop``/``status``/``logs``/``restore``).

A pool entry is a host (``user@node[:port]``) or a mapping of that host plus overrides of the
keys that differ between hosts (its URL, port, unit, drop-in folder, lock path, ssh options,
environment). ``ServiceProfile.for_instance(i)`` applies entry ``i``'s overrides, so the rest
of the harness sees one ordinary profile per xdist worker.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pytest_ddtree.service.base import ENV_NAME_RULE, Capabilities, LaunchFrom, is_env_name
from pytest_ddtree.service.ssh import SSHTarget
from pytest_ddtree.suggest import did_you_mean

COMMAND_TEMPLATES = ("start", "stop", "status", "logs", "restore")
REQUIRED_TEMPLATES = ("start", "stop", "status")
TEMPLATE_FIELDS = frozenset(
    {"config_args", "config_env", "host", "port", "url", "name", "unit", "python", "block_size", "budget", "topk", "window"}
)
HOST_OVERRIDES = ("url", "port", "unit", "dropin_dir", "lock_path", "ssh_options", "env")

FailFn = Callable[[str, str], Exception]


@dataclass(frozen=True)
class HostEntry:
    """One host of a pool and its overrides of the profile's keys (None: the profile's value)."""

    host: str
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FleetKeys:
    """The validated fleet keys of one profile (see the module docstring)."""

    host: str | None = None
    ssh_options: tuple[str, ...] = ()
    sudo: bool = False
    hosts: tuple[HostEntry, ...] = ()
    lock_path: str | None = None
    command_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    commands: Mapping[str, str] = field(default_factory=dict)


def template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def parse_ssh_options(value: Any, key: str, fail: FailFn) -> tuple[str, ...]:
    """``"-i ~/.ssh/k -o X=y"`` or ``["-i", "~/.ssh/k"]`` -> argv words."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise fail(key, f"must be a string or a list of strings (ssh's own options), got {value!r}")


def _parse_target(text: Any, key: str, fail: FailFn) -> str:
    if not isinstance(text, str):
        raise fail(key, f"must be user@node or user@node:port, got {text!r}")
    try:
        SSHTarget.parse(text)
    except ValueError as exc:
        raise fail(key, str(exc)) from None
    return text


def is_host_pool(pool: Any) -> bool:
    """A list pool of hosts (or host mappings), as opposed to a list of service URLs."""
    return isinstance(pool, list) and any(isinstance(e, dict) or (isinstance(e, str) and not e.startswith("http")) for e in pool)


def parse_host_pool(pool: list[Any], fail: FailFn) -> tuple[HostEntry, ...]:
    entries = []
    for index, item in enumerate(pool):
        key = f"pool[{index}]"
        if isinstance(item, str):
            entries.append(HostEntry(_parse_target(item, key, fail)))
            continue
        if not isinstance(item, dict) or "host" not in item:
            raise fail(key, "a host pool entry is user@node[:port] or a mapping with 'host' and overrides")
        unknown = sorted(set(item) - {"host", *HOST_OVERRIDES})
        if unknown:
            raise fail(f"{key}.{unknown[0]}", f"unknown key; {did_you_mean(unknown[0], ('host', *HOST_OVERRIDES))}"
                                              f"a pool entry may set: host, {', '.join(HOST_OVERRIDES)}")
        overrides: dict[str, Any] = {}
        for name, value in item.items():
            if name == "host":
                continue
            if name == "ssh_options":
                overrides[name] = parse_ssh_options(value, f"{key}.ssh_options", fail)
            elif name == "port":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                    raise fail(f"{key}.port", f"must be a TCP port 1-65535, got {value!r}")
                overrides[name] = value
            elif name == "env":
                if not isinstance(value, dict):
                    raise fail(f"{key}.env", f"must be a mapping, got {value!r}")
                for variable in value:
                    if not is_env_name(variable):
                        raise fail(f"{key}.env.{variable}", ENV_NAME_RULE)
                overrides[name] = {str(k): str(v) for k, v in value.items()}
            else:
                if not isinstance(value, str):
                    raise fail(f"{key}.{name}", f"must be a string, got {value!r}")
                overrides[name] = value
        entries.append(HostEntry(_parse_target(item["host"], f"{key}.host", fail), overrides))
    targets = [e.host for e in entries]
    duplicates = sorted({t for t in targets if targets.count(t) > 1 and not any(e.overrides for e in entries if e.host == t)})
    if duplicates:
        raise fail("pool", f"host {duplicates[0]} is listed twice: each pool host runs one service")
    return tuple(entries)


def parse_fleet_keys(raw: Mapping[str, Any], controller: str, can: Capabilities, fail: FailFn, *,
                     remote_kinds: tuple[str, ...] = ()) -> FleetKeys:
    """Validate the fleet keys of a raw profile (types were checked by the caller) against what
    its ``controller`` can do (``can``); ``remote_kinds`` name the controllers that run on hosts."""
    host = raw.get("host")
    if host is not None:
        _parse_target(host, "host", fail)
    hosts = parse_host_pool(raw["pool"], fail) if is_host_pool(raw.get("pool")) else ()
    if host is not None and hosts:
        raise fail("host", "give either host (one host) or pool (a list of hosts), not both")
    remote = bool(host or hosts)
    if remote and not can.remote_hosts:
        able = " or ".join(remote_kinds)
        raise fail("host" if host else "pool", f"remote hosts need controller {able}, not {controller}")
    if hosts and can.placed_by_scheduler:
        raise fail("pool", f"a {controller} profile has no pool: give the login node as host; the scheduler chooses the nodes")
    # A scheduler's job picks its port on its node: auto is fine behind a login host.
    if remote and not can.placed_by_scheduler and raw.get("port", "auto") == "auto" and not (hosts and all("port" in e.overrides or "url" in e.overrides for e in hosts)):
        raise fail("port", "a remote service listens on a fixed port: set port (a free port here says nothing about the host)")
    commands = {name: raw[name] for name in COMMAND_TEMPLATES if raw.get(name)}
    if can.launch is LaunchFrom.OWN_TEMPLATES:
        missing = [name for name in REQUIRED_TEMPLATES if name not in commands]
        if missing:
            raise fail(missing[0], f"the {controller} controller needs start, stop and status command templates")
    elif commands:
        name = next(iter(commands))
        raise fail(name, f"command templates belong to controller: command (this profile's controller is {controller})")
    for name, template in commands.items():
        try:
            bad = template_fields(template) - TEMPLATE_FIELDS
        except ValueError as exc:
            raise fail(name, f"{exc} (write a literal brace as {{{{ or }}}})") from None
        if bad:
            raise fail(name, f"unknown placeholder(s) {sorted(bad)} (allowed: {', '.join('{' + f + '}' for f in sorted(TEMPLATE_FIELDS))})")
    for key in ("command_timeout_s", "connect_timeout_s"):
        if key in raw and raw[key] <= 0:
            raise fail(key, f"must be positive, got {raw[key]}")
    return FleetKeys(
        host=host,
        ssh_options=parse_ssh_options(raw.get("ssh_options"), "ssh_options", fail),
        sudo=bool(raw.get("sudo", False)),
        hosts=hosts,
        lock_path=raw.get("lock_path"),
        command_timeout_s=float(raw.get("command_timeout_s", 60)),
        connect_timeout_s=float(raw.get("connect_timeout_s", 10)),
        commands=commands,
    )
