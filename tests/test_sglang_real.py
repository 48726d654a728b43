"""The real-server lane: real SGLang 0.5.23 on this CPU, started from the shipped profile
``suites/services/sglang-cpu.yaml`` through the harness's own ``process`` controller.

Everything the harness knows about SGLang it learned from source and from the embedded engine;
here it meets the real server (non-speculative: no speculative algorithm runs on a CPU). One
server (two launches: the second is the restart) serves the tests that only read, through the
harness's service manager and client; the plugin's own behaviour (the control and the lossless
reference, throughput cells, the DFLASH refusal, Ctrl-C) runs in pytest sessions of their own
against the profile as shipped. Each launch costs ~20 s and ~3 GB, so the module makes four and
one refused one; tests/sglang_lane.py says where SGLang comes from, and the whole module skips,
saying why, where it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, cast

import pytest
import yaml

from pytest_ddtree.gates import coding, coding_problems
from pytest_ddtree.service import proof
from pytest_ddtree import sandbox
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.gates.lossless import MAX_NEW_TOKENS, load_prompts
from pytest_ddtree.records.shapes import ThroughputRecord
from pytest_ddtree.report.text import bench_serving_arguments
from pytest_ddtree.sandbox import Verdict
from pytest_ddtree.service.manager import REFERENCE_LABEL, Hooks, Pacing, Placement, RunningService, ServiceManager
from pytest_ddtree.service.process import _group_members
from pytest_ddtree.service.profile import load_profile
from pytest_ddtree.service.readiness import not_speculating
from tests.bench_serving_contract import check_result
from tests.polling import wait_until
from tests.sglang_lane import CALLS_LOG_ENV, SGLANG_PYTHON_ENV, SGLANG_VERSION, STANDIN_DIR, build_tiny_model, sglang_python
from tests.suite_helpers import MATRIX, REPO, default_sigint, run_suite

SGLANG_PYTHON, WHY_NOT = sglang_python()
PROFILE = REPO / "suites" / "services" / "sglang-cpu.yaml"
#: What 0.5.23 says when a CPU is asked for DFLASH (sglang/srt/arg_groups/speculative_hook.py:291-301).
DFLASH_REFUSAL = "ValueError: DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'."
#: Lines of a start-up that got as far as loading the model (sglang/srt/model_executor).
LOADING_LINES = ("Load weight begin", "KV Cache is allocated")

# Every test here waits on a real server's start-up (~20 s, more under load): all slow.
pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.skipif(SGLANG_PYTHON is None, reason=WHY_NOT)]


@dataclass
class Lane:
    model: Path
    calls: Path  # where the sgl_kernel stand-in writes the name of anything called


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    """The tiny model, and the profile's variables set for this module (and the sessions it runs)."""
    root = tmp_path_factory.mktemp("sglang-lane")
    model = build_tiny_model(root / "model")
    calls = root / "sgl_kernel_calls.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SGLANG_PYTHON_ENV, str(SGLANG_PYTHON))
        mp.setenv("DDTREE_SGLANG_MODEL", str(model))
        mp.setenv("DDTREE_SGLANG_PYTHONPATH", str(STANDIN_DIR))
        mp.setenv(CALLS_LOG_ENV, str(calls))
        yield Lane(model, calls)


def _tree(pid: int) -> set[int]:
    """``pid``'s process group and every descendant of it, from /proc (a worker that left the group too)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if fields[0] not in ("Z", "X"):
                parents[int(entry.name)] = int(fields[1])
    tree = {pid, *(_group_members(pid) or [])}
    grown = True
    while grown:
        children = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= children
        grown = bool(children)
    return {p for p in tree if p in parents}


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.add(pid)
    return alive


@dataclass
class Served:
    manager: ServiceManager
    service: RunningService
    progress: list[str] = field(default_factory=list)

    @property
    def client(self) -> SGLangClient:
        return self.service.client


@pytest.fixture(scope="class")
def served(lane: Lane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The non-speculative launch of the profile, by the service manager (progress each second)."""
    progress: list[str] = []
    manager = ServiceManager(load_profile(PROFILE), Placement(0, tmp_path_factory.mktemp("sglang-logs")),
                             pacing=Pacing(progress_interval=1.0), hooks=Hooks(progress.append))
    try:
        yield Served(manager, manager.ensure_reference(), progress)
    finally:
        assert manager.close() == []


class TestOneServer:
    """The tests that only read, on one server the service manager launched from the profile
    (torn down before the sessions below start theirs: an idle SGLang still holds 3 GB)."""

    def test_readiness_shows_progress_through_the_real_start_up(self, served: Served) -> None:
        waits = [line for line in served.progress if line.startswith(f"waiting for service {REFERENCE_LABEL} (process group")]
        assert waits, served.progress  # a real start-up takes seconds: at least one progress line a second
        assert all(" s elapsed, last: " in line for line in waits), waits
        assert any(line.startswith(f"{REFERENCE_LABEL} ready on http://127.0.0.1:") for line in served.progress)
        (launch,) = served.manager.launches
        assert launch["outcome"] == "ready" and launch["engine_version"] == SGLANG_VERSION
        assert "--speculative" not in str(launch["command"])  # the command without config_args
        log = Path(str(launch["log"])).read_text()
        assert all(line in log for line in LOADING_LINES) and "The server is fired up and ready to roll!" in log

    def test_server_info_model_info_and_metrics_read_by_the_harness(self, served: Served, lane: Lane) -> None:
        info = served.service.server_info  # what the manager read after readiness
        assert info["version"] == SGLANG_VERSION and info["model_path"] == str(lane.model)
        assert info["enable_metrics"] is True and info["max_total_num_tokens"] == 16384
        states = info["internal_states"]
        assert isinstance(states, list) and isinstance(states[0], dict)
        # nothing speculates on a CPU, and the harness says so from /server_info alone
        assert info["speculative_algorithm"] is None and info["speculative_num_draft_tokens"] is None
        assert not_speculating(info, ["speculative_num_draft_tokens", "speculative_dflash_block_size"]) == (
            "/server_info has speculative_algorithm null (and speculative_dflash_block_size, speculative_num_draft_tokens null)")
        model = served.client.model_info()
        assert model["model_path"] == str(lane.model) and model["is_generation"] is True
        text = served.client.metrics()
        assert proof.metric_value(text, "sglang:max_total_num_tokens") == 16384
        assert proof.metric_value(text, "sglang:num_running_reqs") == 0
        # 0.5.23 publishes the speculative gauges from start-up, at 0, even where nothing speculates
        assert proof.metric_value(text, "sglang:spec_num_draft_tokens") == 0

    def test_generate_answers_as_the_harness_reads_it(self, served: Served) -> None:
        answer = served.client.generate(text="Once upon a time", sampling_params={"max_new_tokens": 16, "temperature": 0.0,
                                                                                "ignore_eos": True})
        meta = answer["meta_info"]
        assert meta["completion_tokens"] == 16 and meta["prompt_tokens"] > 0
        assert not [key for key in meta if key.startswith("spec_")], meta  # no verify ran: no spec_* key
        # the copy probe's reading of such an answer: no histogram, and the server does not speculate
        result = proof.run_copy_probe(lambda text, sampling: served.client.generate(text=text, sampling_params=dict(sampling)),
                                      bound=7, max_requests=1, max_new_tokens=8)
        assert result.no_spec == 1 and result.histogram == []
        judged = proof.judge({"block_size": 8, "budget": 7, "topk": 1, "window": 2048}, settable=["block_size"],
                             reported=[], probe=result, startup=None, metrics_text=None)
        assert any(f.startswith("the server does not speculate: ") for f in judged.failures), judged.failures

    def test_flush_cache_answers_idle_and_busy(self, served: Served) -> None:
        assert served.client.flush_cache() is True  # idle: flushed
        long_request = threading.Thread(target=served.client.generate, kwargs={
            "text": "busy", "sampling_params": {"max_new_tokens": 1500, "temperature": 0.0, "ignore_eos": True}})
        long_request.start()
        try:
            wait_until(lambda: proof.metric_value(served.client.metrics(), "sglang:num_running_reqs") == 1, 60,
                       "the long request to be running")
            assert served.client.flush_cache() is False  # 400 while a request runs: the harness's "not now"
        finally:
            long_request.join(timeout=300)
        assert served.client.flush_cache() is True

    def test_coding_gate_fails_cleanly_on_random_weights(self, served: Served) -> None:
        refused = sandbox.refusal(sandbox.isolation(), allow_plain=False)
        if refused:
            pytest.skip(f"the coding gate runs nothing here: {refused}")
        problems = coding_problems.select_problems("default", 2)
        results = coding.solve(served.client, problems, max_tokens=48)
        verdicts = {r.id: r.verdict for r in results}
        # the real chat answers were read (no failed request, no invalid response), and what they hold fails
        assert not [r for r in results if r.verdict is Verdict.PASSED
                    or r.message.startswith(("the chat request failed", "invalid response"))], \
            [(r.id, r.verdict, r.message) for r in results]
        # the evidence: each problem's answer, its verdict and why (a random model may still stop at its EOS)
        assert all(r.answer and 0 < (r.completion_tokens or 0) <= 48 and r.message for r in results), \
            [(r.id, r.completion_tokens, r.message) for r in results]
        gate = coding.compare(None, verdicts, None)
        assert not gate.passed and gate.pass_count == 0 and gate.total == 2
        table = coding.render_table(results)
        assert all(p.id in table and verdicts[p.id].value in table for p in problems), table

    def test_nothing_called_the_sgl_kernel_stand_in(self, served: Served, lane: Lane) -> None:
        assert served.client.generate(text="one more", sampling_params={"max_new_tokens": 8})["meta_info"]["completion_tokens"] > 0
        # the server imports sgl_kernel from the stand-in and no other (the venv has none of its own) ...
        pid = int(served.manager.launches[-1]["pid"] or 0)
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        assert environ["PYTHONPATH"] == str(STANDIN_DIR) and environ[CALLS_LOG_ENV] == str(lane.calls)
        bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        own = subprocess.run([str(SGLANG_PYTHON), "-c", "import importlib.util; print(importlib.util.find_spec('sgl_kernel'))"],
                             env=bare, capture_output=True, text=True, timeout=60, check=True)
        assert own.stdout.strip() == "None"
        # ... which writes down whatever is called (so an empty log means something) ...
        probe_log = lane.calls.with_name("probe.log")
        called = subprocess.run([str(SGLANG_PYTHON), "-c", "import sgl_kernel; sgl_kernel.copy_all_layer_kv_cache_cpu()"],
                                env={**bare, "PYTHONPATH": str(STANDIN_DIR), CALLS_LOG_ENV: str(probe_log)},
                                capture_output=True, text=True, timeout=60, check=False)
        assert called.returncode != 0 and probe_log.read_text() == "copy_all_layer_kv_cache_cpu\n"
        # ... and after start-up, generate, chat, streaming and flushes nothing was called
        assert not lane.calls.exists(), lane.calls.read_text()

    def test_a_server_that_does_not_speculate_is_told_so(self, served: Served, pytester: pytest.Pytester) -> None:
        """The profile's configs, pointed at this running (non-speculative) server as an external
        service: the applied check fails, and says why."""
        raw = yaml.safe_load(PROFILE.read_text())
        for key in ("command", "python", "env", "lossless", "lossless_args", "control_launches"):
            raw.pop(key, None)
        raw.update(name="sglang-cpu-external", controller="external", url=served.service.url,
                   port=int(served.service.url.rsplit(":", 1)[1]))
        profile = pytester.path / "external.yaml"
        profile.write_text(yaml.safe_dump(raw))
        result = run_suite(pytester, profile, suite="test_health.py", config=None, timeout=120)
        assert result.ret == 1, result.stdout.str()[-3000:]
        result.stdout.fnmatch_lines(["*service does not run config bs8_b7_k1: 3 applied value(s) differ in /server_info of the "
                                     "external service *; the server does not speculate: /server_info has "
                                     "speculative_algorithm null (and speculative_draft_window_size, speculative_eagle_topk, "
                                     "speculative_num_draft_tokens null)"])

    def test_measure_only_gives_the_plain_servers_numbers(self, served: Served, pytester: pytest.Pytester) -> None:
        """``--ddtree-url`` with ``--ddtree-measure-only`` against this running plain server (bench_serving's
        habit): the row specnone with its tok/s, TPOT and req/s, no acceptance, nothing judged or blessed."""
        result = pytester.runpytest_subprocess(
            str(REPO / "suites" / "test_throughput.py"), f"--rootdir={REPO}", f"--ddtree-url={served.service.url}",
            "--ddtree-measure-only", "--ddtree-cell=c1_short", f"--ddtree-results={pytester.path / 'results'}",
            f"--ddtree-baselines={pytester.path / 'baselines'}", "-p", "no:cacheprovider", timeout=300)
        assert result.ret == 0, result.stdout.str()[-3000:]
        result.stdout.fnmatch_lines(["ddtree: configs specnone",
                                     "MEASURED: 1 cell(s) of 1 config(s) measured (specnone); nothing was judged*"])
        (cell,) = json.loads((pytester.path / "results" / "results.json").read_text())["throughput"]
        assert (cell["config"], cell["status"], cell["ddtree_tokens_per_verify"]) == ("specnone", "measured", None)
        assert cell["output_throughput"] > 0 and cell["median_tpot_ms"] > 0 and cell["request_throughput"] > 0
        assert cell["total_output_tokens"] == cell["completed"] * cell["output_tokens"]
        assert not (pytester.path / "baselines").exists()

    def test_restart_between_two_launches(self, served: Served) -> None:
        first = int(served.manager.launches[-1]["pid"] or 0)
        before = _tree(first)
        assert len(before) >= 3, before  # the launcher, its scheduler and detokenizer
        served.manager.release()
        assert _alive(before) == set()  # stop() returns once the whole group is gone
        served.service = served.manager.ensure_reference()
        second = served.manager.launches[-1]
        assert second["outcome"] == "ready" and int(second["pid"] or 0) != first
        assert served.client.server_info()["version"] == SGLANG_VERSION
        assert served.client.generate(text="again", sampling_params={"max_new_tokens": 4})["meta_info"]["completion_tokens"] == 4


def _records(results: Path, kind: str) -> list[dict[str, Any]]:
    found = []
    for path in results.glob("records-*.jsonl"):
        found += [r for line in path.read_text().splitlines() if (r := json.loads(line)).get("kind") == kind]
    return found


def test_a_session_on_the_profile_measures_the_control_and_refuses_dflash(pytester: pytest.Pytester, lane: Lane) -> None:
    """``pytest suites`` against the profile as shipped, the build's default config (bs8_b7_k1):
    the control (the non-speculative launch) is measured through the load generator, the config's
    DFLASH launch is refused by SGLang before any model loads and every test of it says why."""
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_health.py"), str(REPO / "suites" / "test_throughput.py"),
        str(REPO / "suites" / "test_lossless.py"), f"--ddtree-service={PROFILE}", f"--ddtree-matrix={MATRIX}",
        f"--ddtree-results={pytester.path / 'results'}", f"--ddtree-baselines={pytester.path / 'baselines'}",
        "--ddtree-cell=c1_short", "-p", "no:cacheprovider", "-rA", timeout=480,
    )
    out = result.stdout.str()
    assert result.ret == 1 and result.parseoutcomes().get("errors") == 5, out[-4000:]
    assert "ddtree: configs bs8_b7_k1" in out
    # the refusal: SGLang's own last line in the failure's first line, and nothing was loaded
    result.stdout.fnmatch_lines([f"service for config bs8_b7_k1: service exited while starting: process * exited with code 1: "
                                 f"{DFLASH_REFUSAL}; exit code: 1; after * s"])
    launches = {r["config"]: r["launch"] for r in _records(pytester.path / "results", "launch")}
    refused, reference = launches["bs8_b7_k1"], launches[REFERENCE_LABEL]
    assert refused["outcome"].startswith("failed: ") and "--speculative-algorithm DFLASH --speculative-dflash-block-size 8" in refused["command"]
    refused_log = Path(refused["log"]).read_text()
    assert DFLASH_REFUSAL in refused_log and not any(line in refused_log for line in LOADING_LINES)
    # the control is the lossless reference's launch: the command without config_args, really served
    assert reference["outcome"] == "ready" and reference["engine_version"] == SGLANG_VERSION
    assert re.sub(r"--port \d+", "", reference["command"]) == re.sub(r"--port \d+", "", refused["command"].split(" --speculative-algorithm")[0])
    assert all(line in Path(reference["log"]).read_text() for line in LOADING_LINES)
    assert "control: non-speculative launch (the profile's lossless_args) on this host, 1 launch on 1 cell" in out
    # its throughput cell, measured by the load generator: bench_serving's keys and types from a real server
    repeats = _records(pytester.path / "results", "throughput-control-repeat")
    assert len(repeats) >= 3, repeats
    for rec in repeats:
        metrics = rec["metrics"]
        cell = {**bench_serving_arguments(cast(ThroughputRecord, rec)), **metrics}
        assert check_result(cell) == [], check_result(cell)
        assert rec["problems"] == [] and metrics["completed"] == 3 and metrics["total_output_tokens"] == 3 * 64
        assert metrics["ddtree_server_input_tokens"] == metrics["total_input_tokens"] == 3 * 128  # cut by /tokenize
        assert metrics["output_throughput"] > 0 and metrics["accept_length"] is None and metrics["ddtree_spec_verify_ct"] is None
    assert _alive(set().union(*(_tree(int(launch["pid"])) for launch in launches.values()))) == set()
    assert not lane.calls.exists(), lane.calls.read_text()


HOLDING_TEST = '''
import json, threading

def test_hold(ddtree_lossless_reference, ddtree_session):
    # the lossless gate's reference, measured by the plugin on the real server, which stays up
    transcripts = ddtree_lossless_reference.transcripts.values()
    print("SERVING", json.dumps({"pid": ddtree_session.manager.launches[-1]["pid"],
                                 "floor": ddtree_lossless_reference.floor.to_json(),
                                 "tokens": sorted({len(t.output_ids or ()) for t in transcripts}),
                                 "errors": [t.error for t in transcripts if t.error]}), flush=True)
    threading.Event().wait(600)  # the outer test sends SIGINT while we are here
'''


def test_ctrl_c_with_the_server_up_leaves_nothing_running(pytester: pytest.Pytester, lane: Lane) -> None:
    """The lossless reference measured by the plugin's fixture, then Ctrl-C while its server is up."""
    pytester.makepyfile(test_hold=HOLDING_TEST)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "test_hold.py", f"--ddtree-service={PROFILE}",
         f"--ddtree-matrix={MATRIX}", f"--ddtree-results={pytester.path / 'results'}"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=default_sigint,
    )
    seen: list[str] = []
    try:
        stdout = proc.stdout
        assert stdout is not None

        def serving() -> bool:
            line = stdout.readline()
            seen.append(line)
            return line == "" or line.startswith("SERVING")

        # a start-up under CI load; the wait ends at the first SERVING line (or the end of the output)
        wait_until(serving, 400, lambda: "the SERVING line:\n" + "".join(seen)[-3000:], interval=0)
        assert seen and seen[-1].startswith("SERVING"), "".join(seen)[-3000:]
        held = json.loads(seen[-1].split(" ", 1)[1])
        # every lossless prompt generated twice (all at once, then one at a time), none of them empty
        assert held["errors"] == [] and 0 < min(held["tokens"]) <= max(held["tokens"]) <= MAX_NEW_TOKENS, held
        assert held["floor"]["compared"] == len(load_prompts()), held
        tree = _tree(int(held["pid"]))
        assert len(tree) >= 3, tree  # the launcher, its scheduler and detokenizer are up
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, "".join(seen) + rest
    wait_until(lambda: _alive(tree) == set(), 30, f"the server's processes {sorted(tree)} to be gone after Ctrl-C")
    assert not lane.calls.exists(), lane.calls.read_text()
