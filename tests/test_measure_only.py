"""``--ddtree-measure-only``: bench_serving's numbers of any running server, plain included, with no gate.

Real engines on loopback: a plain one (no ``--speculative-algorithm``: SGLang's plain server, its
``/server_info`` and ``meta_info`` as sglang/srt/entrypoints/http_server.py and
managers/tokenizer_manager.py send them) measured through ``--ddtree-url``; a speculative one through
``--ddtree-url`` and through the embedded engine's own launch, each beside a baseline file that a
gated run could not even read (so any judging would fail the cell).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.service.plain import PLAIN_PROOF
from tests.refserver_helpers import RefServer, config_args
from tests.suite_helpers import MATRIX, REFERENCE_PROFILE, REPO, reference_profile, run_suite

CELLS = ("c1_short", "c8_short")
MATRIX_DEFAULT = load_matrix(MATRIX).default.name  # configs.yaml's default: bs8_b8_k4
#: The sweep table's row of a measured cell: numbers in every column a plain server has, "-" for acceptance
#: and the baseline, and the status "measured" (report/text.py's columns).
_ROW = re.compile(r"^(?P<config>\S+)\s+(?P<cell>c\d+_short)\s+\d+\s+128\s+coding via /tokenize\s+(?P<tps>[\d.]+) ±\d+%\s+"
                  r"(?P<accept>\S+)\s+(?P<ttft>[\d.]+)\s+(?P<tpot>[\d.]+)\s+(?P<itl>[\d.]+)\s+(?P<rps>[\d.]+)\s+-\s+measured\s*$", re.M)


def _url_args(pytester: pytest.Pytester, url: str, *args: str) -> list[str]:
    return [f"--rootdir={REPO}", f"--ddtree-url={url}", f"--ddtree-results={pytester.path / 'results'}",
            f"--ddtree-baselines={pytester.path / 'baselines'}", "-p", "no:cacheprovider", *args]


def _rows(out: str) -> dict[str, re.Match[str]]:
    return {m["cell"]: m for m in _ROW.finditer(out)}


@pytest.mark.slow
def test_a_plain_server_is_measured_with_the_numbers_and_no_gate(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """``pytest suites --ddtree-url URL --ddtree-measure-only`` against the engine started plainly:
    the row ``specnone`` with tok/s, TTFT, TPOT, ITL and req/s and no acceptance, in the terminal, results.json,
    results.md, report.html, the JSONL and the history (whose sessions table says "measured", not "passed");
    the verdict says it only measured; the lossless gate is not run; its one field is said proven (by
    speculative_algorithm null), not unverifiable, and configs.yaml's default, never asked for, is not
    said to be left out; without --ddtree-measure-only the same server is refused, saying how to measure it."""
    server = RefServer(["--clock-scale", "10"], tmp_path, name="plain").wait_ready()
    jsonl = pytester.path / "runs.jsonl"
    history = f"sqlite:///{pytester.path / 'history.db'}"
    try:
        assert server.info()["speculative_algorithm"] is None  # SGLang's plain server says so
        result = pytester.runpytest_subprocess(
            str(REPO / "suites" / "test_throughput.py"), str(REPO / "suites" / "test_lossless.py"),
            *_url_args(pytester, server.url, "--ddtree-measure-only", *(f"--ddtree-cell={c}" for c in CELLS),
                       f"--ddtree-output-file={jsonl}", f"--ddtree-history={history}", "-rs"), timeout=240)
        refused = pytester.runpytest_subprocess(str(REPO / "suites" / "test_throughput.py"),
                                                *_url_args(pytester, server.url), timeout=60)
        assert server.proc.poll() is None
    finally:
        server.stop()
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    assert result.parseoutcomes() == {"passed": 2, "skipped": 1}, out[-3000:]
    result.stdout.fnmatch_lines(["ddtree: configs specnone", "*ddtree verdict*",
                                 "MEASURED: 2 cell(s) of 1 config(s) measured (specnone); nothing was judged against a baseline*",
                                 "*lossless gate judges*measure-only session judges nothing*"])
    rows = _rows(out)
    assert sorted(rows) == list(CELLS), out[-3000:]
    for row in rows.values():
        assert row["config"] == "specnone" and row["accept"] == "-"
        assert all(float(row[k]) > 0 for k in ("tps", "ttft", "tpot", "itl", "rps"))
    assert "regression" not in out.lower() and "PASSED:" not in out and "control" not in out.split("ddtree verdict")[1]
    result.stdout.fnmatch_lines([f"ddtree:   speculation: no flag (a server started without --speculative-algorithm); "
                                 f"proven: {PLAIN_PROOF}"])
    assert "config fields not read back" not in out and "unverifiable" not in out, out[-3000:]
    assert "left out of the selection" not in out and f"{MATRIX_DEFAULT}: not in the profile's matrix" not in out
    assert not (pytester.path / "baselines").exists()  # nothing blessed, nothing proposed

    results = json.loads((pytester.path / "results" / "results.json").read_text())
    assert results["measure_only"] is True and results["verdict"].startswith("MEASURED: 2 cell(s)")
    cells = {c["cell"]: c for c in results["throughput"]}
    for cell in CELLS:
        c = cells[cell]
        assert (c["config"], c["status"], c["accept_length"]) == ("specnone", "measured", None)
        assert c["output_throughput"] > 0 and c["request_throughput"] > 0 and c["median_tpot_ms"] > 0 and c["median_itl_ms"] > 0
        assert c["total_output_tokens"] == c["completed"] * c["output_tokens"]  # every request of the cell counted
    assert results["control"] is None and results["configs_against_session"] == []
    assert "**Verdict:** MEASURED: 2 cell(s)" in (pytester.path / "results" / "results.md").read_text()
    html = (pytester.path / "results" / "report.html").read_text()
    assert 'id="overall" class="verdict-overall st-measured">measured<' in html and 'id="measure-only"' in html
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    # one line per repeat run, the cell's kept samples among them (a noisy cell runs more repeats than it keeps)
    assert len(lines) >= sum(c["repeats"] for c in cells.values()) >= 2 * 3
    for cell in CELLS:
        runs = {line["output_throughput"] for line in lines if line["cell"] == cell}
        assert set(cells[cell]["samples"]["output_throughput"]) <= runs, (cell, runs)
    assert {(line["config"], line["backend"], line["accept_length"]) for line in lines} == {("specnone", "sglang", None)}
    assert all(line["output_throughput"] > 0 and line["completed"] > 0 for line in lines)

    _assert_history_says_measured(history, tmp_path, {"specnone"})

    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert "reports no speculative algorithm" in refused.stderr.str() and "add --ddtree-measure-only" in refused.stderr.str()


def _assert_history_says_measured(url: str, output_dir: Path, configs: set[str]) -> None:
    """The session's cells are in the history as 'measured', as points of their series, and the
    history page's sessions table gives the session the verdict of a session that only measured."""
    from pytest_ddtree.report.history import HistoryStore
    from pytest_ddtree.report.html.history import MEASURED_SESSION

    with HistoryStore(url) as store:
        stored = store.cells()
    assert {c.config for c in stored} == configs and {c.status for c in stored} == {"measured"}
    page = output_dir / "history.html"  # ddtree-report in its own process (pytester unloads what a test imported)
    run = subprocess.run([sys.executable, "-m", "pytest_ddtree.report.html.cli", "--history", url, "-o", str(page)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    text = page.read_text()
    assert f"<td>{MEASURED_SESSION}</td>" in text and "<td>passed</td>" not in text
    assert all(f"{config} c" in text for config in configs)  # its cells' trends are drawn


def _unreadable_baseline(baselines: Path, config: str) -> None:
    """A baseline a gated run fails every cell on (it cannot be read); a measure-only run never opens it."""
    folder = baselines / "refserver"
    folder.mkdir(parents=True)
    (folder / f"{config}.yaml").write_text("metrics: [this is: not, a baseline\n")


@pytest.mark.parametrize("how", ["url", "embedded"])
def test_a_speculative_server_measured_only_shows_its_acceptance_and_is_judged_by_nothing(
        pytester: pytest.Pytester, tmp_path: Path, how: str) -> None:
    """A speculating engine measured only: its acceptance is in the row, the config is still proven as in
    a gated run, but no baseline is read (an unreadable one fails nothing, the coding test's included: it
    counts with no floor), no control and no lossless reference is launched (the reference profile here
    measures a control in every session)."""
    _unreadable_baseline(pytester.path / "baselines", "bs8_b8_k4")
    suites = [str(REPO / "suites" / name) for name in ("test_throughput.py", "test_lossless.py", "test_coding.py")]
    args = ["--ddtree-measure-only", "--ddtree-cell=c1_short", "--ddtree-coding-limit=2", "--ddtree-sandbox=plain"]
    if how == "url":
        server = RefServer([*config_args("bs8_b8_k4_w2048"), "--clock-scale", "10"], tmp_path).wait_ready()
        try:
            result = pytester.runpytest_subprocess(*suites, *_url_args(pytester, server.url, *args), timeout=240)
        finally:
            server.stop()
    else:
        profile = reference_profile(tmp_path)
        result = run_suite(pytester, profile, *suites[1:], *args, suite="test_throughput.py", timeout=240)
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    assert result.parseoutcomes() == {"passed": 2, "skipped": 1}, out[-3000:]  # the lossless test skips, saying why
    result.stdout.fnmatch_lines(["MEASURED: 1 cell(s) of 1 config(s) measured (bs8_b8_k4); nothing was judged*"])
    row = _rows(out)["c1_short"]
    assert row["config"] == "bs8_b8_k4" and float(row["accept"]) > 1.0  # tokens per verify: it speculates
    assert re.search(r"^bs8_b8_k4\s+proven by behaviour\s+(proven by behaviour|reported)\s", out, re.M), out[-3000:]
    results = json.loads((pytester.path / "results" / "results.json").read_text())
    assert [c["status"] for c in results["throughput"]] == ["measured"]
    assert results["throughput"][0]["ddtree_tokens_per_verify"] > 1.0  # the gated acceptance, measured here too
    launches = [r for r in results["records"] if r["kind"] == "launch"]
    assert [r["config"] for r in launches] == ["bs8_b8_k4"], launches  # the config's own only: no control, no reference
    assert results["control"] is None
    (coding,) = [r for r in results["records"] if r["kind"] == "coding"]
    assert (coding["total"], coding["gate"]["floor"]) == (2, 0)  # counted, judged by no baseline and no floor


@pytest.mark.slow  # 8-11 s beside other tests: over the fast lane's 8 s
def test_measure_only_under_xdist_measures_each_workers_config_and_judges_none(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-n 2`` over two configs of the embedded engine (a pool of two instances; 8 s on the 2-core box at
    load ~5, two engines at clock scale 10 and one cell each): each worker launches,
    proves and measures its config; the main process's verdict, results.json, report.html and the history
    all say measured, for both configs, with no control and no baseline read or written."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):  # the inner session's own workers decide
        monkeypatch.delenv(name, raising=False)
    _unreadable_baseline(pytester.path / "baselines", "bs8_b4_k4")
    history = f"sqlite:///{pytester.path / 'history.db'}"
    profile = reference_profile(tmp_path, pool=2)
    result = run_suite(pytester, profile, "--ddtree-measure-only", "--ddtree-cell=c1_short", f"--ddtree-history={history}",
                       "-n", "2", suite="test_throughput.py", config="bs8_b8_k4,bs8_b4_k4", timeout=300)
    out = result.stdout.str()
    assert result.ret == 0, out[-4000:]
    assert result.parseoutcomes()["passed"] == 2, out[-3000:]
    result.stdout.fnmatch_lines([
        "ddtree: this session will launch 2 times: 2 configs; measuring 1 throughput cell x 3 repeats on each launch of a "
        "config (--ddtree-measure-only: no control, no lossless reference, no confirmation)",
        "MEASURED: 2 cell(s) of 2 config(s) measured (bs8_b4_k4, bs8_b8_k4); nothing was judged*"])
    rows = {m["config"]: m for m in _ROW.finditer(out)}
    assert sorted(rows) == ["bs8_b4_k4", "bs8_b8_k4"] and all(float(r["accept"]) > 1.0 for r in rows.values()), out[-3000:]
    results = json.loads((pytester.path / "results" / "results.json").read_text())
    assert {(c["config"], c["status"]) for c in results["throughput"]} == {("bs8_b4_k4", "measured"), ("bs8_b8_k4", "measured")}
    launches = [r for r in results["records"] if r["kind"] == "launch"]
    assert sorted(r["config"] for r in launches) == ["bs8_b4_k4", "bs8_b8_k4"], launches  # no control launched
    assert {r["worker"] for r in launches} == {"gw0", "gw1"}  # one config per worker, side by side
    assert results["measure_only"] is True and results["control"] is None
    html = (pytester.path / "results" / "report.html").read_text()
    assert 'id="overall" class="verdict-overall st-measured">measured<' in html
    assert not (pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").exists()  # nothing blessed
    _assert_history_says_measured(history, tmp_path, {"bs8_b4_k4", "bs8_b8_k4"})


@pytest.mark.parametrize(("extra", "message"), [
    (["--ddtree-update-baselines"], "--ddtree-measure-only and --ddtree-update-baselines do not go together"),
    (["--ddtree-require-baselines"], "--ddtree-measure-only and --ddtree-require-baselines do not go together"),
    (["--ddtree-history=h.db", "--ddtree-history-check"], "--ddtree-measure-only and --ddtree-history-check do not go together"),
    (["--ddtree-max-restarts=2"], "--ddtree-measure-only and --ddtree-max-restarts do not go together"),
    ([f"--ddtree-service={REFERENCE_PROFILE}", "--ddtree-config=specnone", "--ddtree-allow-unlisted"],
     "specnone is a plain server's row, which this profile does not launch: start the server without its speculative "
     "flags and measure it with --ddtree-url URL --ddtree-measure-only"),
])
def test_measure_only_with_an_option_that_judges_is_a_usage_error(pytester: pytest.Pytester, extra: list[str], message: str) -> None:
    pytester.makepyfile(test_gate="def test_gate(ddtree_config):\n    pass\n")
    result = pytester.runpytest_subprocess("--ddtree-measure-only", *extra, f"--ddtree-matrix={MATRIX}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str(), result.stderr.str()
