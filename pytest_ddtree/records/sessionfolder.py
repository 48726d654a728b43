"""One session, one results folder: choosing and claiming it, and collecting what was measured.

Why: a results folder that several sessions append to mixes their numbers. A CI recipe with a
fixed ``--ddtree-results`` and a re-run job, or two sweeps started within the same second, used
to merge both sessions into one ``results.json``, and the bless step read every
``baseline-updates-*.jsonl`` it found, so an earlier session's numbers could overwrite a later
session's baselines. Now:

* every session has a unique id (``Settings.session_id``) stamped on each record;
* the folder is chosen once, by the main process (:func:`choose_results_dir`): a missing or empty
  ``--ddtree-results`` is used as is; one that a previous session wrote (it holds
  :data:`MARKER`, or only such session folders) gets a new subfolder named by the session id;
  any other non-empty folder is refused (a usage error) rather than written into;
* the first write claims the folder (:func:`claim_results_dir`): the marker names the session,
  and a folder claimed by another session is never written into;
* the main process takes its workers' records from xdist's ``workeroutput``
  (:class:`SessionCollector`); the JSONL files are only the crash journal, read for a worker
  that never handed its results over, and only this session's entries of them.

No pytest import: the plugin calls these from its hooks.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_ddtree.records.shapes import screen
from pytest_ddtree.records.recorder import BaselineUpdate, read_journal, time_order
from pytest_ddtree.records.words import RecordKind

MARKER = "ddtree-session.json"
"""Written into a results folder by the session that owns it: {session_id, started, pid}."""

WORKEROUTPUT_KEY = "ddtree_results"
"""The key of ``config.workeroutput`` under which a worker hands its records to the main process."""


class ResultsDirError(ValueError):
    """The results folder cannot be used by this session; the message says what to do."""


def _is_session_folder(path: Path) -> bool:
    return (path / MARKER).is_file()


def check_writable(requested: Path) -> None:
    """``--ddtree-results`` must lie in a folder this process can create files in: checked by
    creating (and removing) an empty folder in its nearest existing folder, before anything runs,
    because permissions alone do not say (root ignores them, a read-only mount does not)."""
    base = requested
    while not base.exists() and base.parent != base:
        base = base.parent
    if not base.is_dir():
        raise ResultsDirError(f"--ddtree-results {requested}: {base} exists and is not a folder; give a folder path")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ddtree-write-check-", dir=base))
    except OSError as exc:
        raise ResultsDirError(f"--ddtree-results {requested}: cannot write in {base} ({exc.strerror or exc}); "
                              "give a folder you can write to") from None


def choose_results_dir(requested: Path, session_id: str) -> Path:
    """Where this session writes, given ``--ddtree-results`` (nothing is created here but the
    write check's empty folder, at once removed)."""
    check_writable(requested)
    if not requested.exists():
        return requested
    if not requested.is_dir():
        raise ResultsDirError(f"--ddtree-results {requested}: exists and is not a folder; give a folder path")
    entries = sorted(p for p in requested.iterdir() if not p.name.startswith("."))
    if not entries:
        return requested
    if _is_session_folder(requested) or all(p.is_dir() and _is_session_folder(p) for p in entries):
        return requested / session_id
    shown = ", ".join(p.name for p in entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise ResultsDirError(
        f"--ddtree-results {requested} is not empty ({shown}) and is not a previous pytest-ddtree "
        f"session's folder (no {MARKER}); refusing to mix this session's results with other files. "
        "Give a new or empty folder, or a folder a previous session wrote (this session then gets "
        "a subfolder of its own)"
    )


def claim_results_dir(directory: Path, session_id: str) -> None:
    """Create ``directory`` and mark it as this session's; idempotent for the same session.

    The marker is linked into place (atomic, fails if present), so of two sessions racing for one
    empty folder exactly one wins; the other is told so instead of mixing its results in.
    """
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / MARKER
    payload = json.dumps({"session_id": session_id, "started": time.time(), "pid": os.getpid()}, sort_keys=True) + "\n"
    tmp = directory / f".{MARKER}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    tmp.write_text(payload, encoding="utf-8")
    try:
        os.link(tmp, marker)
    except FileExistsError:
        owner = _marker_owner(marker)
        if owner != session_id:
            raise ResultsDirError(
                f"results folder {directory} belongs to session {owner}, not to this session ({session_id}); "
                "two sessions were started on one --ddtree-results at the same moment: re-run this one"
            ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _marker_owner(marker: Path) -> str:
    try:
        return str(json.loads(marker.read_text(encoding="utf-8")).get("session_id"))
    except (OSError, ValueError, AttributeError):
        return "<unreadable marker>"


def session_of(directory: Path) -> str | None:
    """The id of the session that claimed ``directory`` (None when unclaimed)."""
    marker = directory / MARKER
    return _marker_owner(marker) if marker.is_file() else None


@dataclass
class SessionCollector:
    """The main process's view of the session's results.

    Its own recorder's entries, what each xdist worker handed over through ``workeroutput``, and
    for a worker that never did (crashed, killed) the entries of its journal in this session's
    folder that carry this session's id.
    """

    directory: Path
    session_id: str
    handed_over: dict[str, Mapping[str, object]] = field(default_factory=dict)

    def add_worker_output(self, worker: str, output: object) -> None:
        """What ``worker`` handed over (``SessionRecorder.handover``, through xdist's
        ``workeroutput``: another process's data, checked when it is read), or None if nothing."""
        if output is None:
            return
        self.handed_over[worker] = output if isinstance(output, Mapping) else {"records": output}

    def _journal(self, prefix: str, own: Iterable[Mapping[str, object]], key: str) -> list[dict[str, object]]:
        entries = [dict(e) for e in own]
        for worker, output in self.handed_over.items():
            handed = output.get(key, ())
            if not isinstance(handed, list) or not all(isinstance(e, Mapping) for e in handed):
                entries.append({"kind": RecordKind.CORRUPT_RECORD, "worker": worker,
                                "problem": f"worker {worker} handed over {key} that are not a list of objects: {handed!r:.200}"})
                continue
            entries.extend(dict(e) for e in handed)
        delivered = set(self.handed_over) | {"main"}
        for path in sorted(self.directory.glob(f"{prefix}-*.jsonl")):
            worker = path.name[len(prefix) + 1:-len(".jsonl")]
            if worker in delivered:
                continue
            # a torn last line has no session id; it can only be ours (the folder is this session's)
            entries.extend(e for e in read_journal([path]) if e.get("session") == self.session_id or e.get("kind") == RecordKind.CORRUPT_RECORD)
        return entries

    def records(self, own: Iterable[Mapping[str, object]]) -> list[dict[str, object]]:
        """Every record of this session, in time order (``own``: the main process's recorder's), each
        checked against its kind's shape (``records.screen``: a malformed one, from a worker or a
        journal, is set aside as a ``corrupt-record`` that says what is wrong)."""
        records = screen(self._journal("records", own, "records"))
        records.sort(key=time_order)
        return records

    def baseline_updates(self, own: Iterable[Mapping[str, object]]) -> list[BaselineUpdate]:
        """Every baseline proposal of this session, and nothing another session proposed."""
        return [
            BaselineUpdate(str(e["config"]), str(e["section"]), e["data"],
                           profile if isinstance(profile := e.get("hardware_profile"), str) else None)
            for e in self._journal("baseline-updates", own, "updates")
            if "section" in e and "config" in e and "data" in e
        ]
