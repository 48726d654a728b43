"""A build change is gated: the baseline folder is the setup the user holds fixed, and the engine
version and the drafter are the build under test, recorded with each bless and compared in each
verdict; baselines of the older layout (a folder per build) still load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from pytest_ddtree.baselines import BaselineStore
from pytest_ddtree.gates.throughput import verdicts
from pytest_ddtree.gates.throughput.cells import JudgedCell, read_baseline
from pytest_ddtree.gates.throughput.cells import CellOutcome, judge_cell
from pytest_ddtree.options import Settings
from pytest_ddtree.records.recorder import BaselineUpdate, SessionRecorder
from pytest_ddtree.records.shapes import ThroughputData
from pytest_ddtree.records.words import Status, Verdict
from pytest_ddtree.service import build, fingerprint
from pytest_ddtree.service.manager import RunningService

# -- the drafter's digest and the sentence a verdict says ---------------------------------------------


def _drafter(folder: Path, block_size: int, weights: int = 1000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "block_size": block_size}))
    (folder / "model.safetensors").write_bytes(b"\0" * weights)
    return folder


def test_the_drafter_digest_follows_its_config_and_weight_files_and_says_when_it_cannot_read(tmp_path: Path) -> None:
    a = build.drafter_digest(str(_drafter(tmp_path / "a", 8)))
    assert a.startswith("sha256:") and len(a) == len("sha256:") + 16
    assert build.drafter_digest(str(_drafter(tmp_path / "same", 8))) == a  # content, not the path
    assert build.drafter_digest(str(_drafter(tmp_path / "b", 16))) != a  # another checkpoint's config
    assert build.drafter_digest(str(_drafter(tmp_path / "c", 8, weights=1001))) != a  # another weight file
    # a checkpoint retrained in place: the same config, names and sizes, other values (sampled slices see it)
    retrained = _drafter(tmp_path / "d", 8, weights=300_000)
    before = build.drafter_digest(str(retrained))
    (retrained / "model.safetensors").write_bytes(b"\0" * 150_000 + b"\1" + b"\0" * 149_999)
    assert build.drafter_digest(str(retrained)) != before
    (tmp_path / "a" / "README.md").write_text("notes")
    assert build.drafter_digest(str(tmp_path / "a")) == a  # not a weight file: no change of build
    assert build.drafter_digest("/no/such/drafter") == "unread: no such path on this machine"


def test_the_sentence_names_what_changed_and_an_old_files_details_are_its_build(tmp_path: Path) -> None:
    blessed = {"engine_version": "0.5.23", "speculative_algorithm": "DFLASH", "drafter": "/m/A", "drafter_digest": "sha256:1"}
    here = {**blessed, "engine_version": "0.5.24", "drafter": "/m/B", "drafter_digest": "sha256:2"}
    assert build.build_sentence(blessed, here) == (
        "blessed on sglang 0.5.23 (DFLASH) with drafter /m/A (sha256:1); judged on sglang 0.5.24 (DFLASH) with drafter "
        "/m/B (sha256:2) (changed: engine_version '0.5.23' when blessed, '0.5.24' here; drafter '/m/A' when blessed, "
        "'/m/B' here; drafter_digest 'sha256:1' when blessed, 'sha256:2' here)")
    assert build.build_sentence(blessed, blessed).startswith("judged on the build it was blessed on: sglang 0.5.23")
    assert build.build_sentence({}, here) == ""
    # a file of the older layout recorded the build in its details (the drafter's last path part)
    old = {"name": "8xH200-sglang-0.5.23-K-1a2b3c4d", "details": {"gpu": "8xH200", "engine_version": "0.5.23",
                                                                  "drafter": "A", "driver": "580.1", "model": "K"}}
    assert build.blessed_build(old) == {"engine_version": "0.5.23", "drafter": "A", "driver": "580.1"}
    assert build.build_changes(build.blessed_build(old), {"engine_version": "0.5.23", "drafter": "/m/A"}) == []
    assert build.build_changes(build.blessed_build(old), {"engine_version": "0.5.23", "drafter": "/m/B"}) == [
        "drafter 'A' when blessed, '/m/B' here"]
    # hostile values are cut short
    (said,) = build.build_changes({"engine_version": "x" * 500}, {"engine_version": "y"})
    assert said == f"engine_version {'...' + 'x' * 77!r} when blessed, 'y' here"


def test_the_build_of_a_running_service_reads_its_drafter_here(tmp_path: Path) -> None:
    drafter = _drafter(tmp_path / "d", 8)

    class Profile:
        draft_model_path = str(drafter)
        patches = {"distribution": "sglang"}

    info = {"version": "0.5.23", "speculative_algorithm": "DFLASH", "speculative_draft_model_path": str(drafter)}
    got = build.build_under_test(info, Profile(), {"driver": "580.1"})
    assert got["drafter"] == str(drafter) and got["drafter_digest"] == build.drafter_digest(str(drafter))
    assert got["driver"] == "580.1" and got["patches"].startswith("sha256:") and got["engine_version"] == "0.5.23"
    # the plain launch (the control) has no drafter; a server that does not report one: the profile's
    assert "drafter" not in build.build_under_test({"version": "0.5.23", "speculative_algorithm": None}, Profile())
    assert build.build_under_test({"speculative_algorithm": "DFLASH"}, Profile())["drafter"] == str(drafter)


def _judged(verdict: Verdict, blessed: dict[str, Any], here: dict[str, Any], tmp_path: Path) -> CellOutcome:
    record = cast(ThroughputData, {"measurement_status": Status.VALID, "samples": {}, "repeats": 3,
                                   "build": {"blessed": blessed, "judged": here, "changed": build.build_changes(blessed, here)}})
    cell = JudgedCell(verdict=verdicts.CellVerdict("c8", verdict, (), ("why",)), record=record, durations=[],
                      primary=[100.0], baseline_cell=None, baseline_problem=None, build=here,
                      build_sentence=build.build_sentence(blessed, here))
    return judge_cell(cell, "bs8_b8_k4", "c8", baselines=BaselineStore(tmp_path, "refserver"),
                      recorder=cast(SessionRecorder, None), service=cast(RunningService, None),
                      settings=cast(Settings, SimpleNamespace(require_baselines=False, session_stamp="s1")))


def test_every_verdict_says_the_build_and_a_pass_on_another_build_says_what_changed(tmp_path: Path) -> None:
    a = {"engine_version": "0.5.23", "drafter": "/m/A"}
    b = {"engine_version": "0.5.24", "drafter": "/m/A"}
    assert _judged(Status.PASS, a, a, tmp_path).message == ""  # the blessed build passed: nothing to say
    passed = _judged(Status.PASS, a, b, tmp_path)
    assert passed.decision is Status.PASS and passed.message == (
        "bs8_b8_k4 c8: blessed on sglang 0.5.23 with drafter /m/A; judged on sglang 0.5.24 with drafter /m/A "
        "(changed: engine_version '0.5.23' when blessed, '0.5.24' here)")
    failed = _judged(Status.REGRESSION, a, a, tmp_path)
    assert failed.decision is Status.FAIL and failed.message.endswith(
        "\n  - build: judged on the build it was blessed on: sglang 0.5.23 with drafter /m/A")
    skipped = _judged(Status.INCONCLUSIVE, a, b, tmp_path)
    assert skipped.decision is Status.SKIP and "\n" not in skipped.message
    assert skipped.message.endswith("; build: blessed on sglang 0.5.23 with drafter /m/A; judged on sglang 0.5.24 with drafter "
                                    "/m/A (changed: engine_version '0.5.23' when blessed, '0.5.24' here)")


# -- the older layout's folder ----------------------------------------------------------------------------

SGLANG = {"version": "0.5.3", "model_path": "/models/moonshotai/Kimi-K2.6",
          "speculative_draft_model_path": "/models/dflash-k26", "speculative_algorithm": "DFLASH", "tp_size": 8}


class _Gpu:
    name = "NVIDIA H200"


class _Inventory:
    gpus = (_Gpu(),) * 8
    driver_version = "580.1"
    cuda_driver_version = "13.0"


def test_a_baseline_of_the_older_layout_is_found_read_with_a_note_and_rewritten_in_the_new_folder(tmp_path: Path) -> None:
    fp = fingerprint.fingerprint(SGLANG, inventory=_Inventory())
    # the name the older layout gave these facts (engine version, drafter and driver in it), as it wrote it
    assert fp.legacy_name == "8xH200-sglang-0.5.3-Kimi-K2.6-36466a88"
    assert fp.name == f"8xH200-Kimi-K2.6-{fp.digest}"
    old = tmp_path / fp.legacy_name
    entry = {"workload": {"concurrency": 1}, "gates": {"output_throughput": {
        "direction": "higher", "tolerance": 0.05, "unit": "tok/s", "median": 100.0,
        "sessions": [{"session": "s1", "samples": [100.0, 101.0, 99.0]}]}}}
    old.mkdir()
    (old / "bs8_b7_k1.yaml").write_text(yaml.safe_dump({
        "schema": 1, "config": "bs8_b7_k1", "metrics": {"c1": entry}, "coding": {"default": ["p1"]},
        "fingerprint": {"name": fp.legacy_name, "details": {"gpu": "8xH200", "engine_version": "0.5.3", "drafter": "dflash-k26"}}}))
    (old / "golden").mkdir()
    store = BaselineStore(tmp_path, fp.name, fingerprint=fp, legacy_profile=fp.legacy_name)
    assert (store.load("bs8_b7_k1") or {})["coding"] == {"default": ["p1"]}
    note = store.legacy_note("bs8_b7_k1")
    assert note is not None and str(old / "bs8_b7_k1.yaml") in note and str(store.path_for("bs8_b7_k1")) in note
    assert store.golden_read_dir() == old / "golden" and store.golden_dir() == tmp_path / fp.name / "golden"
    here = build.build_under_test(dict(SGLANG, version="0.5.4"), None, fp.build)
    baseline = read_baseline(store, "bs8_b7_k1", here)
    assert baseline.problem is None and baseline.section["c1"]["gates"]["output_throughput"]["median"] == 100.0
    assert baseline.note == note
    assert build.build_changes(baseline.blessed_build, baseline.build) == ["engine_version '0.5.3' when blessed, '0.5.4' here"]
    # a bless writes the new folder, keeping what the old file held; the old folder is left as it was
    store.apply_updates([BaselineUpdate("bs8_b7_k1", "fingerprint", {**fp.as_dict(), "build": here})])
    written = yaml.safe_load(store.path_for("bs8_b7_k1").read_text())
    assert written["coding"] == {"default": ["p1"]} and written["fingerprint"]["build"]["engine_version"] == "0.5.4"
    assert store.legacy_note("bs8_b7_k1") is None and (old / "bs8_b7_k1.yaml").exists()
    # no older folder: nothing to say
    assert BaselineStore(tmp_path, "elsewhere", legacy_profile="none-such").legacy_note("bs8_b7_k1") is None


# -- a bless, then judged sessions on another drafter and another engine version (the reference engine) -----

MATRIX = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4]
cell_defaults: {output_tokens: 32}
cells:
  - {name: c4_tiny, concurrency: 4, context_tokens: 48, requests: 8, warmup_requests: 4}
"""


def _profile(pytester: pytest.Pytester, repo_root: Path, name: str, engine_args: str) -> Path:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    raw["control"] = "none"  # the build comparison is the configs' (the control has no drafter)
    raw["command"] = raw["command"].replace("{config_args}", f"--clock-scale 5 {engine_args} {{config_args}}")
    raw["max_context"] = 4096
    path = pytester.path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _session(pytester: pytest.Pytester, repo_root: Path, profile: Path, matrix: Path, *args: str) -> pytest.RunResult:
    shutil.rmtree(pytester.path / "results", ignore_errors=True)
    return pytester.runpytest_subprocess(
        str(repo_root / "suites" / "test_throughput.py"), f"--ddtree-service={profile}", f"--ddtree-matrix={matrix}",
        f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        "--ddtree-config=bs8_b8_k4", "--ddtree-require-baselines", "-p", "no:cacheprovider", "-rA", *args, timeout=300)


def _cell(pytester: pytest.Pytester) -> dict[str, Any]:
    results = json.loads((pytester.path / "results" / "results.json").read_text())
    return dict(next(c for c in results["throughput"] if c["cell"] == "c4_tiny"))


@pytest.mark.slow  # four sessions of the engine, two of them confirming a regression
@pytest.mark.usefixtures("measurement_turn")
def test_a_new_drafter_or_engine_version_whose_acceptance_fell_fails_naming_the_build_change(
        pytester: pytest.Pytester, repo_root: Path) -> None:
    matrix = pytester.path / "configs.yaml"
    matrix.write_text(MATRIX)
    drafter_a, drafter_b = _drafter(pytester.path / "drafter-a", 8), _drafter(pytester.path / "drafter-b", 2)
    blessed = _profile(pytester, repo_root, "a", f"--speculative-draft-model-path {drafter_a}")
    bless = _session(pytester, repo_root, blessed, matrix, "--ddtree-update-baselines")
    assert bless.ret == 0, bless.stdout.str()[-3000:]
    recorded = yaml.safe_load((pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").read_text())["fingerprint"]
    assert recorded["build"] == {"engine_version": "refserver-0.1.0", "speculative_algorithm": "DFLASH",
                                 "drafter": str(drafter_a), "drafter_digest": build.drafter_digest(str(drafter_a))}
    assert "engine_version" not in recorded["details"] and "drafter" not in recorded["details"]

    # the build as blessed passes, and results.json says it was compared
    same = _session(pytester, repo_root, blessed, matrix)
    assert same.ret == 0 and "ddtree build" not in same.stdout.str(), same.stdout.str()[-3000:]
    assert _cell(pytester)["build"]["changed"] == []

    # a new drafter checkpoint (another config; the engine's --trained-block-size 2 is what it predicts: one
    # token ahead) in the
    # same folder: not "no baseline", but a regression of acceptance that names the drafter's change
    worse = _profile(pytester, repo_root, "b", f"--speculative-draft-model-path {drafter_b} --trained-block-size 2")
    result = _session(pytester, repo_root, worse, matrix)
    out = result.stdout.str()
    assert result.ret == 1 and "no baseline" not in out, out[-3000:]
    result.stdout.fnmatch_lines(["*bs8_b8_k4 c4_tiny: REGRESSION*", "*ddtree_tokens_per_verify*REGRESSION*",
                                 "*build: blessed on refserver-0.1.0 (DFLASH) with drafter *drafter-a (sha256:*); judged on "
                                 "refserver-0.1.0 (DFLASH) with drafter *drafter-b (sha256:*) (changed: drafter *drafter_digest*"])
    cell = _cell(pytester)
    assert [c.split()[0] for c in cell["build"]["changed"]] == ["drafter", "drafter_digest"], cell["build"]
    records = [json.loads(line) for path in (pytester.path / "results").glob("records-*.jsonl")
               for line in path.read_text().splitlines()]
    notes = [n for r in records if r.get("kind") == "throughput" for n in r.get("notes", [])]
    assert any(n.startswith("build: blessed on") for n in notes), notes

    # an engine upgrade (same drafter path, same content) whose acceptance fell: the version is named
    upgraded = _profile(pytester, repo_root, "c", f"--speculative-draft-model-path {drafter_a} --trained-block-size 2 "
                                                  "--engine-version refserver-0.2.0")
    result = _session(pytester, repo_root, upgraded, matrix)
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*ddtree_tokens_per_verify*REGRESSION*",
                                 "*build: blessed on refserver-0.1.0 *; judged on refserver-0.2.0 * (changed: engine_version "
                                 "'refserver-0.1.0' when blessed, 'refserver-0.2.0' here)*"])
    assert _cell(pytester)["build"]["changed"] == ["engine_version 'refserver-0.1.0' when blessed, 'refserver-0.2.0' here"]
