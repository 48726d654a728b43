"""The session's GPU bill: its launches and measured seconds, by what each was for.

Why: on a GPU box a restart costs minutes (615 s on the campaign's 8-GPU node) and the control's
cells run non-speculatively, slower than the config's own, so the launches and repeats the gate adds
of its own (the control, relaunches of flagged configs, confirmations of flagged cells) can cost more
than the configs it judges. A team choosing its settings needs to see what a verdict cost and which
part bought what. The bill is read from the records the session keeps anyway (each launch's
``purpose`` and ``ready_s``, each repeat's measured ``duration``), so it is what happened; and
:func:`predict` says before a run how many launches a profile's settings will take.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_ddtree.records.shapes import RawRecord
from pytest_ddtree.records.words import RecordKind

CONFIGS = "configs"
CONTROL = "control"
LOSSLESS_REFERENCE = "lossless reference"
CONFIRMATIONS = "confirmations"
RELAUNCHES = "relaunches"
RATE_PROBES = "rate probes"
#: A process that measured this many configs measures the control at its end too (``launches.wants_end_launch``).
END_LAUNCH_MIN_CONFIGS = 3
#: Every purpose, in the order the bill lists them.
PURPOSES = (CONFIGS, CONTROL, LOSSLESS_REFERENCE, CONFIRMATIONS, RELAUNCHES, RATE_PROBES)

#: Which purpose a measured repeat's kind pays for (a repeat of a rate probe's cell, named
#: ``<workload>@<rate>``, pays for rate probes unless it is a relaunch's).
_REPEAT_PURPOSE = {
    RecordKind.THROUGHPUT_REPEAT: CONFIGS,
    RecordKind.THROUGHPUT_CONFIRM_REPEAT: CONFIRMATIONS,
    RecordKind.THROUGHPUT_CONTROL_REPEAT: CONTROL,
    RecordKind.THROUGHPUT_RELAUNCH_REPEAT: RELAUNCHES,
}


class Launcher(Protocol):
    """What :func:`launching_for` sets: the purpose the next launches are recorded under."""

    purpose: str | None


@contextlib.contextmanager
def launching_for(manager: Launcher, purpose: str) -> Iterator[None]:
    """Launches made inside are recorded as ``purpose``'s (the control's, a relaunch's); outside,
    a config's launch is the config's and the non-speculative one the lossless reference's."""
    before, manager.purpose = manager.purpose, purpose
    try:
        yield
    finally:
        manager.purpose = before


@dataclass
class Item:
    """What one purpose cost: its launches (and their seconds from start to ready), its measured
    repeats (and the seconds of their measured loops)."""

    launches: int = 0
    restart_s: float = 0.0
    repeats: int = 0
    measured_s: float = 0.0
    shared: int = 0  # launches of another purpose this one measured on (no restart of its own)

    def as_dict(self) -> dict[str, Any]:
        return {"launches": self.launches, "restart_s": round(self.restart_s, 3), "repeats": self.repeats,
                "measured_s": round(self.measured_s, 3), "shared_launches": self.shared}


@dataclass
class Bill:
    """A session's bill (:func:`session_bill`)."""

    items: dict[str, Item] = field(default_factory=lambda: {p: Item() for p in PURPOSES})

    @property
    def launches(self) -> int:
        return sum(i.launches for i in self.items.values())

    @property
    def restart_s(self) -> float:
        return sum(i.restart_s for i in self.items.values())

    @property
    def measured_s(self) -> float:
        return sum(i.measured_s for i in self.items.values())

    def as_dict(self) -> dict[str, Any]:
        """results.json's ``bill``."""
        return {"launches": self.launches, "restart_s": round(self.restart_s, 3), "measured_s": round(self.measured_s, 3),
                "gpu_s": round(self.restart_s + self.measured_s, 3),
                "by_purpose": {p: i.as_dict() for p, i in self.items.items()}}

    def text(self) -> str:
        """The terminal summary's "ddtree bill" section."""
        lines = [f"{self.launches} launch{'' if self.launches == 1 else 'es'} ({_s(self.restart_s)} from start to ready) "
                 f"and {_s(self.measured_s)} measured: {_s(self.restart_s + self.measured_s)} of the service's time"]
        for purpose, item in self.items.items():
            if not (item.launches or item.repeats or item.shared or item.measured_s):
                continue
            parts = [f"{item.launches} launch{'' if item.launches == 1 else 'es'} ({_s(item.restart_s)})"] if item.launches else []
            if item.shared:
                parts.append(f"on {item.shared} launch{'' if item.shared == 1 else 'es'} of another purpose")
            if item.repeats:
                parts.append(f"{item.repeats} repeat{'' if item.repeats == 1 else 's'} ({_s(item.measured_s)})")
            elif item.measured_s:
                parts.append(f"{_s(item.measured_s)} measured")
            lines.append(f"  {purpose}: {', '.join(parts)}")
        return "\n".join(lines)


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 600 else f"{seconds / 3600:.2f} h"


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0.0


def launch_purpose(entry: Mapping[str, object]) -> str:
    """The purpose a launch was recorded under (a record without one: its config's, or the lossless
    reference's for the non-speculative launch)."""
    purpose = entry.get("purpose")
    if isinstance(purpose, str) and purpose in PURPOSES:
        return purpose
    return LOSSLESS_REFERENCE if entry.get("config") == "lossless-reference" else CONFIGS


def repeat_purpose(record: RawRecord) -> str | None:
    """The purpose a measured repeat pays for (None: not a repeat)."""
    kind = record.get("kind")
    purpose = next((p for k, p in _REPEAT_PURPOSE.items() if k == kind), None)
    if purpose == CONFIGS and "@" in str(record.get("cell") or ""):
        return RATE_PROBES
    return purpose


def session_bill(records: Iterable[RawRecord]) -> Bill:
    """The bill of a session's records: each launch by its purpose, each purpose's launches it only
    shared, each repeat's measured loop by its purpose, the lossless reference's generation."""
    bill = Bill()
    for record in records:
        kind = record.get("kind")
        if kind == RecordKind.LAUNCH:
            entry = record.get("launch")
            if not isinstance(entry, Mapping):
                continue
            item = bill.items[launch_purpose(entry)]
            item.launches += 1
            item.restart_s += _number(entry.get("ready_s"))
            also = entry.get("also_for")
            for other in also if isinstance(also, list) else []:
                if other in bill.items:
                    bill.items[other].shared += 1
        elif kind == RecordKind.LOSSLESS_REFERENCE:
            bill.items[LOSSLESS_REFERENCE].measured_s += _number(record.get("measured_s"))
        else:
            purpose = repeat_purpose(record)
            metrics = record.get("metrics")
            if purpose is not None:
                bill.items[purpose].repeats += 1
                bill.items[purpose].measured_s += _number(metrics.get("duration")) if isinstance(metrics, Mapping) else 0.0
    return bill


@dataclass(frozen=True)
class Plan:
    """What a profile's settings will launch in a session (:func:`predict`)."""

    processes: int
    configs: int
    control: int  # the control's launches at the start and end of each process
    control_most: int  # with the launch policy's further ones at its most
    lossless_reference: int
    cells: int
    repeats: int
    control_cells: int = 0  # the cells of each launch of the control
    judged: bool = True  # False under --ddtree-measure-only: nothing is flagged, so nothing is relaunched or confirmed

    @property
    def launches(self) -> int:
        return self.configs + self.control + self.lossless_reference

    def text(self) -> str:
        parts = [f"{self.configs} config{'' if self.configs == 1 else 's'}"]
        if self.control:
            parts.append(f"{self.control} control" + (f" (up to {self.control_most} while the uniform shift is "
                                                      "inconclusive)" if self.control_most > self.control else ""))
        if self.lossless_reference:
            parts.append(f"{self.lossless_reference} lossless reference" + (" (the control's first launch measures on it)"
                                                                            if self.control else ""))
        repeats = f"{self.cells} throughput cell{'' if self.cells == 1 else 's'} x {self.repeats} repeats"
        control = f" ({self.control_cells} on each of the control's)" if self.control_most else ""
        tail = ("; relaunches of flagged configs and confirmations of flagged cells come on top (the bill at the session "
                "end says what they took)") if self.judged else " (--ddtree-measure-only: no control, no lossless reference, no confirmation)"
        return (f"this session will launch {self.launches} time{'' if self.launches == 1 else 's'}: {', '.join(parts)}; measuring {repeats} on each "
                f"launch of a config{control}{tail}")


def predict(*, configs: int, processes: int, control_launches: int, control_max_launches: int, control: bool,
            lossless_reference: bool, shared: bool, cells: int, repeats: int, end_launch_min_configs: int,
            control_min_configs: int = 1, control_cells: int | None = None, judged: bool = True) -> Plan:
    """How many launches a session of ``configs`` over ``processes`` processes takes: each config once;
    in each process the control's start launches, its end launches where the process measures
    ``end_launch_min_configs`` configs or more (``launches.launches_at``), none in a process of fewer than
    ``control_min_configs``; the lossless reference once a process, the control's first launch measured on it where it ``shared`` the lossless_args launch
    (one fewer of the control's); ``judged`` False: a --ddtree-measure-only session, which launches neither."""
    if not judged:
        control = lossless_reference = False
    processes = max(1, min(processes, configs)) if configs else 0
    start, end = (control_launches + 1) // 2, control_launches // 2
    share = [configs // processes + (1 if i < configs % processes else 0) for i in range(processes)]
    measured = [n for n in share if control and n >= control_min_configs]  # the processes that measure a control
    control_n = sum(start + (end if n >= end_launch_min_configs else 0) for n in measured)
    most = sum(max(control_max_launches, start + (end if n >= end_launch_min_configs else 0)) for n in measured)
    reference = processes if lossless_reference else 0
    if lossless_reference and shared:
        control_n, most = control_n - len(measured), most - len(measured)
    return Plan(processes, configs, control_n, most, reference, cells, repeats, min(cells, control_cells or cells), judged)
