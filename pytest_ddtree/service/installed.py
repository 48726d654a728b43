"""Service profiles and engine dialects that installed distributions declare: the entry point group
``pytest_ddtree.profiles``.

Why an entry point group: a team that carries its own builds (a fork's profile, its dialect for the
reference engine) ships them as a package, as pytest plugins ship through ``pytest11``, instead of
copying YAML files into every checkout. An entry point names either a folder
(``mybuilds = mypkg.profiles``: a package whose folder holds profiles, ``*.yaml``, and at most one
``dialects.yaml``), whose profiles are named by their file's stem, or one profile
(``sglang-mytree = mypkg:PROFILE``, a path to the file), named by the entry point's name.
``--ddtree-service NAME`` takes such a name where NAME is no file; the reference engine reads the
folders' ``dialects.yaml`` after the shipped one (refserver/dialects.py). Nothing here reads a
profile: a name is only resolved to its file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType

#: The entry point group a distribution declares its profiles (a folder, or one by name) in.
ENTRY_POINT_GROUP = "pytest_ddtree.profiles"
#: The file of a profile folder that holds dialects, not a profile.
DIALECTS_FILE = "dialects.yaml"


class InstalledProfileError(ValueError):
    """An installed distribution's profiles cannot be found, or a name matches none; the message
    names the distribution and its entry point, or the names there are (``known``)."""

    def __init__(self, message: str, known: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(message)
        self.known = tuple(known)


@dataclass(frozen=True)
class Installed:
    #: profile name -> (its file, the entry point that declares it)
    profiles: dict[str, tuple[Path, str]]
    #: the ``dialects.yaml`` files of the installed folders
    dialect_files: tuple[Path, ...]


@functools.lru_cache(maxsize=1)
def installed() -> Installed:
    """What the group's entry points declare, read once per process."""
    profiles: dict[str, tuple[Path, str]] = {}
    dialects: list[Path] = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        where, fix = describe(entry)
        try:
            target = entry.load()
        except Exception as exc:  # noqa: BLE001 - a third party's import can raise anything
            raise InstalledProfileError(f"{where} could not be loaded: {type(exc).__name__}: {exc}; {fix}") from None
        path = _path_of(target)
        if path is None or not (path.is_dir() or path.is_file()):
            raise InstalledProfileError(f"{where} names {type(target).__name__} {str(target)[:80]!r}: not a package "
                                        f"with a folder, nor a path to a profile or a folder that exists; {fix}")
        found = {entry.name: path} if path.is_file() else {
            p.stem: p for p in sorted(path.glob("*.yaml")) if p.name != DIALECTS_FILE}
        if path.is_dir() and (path / DIALECTS_FILE).is_file():
            dialects.append(path / DIALECTS_FILE)
        for name, file in found.items():
            if name in profiles and profiles[name][0] != file:
                raise InstalledProfileError(f"profile {name!r} is declared twice: by {profiles[name][1]} and by {where}; {fix}")
            profiles[name] = (file, where)
    return Installed(profiles, tuple(dict.fromkeys(dialects)))


def describe(entry: metadata.EntryPoint) -> tuple[str, str]:
    """(where, what to do): the entry point and its distribution, as an error names them, and how
    the user gets rid of a broken one (the controllers' group words its errors with this too)."""
    dist = f"distribution {entry.dist.name} {entry.dist.version}" if entry.dist is not None else "an unnamed distribution"
    where = f"entry point '{entry.name} = {entry.value}' of {dist} (group {entry.group})"
    fix = "fix that distribution " + (f"or uninstall it (pip uninstall {entry.dist.name})" if entry.dist is not None else "or uninstall it")
    return where, fix


def _path_of(target: object) -> Path | None:
    if isinstance(target, ModuleType):
        file = getattr(target, "__file__", None)
        return Path(file).parent if file else None
    if isinstance(target, (str, Path)):
        return Path(target)
    return None


def profile_path(name: str) -> Path:
    """The file of the installed profile ``name``; InstalledProfileError (its ``known``: the names
    there are, for the caller's did-you-mean) where none is."""
    profiles = installed().profiles
    if name in profiles:
        return profiles[name][0]
    known = sorted(profiles)
    listed = f"installed profiles (entry point group {ENTRY_POINT_GROUP}): {', '.join(known)}" if known else (
        f"no installed distribution declares a profile (entry point group {ENTRY_POINT_GROUP})")
    raise InstalledProfileError(f"no profile file or installed profile {name!r}; {listed}", known)
