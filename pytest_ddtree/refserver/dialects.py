"""The reference engine's ``--dialect``: which SGLang build's flags and environment it follows, read
from a declaration (``pytest_ddtree/refserver/dialects.yaml``, package data beside the engine that reads it, the
``dialects.yaml`` of a profile folder an installed distribution declares, any file given with
``--dialects``), not from code.

Why data: a shipped profile is only worth something if its flags mean, on the engine CI runs it
against, what they mean on the build it names, and builds keep coming (a fork, a PR that renames a
flag). A new build is its profile (which names its dialect, ``dialect:``) and one entry here: the
flags it accepts, the algorithms it knows, which rule of :mod:`~pytest_ddtree.refserver.dialect_rules`
each switch selects, the start-up lines its worker prints. Nothing in the engine branches on a
dialect's name.

The declaration is read as hostile input: every key is known (a did-you-mean otherwise), every
value has its type, every rule and parameter exists, and an error names the file and line.

An entry::

    pr29907:
      extends: upstream                  # another entry's keys, flags merged (a flag set to null is dropped)
      help: "sgl-project/sglang PR 29907 ..."
      algorithms: [DFLASH, DDTREE, NONE] # --speculative-algorithm's choices
      default_algorithm: NONE            # without the flag (null: the rule decides, as the reference's)
      flags:                             # --flag: {type, help, aliases, dest, default, minimum}
        --speculative-ddtree-budget: {type: int, help: "DDTREE: non-root tree nodes B"}
      resolve:                           # the first case whose condition holds names the rule
        - {algorithm: NONE, rule: plain}
        - {algorithm: DDTREE, rule: ddtree-derived-width, max_topk_env: SGLANG_DDTREE_MAX_TOPK, max_topk: 6}
        - {rule: dflash-chain}
      startup_lines: ["Initialized DFLASH draft runner. ... block_size={block_size} ..."]
"""

from __future__ import annotations

import argparse
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_ddtree.service.installed import InstalledProfileError, installed
from pytest_ddtree.refserver.dialect_rules import RULES, DialectError, Launch, Resolved
from pytest_ddtree.suggest import did_you_mean
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

#: The declaration the package ships, beside the engine that reads it.
SHIPPED = Path(__file__).resolve().with_name("dialects.yaml")  # package data: the engine runs from an installed package too

#: An entry's keys: name -> (accepted types, what it is).
_ENTRY_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "extends": (str, "another entry whose keys this one starts from"),
    "help": (str, "one line for the engine's --help"),
    "algorithms": (list, "--speculative-algorithm's choices"),
    "default_algorithm": ((str, type(None)), "the algorithm without the flag (null: the rule decides)"),
    "algorithm_help": (str, "--speculative-algorithm's help"),
    "flags": (dict, "the speculative flags the build accepts"),
    "resolve": (list, "the cases: a condition and the rule it selects"),
    "startup_lines": (list, "the lines the build's worker prints at start-up"),
    "topk_capped_by_vocab": (bool, "the tree takes topk = min(budget, vocabulary)"),
    "ignored_topk_fault": (bool, "the ignore-config=topk fault serves topk 1, as upstream silently does to DFLASH"),
}
_FLAG_KEYS = ("type", "help", "aliases", "dest", "default", "minimum")
_FLAG_TYPES = ("positive", "int", "window", "switch")
_CONDITIONS = ("algorithm", "env", "flag")
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
#: The fields a start-up line may name.
LINE_FIELDS = ("backend", "block_size", "budget", "topk", "window", "compact")


class DialectDeclarationError(ValueError):
    """A dialects file is not a valid declaration; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    dest: str
    type: str
    help: str
    default: int | None = None
    minimum: int = 1


@dataclass(frozen=True)
class Case:
    """``resolve:`` item: when ``condition`` holds (an empty one always does), ``rule`` with ``params``."""

    condition: Mapping[str, str]
    rule: str
    params: Mapping[str, Any]
    server_args: Mapping[str, Any]


@dataclass(frozen=True)
class Dialect:
    name: str
    help: str
    algorithms: tuple[str, ...]
    default_algorithm: str | None
    algorithm_help: str | None  # None: the choices and "no speculation" by default
    flags: tuple[Flag, ...]
    cases: tuple[Case, ...]
    startup_lines: tuple[str, ...] = ()
    topk_capped_by_vocab: bool = False
    ignored_topk_fault: bool = False
    source: str = ""


def load(paths: tuple[Path, ...] = ()) -> dict[str, Dialect]:
    """The shipped declaration, those of installed profile folders (entry point group
    ``pytest_ddtree.profiles``, service/installed.py) and those of ``paths``, in that order;
    a name declared twice is an error."""
    raw: dict[str, tuple[Mapping[str, Any], Callable[[tuple[Any, ...]], str]]] = {}
    try:
        found = installed().dialect_files
    except InstalledProfileError as exc:
        raise DialectDeclarationError(str(exc)) from None
    given = ((SHIPPED,) if SHIPPED.is_file() else ()) + found + paths
    files = tuple(dict.fromkeys(p.resolve() for p in given))
    if not files:
        raise DialectDeclarationError(f"no dialects declaration: {SHIPPED} is missing; give one with --dialects PATH "
                                      "(docs/reference-engine.md)")
    for path in files:
        try:
            document, text = read_yaml(path)
        except YAMLFileError as exc:
            raise DialectDeclarationError(str(exc)) from None
        where = _locator(path, text)
        if not isinstance(document, dict) or not document:
            raise DialectDeclarationError(f"{where(())}: a dialects file is a mapping of dialect name -> entry")
        for name, entry in document.items():
            if name in raw:
                raise DialectDeclarationError(f"{where((name,))}: dialect {name!r} is declared already "
                                              f"({raw[name][1]((name,))}): choose another name")
            raw[name] = (entry, where)
    return {name: _entry(name, raw, ()) for name in raw}


def _locator(path: Path, text: str) -> Callable[[tuple[Any, ...]], str]:
    """``path:line`` of a key path in the document (the nearest enclosing node found)."""
    import yaml

    lines: dict[tuple[Any, ...], int] = {}

    def walk(node: Any, at: tuple[Any, ...]) -> None:
        lines[at] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, at + (key.value,))
                lines[at + (key.value,)] = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, at + (index,))

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = None
    if root is not None:
        walk(root, ())

    def where(at: tuple[Any, ...]) -> str:
        while at and at not in lines:
            at = at[:-1]
        return f"{path}:{lines.get(at, 1)}"

    return where


def _entry(name: Any, raw: Mapping[Any, tuple[Mapping[str, Any], Callable[[tuple[Any, ...]], str]]],
           chain: tuple[str, ...]) -> Dialect:
    entry, where = raw[name]

    def fail(at: tuple[Any, ...], problem: str) -> DialectDeclarationError:
        return DialectDeclarationError(f"{where((name, *at))}: dialect {name}: {'.'.join(map(str, at)) + ': ' if at else ''}{problem}")

    def at(*path: Any) -> Callable[[str], DialectDeclarationError]:
        def fail_there(problem: str) -> DialectDeclarationError:
            return fail(path, problem)

        return fail_there

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise fail((), "a dialect's name is lower-case letters, digits and -, starting with a letter (it is --dialect's value)")
    if not isinstance(entry, dict):
        raise fail((), f"an entry is a mapping of {', '.join(_ENTRY_KEYS)}; got {type(entry).__name__}")
    for key, value in entry.items():
        if key not in _ENTRY_KEYS:
            raise fail((key,), f"unknown key; {did_you_mean(str(key), _ENTRY_KEYS)}allowed: {', '.join(_ENTRY_KEYS)}")
        types = _ENTRY_KEYS[key][0]
        if isinstance(value, bool) is not (types is bool) or not isinstance(value, types):
            raise fail((key,), f"{_ENTRY_KEYS[key][1]}: expected {_type_names(types)}, got {type(value).__name__} {value!r}")
    keys: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    base = entry.get("extends")
    if base is not None:
        if base not in raw:
            raise fail(("extends",), f"no dialect {base!r}; {did_you_mean(base, raw)}declared: {', '.join(map(str, raw))}")
        if base in chain or base == name:
            raise fail(("extends",), f"extends itself through {' -> '.join((*chain, name, base))}")
        parent = _entry(base, raw, (*chain, name))
        keys = {"help": parent.help, "algorithms": list(parent.algorithms), "default_algorithm": parent.default_algorithm,
                "algorithm_help": parent.algorithm_help, "startup_lines": list(parent.startup_lines),
                "topk_capped_by_vocab": parent.topk_capped_by_vocab, "ignored_topk_fault": parent.ignored_topk_fault}
        flags = {f.names[0]: f for f in parent.flags}
        cases: tuple[Case, ...] = parent.cases
    for key in ("help", "algorithms", "resolve"):
        if key not in entry and not keys:
            raise fail((), f"missing key {key!r} ({_ENTRY_KEYS[key][1]}; or extends: another dialect)")
    keys.update({k: v for k, v in entry.items() if k not in ("flags", "resolve", "extends")})
    for flag, spec in (entry.get("flags") or {}).items():
        if spec is None:
            if flag not in flags:
                raise fail(("flags", flag), f"null drops an inherited flag, and {base or 'nothing'} has no {flag}")
            del flags[flag]
            continue
        flags[flag] = _flag(flag, spec, at("flags", flag))
    algorithms = _algorithms(keys, fail)
    if "resolve" in entry:
        cases = tuple(_case(item, algorithms, flags, at("resolve", i)) for i, item in enumerate(entry["resolve"]))
        if not cases or cases[-1].condition:
            raise fail(("resolve",), "the last case has no condition (the rule when no other case holds)")
    lines = keys.get("startup_lines", [])
    for i, line in enumerate(lines):
        _check_line(line, at("startup_lines", i))
    dests = [f.dest for f in flags.values()]
    if len(set(dests)) != len(dests) or "speculative_algorithm" in dests:
        raise fail(("flags",), f"two flags store into one name (or into speculative_algorithm): {sorted(dests)}")
    default = keys.get("default_algorithm", "NONE")
    return Dialect(name, keys["help"], algorithms, default, keys.get("algorithm_help"),
                   tuple(flags.values()), cases, tuple(lines), bool(keys.get("topk_capped_by_vocab")),
                   bool(keys.get("ignored_topk_fault")), where((name,)))


def _type_names(types: type | tuple[type, ...]) -> str:
    named = (types,) if isinstance(types, type) else types
    return " or ".join("null" if t is type(None) else {"str": "a string", "list": "a list", "dict": "a mapping",
                                                         "bool": "true/false"}.get(t.__name__, t.__name__) for t in named)


def _algorithms(keys: Mapping[str, Any], fail: Callable[[tuple[Any, ...], str], DialectDeclarationError]) -> tuple[str, ...]:
    algorithms = keys.get("algorithms") or []
    if not algorithms or not all(isinstance(a, str) and re.fullmatch(r"[A-Z][A-Z0-9_]*", a) for a in algorithms):
        raise fail(("algorithms",), f"a list of upper-case algorithm names (DFLASH, NONE, ...), got {algorithms!r}")
    default = keys.get("default_algorithm", "NONE")
    if default is not None and default not in algorithms:
        raise fail(("default_algorithm",), f"{default!r} is not one of algorithms {algorithms}")
    return tuple(algorithms)


def _flag(flag: Any, spec: Any, fail: Callable[[str], DialectDeclarationError]) -> Flag:
    if not isinstance(flag, str) or not _FLAG.fullmatch(flag):
        raise fail("a flag is written --lower-case-words")
    if flag == "--speculative-algorithm":
        raise fail("--speculative-algorithm is declared by algorithms: and default_algorithm:")
    if not isinstance(spec, dict):
        raise fail(f"a mapping of {', '.join(_FLAG_KEYS)} (or null to drop an inherited flag), got {spec!r}")
    for key in spec:
        if key not in _FLAG_KEYS:
            raise fail(f"unknown key {key!r}; {did_you_mean(str(key), _FLAG_KEYS)}allowed: {', '.join(_FLAG_KEYS)}")
    kind = spec.get("type")
    if kind not in _FLAG_TYPES:
        raise fail(f"type: {did_you_mean(str(kind), _FLAG_TYPES)}choose from {', '.join(_FLAG_TYPES)} (got {kind!r})")
    if not isinstance(spec.get("help"), str) or not spec["help"]:
        raise fail("help: say what the flag does on this build (--help shows it)")
    aliases = spec.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _FLAG.fullmatch(a) for a in aliases):
        raise fail(f"aliases: a list of --flag names, got {aliases!r}")
    dest = spec.get("dest", flag[2:].replace("-", "_"))
    if not isinstance(dest, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", dest):
        raise fail(f"dest: a lower-case identifier (the server arg's name), got {dest!r}")
    for key in ("default", "minimum"):
        value = spec.get(key)
        if key in spec and (isinstance(value, bool) or not isinstance(value, int) or kind == "switch"):
            raise fail(f"{key}: an int, for a flag that takes one (got {value!r})")
    return Flag((flag, *aliases), dest, kind, spec["help"], spec.get("default"), spec.get("minimum", 1))


def _case(item: Any, algorithms: tuple[str, ...], flags: Mapping[str, Flag],
          fail: Callable[[str], DialectDeclarationError]) -> Case:
    if not isinstance(item, dict) or "rule" not in item:
        raise fail(f"a case is a mapping with a rule (one of {', '.join(RULES)}) and at most one of "
                   f"{', '.join(_CONDITIONS)}; got {item!r}")
    rule = RULES.get(item["rule"])
    if rule is None:
        raise fail(f"rule {item['rule']!r}: {did_you_mean(str(item['rule']), RULES)}rules: {', '.join(RULES)}")
    condition = {k: v for k, v in item.items() if k in _CONDITIONS}
    params = {k: v for k, v in item.items() if k not in (*_CONDITIONS, "rule", "server_args")}
    if len(condition) > 1 or not all(isinstance(v, str) for v in condition.values()):
        raise fail(f"one condition per case, a string: algorithm: NAME, env: VARIABLE or flag: DEST (got {condition})")
    if condition.get("algorithm", algorithms[0]) not in algorithms:
        raise fail(f"algorithm: {condition['algorithm']!r} is not one of algorithms {list(algorithms)}")
    dests = [f.dest for f in flags.values()]
    if "flag" in condition and condition["flag"] not in dests:
        raise fail(f"flag: {condition['flag']!r} is no flag's dest; {did_you_mean(condition['flag'], dests)}dests: {', '.join(dests)}")
    for key, value in params.items():
        if key not in rule.params:
            allowed = ", ".join(f"{k} ({v})" for k, v in rule.params.items()) or "none"
            raise fail(f"rule {item['rule']} takes no {key!r}; {did_you_mean(str(key), rule.params)}its parameters: {allowed}")
        if not _param_ok(key, value):
            raise fail(f"{key}: {rule.params[key]}, got {value!r}")
    server_args = item.get("server_args") or {}
    if not isinstance(server_args, dict):
        raise fail(f"server_args: a mapping of /server_info key -> value this case sets, got {server_args!r}")
    return Case(condition, str(item["rule"]), params, server_args)


def _param_ok(key: str, value: Any) -> bool:
    if key.endswith("_env"):
        return isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) is not None
    if key.endswith("_choices"):
        return isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_line(line: Any, fail: Callable[[str], DialectDeclarationError]) -> None:
    if not isinstance(line, str):
        raise fail(f"a start-up line is a string, got {line!r}")
    try:
        names = [field for _, field, _, _ in string.Formatter().parse(line) if field is not None]
    except ValueError as exc:
        raise fail(f"not a format string ({exc}): write a literal brace as {{{{ }}}}") from None
    for field in names:
        if field not in LINE_FIELDS:
            raise fail(f"{{{field}}}: {did_you_mean(field, LINE_FIELDS)}a line may name {', '.join('{' + f + '}' for f in LINE_FIELDS)}")


# -- the declaration at work: argparse flags, resolution, start-up lines ------------------------

def _positive(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _window(text: str) -> int | None:
    if text.strip().lower() in ("none", "null", ""):
        return None
    return _positive(1)(text)


def _algorithm(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper()
        if value not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(choices)})")
        return value

    return parse


def add_speculative_flags(parser: argparse.ArgumentParser, dialect: Dialect) -> None:
    """The speculative flags the dialect's build accepts; anything else is an argparse error (exit 2),
    as an unknown flag is for ``sglang.launch_server``."""
    s = parser.add_argument_group(f"speculative decoding (dialect {dialect.name})")
    s.add_argument("--speculative-algorithm", type=_algorithm(dialect.algorithms), default=dialect.default_algorithm,
                   help=dialect.algorithm_help or f"{', '.join(dialect.algorithms)} (default: no speculation, as SGLang)")
    for flag in dialect.flags:
        if flag.type == "switch":
            s.add_argument(*flag.names, dest=flag.dest, action="store_true", help=flag.help)
            continue
        kinds: dict[str, Callable[[str], int | None]] = {"positive": _positive(flag.minimum), "int": int, "window": _window}
        kind = kinds[flag.type]
        s.add_argument(*flag.names, dest=flag.dest, type=kind, default=flag.default, help=flag.help)


def resolve(dialect: Dialect, ns: argparse.Namespace, env: Mapping[str, str], *, drafter_block_size: int,
            tp_size: int = 1) -> Resolved:
    """The configuration the dialect's build runs: its first case whose condition holds; DialectError
    where the build refuses to start."""
    launch = Launch(ns, env, drafter_block_size, tp_size)
    for case in dialect.cases:
        if _holds(case.condition, launch):
            resolved = RULES[case.rule].run(launch, case.params)
            if case.server_args:
                return Resolved(resolved.algorithm, resolved.block_size, resolved.budget, resolved.topk, resolved.window,
                                {**resolved.server_args, **case.server_args}, resolved.warnings)
            return resolved
    raise DialectError(f"dialect {dialect.name}: no case of resolve: holds ({dialect.source})")  # the last has none


def _holds(condition: Mapping[str, str], launch: Launch) -> bool:
    if "algorithm" in condition:
        return bool(launch.ns.speculative_algorithm == condition["algorithm"])
    if "flag" in condition:
        return bool(getattr(launch.ns, condition["flag"]))
    if "env" in condition:
        text = launch.env.get(condition["env"])
        try:
            return text is not None and int(text) != 0
        except ValueError:
            raise DialectError(f"invalid literal for int() with base 10: {text!r} (environment variable {condition['env']})") from None
    return True


def startup_lines(dialect: Dialect, fields: Mapping[str, Any]) -> list[str]:
    """The dialect's start-up lines with ``fields`` (:data:`LINE_FIELDS`) filled in."""
    return [line.format(**fields) for line in dialect.startup_lines]
