"""records/shapes.py: a record that comes back from a worker or a file is checked against its kind's shape;
a malformed one is set aside with a message naming the key, never a KeyError inside a reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.records import shapes as records
from pytest_ddtree.gates.throughput.cells import throughput_record
from pytest_ddtree.records.cells import normalize
from pytest_ddtree.gates.coding import ProblemResult
from pytest_ddtree.service.proof import PROVEN, FieldEvidence, ProbeResult, Proof
from pytest_ddtree.records.shapes import RecordError, ThroughputData
from pytest_ddtree.records.launch_shapes import LaunchEntry
from pytest_ddtree.sandbox import Verdict
from pytest_ddtree.records.recorder import SessionRecorder
from pytest_ddtree.records.sessionfolder import SessionCollector, claim_results_dir
from pytest_ddtree.records.words import RecordKind, Status


def _cell(cell: str = "c1") -> ThroughputData:
    verdict = verdicts.CellVerdict(cell, Status.PASS, (verdicts.MetricVerdict("output_throughput", Status.PASS, "higher", 0.05, 100.0,
                                                                      101.0, 0.01),)).as_dict()
    return throughput_record(
        config="bs8_b8_k4", cell=cell,
        workload={"concurrency": 1, "context_tokens": 64, "output_tokens": 8, "requests": 2, "prompts": "documents"},
        repeats=[{"output_throughput": 101.0}] * 3, samples={"output_throughput": [101.0] * 3},
        measurement_status=Status.VALID, verdict=verdict)


def test_a_written_record_reads_back_as_its_shape() -> None:
    back = json.loads(json.dumps({"kind": RecordKind.THROUGHPUT, "worker": "gw0", "time": 1.0, **_cell()}))
    assert records.check_record(back) is None
    (cell,) = records.throughput_records([back])
    assert cell["metrics"]["output_throughput"] == 101.0 and cell["verdict"]["metrics"]["output_throughput"]["change"] == 0.01


def test_a_malformed_record_from_a_worker_is_set_aside_saying_which_key_is_wrong(tmp_path: Path) -> None:
    claim_results_dir(tmp_path, "me")
    worker = SessionRecorder(tmp_path, "gw0", "me")
    worker.record(RecordKind.THROUGHPUT, "bs8_b8_k4", _cell("c1"))
    handed = worker.handover()
    good = handed["records"][0]
    handed["records"] = [good, {**good, "cell": "c2", "repeats": "3"}, {k: v for k, v in good.items() if k != "verdict"}]
    collector = SessionCollector(tmp_path, "me")
    collector.add_worker_output("gw0", handed)
    got = collector.records([])
    assert [r["kind"] for r in got] == [RecordKind.THROUGHPUT, RecordKind.CORRUPT_RECORD, RecordKind.CORRUPT_RECORD]
    problems = [str(r["problem"]) for r in got[1:]]
    assert "throughput bs8_b8_k4 c2 (from gw0): repeats is '3', expected an integer" in problems[0]
    assert "lacks 'verdict'" in problems[1]
    assert got[1]["record"] == handed["records"][1]  # kept whole: nothing measured is lost
    collector.add_worker_output("gw1", {"records": "not a list"})  # a worker that handed over garbage
    assert any("worker gw1 handed over records that are not a list of objects" in str(r.get("problem"))
               for r in collector.records([]))
    # the readers see only the checked records; a typed view over an unchecked one says what is wrong
    assert [r["cell"] for r in normalize(got)] == ["c1"]
    with pytest.raises(RecordError, match=r"verdict.metrics.output_throughput.change is 'x', expected a number or null"):
        records.throughput_records([json.loads(json.dumps(good).replace('"change": 0.01', '"change": "x"'))])


def test_a_launch_entry_and_a_coding_problem_read_back_as_their_shapes() -> None:
    """The service manager's launch entry (a slurm job, the proof) and a coding problem's record
    (with the sandbox's tier and uid) are checked key by key when they come back."""
    proof = Proof(fields={"budget": FieldEvidence(PROVEN, "copy probe")}, probe=ProbeResult(4, [0, 1, 2, 3, 4], requests=2))
    entry: LaunchEntry = {"config": "bs8_b8_k4", "host": None, "instance": 0, "controller": "slurm", "command": "python -m x",
                          "env": {"A": "1"}, "port": None, "url": "", "started_at": 1.0, "pid_of_harness": 7, "outcome": "ready",
                          "slurm": {"job_name": "ddtree-x", "script": "#!/bin/sh", "version": "slurm 23.02", "job_id": "12",
                                    "node": "n1", "address": "10.0.0.1", "port": 30000, "queued_s": 0.5},
                          "ready_s": 2.0, "engine_version": "0.4", "applied_evidence": proof.as_dict()}
    launch = json.loads(json.dumps({"kind": RecordKind.LAUNCH, "config": "bs8_b8_k4", "worker": "gw0", "launch": entry}))
    assert records.check_record(launch) is None
    assert records.launch_records([launch])[0]["launch"]["applied_evidence"]["fields"]["budget"]["status"] == PROVEN
    launch["launch"]["slurm"]["port"] = "30000"
    assert "launch.slurm.port is '30000', expected an integer" in str(records.check_record(launch))

    judged = ProblemResult("p1", Verdict.PASSED, sandbox_tier="strong", sandbox_uid=None).to_record()
    asked = ProblemResult("p2", Verdict.ERROR, "the chat request failed").to_record()
    assert "sandbox_tier" in judged and "sandbox_tier" not in asked  # only code that ran says where
    coding_record = {"kind": RecordKind.CODING, "config": "bs8_b8_k4", "set": "default", "limit": None, "max_tokens": 64,
                     "passed": 1, "total": 2, "sandbox": "strong", "speed_factor": 1.0, "problems": [judged, asked],
                     "gate": {"passed": True, "mode": "floor", "floor": 1, "regressions": [], "new_passes": []}}
    assert records.check_record(json.loads(json.dumps(coding_record))) is None
    judged["sandbox_uid"] = "nobody"  # type: ignore[typeddict-item]
    assert "problems[0].sandbox_uid is 'nobody', expected an integer or null" in str(records.check_record(coding_record))


@pytest.mark.slow
def test_a_session_whose_worker_recorded_a_malformed_record_fails_saying_so_and_keeps_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bad='''
def test_bad(ddtree_recorder):
    ddtree_recorder.record("throughput-control-unavailable", None, {"reason": 3})
''')
    results = pytester.path / "results"
    run = pytester.runpytest_subprocess("test_bad.py", f"--ddtree-results={results}", "-n", "1", "-p", "no:cacheprovider")
    assert run.ret != 0
    run.stdout.fnmatch_lines(["*malformed record set aside: throughput-control-unavailable (from gw0): reason is 3, expected a string*"])
    (kept,) = [r for r in json.loads((results / "results.json").read_text())["records"] if r["kind"] == "corrupt-record"]
    assert kept["record"]["reason"] == 3 and kept["worker"] == "gw0"


def test_a_session_level_failure_is_a_failed_test_in_the_summary_the_last_line_and_junit(pytester: pytest.Pytester) -> None:
    """A failure of the session as a whole exits 1 and shows where pytest users look: the short
    test summary, the final counts, the JUnit XML (it once read '1 passed' and exited 1)."""
    pytester.makepyfile(test_bad='''
def test_bad(ddtree_recorder):
    ddtree_recorder.record("throughput-control-unavailable", None, {"reason": 3})
''')
    junit = pytester.path / "junit.xml"
    run = pytester.runpytest_subprocess("test_bad.py", f"--ddtree-results={pytester.path / 'results'}", f"--junitxml={junit}",
                                        "-p", "no:cacheprovider")
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    run.stdout.fnmatch_lines(["*short test summary info*",
                              "FAILED ddtree::records - malformed record set aside: *",
                              "*= 1 failed, 1 passed in *"])
    import xml.etree.ElementTree as ET

    cases = {case.get("name"): case for case in ET.parse(junit).iter("testcase")}
    assert cases["records"].find("failure") is not None and cases["test_bad"].find("failure") is None
