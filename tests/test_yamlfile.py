"""The one YAML reader: libyaml parses, PyYAML words the errors, and both read every file alike."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree import yamlfile
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

needs_libyaml = pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML built without libyaml")

#: Malformed files and what the message says: where the mistake is, in PyYAML's words (libyaml's
#: differ for all but the last: "did not find expected ',' or ']'", "mapping values are not allowed
#: in this context", "found character that cannot start any token").
MALFORMED = [
    ("name: x\ncommand: [unclosed\n", "at line 2, column 10 (command: [unclosed)",
     "a flow sequence opens here and is not closed (expected ',' or ']', but got '<stream end>' at line 3, column 1)"),
    ("a:\n\tb: 1\n", "at line 2, column 1 (b: 1)", "found character '\\t' that cannot start any token"),
    ("a: 1\n b: 2\n", "at line 2, column 3 (b: 2)", "mapping values are not allowed here"),
    ('a: "one\nb: 2\nc: "three"\n', "at line 1, column 4 (a: \"one)",
     "a quoted value opens here and runs on to line 3, where expected <block end>, but found '<scalar>': is its closing quote missing?"),
    ("a: b: c\n", "at line 1, column 5 (a: b: c)", "mapping values are not allowed here"),
    ("a: 'x\n", "at line 1, column 4 (a: 'x)", "a quoted scalar opens here and is not closed (found unexpected end of stream at line 2, column 1)"),
]


class _Counting:
    """Counts the documents a loader class was made for (one instance per ``yaml.load``)."""

    made = 0

    def __init__(self, stream: Any) -> None:
        type(self).made += 1
        super().__init__(stream)  # type: ignore[call-arg]


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[type[_Counting], type[_Counting]]:
    """(libyaml's loader, PyYAML's) as the reader finds them, each counting its uses."""
    fast = type("CountingCSafeLoader", (_Counting, yaml.CSafeLoader), {"made": 0})
    pure = type("CountingSafeLoader", (_Counting, yaml.SafeLoader), {"made": 0})
    monkeypatch.setattr(yaml, "CSafeLoader", fast)
    monkeypatch.setattr(yaml, "SafeLoader", pure)
    return fast, pure


def _message(path: Path) -> str:
    with pytest.raises(YAMLFileError) as info:
        read_yaml(path)
    return str(info.value)


@pytest.mark.parametrize(("text", "location", "problem"), MALFORMED)
def test_a_malformed_file_reads_the_same_with_and_without_libyaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   text: str, location: str, problem: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    expected = f"{path}: YAML syntax error {location}: {problem}"
    with monkeypatch.context() as pure_only:  # an install whose PyYAML has no libyaml
        pure_only.delattr(yaml, "CSafeLoader", raising=False)
        assert yamlfile.fast_loader() is yaml.SafeLoader
        assert _message(path) == expected
    if getattr(yaml, "__with_libyaml__", False):
        fast, pure = _counting(monkeypatch)
        assert _message(path) == expected
        assert (fast.made, pure.made) == (1, 1)  # libyaml refused it, PyYAML worded the error


@needs_libyaml
def test_a_valid_file_is_parsed_by_libyaml_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_root: Path) -> None:
    fast, pure = _counting(monkeypatch)
    source = repo_root / "baselines" / "refserver" / "bs8_b4_k4.yaml"
    doc, text = read_yaml(source)
    assert text == source.read_text() and isinstance(doc, dict) and doc
    assert (fast.made, pure.made) == (1, 0)


@needs_libyaml
def test_libyaml_and_pyyaml_read_every_file_of_the_project_alike(repo_root: Path) -> None:
    """Where the two parsers would disagree on a document, switching parsers would change what a
    session reads: every YAML file in the repository, the baselines included, reads alike."""
    listed = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=repo_root, capture_output=True, text=True, check=True)
    paths = [repo_root / name for name in listed.stdout.split()]
    assert len(paths) > 40, paths
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.load(text, Loader=yaml.SafeLoader), path
