"""What a run sees of the host: the interpreter it needs, and the package directories hidden from it."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from pytest_ddtree.sandbox import bwrap

_PKG_DIR = Path(__file__).resolve().parent


def interpreter() -> tuple[str, list[str]]:
    """The interpreter to run in the sandbox and the directories it needs to be reachable."""
    exe = os.path.realpath(sys.executable)
    prefix = os.path.dirname(os.path.dirname(exe))
    expose = []
    for path in (os.path.realpath(sys.base_prefix), prefix):
        if path not in expose and path != "/":
            expose.append(path)
    return exe, expose


#: Where packages and their data live under a prefix the view shows (``/usr``, a pyenv or
#: ``/usr/local``-like prefix, a ``venv --copies``): covered by an empty read-only tmpfs.
_PACKAGE_GLOBS = (
    "lib*/python*/site-packages", "lib*/python*/dist-packages",
    "local/lib*/python*/site-packages", "local/lib*/python*/dist-packages",
    "python*/site-packages", "python*/dist-packages",
)


def _editable_sources() -> list[str]:
    """Source directories of editable installs (PEP 610 ``direct_url.json``), which live
    outside site-packages and are not always on ``sys.path`` (import-hook editables)."""
    found: list[str] = []
    try:
        from importlib import metadata

        for dist in metadata.distributions():
            try:
                raw = dist.read_text("direct_url.json")
                info = json.loads(raw) if raw else None
            except (OSError, ValueError):
                continue
            if isinstance(info, dict) and isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable"):
                url = str(info.get("url", ""))
                if url.startswith("file://"):
                    found.append(url[len("file://"):])
    except Exception:  # noqa: BLE001 - a broken distribution must not stop the sandbox
        pass
    return found


@functools.lru_cache(maxsize=1)
def hidden_paths() -> tuple[str, ...]:
    """Directories inside the run's view that hold installed packages or this project's
    data, each covered in the run by an empty read-only tmpfs.

    The view must hold the interpreter and its standard library, not what is installed next
    to them: a reference solution, test, corpus or dataset shipped as package data (ours in
    ``pytest_ddtree/refserver/corpus``, HumanEval's ``HumanEval.jsonl.gz``) is readable
    wherever the install puts it under a prefix the view shows (a non-editable install into
    ``/usr/local``, a pyenv version, a ``venv --copies``).  Found by layout (site- and
    dist-packages under every visible prefix) and by this process (its site dirs, ``sys.path``,
    editable sources, this package and its checkout); kept when inside the view and not
    holding the interpreter or the standard library.
    """
    import glob
    import site
    import sysconfig

    exe, expose = interpreter()
    roots = [os.path.realpath(p) for p in (*bwrap.SYSTEM_DIRS, *expose) if os.path.isdir(p)]
    paths = sysconfig.get_paths()
    essential = {exe, *(os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths)}
    candidates: list[str] = []
    for root in dict.fromkeys(roots):
        for pattern in _PACKAGE_GLOBS:
            candidates += glob.glob(os.path.join(glob.escape(root), pattern))
        if root not in ("/usr", "/bin", "/sbin") and not root.startswith("/lib"):
            candidates.append(os.path.join(root, "share"))  # data_files of a prefix's packages
    candidates.append("/usr/local/share")
    try:
        candidates += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - an old virtualenv's site module
        pass
    candidates += [paths[k] for k in ("purelib", "platlib") if k in paths]
    stdlib_dirs = [os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths]
    for entry in sys.path:
        real = os.path.realpath(entry or ".")
        in_stdlib = any(real == d or real.startswith(d + os.sep) for d in stdlib_dirs)  # lib-dynload
        if os.path.isdir(real) and (not in_stdlib or real.endswith("-packages")):
            candidates.append(real)
    candidates += _editable_sources()
    candidates += [str(_PKG_DIR.parent), str(_PKG_DIR.parent.parent), os.environ.get("DDTREE_CODING_DIR", "")]

    def inside(path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip(os.sep) + os.sep)

    kept: list[str] = []
    for raw in candidates:
        if not raw:
            continue
        path = os.path.realpath(raw)
        if not os.path.isdir(path) or path in roots:
            continue
        if not any(inside(path, root) for root in roots):
            continue  # not in the view anyway
        if any(inside(e, path) for e in essential):
            continue  # the interpreter or its standard library lives there
        kept.append(path)
    result: list[str] = []
    for path in sorted(set(kept)):
        if not any(inside(path, other) for other in result):
            result.append(path)
    return tuple(result)


def interpreter_under_tmp() -> str | None:
    """The interpreter's path when it (or a directory it needs) lies under /tmp: every
    namespace tier puts a private tmpfs on /tmp, which hides it from the run."""
    exe, expose = interpreter()
    for path in (exe, *expose):
        if path == "/tmp" or path.startswith("/tmp/"):
            return exe
    return None
