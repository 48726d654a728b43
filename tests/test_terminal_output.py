"""What a user sees in the terminal of a gate run: reasons where pytest shows them, and progress.

Each test drives the real CLI (a pytester subprocess, or a pty for the live status line) against a
real reference engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.suite_helpers import REPO, reference_profile


@pytest.mark.slow
def test_an_inconclusive_cell_says_why_in_the_short_summary_and_results_md(pytester: pytest.Pytester) -> None:
    """An inconclusive cell is a skip; its reason (what to do about it) is in pytest's short test
    summary without -rs, and results.md carries the same words."""
    # At 100000 simulated seconds per wall second no host keeps the engine's clock: every repeat is
    # spoiled, so the cell is inconclusive on any machine, at once.
    profile = reference_profile(pytester.path, clock_scale=100000)
    # the committed baseline, as if blessed at that clock: one of another clock scale is not compared
    baseline = yaml.safe_load((REPO / "baselines" / "refserver" / "bs8_b8_k4.yaml").read_text())
    baseline["fingerprint"]["details"]["clock_scale"] = 100000.0
    (pytester.path / "baselines" / "refserver").mkdir(parents=True)
    (pytester.path / "baselines" / "refserver" / "bs8_b8_k4.yaml").write_text(yaml.safe_dump(baseline))
    results = pytester.path / "results"
    run = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}", f"--ddtree-service={profile}",
        f"--ddtree-baselines={pytester.path / 'baselines'}",
        "--ddtree-cell=c1_short", f"--ddtree-results={results}", "-p", "no:cacheprovider", timeout=180)
    assert run.ret == 0, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["*short test summary info*",
                              "SKIPPED [[]1[]] *test_throughput.py:*: bs8_b8_k4 c1_short: INCONCLUSIVE: only 0 clean repeat(s)*",
                              "*1 skipped in*"])
    md = (results / "results.md").read_text()
    # the verdict first, in the terminal (before the tables and the control's paragraph) and in results.md
    out = run.stdout.str()
    assert out.index("ddtree verdict") < out.index("ddtree throughput sweep") < out.index("ddtree control and uniform shift"), out[-4000:]
    assert "PASSED, with 1 throughput cell(s) inconclusive" in out
    assert md.startswith("# pytest-ddtree results\n\n**Verdict:** PASSED, with 1 throughput cell(s) inconclusive")
    assert "**bs8_b8_k4 c1_short**: inconclusive: only 0 clean repeat(s) of the 3 needed" in md
    assert "rerun on a quieter machine" in md


def test_the_user_choice_of_summary_wins(pytester: pytest.Pytester) -> None:
    """-r chooses what the short summary lists; the plugin adds skip reasons only when it was not chosen."""
    pytester.makepyfile(test_x="import pytest\ndef test_s(ddtree_settings):\n    pytest.skip('because')\n")
    args = (f"--ddtree-matrix={REPO / 'suites' / 'configs.yaml'}", f"--ddtree-service={REPO / 'suites' / 'services' / 'reference.yaml'}",
            "-p", "no:cacheprovider")
    shown = pytester.runpytest_subprocess(*args)
    shown.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_x.py:3: because"])
    chosen = pytester.runpytest_subprocess(*args, "-rf")
    assert "SKIPPED" not in chosen.stdout.str()


def _run_in_a_pty(argv: list[str], cwd: Path, timeout: float) -> list[tuple[float, str]]:
    """Run ``argv`` with a pseudo-terminal as its stdout and stderr (what a person at a terminal
    sees): every chunk it wrote, with the seconds since the start when it arrived."""
    import os
    import pty
    import select
    import subprocess
    import time

    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    chunks: list[tuple[float, str]] = []
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append((time.monotonic() - start, data.decode(errors="replace")))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        os.close(leader)
    assert proc.returncode == 0, "".join(c for _, c in chunks)[-3000:]
    return chunks


MATRIX_OF_ONE_CELL = """\
default: bs8_b8_k4
matrix: [bs8_b8_k4]
cell_defaults: {output_tokens: 64, prompts: coding}
cells:
  - {name: c1_steady, concurrency: 1, context_tokens: 128, requests: 4, warmup_requests: 1}
"""


@pytest.mark.slow
def test_a_cell_shows_live_progress_on_a_terminal(pytester: pytest.Pytester) -> None:
    """On a TTY each repeat is a live status line (repeat i/n, requests done, tok/s so far),
    rewritten in place while the cell runs; the restart shows its wait too."""
    # clock scale 1: a request of 64 tokens takes about half a second, so each repeat is seconds long
    profile = reference_profile(pytester.path, clock_scale=1, control="none")
    (pytester.path / "configs.yaml").write_text(MATRIX_OF_ONE_CELL)
    import sys

    chunks = _run_in_a_pty([sys.executable, "-m", "pytest", str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}",
                            f"--ddtree-service={profile}", f"--ddtree-matrix={pytester.path / 'configs.yaml'}",
                            f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
                            "-p", "no:cacheprovider"], pytester.path, timeout=180)
    text = "".join(c for _, c in chunks)
    assert "[ddtree] waiting for service bs8_b8_k4" in text
    live = [(t, c) for t, c in chunks if c.startswith("\r[ddtree] bs8_b8_k4 c1_steady: repeat")]
    for n in (1, 2, 3):
        assert f"\r[ddtree] bs8_b8_k4 c1_steady: repeat {n}/3: " in text, text[-3000:]
    assert any("5/5 requests" in c and "tok/s so far" in c for _, c in live), live
    # while the cell ran, the line moved at least every 30 s (here: at each request)
    times = [t for t, _ in live]
    assert len(times) >= 9 and max(b - a for a, b in zip(times, times[1:])) < 30, times


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True])
def test_a_slow_restart_says_so_in_a_log_and_nothing_under_qq(pytester: pytest.Pytester, quiet: bool) -> None:
    """Not on a TTY (a CI log): a line about every 10 s of a wait, here a restart that stays 503
    for 11 s; ``-q -q`` asks for no progress at all."""
    profile = reference_profile(pytester.path, "--fault slow-start=11", control="none")
    run = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_health.py"), f"--rootdir={REPO}", f"--ddtree-service={profile}",
        f"--ddtree-results={pytester.path / 'results'}", "-p", "no:cacheprovider", *(["-qq"] if quiet else []), timeout=180)
    assert run.ret == 0, run.stdout.str()[-3000:]
    out = run.stdout.str() + run.stderr.str()
    if quiet:
        assert "[ddtree]" not in out, out
    else:
        run.stdout.fnmatch_lines(["[[]ddtree[]] waiting for service bs8_b8_k4 to be ready: 1? s of *, health HTTP 503*"])


def test_bench_serving_habits_an_inline_workload_a_jsonl_of_every_run_and_tpot_itl_in_the_table(pytester: pytest.Pytester) -> None:
    """``--ddtree-cell 'concurrency=2,prompts=4,input=128,output=16'`` (no YAML edit), ``--ddtree-output-file``
    (bench_serving's --output-file: one JSON line per run, its keys), and the table's TPOT, ITL and req/s."""
    import json

    profile = reference_profile(pytester.path, clock_scale=20)
    out_file = pytester.path / "runs.jsonl"
    run = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}", f"--ddtree-service={profile}",
        "--ddtree-cell=concurrency=2,prompts=4,input=128,output=16", f"--ddtree-output-file={out_file}",
        f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        "-p", "no:cacheprovider", timeout=240)
    out = run.stdout.str()
    assert "TPOT p50 ms" in out and "ITL p50 ms" in out and "req/s" in out, out[-4000:]
    assert "c2_ctx128" in out
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(lines) >= 3 and {line["cell"] for line in lines} == {"c2_ctx128"}
    for key in ("backend", "max_concurrency", "random_input_len", "random_output_len", "completed", "request_throughput",
                "output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "config"):
        assert key in lines[0], (key, sorted(lines[0]))
    assert lines[0]["random_input_len"] == 128 and lines[0]["completed"] == 4


def test_more_workers_than_the_pool_has_instances_is_said_at_the_start(pytester: pytest.Pytester) -> None:
    """Said where workers take turns on an instance (``instance_lock``); the shipped reference profile
    has none (each worker starts its own engine on a free port), so a pool of one is no wait there."""
    profile = reference_profile(pytester.path, pool=1, instance_lock=True)
    run = pytester.runpytest_subprocess(str(REPO / "suites" / "test_health.py"), f"--rootdir={REPO}", f"--ddtree-service={profile}",
                                        "-n", "2", "--collect-only", "-p", "no:cacheprovider", timeout=120)
    run.stdout.fnmatch_lines(["ddtree: -n 2, but the profile *'s pool has 1 instance(s): 1 worker(s) wait for an instance, "
                              "so this runs no faster than -n 1*"])
    unlocked = reference_profile(pytester.path, pool=1, filename="unlocked.yaml")
    free = pytester.runpytest_subprocess(str(REPO / "suites" / "test_health.py"), f"--rootdir={REPO}", f"--ddtree-service={unlocked}",
                                         "-n", "2", "--collect-only", "-p", "no:cacheprovider", timeout=120)
    assert free.ret == 0 and "runs no faster" not in free.stdout.str()
    alone = pytester.runpytest_subprocess(str(REPO / "suites" / "test_health.py"), f"--rootdir={REPO}", "-n", "2",
                                          "--collect-only", "-p", "no:cacheprovider", timeout=120)
    assert "runs no faster" not in alone.stdout.str()  # the shipped profile's pool is 2
