"""The documentation site builds, strictly and offline, and says what the package really offers.

MkDocs (Material theme) builds ``docs/`` with ``--strict``: a broken link or anchor, a page
missing from the nav or a nav entry without its page fails the build, and so this test. A
maintained builder checks the links and the navigation better than hand-written checks could.
The build runs with the network closed in its own process (every name lookup and every
non-loopback connection raises), so a theme feature or plugin that fetches something at build
time (social cards, the privacy plugin) fails here instead of in an offline CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Runs mkdocs' own command line with the network closed: no name lookups, loopback connections only.
_OFFLINE_MKDOCS = """
import socket, sys

def _refuse(*args, **kwargs):
    raise OSError("network access during the docs build: " + repr(args[:2]))

_connect = socket.socket.connect
def _loopback_only(sock, address):
    host = address[0] if isinstance(address, tuple) else address
    if isinstance(host, str) and (host.startswith("127.") or host in ("::1", "localhost") or host.startswith("/")):
        return _connect(sock, address)
    _refuse(address)

socket.getaddrinfo = _refuse
socket.gethostbyname = _refuse
socket.create_connection = _refuse
socket.socket.connect = _loopback_only
socket.socket.connect_ex = _loopback_only
from mkdocs.__main__ import cli
sys.argv = ["mkdocs", *sys.argv[1:]]
cli()
"""


def _build(repo_root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2; not a build warning
    return subprocess.run(
        [sys.executable, "-c", _OFFLINE_MKDOCS, "build", "--strict", "--site-dir", str(site)],
        cwd=repo_root, capture_output=True, text=True, timeout=300, env=env,
    )


@pytest.fixture(scope="module")
def built_site(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = _build(repo_root, site)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return site


def test_the_site_builds_strictly_and_offline_with_every_page(built_site: Path, repo_root: Path) -> None:
    pages = sorted(p.relative_to(repo_root / "docs") for p in (repo_root / "docs").rglob("*.md"))
    assert len(pages) >= 15, pages
    for page in pages:
        html = built_site / ("index.html" if page.name == "index.md" and page.parent == Path(".")
                             else page.with_suffix("") / "index.html")
        assert html.is_file(), f"{page} was not built to {html}"
    # the figures the pages show are in the site, and the included READMEs were included
    assert (built_site / "report.png").is_file() and (built_site / "history.png").is_file()
    internals = (built_site / "engine-internals" / "index.html").read_text()
    assert "Simulated clock" in internals and "--8&lt;--" not in internals and "--8<--" not in internals


def test_a_broken_link_fails_the_build(repo_root: Path, tmp_path: Path) -> None:
    """The strict build is what catches a broken link: prove it does, on a copy of the site."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(repo_root / "docs", copy / "docs")
    shutil.copy(repo_root / "mkdocs.yml", copy / "mkdocs.yml")
    for folder in ("pytest_ddtree/refserver", "benchmarks"):  # the two included READMEs
        (copy / folder).mkdir(parents=True)
        shutil.copy(repo_root / folder / "README.md", copy / folder / "README.md")
    page = copy / "docs" / "sandbox.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = _build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_to_pages_and_anchors_that_exist(repo_root: Path) -> None:
    """The README is not part of the site's build: its links into docs/ are checked here."""
    readme = (repo_root / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) >= 15, local
    for link in local:
        target, _, anchor = link.partition("#")
        path = repo_root / target
        assert path.is_file(), f"README links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {_github_anchor(h) for h in headings}, f"README links to {link}: no such heading"


class _Group:
    def __init__(self) -> None:
        self.options: list[str] = []

    def addoption(self, *opts: str, **attrs: Any) -> None:
        self.options.extend(o for o in opts if o.startswith("--"))


class _Parser:
    def __init__(self) -> None:
        self.group = _Group()
        self.ini: list[str] = []

    def getgroup(self, name: str, description: str = "") -> _Group:
        return self.group

    def addini(self, name: str, help: str, type: Any = None, default: Any = None) -> None:
        self.ini.append(name)


def test_the_options_reference_documents_every_option_and_ini_key(repo_root: Path) -> None:
    from pytest_ddtree import options

    parser = _Parser()
    options.add_options(parser)
    assert len(parser.group.options) >= 20 and parser.ini, (parser.group.options, parser.ini)
    page = (repo_root / "docs" / "options.md").read_text()
    section = page[page.index("## Options"):page.index("## Fixtures for a suite")]
    table = {m.group(1) for m in re.finditer(r"^\| `(--ddtree-[\w-]+)", section, re.M)}
    assert sorted(set(parser.group.options) - table) == [], "options without a row in docs/options.md"
    assert sorted(table - set(parser.group.options)) == [], "rows in docs/options.md for options that do not exist"
    missing_ini = sorted(name for name in parser.ini if f"`{name}`" not in section)
    assert not missing_ini, f"ini keys not named in docs/options.md: {missing_ini}"


def test_nothing_cites_the_private_design_notes(repo_root: Path) -> None:
    """The product's docs stand on their own: no page, comment or test cites the notes its
    authors worked from (they are not in the repository)."""
    cited = re.compile("(DESIGN|FACTS)" + r"\.md")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=repo_root, capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    suffixes = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".j2", ".sh", ".cfg", ".ini")
    offenders = [name for name in listed if name.endswith(suffixes) and (repo_root / name).is_file()
                 and cited.search((repo_root / name).read_text(errors="replace"))]
    assert not offenders, offenders
