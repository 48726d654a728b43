"""The lossless gate: pure comparison rules, golden transcripts, and real reference engines
(non-speculative vs speculative vs ``--fault lossy-verify=0.05``), also through the suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates import lossless
from pytest_ddtree.gates.lossless import Prompt, Transcript
from tests.suite_helpers import reference_profile
from tests.suite_helpers import run_suite as run_helper

from tests.refserver_helpers import config_args, start_many


def t(pid: str, text: str, ids: list[int] | None, error: str = "") -> Transcript:
    return Transcript(pid, text, tuple(ids) if ids is not None else None, error=error)


def test_compare_tokens_and_text() -> None:
    assert lossless.compare(t("p", "abc", [1, 2, 3]), t("p", "abc", [1, 2, 3])) is None
    d = lossless.compare(t("p", "hello world", [1, 2, 3, 4]), t("p", "hello there", [1, 2, 9, 9]))
    assert d is not None and d.unit == "token" and d.position == 2
    assert d.reference == "world" and d.got == "there" and "reference token 3, got 9" in d.detail
    assert "first divergence at token 2" in d.describe() and "'world'" in d.describe()
    # same text, different ids: still a divergence (token-exact)
    d2 = lossless.compare(t("p", "ab", [1, 2]), t("p", "ab", [1, 3]))
    assert d2 is not None and d2.position == 1
    # shorter output (early stop) diverges at the end of the shorter one
    d3 = lossless.compare(t("p", "abc", [1, 2, 3]), t("p", "ab", [1, 2]))
    assert d3 is not None and d3.position == 2 and "end" in d3.detail
    # no output_ids: text fallback
    d4 = lossless.compare(t("p", "abcX", None), t("p", "abcY", None))
    assert d4 is not None and d4.unit == "char" and d4.position == 3
    err = lossless.compare(t("p", "", None, error="boom"), t("p", "x", [1]))
    assert err is not None and err.unit == "request" and "boom" in err.describe()


def _reference(transcripts: dict[str, Transcript], diverged: int = 0, earliest: int | None = None) -> lossless.Reference:
    floor = lossless.Floor(len(transcripts), diverged, earliest, (1, len(transcripts)))
    return lossless.Reference(transcripts, floor, "test launch --speculative-algorithm NONE", "CMD")


def test_judge_exact_and_against_the_floor() -> None:
    ref = {f"p{i}": t(f"p{i}", "x" * 100, list(range(100))) for i in range(4)}
    late = dict(ref, p1=t("p1", "x" * 100, list(range(60)) + [999] * 40))  # diverges at token 60
    early = dict(ref, p1=t("p1", "x" * 100, list(range(20)) + [999] * 80))  # at token 20
    two = dict(late, p2=t("p2", "x" * 100, list(range(70)) + [999] * 30))
    floor = _reference(ref, diverged=1, earliest=40)  # the service disagrees with itself once, at 40
    assert lossless.judge(floor, late, exact=None).passed  # within the floor: not more often, not earlier
    assert not lossless.judge(floor, early, exact=None).passed  # earlier than the floor
    assert not lossless.judge(floor, two, exact=None).passed  # more often than the floor
    out = lossless.judge(floor, late, exact="SGLang's deterministic inference is on")  # deterministic: exact
    assert not out.passed and "rule: identical (SGLang's deterministic inference is on)" in out.message
    assert not lossless.judge(_reference(ref), late, exact=None).passed  # a floor without divergence means exact
    out = lossless.judge(floor, late, exact=None)
    assert "reference: test launch --speculative-algorithm NONE" in out.message
    assert "floor: 1/4 prompts differ between the same prompts at batch 1 and at batch 4, the earliest at token 40" in out.message
    assert not lossless.judge(floor, {}, exact=None).passed  # nothing compared is not a pass
    failed = dict(ref, p3=t("p3", "", None, error="HTTP 500"))
    assert not lossless.judge(_reference(ref, 2, 0), failed, exact=None).passed  # a failed request never hides in the floor


def test_exact_reason() -> None:
    assert lossless.exact_reason({"version": "refserver-0.1.0"}) == "the reference engine is deterministic"
    assert "deterministic inference" in (lossless.exact_reason({"version": "0.5.4", "enable_deterministic_inference": True}) or "")
    assert lossless.exact_reason({"version": "0.5.4", "enable_deterministic_inference": False}) is None
    hint = lossless.deterministic_hint({"enable_deterministic_inference": False})
    assert "--enable-deterministic-inference" in hint and lossless.deterministic_hint({"version": "0.4.0"}) == ""
    ref = {"p": t("p", "x", [1, 2, 3])}
    within = lossless.judge(_reference(ref, 1, 0), {"p": t("p", "x", [1, 2, 4])}, None, hint)
    assert within.passed and hint in within.message


def test_prompts() -> None:
    prompts = lossless.load_prompts()
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids))
    assert sum(p.source == "coding" for p in prompts) >= 20 and sum(p.source == "text" for p in prompts) >= 3


def test_golden_roundtrip_stale_and_corrupt(tmp_path: Path) -> None:
    prompts = [Prompt("coding:x", "def x():", "coding"), Prompt("text:y", "Hello", "text")]
    trans = {p.id: Transcript(p.id, "out", (1, 2), None, p.sha256) for p in prompts}
    reference = lossless.Reference(trans, lossless.Floor(2, 1, 7, (1, 2)), "live", "python -m engine --speculative-algorithm NONE")
    written = lossless.write_golden(tmp_path, json.loads(json.dumps(reference.golden_payload("s1"))))  # as workeroutput carries it
    assert [p.name for p in written] == ["reference.json", "lossless-coding-x.json", "lossless-text-y.json"]
    loaded = lossless.load_golden_reference(tmp_path, prompts, "CMD")
    assert loaded.missing == () and loaded.transcripts["text:y"].output_ids == (1, 2)
    assert loaded.floor == reference.floor and loaded.command == reference.command
    assert "blessed" in loaded.source and "--speculative-algorithm NONE" in loaded.source
    changed = [prompts[0], Prompt("text:y", "Hello!", "text")]
    loaded = lossless.load_golden_reference(tmp_path, changed, "CMD")
    assert list(loaded.transcripts) == ["coding:x"] and "stale" in loaded.missing[0] and "CMD" in loaded.missing[0]
    missing = lossless.load_golden(tmp_path, [Prompt("text:z", "z", "text")], "CMD")[1]
    assert "no golden transcript" in missing[0]
    lossless.golden_path(tmp_path, "text:y").write_text("{not json")
    with pytest.raises(lossless.LosslessError, match="corrupt golden transcript .* CMD"):
        lossless.load_golden(tmp_path, prompts, "CMD")
    (tmp_path / "reference.json").unlink()  # transcripts of unknown origin (an older harness's) are not trusted
    untrusted = lossless.load_golden_reference(tmp_path, prompts, "CMD")
    assert not untrusted.transcripts and "not written from a non-speculative launch" in untrusted.missing[0]


def test_real_engines_lossless_and_lossy(tmp_path: Path) -> None:
    servers = start_many(
        {
            "none": config_args("NONE") + ["--clock-scale", "100"],
            "spec": config_args("bs8_b8_k4") + ["--clock-scale", "100"],
            "lossy": config_args("bs8_b8_k4") + ["--clock-scale", "100", "--fault", "lossy-verify=0.05"],
        },
        tmp_path,
    )
    try:
        from pytest_ddtree.service.client import SGLangClient

        prompts = lossless.load_prompts()
        clients = {name: SGLangClient(s.url) for name, s in servers.items()}
        ref = lossless.measure_reference(clients["none"], prompts, "refserver --speculative-algorithm NONE")
        assert ref.floor.diverged == 0 and ref.floor.compared == len(prompts)  # the engine is batch-invariant
        assert all(tr.output_ids and len(tr.output_ids) > 0 for tr in ref.transcripts.values())
        exact = lossless.exact_reason(clients["spec"].server_info())
        assert exact == "the reference engine is deterministic"
        good = lossless.judge(ref, lossless.collect(clients["spec"], prompts), exact)
        assert good.passed, good.message
        bad = lossless.judge(ref, lossless.collect(clients["lossy"], prompts), exact)
        assert not bad.passed and bad.divergences
        assert "first divergence at token" in bad.message and "reference:" in bad.message and "got:" in bad.message
    finally:
        for s in servers.values():
            s.stop()


# --------------------------------------------------------------------------- the suite


def write_profile(directory: Path, repo_root: Path, engine_args: str = "", **overrides: Any) -> Path:
    # a 100x simulated clock: these tests check outputs, not timing
    name = f"profile-{len(list(directory.glob('profile-*.yaml')))}.yaml"
    return reference_profile(directory, engine_args, clock_scale=100, filename=name, hardware_profile="testhw", pool=1, **overrides)


def run_suite(pytester: pytest.Pytester, repo_root: Path, profile: Path, *args: str) -> pytest.RunResult:
    return run_helper(pytester, profile, *args, suite="test_lossless.py")


@pytest.mark.slow
def test_suite_instance_mode_catches_lossy_verify(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root, "--fault lossy-verify=0.05")
    result = run_suite(pytester, repo_root, profile)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*reference: a launch with lossless_args, measured now: *pytest_ddtree.refserver*",
        "*floor: 0/* prompts differ*", "*rule: identical (the reference engine is deterministic)*",
        "*DIVERGED*", "*first divergence at token*",
    ])


@pytest.mark.slow  # about 20 s on a 2-core box, 30 s beside other load
def test_suite_golden_mode_blessed_only_from_the_reference_launch(pytester: pytest.Pytester, repo_root: Path) -> None:
    """A lossy-verify engine cannot bless itself: golden/ comes from the lossless_args launch, and
    the config under test is judged against it in the blessing session too."""
    golden_dir = pytester.path / "baselines" / "testhw" / "golden"
    lossy = write_profile(pytester.path, repo_root, "--fault lossy-verify=0.05", lossless="golden")
    missing = run_suite(pytester, repo_root, lossy)
    missing.assert_outcomes(skipped=1)
    missing.stdout.fnmatch_lines(["*no usable golden transcripts*--ddtree-update-baselines*"])

    blessing = run_suite(pytester, repo_root, lossy, "--ddtree-update-baselines")
    blessing.assert_outcomes(failed=1)  # judged against the reference launch, not blessed as its own
    blessing.stdout.fnmatch_lines(["*DIVERGED*", "*wrote * golden transcripts in *golden from: *pytest_ddtree.refserver*"])
    files = sorted(golden_dir.glob("lossless-*.json"))
    assert len(files) == len(lossless.load_prompts())
    meta = json.loads((golden_dir / "reference.json").read_text())
    # the plain launch, as SGLang takes it: the command without config_args, no --speculative-algorithm
    assert "pytest_ddtree.refserver" in meta["command"] and "--speculative" not in meta["command"], meta["command"]
    assert meta["floor"]["diverged"] == 0

    clean = write_profile(pytester.path, repo_root, lossless="golden")
    run_suite(pytester, repo_root, clean).assert_outcomes(passed=1)  # the blessed reference is the lossless one
    result = run_suite(pytester, repo_root, lossy)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*reference: golden transcripts in*blessed * from a launch with lossless_args*", "*first divergence at token*"])
