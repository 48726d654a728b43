"""The calibration probe's run: a profile's ``calibration_command`` on the service's host, its answer read.

Why: a session's numbers carry the day it ran on (clocks, thermals, the host's load), and that day
is common to every series of the session, the control's too, so across sessions a 3% slower build
hides in a 2% day-to-day spread (docs/benchmarks.md, "A whole build slower, the control
included"). A fixed workload that the SGLang build cannot change, run on the service's host while
no server of the session holds the accelerators (before its first launch, and after its last
stop), moves with the machine and not with the build: the history subtracts its change from each
session's level (``report/changepoints.py``).

The manager runs the profile's ``calibration_command`` through the controller's host (this machine
or an ssh host: ``service/ssh.py``), under one whole-command deadline (``calibration_timeout_s``)
and a bound on its output, and reads its answer: the last non-empty line of its stdout is a JSON
object of named figures (``{"gemm_tflops": 712.3, "cpu_ops_per_s": 1.2e7}``) or one number, each
finite and > 0, higher = faster. Anything else is an error that names the command, its exit code
and the tail of its output (the session end fails on it; the tests still ran). The shipped probes
are ``python -m pytest_ddtree.measure.calibration`` (CPU) and ``suites/services/calibrate_gpu.py``.

What a probe must not depend on is the build under test: run it with an interpreter of its own
(a pinned venv), not the build's; a probe that moves with the build cancels the very step the
history looks for.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from pytest_ddtree.records.shapes import CalibrationData
    from pytest_ddtree.service.ssh import LocalHost, SSHHost

#: ``calibration_timeout_s`` when a profile does not set it: the whole command, start to exit.
DEFAULT_TIMEOUT_S = 120.0
#: What a probe may print (stdout and stderr together) before it is killed: one line is the answer.
MAX_OUTPUT_BYTES = 1024 * 1024
#: The answer's line is read up to this long (a longer one is refused, not parsed).
MAX_LINE_CHARS = 4096
#: Named figures in one answer at most.
MAX_FIGURES = 32
#: The name of a probe's figure when it prints one number.
SINGLE_FIGURE = "calibration"
#: A figure's name: what a results.json key and a history row can hold.
_FIGURE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
#: On an ssh host the command runs under coreutils' ``timeout``, which sends SIGKILL this long after
#: its SIGTERM, and exits 124 (137 when it had to kill).
REMOTE_KILL_AFTER_S = 5
REMOTE_TIMED_OUT = 124
REMOTE_TIMED_OUT_KILLED = 137
#: When a probe runs: before the session's first launch, after its last stop.
WHEN_START = "start"
WHEN_END = "end"


class CalibrationOutputError(ValueError):
    """A probe's answer is not the output contract (the message says what it is instead)."""


@dataclass(frozen=True)
class CalibrationRun:
    """One run of the probe: its figures, or why there are none (``error``)."""

    when: str
    command: str
    host: str
    at: float
    seconds: float
    figures: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    instance: int = 0

    def as_record(self) -> CalibrationData:
        """The run as its ``RecordKind.CALIBRATION`` record (and results.json's ``calibration.runs``)."""
        out: CalibrationData = {"when": self.when, "command": self.command, "calibration_host": self.host,
                               "started_at": self.at, "seconds": round(self.seconds, 3), "figures": dict(self.figures),
                               "instance": self.instance}
        if self.error is not None:
            out["error"] = self.error
        return out


def _finite_positive(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 < number < 1e300 else None


def _reject_constant(name: str) -> float:
    raise CalibrationOutputError(f"{name} is not a figure (each must be a finite number > 0)")


def parse_output(stdout: str) -> dict[str, float]:
    """The figures of a probe's stdout (the last non-empty line), or CalibrationOutputError."""
    last = ""
    for line in reversed(stdout.splitlines()):
        if line.strip():
            last = line.strip()
            break
    if not last:
        raise CalibrationOutputError("it printed nothing on stdout (its last line must be a JSON object of figures)")
    if len(last) > MAX_LINE_CHARS:
        raise CalibrationOutputError(f"its last line is {len(last)} characters long (at most {MAX_LINE_CHARS})")
    try:
        value = json.loads(last, parse_constant=_reject_constant)
    except CalibrationOutputError:
        raise
    except (ValueError, RecursionError):
        raise CalibrationOutputError(f"its last line is not JSON: {last[:200]!r}") from None
    single = _finite_positive(value)
    if single is not None:
        return {SINGLE_FIGURE: single}
    if not isinstance(value, dict) or not value:
        raise CalibrationOutputError(f"its last line is not a JSON object of figures nor one number > 0: {last[:200]!r}")
    if len(value) > MAX_FIGURES:
        raise CalibrationOutputError(f"it printed {len(value)} figures (at most {MAX_FIGURES})")
    figures: dict[str, float] = {}
    for name, raw in value.items():
        if not _FIGURE_NAME.fullmatch(name):
            raise CalibrationOutputError(f"figure name {name[:80]!r} is not a name (letters, digits, '_', '.', '-'; "
                                         "at most 64)")
        number = _finite_positive(raw)
        if number is None:
            raise CalibrationOutputError(f"figure {name!r} is {json.dumps(raw)[:80]}, not a finite number > 0 "
                                         "(higher = faster)")
        figures[name] = number
    return figures


def _tail(text: str, lines: int = 5, chars: int = 600) -> str:
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    joined = " | ".join(kept[-lines:])
    return (joined[-chars:] if len(joined) > chars else joined) or "<no output>"


def run_calibration(host: LocalHost | SSHHost, command: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                    when: str = WHEN_START, instance: int = 0) -> CalibrationRun:
    """Run ``command`` (a shell command line, the profile's template filled) on ``host`` once.

    Never raises for what the command does: a failure is the run's ``error`` (the session end
    reports it), because a probe that broke must not stop the gates that need no probe.
    """
    from pytest_ddtree.service.ssh import CommandTimedOut, OutputTooLarge, SSHError, SSHTimedOut

    begin_wall, begin = time.time(), time.monotonic()

    def failed(problem: str) -> CalibrationRun:
        return CalibrationRun(when, command, host.name, begin_wall, time.monotonic() - begin, error=(
            f"calibration command `{command}` on {host.name}: {problem}\nwhat to do: run it there by hand; its last "
            "line on stdout must be a JSON object of named figures > 0 (higher = faster) or one number "
            "(docs/profiles.md, \"Calibration probe\")"), instance=instance)

    def deadline(how: str) -> str:
        return (f"did not finish within calibration_timeout_s = {timeout_s:g} s ({how}; raise calibration_timeout_s in "
                "the profile if the probe needs longer)")

    argv, local_s = ["sh", "-c", command], timeout_s
    if host.remote:  # killing ssh here leaves the command running there: the host's own timeout ends it
        argv, local_s = ["timeout", "-k", str(REMOTE_KILL_AFTER_S), f"{timeout_s:g}", *argv], timeout_s + 2 * REMOTE_KILL_AFTER_S
    try:
        result = host.run(argv, timeout_s=local_s, max_output_bytes=MAX_OUTPUT_BYTES)
    except (CommandTimedOut, SSHTimedOut):
        return failed(deadline("killed"))
    except OutputTooLarge:
        return failed(f"printed more than {MAX_OUTPUT_BYTES} bytes (killed): a probe prints one line")
    except SSHError as exc:
        return failed(f"ssh failed: {exc.problem}")
    except OSError as exc:
        return failed(f"could not be started: {exc}")
    output = _tail(result.stdout + "\n" + result.stderr)
    if host.remote and result.returncode in (REMOTE_TIMED_OUT, REMOTE_TIMED_OUT_KILLED):
        return failed(deadline("killed there by timeout(1)") + f"; last lines of its output: {output}")
    if result.returncode != 0:
        return failed(f"exit code {result.returncode}; last lines of its output: {output}")
    try:
        figures = parse_output(result.stdout)
    except CalibrationOutputError as exc:
        return failed(f"{exc}; exit code 0; last lines of its output: {output}")
    return CalibrationRun(when, command, host.name, begin_wall, time.monotonic() - begin, figures, instance=instance)


def run_figures(runs: Sequence[object]) -> dict[str, list[float]]:
    """Each figure's value in every run that has it (records, or results.json's runs: a file, so
    every run, name and value is checked); a run with an ``error`` is left out."""
    out: dict[str, list[float]] = {}
    for run in runs:
        figures = run.get("figures") if isinstance(run, Mapping) else None
        if not isinstance(run, Mapping) or not isinstance(figures, Mapping) or run.get("error"):
            continue
        for name, value in figures.items():
            number = _finite_positive(value)
            if isinstance(name, str) and _FIGURE_NAME.fullmatch(name) and number is not None:
                out.setdefault(name, []).append(number)
    return out


def session_figures(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each figure's geometric mean over the session's runs that have it (``run_figures``)."""
    return {name: math.exp(sum(math.log(v) for v in values) / len(values))
            for name, values in sorted(run_figures(runs).items())}


def describe_runs(runs: Sequence[Mapping[str, Any]]) -> str:
    """The terminal's lines: each run's figures (or its error)."""
    lines = []
    for run in runs:
        figures = run.get("figures") if isinstance(run.get("figures"), Mapping) else {}
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(figures.items())) if figures else "no figures"
        lines.append(f"{run.get('when')} on {run.get('calibration_host')}: {run.get('error') or shown}")
    return "\n".join(lines)
