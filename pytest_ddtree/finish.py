"""Session end on the controller: merge results, apply baselines, report, package.

Runs once, on the xdist main process (or the only process), after every worker is done, so it sees
all records and is the only writer of results.json, baselines and the reproduction package. Each
step is independent: a failing package write must not lose the results, and a missing results
module must not stop the package, so every step records its own failure instead of raising.
"""

from __future__ import annotations

import traceback
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pytest_ddtree.gates import measure_only
from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.baselines import BaselineError, baseline_store
from pytest_ddtree.records.recorder import (
    RESULTS_JSON,
    RESULTS_MD,
    BaselineUpdate,
    write_json_atomic,
)
from pytest_ddtree.service.profile import ProfileError
from pytest_ddtree.records.words import CONTROL_KINDS, RecordKind, Status

if TYPE_CHECKING:
    from pytest_ddtree.options import Settings
    from pytest_ddtree.selection import Selection
    from pytest_ddtree.service.profile import ServiceProfile
    from pytest_ddtree.session import DDTreeSession, LivePage


#: The node id of a session-level failure's report (``ddtree::control``...).
SESSION_CHECK_PREFIX = "ddtree::"


@dataclass(frozen=True)
class SessionFailure:
    """A failure of the session as a whole, not of one test: which check found it and why.

    The plugin reports each one as a failed test of its own (``ddtree::<check>``), so it shows
    where pytest users look: the short test summary, the final line's count, and every plugin
    that reads test reports (JUnit XML among them); a line in a section of its own is not read to
    the end, under a last line that says "9 passed". Like pytest-mypy's status check, it is a test
    of its own, but made at the session end, after the last worker's results arrived, which is
    where the checks can run."""

    check: str
    message: str

    def report(self) -> dict[str, Any]:
        """The fields of its failed test report (pytest's ``TestReport``)."""
        return {"nodeid": f"{SESSION_CHECK_PREFIX}{self.check}", "location": ("ddtree", None, self.check),
                "keywords": {"ddtree-session": 1}, "outcome": "failed", "longrepr": self.message, "when": "call"}


#: The session-level checks, as the failures' test ids name them.
CHECK_RECORDS = "records"
CHECK_CONTROL = "control"
CHECK_UNIFORM_SHIFT = "uniform-shift"
CHECK_AGAINST_SESSION = "configs-against-session"
CHECK_RELAUNCH = "relaunch"
CHECK_HISTORY = "history-check"
CHECK_CALIBRATION = "calibration"
CHECK_OUTPUT = "session-output"


CONTROL_SECTION = "ddtree control and uniform shift"
#: pytest's exit statuses a session's verdict names.
_INTERRUPTED, _NO_TESTS = 2, 5


def verdict_line(exitstatus: int, failed_tests: Sequence[Mapping[str, str]], failures: Sequence[SessionFailure],
                 inconclusive: int = 0) -> str:
    """The session's answer in one line, shown before anything else (the terminal, results.md,
    results.json): passed, or what failed (the first few tests with their reasons, the session checks)."""
    parts = []
    if failed_tests:
        named = "; ".join(f"{t.get('nodeid', '?').rsplit('::', 1)[-1]}: {str(t.get('reason', '')).splitlines()[0][:120] if t.get('reason') else 'failed'}"
                          for t in failed_tests[:3])
        parts.append(f"{len(failed_tests)} test(s) failed ({named}{'; ...' if len(failed_tests) > 3 else ''})")
    checks = sorted({f.check for f in failures})
    if checks:
        parts.append(f"session check(s) failed: {', '.join(checks)}")
    if exitstatus == _INTERRUPTED:
        return "INTERRUPTED: " + ("; ".join(parts) if parts else "what ran is below, the rest never ran")
    if parts or exitstatus not in (0, _NO_TESTS):
        return "FAILED: " + ("; ".join(parts) if parts else f"pytest's exit status {exitstatus}")
    if exitstatus != 0:
        return "NOTHING RAN: no test was collected"
    if inconclusive:
        return (f"PASSED, with {inconclusive} throughput cell(s) inconclusive (not judged: the reason is in the short test "
                "summary; --ddtree-require-baselines fails them)")
    return "PASSED: every gate and session check passed"


@dataclass
class FinishOutcome:
    """What the terminal summary prints and whether the exit status must become non-zero."""

    sections: list[tuple[str, str]] = field(default_factory=list)
    failures: list[SessionFailure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    bill: dict[str, Any] | None = None  # results.json's ``bill`` (records/bill.py), for the pytest_ddtree_session_bill hook
    verdict: str | None = None  # results.json's ``verdict`` line, once made (for the pytest_ddtree_verdict hook)

    @property
    def exit_failure(self) -> bool:
        return bool(self.failures)

    def session_verdict(self, exitstatus: int) -> dict[str, Any]:
        """The session's verdict as the pytest_ddtree_verdict hook gets it (hookspec.py): ``fail``
        where the exit status will be non-zero, with the verdict line and the failed session checks."""
        passed = exitstatus == 0 and not self.exit_failure
        return {"decision": Status.PASS if passed else Status.FAIL, "message": self.verdict,
                "failed_checks": sorted({f.check for f in self.failures})}

    def fail(self, message: str, check: str = CHECK_OUTPUT) -> None:
        """A failure that also belongs in the "ddtree errors" section (writing results, the
        package, the history, a corrupt record)."""
        self.failures.append(SessionFailure(check, message))
        self.errors.append(message)

    def failed_check(self, check: str, message: str) -> None:
        """A failure whose detail already has its own section (control, session check, history)."""
        self.failures.append(SessionFailure(check, message))


def _report_field_mapping(profile: ServiceProfile | None, outcome: FinishOutcome, results: dict[str, Any]) -> None:
    """How each config field reached the service, in results.json; the fields the harness could
    not prove (unverifiable, with the profile's reason, or not settable) also in the summary."""
    if profile is None:
        return
    mapping = profile.how_fields_reach_the_service()
    results["config_fields"] = mapping
    unproven = {name: how for name, how in mapping.items()
                if "unverifiable:" in how or (how.startswith("not settable") and "; read back as" not in how)}
    if unproven:
        outcome.sections.append(("ddtree config fields not read back",
                                 "\n".join(f"{name}: {how}" for name, how in unproven.items())))


def _report_selection(selection: Selection | None, outcome: FinishOutcome, results: dict[str, Any]) -> None:
    """What the selection left out of configs.yaml's matrix on this build, and why (results.json
    ``selection``; the summary's "ddtree selection" section when anything was left out)."""
    if selection is None:
        return
    results["selection"] = selection.as_dict()
    lines = selection.summary_lines()
    if lines:
        outcome.sections.append((
            "ddtree selection",
            f"ran {', '.join(c.name for c in selection.configs)} on this build ({selection.build.origin}); "
            f"left out {len(lines)} matrix config(s) it cannot run as named:\n" + "\n".join(lines)))


def _profile(session: DDTreeSession) -> ServiceProfile | None:
    """The session's profile, or None where it cannot be read (a broken profile is reported where it is loaded)."""
    try:
        return session.profile
    except (ProfileError, OSError):
        return None


def _selection(session: DDTreeSession) -> Selection | None:
    """The session's selection, or None where it cannot be made (reported where it is used)."""
    try:
        return session.selection
    except Exception:  # noqa: BLE001 - a broken profile or matrix is reported where it is used
        return None


def end_session(session: DDTreeSession, exitstatus: int) -> FinishOutcome:
    """The main process's session end (:func:`finish_session`), then the project's hooks told the
    session's bill and its verdict (hookspec.py)."""
    outcome = finish_session(session, exitstatus=exitstatus)
    if outcome.bill is not None:
        session.hooks.session_bill(outcome.bill)
    if outcome.verdict is not None:
        session.hooks.verdict(None, None, outcome.session_verdict(exitstatus))
    return outcome


class SessionEnd:
    """The main process's session end, registered as a plugin by :meth:`end` (as xdist registers its
    DSession): the plugin's sessionfinish calls it before junitxml's writes the XML, so every plugin
    that reads test reports gets each session failure as a failed test (``make_report``: pytest's
    ``TestReport``); the terminal reporter gets them in the terminal summary, where its short summary
    and final counts are made after the session's sections."""

    def __init__(self, session: DDTreeSession, make_report: Callable[..., Any], tests_failed: int) -> None:
        self._session = session
        self._make_report = make_report
        self._tests_failed = tests_failed
        self.outcome: FinishOutcome | None = None

    def _reports(self) -> list[Any]:
        return [self._make_report(**failure.report()) for failure in self.outcome.failures] if self.outcome else []

    def end(self, session: Any, exitstatus: int) -> None:
        """The session ended (:func:`end_session`), its exit status folded into pytest's ``session``."""
        plugins = session.config.pluginmanager
        plugins.register(self, "ddtree-session-end")
        self.outcome = end_session(self._session, exitstatus)
        if self.outcome.exit_failure and session.exitstatus == 0:
            session.exitstatus = self._tests_failed
        reporter = plugins.get_plugin("terminalreporter")
        others = plugins.subset_hook_caller("pytest_runtest_logreport", remove_plugins=[reporter] if reporter else [])
        for report in self._reports():
            others(report=report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.outcome is not None:
            from pytest_ddtree.report.terminal import write_sections

            write_sections(terminalreporter, self.outcome.sections)
            terminalreporter.stats.setdefault("failed", []).extend(self._reports())


def finish_session(session: DDTreeSession, exitstatus: int) -> FinishOutcome:
    """The main process's session end. The session is read here, once; each step takes what it uses."""
    outcome = FinishOutcome()
    settings = session.settings
    records = session.collected_records()
    if not records and settings.package is None:
        return outcome
    profile = _profile(session)
    # records that came back malformed (records.screen set them aside, kept whole in results.json)
    for record in records:
        if record.get("kind") == RecordKind.CORRUPT_RECORD and "problem" in record:
            outcome.fail(str(record["problem"]), CHECK_RECORDS)

    # 1. Baselines first: they are what the user asked for with --ddtree-update-baselines.
    if settings.update_baselines:
        _apply_baseline_updates(settings, session.collected_updates(), outcome)

    # 2. Each config against the other configs of this session (a config slower as a whole), and
    #    every config against the session's control (a build slower as a whole).
    judged = not (settings.update_baselines or settings.measure_only)
    session_check = _judge_configs_against_session(records, outcome) if judged else []
    control_check = None if settings.measure_only else _judge_control(settings, profile, records, outcome,
                                                                      interrupted=exitstatus == _INTERRUPTED)

    # 3. Results JSON and Markdown (bench_serving key names), and the sweep table.
    summary_json = _write_results(session, profile, records, session_check, control_check, exitstatus, outcome)

    # 4. The history (after report.html, so the history links to it); its failure keeps the results.
    if settings.history is not None and summary_json is not None:
        _append_history(settings, _service_python(profile), summary_json, records, outcome, exitstatus)

    # 5. The reproduction package, verified before it is reported.
    if settings.package is not None:
        _write_package(session, outcome, records, exitstatus)
    if outcome.errors:
        outcome.sections.append(("ddtree errors", "\n".join(outcome.errors)))
    return outcome


def _write_results(session: DDTreeSession, profile: ServiceProfile | None, records: list[dict[str, object]],
                   session_check: list[dict[str, Any]], control_check: dict[str, Any] | None, exitstatus: int,
                   outcome: FinishOutcome) -> dict[str, Any] | None:
    """results.json, results.md, the output file and report.html, with the verdict the terminal shows.

    One step with one failure: whatever goes wrong here is a failed session, never a lost one (the
    raw records are on disk already). The results' payload comes back for the history, None when
    they could not be written."""
    settings = session.settings
    results_dir = settings.results
    summary_json: dict[str, Any] | None = None
    try:
        from pytest_ddtree.report import text as report

        default_window = profile.default_window if profile is not None else None
        summary = report.session_summary(records, session.failed_tests, results_dir, default_window)
        if session.live_report is not None:
            summary.json["environment"] = session.live_report.environment
        summary.json["session_id"] = settings.session_id
        summary.json["configs_against_session"] = session_check
        summary.json["control"] = control_check
        summary.json["calibration"] = _calibration(records, outcome)
        summary.json["bill"] = _bill(records, outcome)
        _report_field_mapping(profile, outcome, summary.json)
        _report_selection(_selection(session), outcome, summary.json)
        verdict = verdict_line(exitstatus, session.failed_tests, outcome.failures,
                               sum(1 for c in summary.json.get("throughput") or [] if c.get("status") == Status.INCONCLUSIVE))
        if settings.measure_only:
            verdict = measure_only.verdict_line(verdict, summary.json.get("throughput") or [])
            summary.json["measure_only"] = True
        summary.json["verdict"] = verdict
        outcome.verdict = verdict
        write_json_atomic(results_dir / RESULTS_JSON, summary.json)
        summary_json = summary.json
        if settings.output_file is not None:
            _append_output_file(settings.output_file, summary.json.get("throughput_repeats") or [], outcome)
        write_atomic(results_dir / RESULTS_MD, summary.markdown.replace("\n", f"\n\n**Verdict:** {verdict}\n", 1))
        _write_html_report(session.live_report, results_dir, summary.json, outcome)
        _arrange_sections(outcome, verdict, summary.sections, summary.plot_error)
    except Exception as exc:  # the raw records are on disk whatever happens here
        outcome.fail(f"writing results failed: {type(exc).__name__}: {exc}")
        outcome.sections.append(("ddtree results error", traceback.format_exc()))
    outcome.sections.append(("ddtree results", f"results: {results_dir}"))
    return summary_json


def _arrange_sections(outcome: FinishOutcome, verdict: str, tables: Sequence[tuple[str, str]], plot_error: str | None) -> None:
    """The terminal's order: the verdict first, then the tables; the control's paragraph after them
    (it explains, it is not the answer), then a plot that could not be drawn."""
    outcome.sections.insert(0, ("ddtree verdict", verdict))
    control_sections = [s for s in outcome.sections if s[0] == CONTROL_SECTION]
    outcome.sections[:] = [s for s in outcome.sections if s[0] != CONTROL_SECTION]
    for title, text in tables:
        outcome.sections.append((title, text))
    outcome.sections.extend(control_sections)
    if plot_error:
        outcome.sections.append(("ddtree plot", plot_error))


def _calibration(records: list[dict[str, object]], outcome: FinishOutcome) -> dict[str, Any] | None:
    """results.json's ``calibration``: the probe's command, each run (when, where, its figures) and
    the session's figures (geometric means over the runs); a run that failed fails the session
    (its tests ran: a broken probe leaves this session's history uncalibrated, and must be seen)."""
    from pytest_ddtree.service.calibration import describe_runs, session_figures
    from pytest_ddtree.records import shapes as records_mod

    runs = [dict(run) for run in records_mod.calibration_runs(records)]
    if not runs:
        return None
    for run in runs:
        if run.get("error"):
            outcome.failed_check(CHECK_CALIBRATION, f"calibration probe ({run['when']}): {run['error']}")
    figures = session_figures(runs)
    outcome.sections.append(("ddtree calibration", describe_runs(runs) + (
        "\nthe session's figures (geometric means): " + ", ".join(f"{k} {v:.4g}" for k, v in figures.items())
        if figures else "")))
    return {"command": runs[0]["command"], "runs": runs, "figures": figures}


def _bill(records: list[dict[str, object]], outcome: FinishOutcome) -> dict[str, Any]:
    """results.json's ``bill``: the session's launches and measured seconds by purpose, also in the summary."""
    from pytest_ddtree.records.bill import session_bill

    bill = session_bill(records)
    outcome.sections.append(("ddtree bill", bill.text()))
    outcome.bill = bill.as_dict()
    return outcome.bill


def _judge_configs_against_session(records: list[dict[str, object]], outcome: FinishOutcome) -> list[dict[str, Any]]:
    """``session_check.judge_session`` over this session's throughput verdicts: a config that regressed as a
    whole, beyond what the other configs of the session moved, fails the run here, also when each
    of its cells passed."""
    from pytest_ddtree.gates.throughput.session_check import config_moves, judge_session
    from pytest_ddtree.records import shapes as records_mod
    from pytest_ddtree.records.cells import normalize

    relaunches = records_mod.judged_relaunches(records)
    findings = judge_session(config_moves(normalize(records)), config_moves(relaunches))
    for finding in findings:
        if finding.failed:
            outcome.failed_check(CHECK_AGAINST_SESSION, finding.message)
    shown = [f.message for f in findings if f.failed or f.relaunched]
    for failure in records_mod.relaunch_failures(records):
        line = f"{failure.get('config')}: relaunch failed: {failure['error']}"
        shown.append(line)
        outcome.failed_check(CHECK_RELAUNCH, line)
    if shown:
        outcome.sections.append(("ddtree configs against their session", "\n".join(shown)))
    return [f.as_dict() for f in findings]


def _service_python(profile: ServiceProfile | None) -> str | None:
    """The service's interpreter where it runs on this machine (the history names its engine build), else None."""
    if profile is None or not profile.capabilities.service_python_here or profile.host:
        return None
    return profile.service_python


def _append_history(settings: Settings, python: str | None, payload: dict[str, Any], records: list[dict[str, object]],
                    outcome: FinishOutcome, exitstatus: int) -> None:
    """Append this session to --ddtree-history; with --ddtree-history-check, fail it when its
    measurements start a regression change point of the history (naming the build; ``python``:
    the service's interpreter where it runs here, whose engine build it reads)."""
    import pytest_ddtree
    from pytest_ddtree.report import history

    url = settings.history
    assert url is not None
    times = [float(when) for r in records if isinstance(when := r.get("time"), (int, float))]
    build = history.Build(engine_version=history.engine_version_of(payload), engine_build=history.engine_build(python),
                          project_commit=history.git_commit(settings.rootdir), package_version=pytest_ddtree.__version__)
    entry = history.session_from_payload(payload, session_id=settings.session_id, started_at=min(times) if times else 0.0,
                                         results_dir=settings.results, build=build, exit_status=exitstatus)
    cells = history.cells_from_payload(payload) + history.control_cells(records)
    written = False
    try:
        with history.HistoryStore(url) as store:
            store.append(entry, cells)
            written = True
            stored = store.cells() if settings.history_check else []
    except history.HistoryError as exc:
        outcome.fail(f"--ddtree-history-check: history written, not read: {exc}" if written else f"history not written: {exc}",
                     CHECK_HISTORY)
        return
    lines = [f"appended session {entry.session_id} ({len(cells)} cells, build {build.label()}) to {history.redact(url)}"]
    lines += filter(None, [store.set_aside.note()])
    if settings.history_check:
        from pytest_ddtree.report import changepoints

        try:
            summary, regressions = changepoints.check_history(stored, entry.session_id)
        except changepoints.ChangePointsUnavailable as exc:
            outcome.fail(f"--ddtree-history-check: {exc}", CHECK_HISTORY)
            return
        lines.append(summary)
        for text in regressions:
            outcome.failed_check(CHECK_HISTORY, f"this session starts a regression of the history: {text}")
        if regressions:
            outcome.sections.append(("ddtree history check", "this session's measurements start a regression of the "
                                     "history:\n" + "\n".join(f"- {text}" for text in regressions)))
    outcome.sections.append(("ddtree history", "\n".join(lines)))


def _judge_control(settings: Settings, profile: ServiceProfile | None, records: list[dict[str, object]], outcome: FinishOutcome,
                   interrupted: bool = False) -> dict[str, Any] | None:
    """control.judge over this session's records: the control's own verdict, the session's uniform
    shift with its interval and kind, each config's speedup over the control; a failing control cell
    or a uniform slowdown while the control held fails the run. Always stated in the summary when
    throughput was measured (with the reason when there is no control)."""
    from pytest_ddtree.gates.throughput import control, launches
    from pytest_ddtree.records.cells import normalize

    configs = normalize(records)
    if not configs and not any(str(r.get("kind", "")) in CONTROL_KINDS for r in records):
        return None
    # a process that took further launches of the control is judged at the later looks' z
    z_uniform = control.Z_UNIFORM if profile is None else launches.uniform_z(profile, launches.launches_of(records))
    judgement = control.judge(records, configs, require_baselines=settings.require_baselines,
                              update_mode=bool(settings.update_baselines), z_uniform=z_uniform, interrupted=interrupted)
    for group in judgement.groups:
        for message in group.control_failures:
            outcome.failed_check(CHECK_CONTROL, f"control {message}")
        if group.uniform_failure:
            outcome.failed_check(CHECK_UNIFORM_SHIFT, group.uniform_failure)
        if group.failed and not group.control_failures and not group.uniform_failure:
            outcome.failed_check(CHECK_CONTROL, f"the control of {group.group} failed (see the control section)")
    outcome.sections.append((CONTROL_SECTION, judgement.text()))
    return judgement.as_dict()


def _write_html_report(live: LivePage | None, results_dir: Path, payload: dict[str, Any], outcome: FinishOutcome) -> None:
    """The final report.html (the ``live`` one, marked finished); its failure never loses results."""
    try:
        from pytest_ddtree.report.html import REPORT_HTML, write_report

        if live is not None:
            path = live.write_final(payload)
            outcome.errors.extend(live.errors)
        else:
            path = write_report(results_dir / REPORT_HTML, payload)
        outcome.sections.append(("ddtree report", f"report: {path}"))
    except Exception as exc:  # noqa: BLE001 - results.json is written already
        outcome.fail(f"writing report.html failed: {type(exc).__name__}: {exc}")


def _write_golden_references(settings: Settings, outcome: FinishOutcome, proposals: list[BaselineUpdate]) -> None:
    """Golden transcripts: the first reference measured on each hardware profile this session
    (every proposal came from a ``lossless_args`` launch; one write per profile, by the controller)."""
    from pytest_ddtree.gates.lossless import write_golden

    lines: list[str] = []
    done: set[str] = set()
    for proposal in proposals:
        if proposal.hardware_profile is None:
            outcome.fail("a golden reference without a hardware profile was dropped (the service never started?)")
            continue
        if proposal.hardware_profile in done:
            continue
        done.add(proposal.hardware_profile)
        store = baseline_store(settings, proposal.hardware_profile)  # reached only when blessing: a store in bless mode
        try:
            written = write_golden(store.golden_dir(), proposal.data)
        except (OSError, KeyError, TypeError) as exc:
            outcome.fail(f"writing golden transcripts failed: {type(exc).__name__}: {exc}")
            continue
        lines.append(f"wrote {len(written) - 1} golden transcripts in {store.golden_dir()} from: {proposal.data.get('command')}")
    if lines:  # reviewed like any bless: the folder written, --ddtree-baselines DIR's own
        outcome.sections.append(("ddtree golden transcripts", "\n".join(lines) + f"\nreview with: {review_command(settings.baselines)}"))


def _apply_baseline_updates(settings: Settings, updates: list[BaselineUpdate], outcome: FinishOutcome) -> None:
    """This session's baseline proposals (``updates``) written: golden transcripts, then each hardware
    profile's files."""
    from pytest_ddtree.gates.lossless import GOLDEN_SECTION

    _write_golden_references(settings, outcome, [u for u in updates if u.section == GOLDEN_SECTION])
    by_profile: dict[str | None, list[BaselineUpdate]] = defaultdict(list)
    for update in updates:
        if update.section != GOLDEN_SECTION:
            by_profile[update.hardware_profile].append(update)
    lines: list[str] = []
    for hardware_profile, profile_updates in sorted(by_profile.items(), key=lambda kv: str(kv[0])):
        if hardware_profile is None:
            outcome.fail("baseline updates without a hardware profile were dropped (the service never started?)")
            continue
        store = baseline_store(settings, hardware_profile)  # reached only when blessing: a store in bless mode
        try:
            written = store.apply_updates(profile_updates)
        except (BaselineError, OSError) as exc:
            outcome.fail(f"writing baselines failed: {exc}")
            continue
        lines.extend(f"wrote {path}" for path in written)
    if lines:
        outcome.sections.append(("ddtree baselines updated", "\n".join(lines) + f"\nreview with: {review_command(settings.baselines)}"))


def _append_output_file(path: Path, repeats: Sequence[Mapping[str, Any]], outcome: FinishOutcome) -> None:
    """--ddtree-output-file: one JSON line per measured repeat, bench_serving's result keys first (its
    --output-file appends one per run), then which config and cell it was and whether it was retaken."""
    import json

    lines = []
    for r in repeats:
        workload, metrics = r.get("workload") or {}, r.get("metrics") or {}
        line = {"backend": "sglang", "dataset_name": r.get("prompts") or workload.get("prompts"),
                "request_rate": workload.get("request_rate", float("inf")), "max_concurrency": workload.get("max_concurrency",
                                                                                                     workload.get("concurrency")),
                "random_input_len": workload.get("context_tokens"), "random_output_len": workload.get("output_tokens"),
                **metrics, "config": r.get("config"), "cell": r.get("cell"), "repeat": r.get("repeat"), "spoiled": r.get("spoiled")}
        lines.append(json.dumps(line, default=str, allow_nan=True))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("".join(f"{line}\n" for line in lines))
    except OSError as exc:
        outcome.fail(f"--ddtree-output-file {path}: {exc}")
        return
    outcome.sections.append(("ddtree output file", f"appended {len(lines)} run(s) to {path}"))


def review_command(root: Path) -> str:
    """``git diff -- <the baselines folder written>``, as the user can run it from here (relative
    where it lies under the working directory; --ddtree-baselines DIR's own folder, not baselines/)."""
    import os
    import shlex

    resolved = root.resolve()
    try:
        shown = str(resolved.relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        shown = str(resolved)
    return f"git diff -- {shlex.quote(shown.rstrip(os.sep) + os.sep)}"


def _write_package(session: DDTreeSession, outcome: FinishOutcome, records: list[dict[str, object]], exitstatus: int) -> None:
    try:
        from pytest_ddtree.repro.plugin_bridge import SessionFacts, package_from_session

        selection = _selection(session)  # none where it failed: reported at the start; the package records what ran
        facts = SessionFacts(session.settings, session.profile, session.matrix,
                             [c.name for c in selection.configs] if selection is not None else [], session.failed_tests)
        report = package_from_session(facts, records, exitstatus)
    except (OSError, ValueError) as exc:  # a bad profile or matrix (ConfigError, ProfileError) among them
        outcome.fail(f"reproduction package not written: {exc}")
        return
    except Exception as exc:
        outcome.fail(f"reproduction package failed: {type(exc).__name__}: {exc}")
        outcome.sections.append(("ddtree package error", traceback.format_exc()))
        return
    outcome.sections.append(("ddtree reproduction package", report.summary()))
    if not report.ok:
        outcome.fail("reproduction package not published: " + "; ".join(report.problems))
