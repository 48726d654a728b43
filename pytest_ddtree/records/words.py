"""The words a session's records and verdicts are spelled with: record kinds and status words.

Why one module: every writer (the suites, the session, the control, the adaptive sweep) and every
reader (the report, the HTML report, the history, the repro kit) spells ``"throughput"``,
``"launch"`` or ``"regression"``; each spelling its own, a typo or a rename would split them
silently. Here each word is defined once, as a member of a ``str`` enum: a member *is* its string (``RecordKind.LAUNCH
== "launch"``, same hash, JSON writes ``"launch"``), so the records on disk and ``results.json``
stay byte-identical, and records read back from JSON (plain strings) compare equal to the members.
``tests/test_codebase.py`` fails on a kind spelled as a bare string outside this module.

The shapes of the records are TypedDicts in ``records.py``, which also checks a record read back
from another process or a file against its shape.
"""

from __future__ import annotations

import enum
from typing import Literal


class Word(str, enum.Enum):
    """A ``str`` enum whose ``str()`` and ``format()`` are its value (``enum.StrEnum`` of Python
    3.11, which 3.10 lacks): f-strings, Jinja templates and tables print ``launch``, not
    ``RecordKind.LAUNCH``."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return str(self.value).__format__(format_spec)


class RecordKind(Word):
    """The ``kind`` of a record (``SessionRecorder.record(kind, config, data)``)."""

    #: One measured throughput cell with its verdict (the throughput suite).
    THROUGHPUT = "throughput"
    #: One repeat of a throughput cell (the samples behind a cell's median).
    THROUGHPUT_REPEAT = "throughput-repeat"
    #: One repeat of a flagged cell's confirmation run.
    THROUGHPUT_CONFIRM_REPEAT = "throughput-confirm-repeat"
    #: One measured cell of the throughput control (config ``control``).
    THROUGHPUT_CONTROL = "throughput-control"
    #: One repeat of a control cell.
    THROUGHPUT_CONTROL_REPEAT = "throughput-control-repeat"
    #: No control could be measured this session; ``reason`` says why.
    THROUGHPUT_CONTROL_UNAVAILABLE = "throughput-control-unavailable"
    #: One cell of a flagged config's relaunch, with its verdict (``throughput.relaunch_flagged``),
    #: or the reason the relaunch failed.
    THROUGHPUT_RELAUNCH = "throughput-relaunch"
    #: One repeat of a relaunched cell.
    THROUGHPUT_RELAUNCH_REPEAT = "throughput-relaunch-repeat"
    #: The coding gate's result of one config.
    CODING = "coding"
    #: The lossless gate's result of one config.
    LOSSLESS = "lossless"
    #: The lossless gate's reference (its command and the floor it measured).
    LOSSLESS_REFERENCE = "lossless-reference"
    #: The health check of one config.
    HEALTH = "health"
    #: One launch of the service (command, outcome, applied evidence).
    LAUNCH = "launch"
    #: The environment of one host (its systemd unit, packages, GPU).
    HOST_ENV = "host-env"
    #: One run of the profile's calibration probe (its figures, or why there are none).
    CALIBRATION = "calibration"
    #: The outcome of the adaptive sweep.
    ADAPTIVE_SWEEP = "adaptive-sweep"
    #: The highest request rate one config sustains under the session's SLO, and every rate probed.
    SUSTAINABLE_RATE = "sustainable-rate"
    #: A torn journal line (a killed process), kept so that the loss is visible.
    CORRUPT_RECORD = "corrupt-record"


#: Every record kind of the throughput gate; the report's ``records`` section holds the others.
#: (Tuples, not sets: a value read from a file may be unhashable, and ``in`` must still answer.)
THROUGHPUT_KINDS = (RecordKind.THROUGHPUT, RecordKind.THROUGHPUT_REPEAT, RecordKind.THROUGHPUT_CONFIRM_REPEAT,
                    RecordKind.THROUGHPUT_CONTROL, RecordKind.THROUGHPUT_CONTROL_REPEAT,
                    RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE, RecordKind.THROUGHPUT_RELAUNCH,
                    RecordKind.THROUGHPUT_RELAUNCH_REPEAT)
#: The throughput control's kinds (its cells, their repeats, and why there was none).
CONTROL_KINDS = (RecordKind.THROUGHPUT_CONTROL, RecordKind.THROUGHPUT_CONTROL_REPEAT, RecordKind.THROUGHPUT_CONTROL_UNAVAILABLE)


class Status(Word):
    """Every status word of the harness, defined once.

    Four vocabularies share it: a cell's measurement (``MeasurementStatus``: valid,
    inconclusive, invalid), the gate's verdict on a cell or metric (``Verdict``), what a cell's
    test does (``GateDecision``) and the HTML report's result of a gate (``GateStatus``); the
    ``Literal`` types below say which words each may use. No module keeps a second name for a
    word (tests/test_words.py).
    """

    #: The measurement can be judged.
    VALID = "valid"
    #: Too noisy, starved or short to judge either way.
    INCONCLUSIVE = "inconclusive"
    #: The measurement is broken (errors, wrong token counts): nothing can be judged.
    INVALID = "invalid"
    #: Within tolerance of the baseline.
    PASS = "pass"
    #: Better than the baseline beyond tolerance.
    IMPROVED = "improved"
    #: Beyond tolerance in the first pass; waits for its confirmation run.
    FLAGGED = "flagged"
    #: Worse than the baseline beyond tolerance (confirmed).
    REGRESSION = "regression"
    #: No baseline for the cell.
    MISSING = "missing"
    #: A baseline with fewer samples than the gate needs: reported, not trusted.
    THIN = "thin"
    #: A metric measured now, absent from the baseline: reported.
    NEW = "new"
    #: A metric gated in the baseline and not produced by the run: fails.
    METRIC_MISSING = "metric-missing"
    #: The cell was blessed this session (update mode): the table shows what was written.
    UPDATED = "updated"
    #: A throughput row the adaptive sweep predicted instead of measuring: never gated, never a baseline.
    PREDICTED = "predicted"
    #: A throughput cell of a --ddtree-measure-only session: measured and reported, never judged or blessed.
    MEASURED = "measured"
    #: The HTML report's overall while a --ddtree-measure-only session runs and nothing has failed.
    MEASURING = "measuring"
    #: A gate of the HTML report that failed.
    FAIL = "fail"
    #: A gate of the HTML report with no record.
    NOT_MEASURED = "not measured"
    #: A gate of the HTML report whose session is still running.
    PENDING = "pending"
    #: A cell's test skipped by the gate (inconclusive, not judged either way).
    SKIP = "skip"
    #: A cell's test passed with warnings (no trusted baseline yet, a metric the baseline lacks).
    WARN = "warn"


#: A cell's measurement status (``stats.RepeatPolicy.status``, ``measurement_status`` in records).
MeasurementStatus = Literal[Status.VALID, Status.INCONCLUSIVE, Status.INVALID]
#: The gate's verdict on a metric or a cell (``status`` in throughput records).
Verdict = Literal[Status.PASS, Status.IMPROVED, Status.FLAGGED, Status.REGRESSION, Status.INCONCLUSIVE,
                  Status.INVALID, Status.MISSING, Status.THIN, Status.NEW, Status.METRIC_MISSING, Status.UPDATED,
                  Status.PREDICTED, Status.MEASURED]
#: What a throughput cell's test does (``cells.judge_cell``, ``rate_gate.judge_rate``): pass,
#: fail, skip (inconclusive), or pass with warnings.
GateDecision = Literal[Status.PASS, Status.FAIL, Status.SKIP, Status.WARN]
#: A gate's result on the HTML report.
GateStatus = Literal[Status.PASS, Status.FAIL, Status.INCONCLUSIVE, Status.INVALID, Status.NOT_MEASURED, Status.PENDING,
                     Status.MEASURED]

#: Verdicts that make a throughput cell need attention (the report lists them with their reasons).
ATTENTION = (Status.REGRESSION, Status.INVALID, Status.INCONCLUSIVE, Status.MISSING, Status.THIN, Status.METRIC_MISSING)
