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
    """(parsed document, text) of ``path``; raises YAMLFileError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YAMLFileError(path, str(exc.strerror or exc), syntax=False) from None
    import yaml  # here, not at the top: configs.py (and so the xdist scheduler) imports this module

    try:
        return yaml.safe_load(text), text
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        location = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise YAMLFileError(path, str(getattr(exc, "problem", None) or exc), location) from None
