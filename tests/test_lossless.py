"""The lossless gate: pure comparison rules, golden transcripts, and real reference engines
(non-speculative vs speculative vs ``--fault lossy-verify=0.05``), also through the suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree import lossless
from pytest_ddtree.lossless import Prompt, Transcript
from tests.suite_helpers import reference_profile
from tests.suite_helpers import run_suite as run_helper

from refserver_helpers import config_args, start_many


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


def test_compare_all_message() -> None:
    ref = {"a": t("a", "x", [1]), "b": t("b", "y", [2])}
    out = lossless.compare_all(ref, {"a": t("a", "x", [1]), "b": t("b", "z", [3]), "c": t("c", "q", [4])}, ["c: no golden"])
    assert not out.passed and out.compared == 2 and len(out.divergences) == 1
    assert "1/2 prompts identical" in out.message and "DIVERGED" in out.message and "c: no golden" in out.message
    assert lossless.compare_all(ref, {"a": t("a", "x", [1])}).passed
    assert not lossless.compare_all({}, {"a": t("a", "x", [1])}).passed  # nothing compared is not a pass


def test_prompts() -> None:
    prompts = lossless.load_prompts()
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids))
    assert sum(p.source == "coding" for p in prompts) >= 20 and sum(p.source == "text" for p in prompts) >= 3


def test_golden_roundtrip_stale_and_corrupt(tmp_path: Path) -> None:
    prompts = [Prompt("coding:x", "def x():", "coding"), Prompt("text:y", "Hello", "text")]
    trans = {p.id: Transcript(p.id, "out", (1, 2), None, p.sha256) for p in prompts}
    written = lossless.write_golden(tmp_path, trans)
    assert len(written) == 2 and all(p.name.startswith("lossless-") for p in written)
    found, problems = lossless.load_golden(tmp_path, prompts, "CMD")
    assert problems == [] and found["text:y"].output_ids == (1, 2)
    changed = [prompts[0], Prompt("text:y", "Hello!", "text")]
    found, problems = lossless.load_golden(tmp_path, changed, "CMD")
    assert list(found) == ["coding:x"] and "stale" in problems[0] and "CMD" in problems[0]
    missing = lossless.load_golden(tmp_path, [Prompt("text:z", "z", "text")], "CMD")[1]
    assert "no golden transcript" in missing[0]
    lossless.golden_path(tmp_path, "text:y").write_text("{not json")
    with pytest.raises(lossless.LosslessError, match="corrupt golden transcript .* CMD"):
        lossless.load_golden(tmp_path, prompts, "CMD")


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
        from pytest_ddtree.client import SGLangClient

        prompts = lossless.load_prompts()
        clients = {name: SGLangClient(s.url) for name, s in servers.items()}
        ref = lossless.collect_cached(servers["none"].url, clients["none"], prompts)
        assert all(tr.output_ids and len(tr.output_ids) > 0 for tr in ref.values())
        good = lossless.compare_all(ref, lossless.collect(clients["spec"], prompts))
        assert good.passed, good.message
        bad = lossless.compare_all(ref, lossless.collect(clients["lossy"], prompts))
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


def test_suite_instance_mode_catches_lossy_verify(pytester: pytest.Pytester, repo_root: Path) -> None:
    profile = write_profile(pytester.path, repo_root, "--fault lossy-verify=0.05")
    result = run_suite(pytester, repo_root, profile)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*reference: non-speculative instance (--speculative-algorithm NONE)*", "*DIVERGED*", "*first divergence at token*"])


def test_suite_golden_mode(pytester: pytest.Pytester, repo_root: Path) -> None:
    golden = write_profile(pytester.path, repo_root, lossless="golden", lossless_args=None)
    missing = run_suite(pytester, repo_root, golden)
    missing.assert_outcomes(skipped=1)
    missing.stdout.fnmatch_lines(["*no usable golden transcripts*--ddtree-update-baselines*"])

    run_suite(pytester, repo_root, golden, "--ddtree-update-baselines").assert_outcomes(passed=1)
    files = sorted((pytester.path / "baselines" / "testhw" / "golden").glob("lossless-*.json"))
    assert len(files) == len(lossless.load_prompts())
    assert json.loads(files[0].read_text())["output_ids"]

    run_suite(pytester, repo_root, golden).assert_outcomes(passed=1)
    lossy = write_profile(pytester.path, repo_root, "--fault lossy-verify=0.05", lossless="golden", lossless_args=None)
    result = run_suite(pytester, repo_root, lossy)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*reference: golden transcripts in*", "*first divergence at token*"])
