"""The shapes of a launch's records: what the service manager and its controller record of each
launch, and what its behaviour proved (``records/shapes.py`` maps ``RecordKind.LAUNCH`` to
``LaunchData`` and checks it with the other kinds)."""

from __future__ import annotations

from typing import TypedDict


class SlurmJobEntry(TypedDict, total=False):
    """A launch's Slurm job (``service.slurm``): its name, script and Slurm's version at submission,
    its id and log once queued, its node and endpoint once it runs, its end as Slurm said it."""

    job_name: str
    script: str
    version: str
    job_id: str
    output: str
    node: str
    address: str
    port: int
    queued_s: float
    state: str
    exit_code: str
    reason: str


class ProbeData(TypedDict):
    """What the copy probe saw (``proof.ProbeResult.as_dict``)."""

    bound: int | None
    histogram: list[int]
    requests: int
    reached: bool
    errors: list[str]
    failed_requests: list[str]


class FieldEvidenceData(TypedDict):
    """One config field's strongest evidence (``proof.FieldEvidence.as_dict``)."""

    status: str
    detail: str


class ProofData(TypedDict):
    """What a launch's behaviour proved about its config (``proof.Proof.as_dict``)."""

    fields: dict[str, FieldEvidenceData]
    failures: list[str]
    notes: list[str]
    probe: ProbeData | None
    startup_lines: list[str]
    spec_num_draft_tokens: float | None


class NoEffectFinding(TypedDict):
    """A config field that showed no effect on this build (``proof.no_effect``): results.json's
    ``no_effect`` and the applied-evidence table's note."""

    field: str
    configs: list[str]
    cells: list[str]
    message: str


class _ControllerKeys(TypedDict, total=False):
    # the process controller's
    pid: int | None
    log: str | None
    # the systemd controller's
    unit: str
    dropin_path: str
    dropin: str | None
    # the command controller's
    templates: dict[str, str]
    commands: dict[str, str]
    # the slurm controller's
    slurm: SlurmJobEntry
    login_host: str


class ControllerEntry(_ControllerKeys, total=False):
    """What a controller adds to its launch's entry (``Controller.launch_record``): its own keys,
    and the ``host`` it drove on a remote host (systemd, command)."""

    host: str


class _LaunchRequired(TypedDict):
    config: str
    host: str | None
    instance: int
    controller: str
    command: str | None
    env: dict[str, str]
    port: int | None
    url: str
    started_at: float
    pid_of_harness: int
    outcome: str  # starting, ready, failed: ..., died: ...


class LaunchEntry(_LaunchRequired, _ControllerKeys, total=False):
    """One launch of the service as ``service.manager`` records it, filled in as it goes: what the
    controller adds (a ``ControllerEntry``), then the timings and evidence once it is ready."""

    ready_s: float
    purpose: str  # what it was launched for (``records.bill.PURPOSES``)
    also_for: list[str]  # the other purposes that measured on it (the control on the lossless reference's launch)
    engine_version: str | None  # /server_info's version (the report's environment section)
    applied_evidence: ProofData


class LaunchData(TypedDict):
    """``RecordKind.LAUNCH``: one launch of the service as the manager recorded it (its command,
    outcome, timings and applied evidence: ``service.manager``'s launch record)."""

    launch: LaunchEntry
