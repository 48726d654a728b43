"""The baseline store: ``baselines/<hardware-profile>/<config>.yaml``.

A baseline only means something on the hardware it was measured on, so the first folder level is
a hardware fingerprint (see ``fingerprint.py``). Inside a file each gate owns one section
(``metrics`` for throughput, ``coding`` for the coding gate); golden transcripts for the lossless
gate live in ``golden/``. Files are written atomically with sorted keys so an update is a small,
reviewable YAML diff, and a cross-process lock keeps concurrent writers from interleaving.
"""

from __future__ import annotations

import fcntl
import shlex
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import yaml

from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.records.recorder import BaselineUpdate
from pytest_ddtree.records.words import Word
from pytest_ddtree.yamlfile import YAMLFileError, read_yaml

if TYPE_CHECKING:
    from pytest_ddtree.options import Settings
    from pytest_ddtree.service.fingerprint import HardwareProfile

SCHEMA_VERSION = 1
#: The command that (re)creates baselines, where a store is not told its session's own.
CREATE_HINT = "pytest suites --ddtree-update-baselines"


class BaselineError(RuntimeError):
    """A baseline file exists but cannot be used; the message names the file and the fix."""


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """safe_dump's dumper, which also writes the vocabulary's words (``str`` enums) as the plain
    strings they are: SafeDumper knows only exact types, and a baseline must not fail to save
    because a status reached it as ``Status.PASS`` rather than ``"pass"``. libyaml's emitter where
    PyYAML has it: a sweep writes a file per config, and the pure-Python emitter was most of a
    bless's own time; it writes the same bytes for a baseline (tests/test_baselines_gate.py)."""


_Dumper.add_multi_representer(Word, lambda dumper, word: dumper.represent_str(str(word)))


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=100)


def write_yaml_atomic(path: Path, data: Any, header: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, header + dump_yaml(data))


def read_yaml_file(path: Path, what: str, fix: str) -> Any:
    """Parse a YAML file or raise BaselineError naming the file, the line and the fix."""
    try:
        return read_yaml(path)[0]
    except YAMLFileError as exc:
        if not exc.syntax:
            raise BaselineError(f"cannot read {what} {path}: {exc.problem}") from None
        raise BaselineError(f"corrupt {what} {path}: YAML error{exc.location}: {exc.problem}. {fix}") from None


@dataclass(frozen=True)
class BaselineStore:
    """The store root plus the hardware profile this session measures on."""

    root: Path
    hardware_profile: str
    update_mode: bool = False
    create_hint: str = CREATE_HINT
    #: The fingerprint the session took of its service (a fleet host's GPUs from that host): what a
    #: bless records as the setup, and what a judged cell compares with the setup it was blessed on.
    fingerprint: HardwareProfile | None = field(default=None, compare=False)
    #: The folder the older layout (keyed by the build too: ``fingerprint.legacy_name``) gave this
    #: setup: read where this layout's folder has no file yet, never written.
    legacy_profile: str | None = None

    @property
    def directory(self) -> Path:
        return self.root / self.hardware_profile

    @property
    def read_directory(self) -> Path:
        """The folder baselines are read from: this layout's, else the older layout's (while only it exists)."""
        if self.directory.is_dir() or self.legacy_profile is None or not (self.root / self.legacy_profile).is_dir():
            return self.directory
        return self.root / self.legacy_profile

    def path_for(self, config_name: str) -> Path:
        """Where ``config_name``'s baseline is written (and read, once it exists)."""
        return self.directory / f"{config_name}.yaml"

    def read_path(self, config_name: str) -> Path:
        """Where ``config_name``'s baseline is read: this layout's file, else the older layout's."""
        path = self.path_for(config_name)
        if path.exists() or self.legacy_profile is None:
            return path
        legacy = self.root / self.legacy_profile / f"{config_name}.yaml"
        return legacy if legacy.exists() else path

    def legacy_note(self, config_name: str) -> str | None:
        """Said where ``config_name``'s baseline is read from the older layout's folder."""
        path = self.read_path(config_name)
        if path == self.path_for(config_name):
            return None
        return (f"baseline read from {path}, the folder of the older layout (named by the engine version and "
                f"keyed by the drafter too); the next bless writes {self.path_for(config_name)} (or git mv the folder "
                f"to {self.directory})")

    def golden_dir(self) -> Path:
        """Where golden transcripts are written (and read, once they exist)."""
        return self.directory / "golden"

    def golden_read_dir(self) -> Path:
        """Where golden transcripts are read: this layout's folder, else the older layout's."""
        golden = self.golden_dir()
        if golden.exists() or self.legacy_profile is None:
            return golden
        legacy = self.root / self.legacy_profile / "golden"
        return legacy if legacy.exists() else golden

    def create_command(self, config_name: str) -> str:
        return f"{self.create_hint} --ddtree-config={shlex.quote(config_name)}"

    def load(self, config_name: str) -> dict[str, Any] | None:
        """The parsed baseline file (the older layout's where this one has none yet), or None when
        there is none yet."""
        path = self.read_path(config_name)
        if not path.exists():
            return None
        fix = f"Fix or delete it, then re-create it with: {self.create_command(config_name)}"
        data = read_yaml_file(path, "baseline", fix)
        if not isinstance(data, dict):
            raise BaselineError(f"corrupt baseline {path}: expected a mapping at the top level, got {type(data).__name__}. {fix}")
        version = data.get("schema", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise BaselineError(f"baseline {path} has schema {version!r}, this pytest-ddtree reads {SCHEMA_VERSION}. {fix}")
        return data

    def section(self, config_name: str, section: str) -> Any:
        data = self.load(config_name)
        return None if data is None else data.get(section)

    def apply_updates(self, updates: Iterable[BaselineUpdate]) -> list[Path]:
        """Merge section updates into their files (main process only). Returns the files written."""
        by_config: dict[str, list[BaselineUpdate]] = {}
        for update in updates:
            by_config.setdefault(update.config, []).append(update)
        written: list[Path] = []
        with _locked(self.directory):
            for config_name, config_updates in sorted(by_config.items()):
                path = self.path_for(config_name)
                current = self.load(config_name) if self.read_path(config_name).exists() else None
                data: dict[str, Any] = dict(current or {})
                data["schema"] = SCHEMA_VERSION
                data["config"] = config_name
                data["hardware_profile"] = self.hardware_profile
                for update in config_updates:
                    existing = data.get(update.section)
                    if isinstance(existing, dict) and isinstance(update.data, dict):
                        merged = dict(existing)
                        merged.update(update.data)
                        data[update.section] = merged
                    else:
                        data[update.section] = update.data
                header = (
                    f"# Baseline for {config_name} on {self.hardware_profile}.\n"
                    f"# Written by {self.create_hint}; review the diff before committing.\n"
                )
                write_yaml_atomic(path, data, header)
                written.append(path)
        return written


def baseline_store(settings: Settings, hardware_profile: str, *, create_hint: str = CREATE_HINT,
                   fingerprint: HardwareProfile | None = None, legacy_profile: str | None = None) -> BaselineStore:
    """A session's store for one hardware profile: the one place the settings become a store, so
    the store the gates read and the stores the session end writes through take their folder
    (``--ddtree-baselines``) and their bless mode (``--ddtree-update-baselines``) alike."""
    return BaselineStore(root=settings.baselines, hardware_profile=hardware_profile,
                         update_mode=settings.update_baselines, create_hint=create_hint,
                         fingerprint=fingerprint, legacy_profile=legacy_profile)
