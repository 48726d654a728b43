"""Reading the project's YAML files with errors a person can act on.

Profiles, the config matrix, baselines and coding problems are all hand-edited YAML; a typo in
any of them must come back as "which file, which line, what is wrong", never as a traceback
from the parser. One reader serves all four; each caller words the message for its own file
(and raises its own error type) from the pieces this error carries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class YAMLFileError(ValueError):
    """A YAML file cannot be read or parsed.

    ``path``; ``location`` (`` at line 3, column 7`` or ``""``); ``problem`` (the parser's
    words, or the OS error); ``syntax`` tells a parse error from an unreadable file.
    """

    def __init__(self, path: Path, problem: str, location: str = "", syntax: bool = True) -> None:
        self.path = path
        self.problem = problem
        self.location = location
        self.syntax = syntax
        super().__init__(f"{path}: YAML syntax error{location}: {problem}" if syntax else f"cannot read {path}: {problem}")


def read_yaml(path: Path) -> tuple[Any, str]:
    """(parsed document, text) of ``path``; raises YAMLFileError.

    Parsed by libyaml (``CSafeLoader``) where PyYAML was built with it: a baseline file takes
    ~60 ms with the pure-Python parser, and a session reads every config's. A file libyaml refuses
    is parsed again by the pure-Python ``SafeLoader``, whose words and marks the error message is
    made of (libyaml's differ: "did not find expected key" where PyYAML says what it expected and
    found), so a message is the same on every install; a file only libyaml refused still loads.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YAMLFileError(path, str(exc.strerror or exc), syntax=False) from None
    import yaml  # here, not at the top: configs.py (and so the xdist scheduler) imports this module

    fast = fast_loader()
    if fast is not yaml.SafeLoader:
        try:
            return yaml.load(text, Loader=fast), text  # noqa: S506 (a safe loader: CSafeLoader)
        except yaml.YAMLError:
            pass  # parsed again below, for PyYAML's words
    try:
        return yaml.load(text, Loader=yaml.SafeLoader), text  # noqa: S506 (a safe loader)
    except yaml.YAMLError as exc:
        location, problem = _where(exc, text)
        raise YAMLFileError(path, problem, location) from None


def fast_loader() -> type:
    """libyaml's safe loader where PyYAML has it, else the pure-Python one."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: Parser contexts that start where the mistake is: an unclosed quote or bracket is noticed only
#: lines later (at the end of the file, or at the next key), but it was made where it opened.
_OPENED_AT = ("quoted scalar", "flow mapping", "flow sequence", "flow collection")


def _runaway_quote(text: str, index: int) -> Any:
    """Where a quoted value opened, if the parser's error comes right after a quoted value that
    spans lines: a missing closing quote swallows the lines up to the next quote, so the parser
    complains there. None otherwise."""
    import yaml

    last = None
    try:
        for token in yaml.scan(text):
            if token.end_mark.index > index:
                break
            last = token
    except yaml.YAMLError:
        pass
    if isinstance(last, yaml.ScalarToken) and last.style in ('"', "'") and last.start_mark.line != last.end_mark.line:
        return last.start_mark
    return None


def _where(exc: Any, text: str) -> tuple[str, str]:
    """(location, problem): the line where a person fixes the file, and what is wrong there.

    PyYAML marks where it noticed the error (``problem_mark``). For an unclosed quote or bracket
    that is the end of the file or the next key, lines past the fault; its ``context_mark`` is
    where the construct opened, so that is the line reported, with the place it was noticed. The
    line's own text is quoted so the reader sees the fault without opening the file.
    """
    problem_mark, context_mark = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    problem = str(getattr(exc, "problem", None) or exc)
    context = str(getattr(exc, "context", None) or "")
    mark = problem_mark
    if context_mark is not None and problem_mark is not None and any(kind in context for kind in _OPENED_AT):
        mark = context_mark
        opened = context.removeprefix("while scanning ").removeprefix("while parsing ")
        problem = (f"{opened} opens here and is not closed ({problem} at line {problem_mark.line + 1}, "
                   f"column {problem_mark.column + 1})")
    elif problem_mark is not None:
        runaway = _runaway_quote(text, problem_mark.index)
        if runaway is not None:
            mark = runaway
            problem = (f"a quoted value opens here and runs on to line {problem_mark.line + 1}, where {problem}: "
                       "is its closing quote missing?")
    if mark is None:
        return "", problem
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    quoted = f" ({shown[:120]})" if shown else ""
    return f" at line {mark.line + 1}, column {mark.column + 1}{quoted}", problem


def key_lines(text: str) -> dict[str, int]:
    """Each key of ``text``'s mappings by its path (``deadlines.ready_s``, ``pool[1].unit``) -> its
    line (from 1), four levels deep; {} where the text does not parse.

    Why: an error about a key a validator found in the parsed document points at the line, as a
    syntax error does (the parsed values carry no marks; the composed nodes do).
    """
    import yaml

    try:
        root = yaml.compose(text, Loader=fast_loader())  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: Any, path: str, depth: int) -> None:
        if depth > 4:
            return
        if isinstance(node, yaml.MappingNode):
            children = [(f"{path}.{key.value}" if path else str(key.value), key, value) for key, value in node.value]
        elif isinstance(node, yaml.SequenceNode):
            children = [(f"{path}[{index}]", value, value) for index, value in enumerate(node.value)]
        else:
            return
        for child, marked, value in children:
            lines.setdefault(child, marked.start_mark.line + 1)
            walk(value, child, depth + 1)

    walk(root, "", 0)
    return lines
