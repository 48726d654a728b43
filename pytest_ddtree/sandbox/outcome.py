"""What one sandboxed run gives back: its verdict, message, captured output and the facts of the run."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    """Outcome of one problem.  ``str`` subclass so it serializes as its value."""

    PASSED = "passed"
    FAILED = "failed"  # an assertion of the tests failed
    ERROR = "error"  # an exception, a crash, a flood of output, a missing entry point
    TIMEOUT = "timeout"  # wall-clock or CPU limit
    NO_CODE = "no_code"  # nothing to run was extracted from the answer


@dataclass
class RunResult:
    verdict: Verdict
    message: str = ""
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    returncode: int | None = None
    tier: str = ""
    uid: int | None = None
    workdir: str = ""
    limits: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    cleanup_error: str | None = None  # the work dir could not be removed (logged, never a verdict)

