"""A fake installed SGLang site, its patches and the package requests of the repro tests, shared
by the repro, hostile-repro, source and main-job tests.

Why a helper module and not the test module itself: a test module importing another one ties
two test files together (the other's module-level set-up runs wherever it is imported, and a
rename there breaks tests elsewhere); tests/test_codebase.py holds test modules to importing
helpers only.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_ddtree.repro import FailedTest, PackagedLaunch, PackageRequest, envsnap, writer


REPO = Path(__file__).resolve().parent.parent
VERSION = "0.5.3"

PRISTINE_FILES = {
    "sglang/__init__.py": "__version__ = '0.5.3'\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/speculative/dflash_worker.py": "".join(f"line_{i} = {i}\n" for i in range(40)),
    "sglang/srt/speculative/dflash_info.py": "class DFlashInfo:\n    block_size = 8\n\n\ndef f():\n    return 1",
    "sglang/srt/layers/triton_backend.py": "import math\n\n\ndef attn(x):\n    return math.sqrt(x)\n",
}
PATCHED_CHANGES = {
    "sglang/srt/speculative/dflash_worker.py": "".join(
        (f"line_{i} = {i}  # ddtree\n" if i in (3, 30) else f"line_{i} = {i}\n") for i in range(40)
    ) + "TREE = True\n",
    # no trailing newline before and after: exercises the '\ No newline' marker
    "sglang/srt/speculative/dflash_info.py": "class DFlashInfo:\n    block_size = 8\n    tree = True\n\n\ndef f():\n    return 2",
}
ADDED = {"sglang/srt/speculative/ddtree_utils.py": "def build_tree(budget):\n    return list(range(budget))\n"}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_site(root: Path, version: str = VERSION) -> Path:
    """A pristine site-packages with sglang-<version>.dist-info/{METADATA,RECORD}."""
    site = root
    site.mkdir(parents=True, exist_ok=True)
    rows = []
    for rel, text in PRISTINE_FILES.items():
        p = site / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        rows.append(f"{rel},{_record_hash(text.encode())},{len(text.encode())}")
    di = site / f"sglang-{version}.dist-info"
    di.mkdir()
    meta = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\nSummary: fake\n\nbody\n"
    (di / "METADATA").write_text(meta, encoding="utf-8")
    rows.append(f"{di.name}/METADATA,{_record_hash(meta.encode())},{len(meta)}")
    rows.append(f"{di.name}/RECORD,,")
    (di / "RECORD").write_text("\n".join(rows) + "\n", encoding="utf-8")
    # a compiled cache file that RECORD does not list: must not count as "added"
    cache = site / "sglang/__pycache__/__init__.cpython-311.pyc"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(b"\x00junk")
    return site


def patch_site(site: Path) -> None:
    for rel, text in {**PATCHED_CHANGES, **ADDED}.items():
        (site / rel).write_text(text, encoding="utf-8")


def expected_patched() -> dict[str, str]:
    return {**PRISTINE_FILES, **PATCHED_CHANGES, **ADDED}


def make_results(root: Path) -> Path:
    rd = root / "results"
    rd.mkdir(parents=True)
    (rd / "results.json").write_text(json.dumps({"configs": {"bs8_b8_k4": {"output_throughput": 897.0}}}), encoding="utf-8")
    (rd / "results.md").write_text(
        "| config | output tok/s | accept |\n| --- | --- | --- |\n| bs8_b8_k4 | 897.0 | 4.1 |\n", encoding="utf-8")
    (rd / "records-gw0.jsonl").write_text('{"kind": "throughput", "config": "bs8_b8_k4"}\n', encoding="utf-8")
    return rd


def make_request(tmp: Path, out: Path, patches: dict[str, Any], **kw: Any) -> PackageRequest:
    drafter = tmp / "hub/models--x--drafter/snapshots/abc123def"
    drafter.mkdir(parents=True, exist_ok=True)
    (drafter / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 8}), encoding="utf-8")
    profile = {
        "name": "k26-ddtree",
        "controller": "systemd",
        "unit": "sglang-k26.service",
        "command": "python -m sglang.launch_server --port {port} {config_args}",
        "draft_model_path": str(drafter),
        "patches": patches,
    }
    args: dict[str, Any] = dict(
        out_dir=out,
        profile=profile,
        profile_text="name: k26-ddtree\ncontroller: systemd\n# as given\n",
        name="pkg",
        launches=[
            PackagedLaunch("bs8_b8_k4", "python -m sglang.launch_server --port 30000 --speculative-num-draft-tokens 8",
                         {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "hf_secret"},
                         "[Service]\nExecStart=\nExecStart=/usr/bin/python -m sglang.launch_server\n"),
            PackagedLaunch("bs8_b4_k4", "python -m sglang.launch_server --port 30000 --speculative-num-draft-tokens 4"),
        ],
        systemd_unit_text="[Unit]\nDescription=sglang\n[Service]\nExecStart=/usr/bin/false\n",
        results_dir=make_results(tmp) if not (tmp / "results").exists() else tmp / "results",
        matrix=["bs8_b4_k4", "bs8_b8_k4"],
        default_config="bs8_b8_k4",
        recommended_config="bs8_b8_k4",
        configs_run=["bs8_b4_k4", "bs8_b8_k4"],
        failed_tests=[FailedTest("suites/test_coding.py::test_pass[bs8_b4_k4]", "3/5 passed, floor 4")],
        command_line="pytest suites --ddtree-package out",
    )
    args.update(kw)
    return PackageRequest(**args)


@pytest.fixture(scope="module")
def snap_cache() -> dict[str, Any]:
    return envsnap.snapshot_env()


@pytest.fixture
def fast_env(monkeypatch: pytest.MonkeyPatch, snap_cache: dict[str, Any]) -> None:
    """Reuse one real snapshot (pip freeze costs ~1 s) in tests that are not about the env."""
    monkeypatch.setattr(writer, "snapshot_env", lambda environ=None, **kw: copy.deepcopy(snap_cache))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Path]]:
    pristine = make_site(tmp_path / "pristine")
    installed = make_site(tmp_path / "installed")
    patch_site(installed)
    yield {"tmp": tmp_path, "pristine": pristine, "installed": installed, "out": tmp_path / "out"}


def dist_spec(w: dict[str, Path], pristine: Path | None = None) -> dict[str, Any]:
    return {"distribution": "sglang", "site_packages": str(w["installed"]), "pristine": str(pristine or w["pristine"])}


def repro_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_ddtree.repro", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def file_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
