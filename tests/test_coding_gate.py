"""suites/test_coding.py end to end: pytester runs against real reference engines.

* the reference engine (its corpus holds the reference solutions) passes the full set on
  bs8_b8_k4, and --ddtree-update-baselines stores the passed ids;
* an engine whose corpus answers every default problem with hostile code (fork bomb, file
  writer, setsid daemon + endless loop, output flood, memory bomb + network) fails the gate
  against a baseline, names the regressions with the extracted code, and does no harm: the
  canary is intact and no sandbox process survives.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.gates import coding_problems
from pytest_ddtree import sandbox
from pytest_ddtree.sandbox.processes import proc_table
from tests.polling import wait_until
from tests.suite_helpers import reference_profile
from tests.suite_helpers import run_suite as run_helper

FENCE = "```"


def write_profile(directory: Path, repo_root: Path, engine_args: str = "", **overrides: Any) -> Path:
    # a 100x simulated clock: these tests check outputs, not timing
    return reference_profile(directory, engine_args, clock_scale=100, hardware_profile="testhw", pool=1, **overrides)


def run_suite(pytester: pytest.Pytester, repo_root: Path, profile: Path, *args: str, suite: str = "test_coding.py") -> pytest.RunResult:
    return run_helper(pytester, profile, *args, suite=suite)


def coding_records(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    out = []
    for path in (pytester.path / "results").glob("records-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "coding":
                out.append(rec)
    return out


@pytest.mark.slow
def test_reference_engine_passes_full_set_and_updates_baseline(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root)
    result = run_suite(pytester, repo_root, profile, "--ddtree-coding-set=full", "--ddtree-update-baselines")
    result.assert_outcomes(passed=1)
    (rec,) = coding_records(pytester)
    full = coding_problems.select_problems("full")
    assert rec["passed"] == rec["total"] == len(full), rec["gate"]
    assert {p["id"] for p in rec["problems"]} == {p.id for p in full}
    assert all(p["verdict"] == "passed" and p["code"] for p in rec["problems"])
    # the report says which tier ran the code and what holds: namespaces, memory accounting, seccomp
    assert rec["sandbox"] == sandbox.isolation().describe()
    assert rec["sandbox"].startswith("tier=") and ("by cgroup" in rec["sandbox"] or "RLIMIT_AS only" in rec["sandbox"]) and "seccomp" in rec["sandbox"]
    baseline = yaml.safe_load((pytester.path / "baselines" / "testhw" / "bs8_b8_k4.yaml").read_text())
    assert baseline["coding"]["full"] == sorted(p.id for p in full)


HOSTILE = {
    "slugify": "import os\n\ndef slugify(text):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n\nslugify('x')\n",
    "parse_duration": (
        "import os\nTARGETS = {targets!r}\nfor t in TARGETS:\n    try:\n        open(t, 'w').write('pwned')\n    except OSError:\n        pass\n"
        "def parse_duration(text):\n    return 0\n"
    ),
    "merge_intervals": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n    os._exit(0)\n"
        "def merge_intervals(x):\n    while True:\n        pass\n"
    ),
    "lru_cache": "import sys\nwhile True:\n    sys.stdout.write('A' * 65536)\n",
    "int_to_roman": (
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\nexcept OSError:\n    pass\n"
        "hog = []\nwhile True:\n    hog.append(bytearray(64 * 1024 * 1024))\n"
    ),
}


@pytest.mark.slow
def test_hostile_answers_fail_the_gate_without_harm(pytester: pytest.Pytester, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every answer here is hostile, none is slow-but-correct: shorter limits (wall 4 s, CPU 2 s)
    # keep the test fast without changing what is proven.
    monkeypatch.setenv("DDTREE_SANDBOX_SPEED_FACTOR", "0.4")
    # A uid range of its own, so the leftover check below sees this run's sandboxes only and
    # not those of tests running beside it on another xdist worker.
    uid_base = sandbox.UID_BASE + 100_000_000
    monkeypatch.setenv("DDTREE_SANDBOX_UID_BASE", str(uid_base))
    # Two kinds of target: a file of ours (under tmp_path, which the sandbox's private /tmp
    # hides) and the checkout, which the sandbox shows read-only. The test writes only the
    # former; the latter is only ever attempted by the hostile code, and must stay clean.
    canary_dir = pytester.path / "canary"
    canary_dir.mkdir()
    escape = repo_root / f"pwned-{os.getpid()}-{time.monotonic_ns()}.txt"
    try:
        canary_dir.chmod(0o755)
        canary = canary_dir / "canary.txt"
        canary.write_text("intact\n")
        targets = [str(canary), str(canary_dir / "dropped.txt"), str(escape)]
        corpus = pytester.path / "hostile-corpus"
        corpus.mkdir()
        lines = []
        for problem in coding_problems.select_problems("default"):
            code = HOSTILE[problem.id].replace("{targets!r}", repr(targets))
            lines.append(json.dumps({"prompt": coding_problems.user_message(problem), "response": f"{FENCE}python\n{code}{FENCE}"}))
        (corpus / "coding.jsonl").write_text("\n".join(lines) + "\n")
        hw = pytester.path / "baselines" / "testhw"
        hw.mkdir(parents=True)
        (hw / "bs8_b8_k4.yaml").write_text(yaml.safe_dump({"schema": 1, "config": "bs8_b8_k4", "coding": {"default": sorted(HOSTILE)}}))
        profile = write_profile(pytester.path, repo_root, f"--corpus-dir {corpus}")

        result = run_suite(pytester, repo_root, profile)

        result.assert_outcomes(failed=1)
        out = result.stdout.str()
        assert "REGRESSED (passed in the baseline, not now): " + ", ".join(sorted(HOSTILE)) in out
        assert "os.fork()" in out and "--- extracted code:" in out
        (rec,) = coding_records(pytester)
        verdicts = {p["id"]: p["verdict"] for p in rec["problems"]}
        assert rec["passed"] == 0 and set(verdicts.values()) <= {"error", "timeout", "failed"}, verdicts
        assert verdicts["merge_intervals"] == "timeout"
        assert verdicts["lru_cache"] == "error" and "output flood" in next(p["message"] for p in rec["problems"] if p["id"] == "lru_cache")
        assert canary.read_text() == "intact\n"
        assert not (canary_dir / "dropped.txt").exists() and not escape.exists()
        uids = {p["sandbox_uid"] for p in rec["problems"]}
        assert all(uid is not None and uid_base <= uid < uid_base + 64 * 100_000 for uid in uids), uids
        def leftovers() -> list[int]:
            return [pid for pid, (_pp, uid, _cwd) in proc_table().items() if uid_base <= uid < uid_base + 64 * 100_000]

        # The kernel may still be tearing down the last killed process when the gate returns (seen
        # under -n 4 on a loaded 2-core box); a survivor is one still there after the deadline.
        try:
            wait_until(lambda: not leftovers(), timeout=15, what="sandbox processes to be gone")
        except AssertionError:
            raise AssertionError(f"sandbox processes survived: {leftovers()}") from None
    finally:
        escape.unlink(missing_ok=True)  # only there if the sandbox failed (and the test with it)


@pytest.mark.slow  # about 20 s on a 2-core box, 30 s beside other load
def test_missing_baseline_holds_the_floor(pytester: pytest.Pytester, repo_root: Path) -> None:
    """One wrong answer, no baseline, floor 4 of 5 -> passes; the default floor (all) -> fails."""
    corpus = pytester.path / "corpus"
    shutil.copytree(repo_root / "pytest_ddtree" / "refserver" / "corpus", corpus)
    problem = coding_problems.select_problems("default")[0]
    lines = (corpus / "coding.jsonl").read_text().splitlines()
    wrong = json.dumps({"prompt": coding_problems.user_message(problem), "response": f"{FENCE}python\ndef {problem.entry_point}(*a):\n    return None\n{FENCE}"}, sort_keys=True)
    lines = [wrong if json.loads(line)["prompt"] == coding_problems.user_message(problem) else line for line in lines]
    (corpus / "coding.jsonl").write_text("\n".join(lines) + "\n")

    lenient = write_profile(pytester.path, repo_root, f"--corpus-dir {corpus}", coding_min_pass=4)
    run_suite(pytester, repo_root, lenient).assert_outcomes(passed=1)
    strict = write_profile(pytester.path, repo_root, f"--corpus-dir {corpus}")
    result = run_suite(pytester, repo_root, strict)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*BELOW THE FLOOR; not passed: {problem.id}*"])
    # blessing below the floor is refused with the numbers, and writes nothing
    result = run_suite(pytester, repo_root, strict, "--ddtree-update-baselines")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not blessing coding set 'default' of bs8_b8_k4: 4/5 passed, below the profile's "
                                 "floor of 5 (every problem (coding_min_pass: null))*"])
    assert not list((pytester.path / "baselines").rglob("*.yaml"))


@pytest.mark.slow
def test_weak_sandbox_without_opt_in_fails_the_gate_with_reason(pytester: pytest.Pytester, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: with only the plain tier available the gate runs no generated code and
    fails with the reason and the fix; the opt-in is accepted from the ini file, but never
    runs code as root without a uid drop."""
    monkeypatch.setenv("DDTREE_SANDBOX_TIER", "plain")
    profile = write_profile(pytester.path, repo_root)
    result = run_suite(pytester, repo_root, profile)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "coding gate not run" in out and "tier=plain" in out and "Fix:" in out
    assert "--ddtree-sandbox=plain" in out or "as root" in out
    assert coding_records(pytester) == []  # nothing was asked or run

    # the ini key (-o overrides it) opts in: the gate then runs, unless that would mean root
    opted_in = run_suite(pytester, repo_root, profile, "-o", "ddtree_sandbox=plain", "--ddtree-coding-limit=1")
    text = opted_in.stdout.str()
    assert "--ddtree-sandbox=plain" not in text
    if "coding gate not run" in text:
        assert os.getuid() == 0 and "would run generated code as root" in text
    else:
        assert len(coding_records(pytester)) == 1

    bad = run_suite(pytester, repo_root, profile, "--ddtree-sandbox=nonsense")
    assert bad.ret == 4 and "strong, plain" in bad.stderr.str() + bad.stdout.str()
