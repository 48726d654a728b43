"""Reproduction packages from engines installed from source (#9.6): an editable install of a
patched git checkout (``pip install -e``, PEP 660), a from-source build (PEP 610 direct_url), and
env/ taken from the service's interpreter, not the harness's.

The editable case is a real ``pip install -e`` into a throwaway virtual environment (created
without pip; the harness's pip and setuptools reach it through a .pth file, so nothing is
downloaded and it stays fast).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pytest_ddtree.repro import envsnap, verify_package, write_package
from pytest_ddtree.repro.patches import collect_patches
from pytest_ddtree.service.profile import resolve_service_python
from tests.repro_helpers import make_request

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "0.0.1"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""
WORKER = "def verify(tree, target):\n    return target\n"
PATCHED_WORKER = "def verify(tree, target):\n    # DDTree: walk the tree, keep the longest accepted path\n    return tree.walk(target)\n"
ADDED = "def build_tree(dists, budget):\n    return sorted(dists)[:budget]\n"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


def make_source_tree(root: Path) -> Path:
    """A git checkout laid out like SGLang's (the package under python/), committed pristine."""
    pkg = root / "python" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "worker.py").write_text(WORKER)
    (root / ".gitignore").write_text("*.egg-info/\n__pycache__/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "pristine")
    return pkg


def patch_tree(pkg: Path) -> None:
    (pkg / "srt" / "worker.py").write_text(PATCHED_WORKER)
    (pkg / "srt" / "ddtree_utils.py").write_text(ADDED)


@pytest.fixture(scope="module")
def editable_service(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A patched source tree installed with ``pip install -e`` into its own interpreter."""
    if shutil.which("git") is None:
        pytest.fail("git is needed (apt-get install -y git)")
    root = tmp_path_factory.mktemp("editable")
    pkg = make_source_tree(root / "sglang-src")
    patch_tree(pkg)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "harness-tools.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # pip, setuptools, wheel
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
         "--disable-pip-version-check", "-e", str(root / "sglang-src" / "python")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {"python": python, "pkg": pkg, "site": Path(purelib), "root": root}


def test_package_from_editable_install_holds_the_patch_and_verifies(tmp_path: Path, editable_service: dict[str, Path]) -> None:
    python = editable_service["python"]
    direct_url = json.loads(next(editable_service["site"].glob("sglang-*.dist-info")).joinpath("direct_url.json").read_text())
    assert direct_url["dir_info"] == {"editable": True}  # a real PEP 610/660 editable install
    request = make_request(tmp_path, tmp_path / "out", {"distribution": "sglang"})
    # the profile names no python: the command's first word is the service's interpreter
    request.profile["command"] = f"{python} -m sglang.launch_server --port {{port}} {{config_args}}"
    report = write_package(request)
    assert report.ok, report.problems
    pkg = report.path
    assert pkg is not None
    full = pkg / "patches" / "full" / "sglang" / "srt"
    assert (full / "worker.py").read_text() == PATCHED_WORKER and (full / "ddtree_utils.py").read_text() == ADDED
    meta = json.loads((pkg / "patches" / "patches.json").read_text())
    assert {(e["target"], e["status"]) for e in meta["files"]} == {("sglang/srt/worker.py", "modified"), ("sglang/srt/ddtree_utils.py", "added")}
    assert "DDTree: walk the tree" in (pkg / "patches" / "diffs" / "sglang__srt__worker.py.diff").read_text()
    assert "sglang/__init__.py" in (pkg / "patches" / "RECORD").read_text()  # the pristine layout, for deploy checks
    env = json.loads((pkg / "env" / "environment.json").read_text())
    assert env["python"]["executable"] == str(python) and env["python"]["role"] == "the service's interpreter"
    freeze = (pkg / "env" / "pip-freeze.txt").read_text()
    assert "sglang" in freeze and "sglang-src" in freeze  # pip freeze of the service's venv names the editable checkout
    again = verify_package(pkg)
    assert again.ok, again.problems


def test_from_source_build_is_compared_with_the_checkout(tmp_path: Path) -> None:
    """``pip install ./python`` of a patched checkout: RECORD hashes the patched files, so the
    installed files are compared with the checkout's HEAD (the layout pip writes, made by hand)."""
    pkg = make_source_tree(tmp_path / "src")
    patch_tree(pkg)
    site = tmp_path / "site"
    dist_info = site / "sglang-0.0.1.dist-info"
    dist_info.mkdir(parents=True)
    rows = []
    for rel in ("sglang/__init__.py", "sglang/srt/__init__.py", "sglang/srt/worker.py", "sglang/srt/ddtree_utils.py"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pkg.parent / rel, site / rel)
        rows.append(f"{rel},,")
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.1\n\n")
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n")
    (dist_info / "direct_url.json").write_text(json.dumps({"url": (tmp_path / "src" / "python").as_uri(), "dir_info": {}}))
    ps = collect_patches({"distribution": "sglang", "site_packages": str(site)})
    assert {(f.target, f.status) for f in ps.files} == {("sglang/srt/worker.py", "modified"), ("sglang/srt/ddtree_utils.py", "added")}
    assert ps.pristine_kind == "git" and next(f for f in ps.files if f.status == "modified").pristine == WORKER.encode()


def test_service_python_and_its_env() -> None:
    assert resolve_service_python("/opt/sglang/bin/python", "anything") == "/opt/sglang/bin/python"
    assert resolve_service_python(None, "{python} -m pytest_ddtree.refserver --port {port}") == sys.executable
    assert resolve_service_python(None, "/opt/venv/bin/python3.11 -m sglang.launch_server") == "/opt/venv/bin/python3.11"
    assert resolve_service_python(None, "sglang serve --port {port}") is None  # not a Python: the harness's, with the reason
    broken = envsnap.snapshot_env({}, include_pip=False, python="/nonexistent/python")
    assert broken["python"]["executable"] == sys.executable and "cannot run" in broken["python"]["service_interpreter_error"]


def test_fingerprint_takes_the_engine_version_from_the_service_interpreter(editable_service: dict[str, Path]) -> None:
    from pytest_ddtree.service.fingerprint import local_fingerprint
    from pytest_ddtree.service.profile import parse_profile

    profile = parse_profile({"name": "src", "controller": "external", "url": "http://127.0.0.1:1", "port": 1, "config_args": {},
                             "python": str(editable_service["python"]), "hardware_profile": None})
    assert local_fingerprint(profile, {"tp_size": 8}).build["engine_version"] == "0.0.1"  # sglang of the service's venv
    assert local_fingerprint(profile, {"version": "0.5.9"}).build["engine_version"] == "0.5.9"  # the service's own word first


def test_legacy_develop_install_via_egg_link(tmp_path: Path) -> None:
    """``setup.py develop`` (what older pips ran for ``-e``): ``<site>/sglang.egg-link`` names the
    source root, whose ``sglang.egg-info`` holds the metadata (the layout setuptools writes)."""
    pkg = make_source_tree(tmp_path / "src")
    patch_tree(pkg)
    egg = pkg.parent / "sglang.egg-info"  # ignored by the checkout's .gitignore, as in real trees
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.0.1\n\n")
    (egg / "top_level.txt").write_text("sglang\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sglang.egg-link").write_text(f"{pkg.parent}\n.\n")
    ps = collect_patches({"distribution": "sglang", "site_packages": str(site)})
    assert {(f.target, f.status) for f in ps.files} == {("sglang/srt/worker.py", "modified"), ("sglang/srt/ddtree_utils.py", "added")}
    assert ps.version == "0.0.1" and ps.pristine_kind == "git" and "sglang/srt/worker.py" in (ps.record_text or "")
