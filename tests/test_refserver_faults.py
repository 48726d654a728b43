"""Every fault of the reference engine behaves as documented (each is used here)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.polling import wait_until
from tests.refserver_helpers import RefServer, start_many

FAST = ["--clock-scale", "200", "--speculative-algorithm", "DFLASH"]
BODY = {"text": "def merge_sort(items):", "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RefServer]]:
    specs = {
        "base": FAST,
        "none": ["--clock-scale", "200"],  # no speculative flag: plain, as SGLang
        "slowdown": [*FAST, "--fault", "slowdown=3"],
        "jitter": [*FAST, "--fault", "clock-jitter=0.5"],
        "topk": [*FAST, "--speculative-eagle-topk", "4", "--fault", "ignore-config=topk"],
        "lossy": [*FAST, "--fault", "lossy-verify=0.5"],
        "http500": [*FAST, "--fault", "http500-rate=0.5", "--seed", "3"],
        # combinable: several faults in one process, comma list and repeated flag
        "combo": [*FAST, "--fault", "slowdown=2,ignore-config=topk", "--fault", "exit-after=3"],
    }
    s = start_many(specs, tmp_path_factory.mktemp("faults"))
    yield s
    for srv in s.values():
        srv.stop()


def busy_after_one_request(srv: RefServer) -> tuple[list[int], float]:
    r = srv.post("/generate", json=BODY).json()
    return r["output_ids"], float(srv.info()["internal_states"][0]["simulated_busy_seconds"])  # type: ignore[index]


def test_slowdown_multiplies_step_cost(servers: dict[str, RefServer]) -> None:
    ids, base = busy_after_one_request(servers["base"])
    ids2, slow = busy_after_one_request(servers["slowdown"])
    assert ids == ids2
    assert slow == pytest.approx(3 * base, rel=1e-6)


def test_clock_jitter_perturbs_step_time(servers: dict[str, RefServer]) -> None:
    _, base = busy_after_one_request(servers["base"])
    _, jit = busy_after_one_request(servers["jitter"])
    assert jit != pytest.approx(base, rel=1e-3)
    assert 0.5 * base < jit < 1.5 * base


def test_ignore_config_topk_runs_and_reports_topk_1(servers: dict[str, RefServer]) -> None:
    info = servers["topk"].info()
    assert info["speculative_eagle_topk"] == 1
    assert servers["topk"].post("/generate", json=BODY).json()["output_ids"] == servers["base"].post("/generate", json=BODY).json()["output_ids"]


def test_lossy_verify_breaks_losslessness(servers: dict[str, RefServer]) -> None:
    differs = 0
    for text in ("def merge_sort(items):", "The history of computing", "Once upon a time"):
        body = {"text": text, "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}
        a = servers["none"].post("/generate", json=body).json()["output_ids"]
        b = servers["lossy"].post("/generate", json=body).json()["output_ids"]
        differs += a != b
    assert differs >= 2


def test_http500_rate(servers: dict[str, RefServer]) -> None:
    srv = servers["http500"]
    codes = [srv.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code for _ in range(30)]
    assert codes.count(500) >= 5 and codes.count(200) >= 5 and set(codes) == {200, 500}
    assert srv.get("/health").status_code == 200


def test_combined_faults_then_exit_after_n(servers: dict[str, RefServer]) -> None:
    srv = servers["combo"]
    assert srv.info()["speculative_eagle_topk"] == 1
    _, busy = busy_after_one_request(srv)
    assert busy > 0
    for _ in range(2):
        assert srv.post("/generate", json=BODY).status_code == 200
    assert srv.proc.wait(10) != 0  # exited right after the 3rd completed request
    assert "exit-after=3" in srv.log()
    with pytest.raises(requests.ConnectionError):
        srv.get("/health", timeout=2)


def test_crash_on_start(tmp_path: Path) -> None:
    srv = RefServer(["--fault", "crash-on-start"], tmp_path)
    try:
        assert srv.proc.wait(15) != 0
        assert "Traceback" in srv.log()
    finally:
        srv.stop()


def test_hang_after_n(tmp_path: Path) -> None:
    srv = RefServer([*FAST, "--fault", "hang-after=1"], tmp_path).wait_ready()
    try:
        assert srv.post("/generate", json=BODY).status_code == 200
        for path in ("/generate", "/health"):
            with pytest.raises(requests.Timeout):
                if path == "/health":
                    srv.get(path, timeout=1)
                else:
                    srv.post(path, json=BODY, timeout=1)
        assert srv.proc.poll() is None  # alive, just not answering
    finally:
        srv.stop()


def _start_phases(srv: RefServer, started: float, generate_refused: bool) -> tuple[float, float]:
    """Seconds refused (port closed), then seconds answering 503, until health says 200."""
    first_answer = None
    codes: list[int] = []

    def healthy() -> bool:
        nonlocal first_answer
        try:
            code = srv.get("/health", timeout=2).status_code
        except requests.ConnectionError:  # the port is not open yet: normal
            return False
        if first_answer is None:
            first_answer = time.monotonic()
            if generate_refused:  # a long warm-up: generation is refused too, with a message
                r = srv.post("/generate", json=BODY)
                assert r.status_code == 503 and r.json()["error"]["message"]
        codes.append(code)
        return code == 200

    wait_until(healthy, 60, lambda: f"/health to answer 200 (answers so far: {codes})")
    assert first_answer is not None and codes[-1] == 200, codes
    assert set(codes[:-1]) <= {503}  # never an error or a hang
    return first_answer - started, time.monotonic() - first_answer


def test_start_refuses_connections_while_loading_then_answers_503_during_warm_up(tmp_path: Path) -> None:
    """As SGLang: the port opens only after the weights are loaded (http_server.py launch_server),
    then health answers 503 until the warm-up is done (server_status Starting). Two engines side by
    side, one loading 2.5 s longer and one warming up 2.5 s longer: each spends its extra time in
    its own phase."""
    started = time.monotonic()
    loading = RefServer([*FAST, "--load-seconds", "2.5"], tmp_path, "loading")
    warming = RefServer([*FAST, "--fault", "slow-start=2.5"], tmp_path, "warming")
    try:
        with ThreadPoolExecutor(2) as pool:
            (load_refused, load_503), (warm_refused, warm_503) = pool.map(lambda args: _start_phases(*args), [(loading, started, False), (warming, started, True)])
        assert load_refused > warm_refused + 1.0, (load_refused, warm_refused)
        assert warm_503 > load_503 + 1.0, (warm_503, load_503)
    finally:
        loading.stop()
        warming.stop()


def test_the_documented_way_to_run_a_session_against_a_faulty_engine_puts_the_fault_in_every_launch(tmp_path: Path) -> None:
    """docs/reference-engine.md's commands, run as printed (the copy written under tmp_path): the profile they
    make is valid and every launch it renders, a config's and the plain one (the control's, the lossless
    reference's), carries the fault."""
    import re
    import subprocess

    from pytest_ddtree.configs import parse_config_name
    from pytest_ddtree.service.profile import load_profile

    repo = Path(__file__).resolve().parent.parent
    text = (repo / "docs" / "reference-engine.md").read_text()
    (sed,) = re.findall(r"^    (sed .*reference\.yaml > /tmp/faulty\.yaml)$", text, re.M)
    (session,) = re.findall(r"^    (pytest suites --ddtree-service=/tmp/faulty\.yaml .*)$", text, re.M)
    copy = tmp_path / "faulty.yaml"
    subprocess.run(["bash", "-c", sed.replace("/tmp/faulty.yaml", str(copy))], cwd=repo, check=True)
    profile = load_profile(copy)
    fault = re.search(r"--fault [^/\s]+", sed)
    assert fault is not None and session.endswith("--ddtree-config=bs8_b8_k4")
    assert fault.group(0) in profile.render_command(parse_config_name("bs8_b8_k4"), 30000)
    assert fault.group(0) in (profile.command or "")  # the plain launch is the command without config_args
