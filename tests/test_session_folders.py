"""One session, one results folder (#10.5): sessions sharing --ddtree-results never mix.

The reproduced failure: session A (one process) blessed a number, session B (under xdist) blessed
a later one into the same folder; B's bless step read every ``baseline-updates-*.jsonl`` there,
sorted by name, so A's ``-main`` file was applied after B's ``-gw0`` and A's older number won.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pytest_ddtree.records.sessionfolder import MARKER, ResultsDirError, SessionCollector, choose_results_dir, claim_results_dir, session_of

PROBE_TEST = '''
import os

def test_probe(ddtree_recorder):
    ddtree_recorder.hardware_profile = "testhw"
    value = os.environ["DDTREE_PROBE"]
    ddtree_recorder.record("probe", "bs8_b8_k4", {"value": value})
    ddtree_recorder.propose_baseline("bs8_b8_k4", "probe", {"value": value})
'''


def _bless(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, results: Path, value: str, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("DDTREE_PROBE", value)
    return pytester.runpytest_subprocess(
        "test_probe.py", f"--ddtree-results={results}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        "--ddtree-update-baselines", "-p", "no:cacheprovider", *args,
    )


def _probe_values(folder: Path) -> list[str]:
    summary = json.loads((folder / "results.json").read_text())
    return [r["value"] for r in summary["records"] if r.get("kind") == "probe"]


@pytest.mark.slow
def test_two_sessions_sharing_results_never_mix(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_probe=PROBE_TEST)
    results = pytester.path / "shared-results"
    first = _bless(pytester, monkeypatch, results, "A-earlier")
    assert first.ret == 0, first.stdout.str()
    second = _bless(pytester, monkeypatch, results, "B-later", "-n", "1")
    assert second.ret == 0, second.stdout.str()

    session_a = session_of(results)
    (b_folder,) = [p for p in results.iterdir() if p.is_dir() and p.name != "logs"]
    session_b = session_of(b_folder)
    assert session_a and session_b and session_a != session_b and b_folder.name == session_b
    assert _probe_values(results) == ["A-earlier"] and _probe_values(b_folder) == ["B-later"]
    assert json.loads((b_folder / "results.json").read_text())["session_id"] == session_b
    # the later session's number is the blessed one, whatever the journal files are called
    baseline = yaml.safe_load((pytester.path / "baselines" / "testhw" / "bs8_b8_k4.yaml").read_text())
    assert baseline["probe"] == {"value": "B-later"}
    assert (b_folder / "records-gw0.jsonl").exists() and not (b_folder / "records-main.jsonl").exists()


def test_foreign_non_empty_folder_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_probe=PROBE_TEST)
    foreign = pytester.path / "not-ours"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("somebody's files\n")
    result = _bless(pytester, monkeypatch, foreign, "X")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ddtree-results*not-ours is not empty (notes.txt)*refusing to mix*"])
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_a_results_folder_that_cannot_be_written_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before anything runs, not at the first record (a ~70-line INTERNALERROR). Permissions say
    nothing to root, so as root the folder is one on a read-only file system (/proc)."""
    import os

    pytester.makepyfile(test_probe=PROBE_TEST)
    if os.geteuid() == 0:
        folder = Path("/proc/ddtree-results-test")
    else:
        locked = pytester.path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        folder = locked / "results"
    result = _bless(pytester, monkeypatch, folder, "X")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    assert f"--ddtree-results {folder}: cannot write in {folder.parent}" in err and "give a folder you can write to" in err, err
    assert "INTERNALERROR" not in result.stdout.str() + err and "Traceback" not in err
    assert not folder.exists()


def test_choose_and_claim(tmp_path: Path) -> None:
    assert choose_results_dir(tmp_path / "new", "s1") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert choose_results_dir(tmp_path / "empty", "s1") == tmp_path / "empty"
    claim_results_dir(tmp_path / "empty", "s1")
    claim_results_dir(tmp_path / "empty", "s1")  # idempotent for its own session (several workers)
    with pytest.raises(ResultsDirError, match="belongs to session s1"):
        claim_results_dir(tmp_path / "empty", "s2")  # a race lost: told, never mixed
    assert choose_results_dir(tmp_path / "empty", "s2") == tmp_path / "empty" / "s2"
    parent = tmp_path / "root"
    claim_results_dir(parent / "s1", "s1")  # a folder of session folders counts as a previous session's
    assert choose_results_dir(parent, "s3") == parent / "s3"
    (tmp_path / "file").write_text("")
    with pytest.raises(ResultsDirError, match="not a folder"):
        choose_results_dir(tmp_path / "file", "s1")
    assert json.loads((tmp_path / "empty" / MARKER).read_text())["session_id"] == "s1"


def test_collector_prefers_handover_and_reads_only_crashed_workers_journals(tmp_path: Path) -> None:
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.records.words import RecordKind

    claim_results_dir(tmp_path, "me")
    gw0, gw1 = SessionRecorder(tmp_path, "gw0", "me"), SessionRecorder(tmp_path, "gw1", "me")
    gw0.record(RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE, "c", {"reason": "0"})
    gw1.record(RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE, "c", {"reason": "1"})
    gw1.propose_baseline("c", "probe", {"value": 1})
    stranger = SessionRecorder(tmp_path, "gw2", "someone-else")  # a stray journal of another session
    stranger.propose_baseline("c", "probe", {"value": "theirs"})
    collector = SessionCollector(tmp_path, "me")
    collector.add_worker_output("gw0", gw0.handover())
    (tmp_path / "records-gw0.jsonl").write_text("")  # handed over: its journal is not read again
    # gw1 crashed (no handover): its journal is the record of what it measured
    assert [r["reason"] for r in collector.records([])] == ["0", "1"]
    assert [u.data for u in collector.baseline_updates([])] == [{"value": 1}]
