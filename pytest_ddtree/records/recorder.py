"""The session's results: kept in memory, journaled as they are measured, merged once at the end.

Every gate writes through one SessionRecorder. Each record is kept in memory and also appended
as one JSON line, flushed the moment it exists (``records-<worker>.jsonl``), so a crash, a Ctrl-C
or a killed CI job loses nothing already measured. Under pytest-xdist each worker hands its
records to the main process through ``workeroutput`` when it finishes; its journal is read only if
it never did (see ``sessionfolder.SessionCollector``). Every entry carries the session id, and the
folder belongs to one session, so two sessions never mix. Baseline updates travel the same way
(``baseline-updates-<worker>.jsonl``) and only the main process applies them, which is how xdist
workers can never corrupt a baseline.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.records.shapes import RawRecord, RecordData, RecordEnvelope
from pytest_ddtree.records.words import RecordKind

RECORDS_GLOB = "records-*.jsonl"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if hasattr(value, "name") and hasattr(value, "block_size"):  # DDTreeConfig
        return value.name
    raise TypeError(f"cannot record {type(value).__name__} as JSON")


def dumps(value: Any) -> str:
    """Deterministic JSON (sorted keys) so result files diff cleanly."""
    return json.dumps(value, sort_keys=True, default=_json_default)


class SessionRecorder:
    """Appends records for one process (the main process or one xdist worker)."""

    def __init__(self, directory: Path, worker: str = "main", session_id: str = "") -> None:
        self.directory = directory
        self.worker = worker
        self.session_id = session_id
        self.records: list[dict[str, object]] = []  # of every kind: read them through records.py's views
        self.updates: list[dict[str, object]] = []
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self.records_path = directory / f"records-{worker}.jsonl"
        self.updates_path = directory / f"baseline-updates-{worker}.jsonl"
        # Set once the session knows which hardware it measures on (first service start); the
        # main process may never start a service itself, so every proposal carries it.
        self.hardware_profile: str | None = None
        # The host this process's service runs on (a fleet pool), stamped on every record so the
        # results say which host measured what.
        self.host: str | None = None

    def _append(self, path: Path, entry: Mapping[str, object], memory: list[dict[str, object]]) -> None:
        line = dumps({**entry, "session": self.session_id}) + "\n"
        with self._lock, open(path, "a", encoding="utf-8") as handle:
            memory.append(json.loads(line))  # plain JSON types: what workeroutput can carry
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def record(self, kind: RecordKind, config: str | None, data: RecordData) -> None:
        """Append one measurement/verdict now (``data``'s keys, of ``kind``'s shape in records.py,
        go beside the envelope's)."""
        envelope: RecordEnvelope = {"kind": kind, "config": config, "worker": self.worker, "time": time.time()}
        entry: dict[str, object] = {**envelope, **data}
        if self.host is not None:
            entry.setdefault("host", self.host)
        self._append(self.records_path, entry, self.records)

    def propose_baseline(self, config: str, section: str, data: Any) -> None:
        """Queue a baseline section update; the main process applies it at session end (update mode only)."""
        entry = {"config": config, "section": section, "data": data, "worker": self.worker, "hardware_profile": self.hardware_profile}
        self._append(self.updates_path, entry, self.updates)

    def handover(self) -> dict[str, list[dict[str, object]]]:
        """What an xdist worker gives the main process (``workeroutput``) when it finishes: its
        ``records`` and its baseline ``updates`` (the main process checks both: ``sessionfolder``)."""
        with self._lock:
            return {"records": list(self.records), "updates": list(self.updates)}


@dataclass(frozen=True)
class BaselineUpdate:
    config: str
    section: str
    data: Any
    hardware_profile: str | None = None


def read_journal(paths: Iterable[Path]) -> list[dict[str, object]]:
    """The entries of journal files, as they are (``records.screen`` checks records)."""
    entries: list[dict[str, object]] = []
    for path in sorted(paths):
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    entries.append(json.loads(line))
                except json.JSONDecodeError:
                    # A torn last line from a killed process: keep everything before it.
                    entries.append({"kind": RecordKind.CORRUPT_RECORD, "file": path.name, "line": number})
    return entries


def time_order(record: RawRecord) -> tuple[float, str]:
    """Records sort by their time, then their worker (a record without them first)."""
    when, worker = record.get("time"), record.get("worker")
    return (float(when) if isinstance(when, (int, float)) else 0.0, worker if isinstance(worker, str) else "")


def read_records(directory: Path) -> list[dict[str, object]]:
    """Every journaled record in a session's folder, in time order, checked (``records.screen``: a
    malformed one is set aside as a ``corrupt-record``). A folder holds one session; the
    main process's own merge uses ``sessionfolder.SessionCollector`` instead."""
    from pytest_ddtree.records.shapes import screen

    records = screen(read_journal(directory.glob(RECORDS_GLOB)))
    records.sort(key=time_order)
    return records


def write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, sort_keys=True, indent=2, default=_json_default) + "\n")
