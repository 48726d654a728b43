"""A sweep's cell records as every reader takes them: checked, and in the sweep table's order.

Why here and not in the report: the gate's session checks, the control's sequential test and the
session end read a session's cells as the report does, and a gate reading its records through the
report would be an import climbing back up the package.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pytest_ddtree.configs import name_sort_key
from pytest_ddtree.records import shapes as records_mod
from pytest_ddtree.records.shapes import RawRecord, ThroughputRecord
from pytest_ddtree.records.words import RecordKind


def normalize(records: Iterable[RawRecord]) -> list[ThroughputRecord]:
    """The throughput records, checked (``records.throughput_records``: a malformed one raises
    ``RecordError``), sorted for display. A record without a kind that names a cell is one too
    (the data of ``gates.throughput.cells.throughput_record`` alone)."""
    out = records_mod.throughput_records(
        {**r, "kind": RecordKind.THROUGHPUT} if r.get("kind") is None and _names_a_cell(r) else r for r in records)
    out.sort(key=_sort_key)
    return out


def _names_a_cell(record: RawRecord) -> bool:
    data = record.get("data")
    return "cell" in record or (isinstance(data, Mapping) and "cell" in data)


def _sort_key(rec: ThroughputRecord) -> tuple[Any, ...]:
    w = rec["workload"]
    return (name_sort_key(rec["config"]), w["context_tokens"], w["concurrency"], rec["cell"])
