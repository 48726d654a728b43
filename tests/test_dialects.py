"""The engine's dialects are data: a build is one profile and one entry of a dialects file.

A new build, declared in a folder of its own (its profile and its ``dialects.yaml``, nothing in
the package or the shipped files edited), is launched on the reference engine in that dialect and
gated; and the declaration is read as hostile input: every mistake comes back with the file, the
line and what was meant.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_ddtree.refserver.cli import parse_args
from pytest_ddtree.refserver.dialects import SHIPPED, DialectDeclarationError, load
from tests.build_helpers import NEW_DIALECT, NEW_PROFILE, as_refserver, check_ran_as_named
from tests.suite_helpers import run_suite

def test_a_new_build_is_one_profile_and_one_dialect_entry(pytester: pytest.Pytester) -> None:
    """The build's folder holds its profile and its dialect, nothing else: the engine parses the
    new flags as the entry declares (the tree's block size and budget reach the worker's start-up
    line and /server_info), and the health suite passes (health, the applied read-back, the proof
    by the acceptance histogram) for two configs that differ only in the new flags."""
    folder = pytester.path / "mybuild"
    folder.mkdir()
    (folder / "dialects.yaml").write_text(NEW_DIALECT)
    (folder / "sglang-mytree.yaml").write_text(NEW_PROFILE)
    profile = as_refserver(folder / "sglang-mytree.yaml", pytester.path)
    configs = ["bs8_b4_k4", "bs16_b16_k16"]
    result = run_suite(pytester, profile, suite="test_health.py", config=",".join(configs), timeout=300)
    check_ran_as_named(pytester, result, folder / "sglang-mytree.yaml", configs)
    logs = "\n".join(p.read_text() for p in (pytester.path / "results" / "logs").glob("*.log"))
    assert "starting (dialect mytree)" in logs
    for block, budget in ((8, 4), (16, 16)):
        assert f"Initialized DDTREE v2 worker. block_size={block}, tree_budget={budget}," in logs, logs[-3000:]


def test_the_new_dialect_parses_its_flags_as_declared(tmp_path: Path) -> None:
    (tmp_path / "dialects.yaml").write_text(NEW_DIALECT)
    ns, _ = parse_args(["--port", "0", "--dialects", str(tmp_path / "dialects.yaml"), "--dialect", "mytree",
                        "--speculative-algorithm", "DFLASH", "--speculative-tree-verify",
                        "--speculative-tree-block-size", "6", "--speculative-tree-budget", "4"])
    assert (ns.speculative_ddtree_block_size, ns.speculative_ddtree_budget, ns.speculative_tree_verify) == (6, 4, True)
    with pytest.raises(SystemExit):  # the shipped ddtree dialect's flag is not this build's
        parse_args(["--port", "0", "--dialects", str(tmp_path / "dialects.yaml"), "--dialect", "mytree",
                    "--speculative-ddtree-budget", "4"])


@pytest.mark.parametrize(("edit", "line", "message"), [
    (("help:", "hepl:"), 3, "unknown key; did you mean 'help'?"),
    (("rule: dflash-chain", "rule: dflash-chian"), 11, "did you mean 'dflash-chain'?"),
    (("extends: upstream", "extends: upstream-dflash"), 2, "no dialect 'upstream-dflash'; did you mean 'upstream'?"),
    (("type: switch", "type: switsh"), 5, "did you mean 'switch'?"),
    (("{block_size}", "{block_sise}"), 13, "did you mean 'block_size'?"),
    (("flag: speculative_tree_verify", "flag: speculative_tree_verfy"), 10, "did you mean 'speculative_tree_verify'"),
    (("rule: ddtree-pr27509}", "rule: ddtree-pr27509, topk_choices: [4]}"), 10, "takes no 'topk_choices'"),
    (("mytree:", "reference:"), 1, "'reference' is declared already"),
    (("  resolve:", "  resolve: 3\n  xresolve:"), 8, "expected a list, got int 3"),
    (("help: \"a fork", "help: \"a fork\n   bad: [\""), 3, "YAML syntax error at line"),
])
def test_a_bad_declaration_names_its_file_line_and_fix(tmp_path: Path, edit: tuple[str, str], line: int, message: str) -> None:
    path = tmp_path / "dialects.yaml"
    path.write_text(NEW_DIALECT.replace(*edit, 1))
    with pytest.raises(DialectDeclarationError) as raised:
        load((path,))
    text = str(raised.value)
    assert str(path) in text and message in text, text
    if "syntax" not in message:
        assert f"{path}:{line}:" in text, text


def test_the_engine_refuses_a_bad_declaration_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dialects.yaml"
    path.write_text(NEW_DIALECT.replace("rule: plain", "rule: plian"))
    with pytest.raises(SystemExit) as exited:
        parse_args(["--dialects", str(path), "--dialect", "mytree"])
    assert exited.value.code == 2
    assert re.search(rf"argument --dialects: {re.escape(str(path))}:9: .*did you mean 'plain'", capsys.readouterr().err)
    with pytest.raises(SystemExit):
        parse_args(["--dialect", "upstreem"])
    assert "did you mean 'upstream'" in capsys.readouterr().err


def test_every_shipped_dialect_is_declared_and_valid() -> None:
    declared = load()
    assert SHIPPED.is_file() and {"reference", "upstream", "ddtree", "eagle3"} <= set(declared)
    assert all(d.cases and d.help for d in declared.values())
