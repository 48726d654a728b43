"""A service that reports one config and serves another fails with the behaviour's evidence:
real reference-engine processes with the serve-* faults, driven by the service manager."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from pytest_ddtree.service import proof
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.base import ConfigNotServed
from pytest_ddtree.service.manager import Clients, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ServiceProfile, parse_profile

REFERENCE = Path(__file__).resolve().parent.parent / "suites" / "services" / "reference.yaml"


def ref_profile(extra: str = "", **overrides: Any) -> ServiceProfile:
    raw = yaml.safe_load(REFERENCE.read_text())
    raw["command"] = raw["command"].replace("--clock-scale 10", "--clock-scale 100") + (" " + extra if extra else "")
    raw.update(overrides)
    return parse_profile(raw)


@pytest.fixture
def managers() -> Iterator[list[ServiceManager]]:
    made: list[ServiceManager] = []
    yield made
    for m in made:
        m.close()


def manager(profile: ServiceProfile, tmp_path: Path, made: list[ServiceManager]) -> ServiceManager:
    m = ServiceManager(profile, Placement(0, tmp_path / "logs", tmp_path / "locks"), pacing=Pacing(poll_interval=0.1),
                       clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)))
    made.append(m)
    return m


def test_a_healthy_engine_proves_block_size_and_budget_by_behaviour(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--enable-metrics --decode-log-interval 2"), tmp_path, managers)
    svc = m.ensure(parse_config_name("bs8_b4_k4"))
    assert svc.proof is not None and not svc.proof.failures
    fields = svc.proof.fields
    assert fields["budget"].status == proof.PROVEN and "copy probe reached the bound of 4" in fields["budget"].detail
    assert fields["block_size"].status == proof.PROVEN and "start-up line says block_size=8" in fields["block_size"].detail
    # the probe's decode batches fold a decode-log interval: the worker's block size is on /metrics
    assert "/metrics sglang:spec_num_draft_tokens is 8" in fields["block_size"].detail
    assert fields["topk"].status == proof.REPORTED and fields["window"].status == proof.REPORTED
    assert m.launches[-1]["applied_evidence"]["fields"]["budget"]["status"] == proof.PROVEN


@pytest.mark.parametrize("config, fault, evidence", [
    # serves a larger tree than it reports: verifies accept more drafts than the config allows
    ("bs8_b4_k4", "serve-budget=8", "accepted more than 4 drafts"),
    # serves a smaller block: the start-up line fails it, the probe's pile-up below the bound is shown beside
    ("bs8_b8_k4", "serve-block-size=4", "pile up at 3 accepted drafts"),
])
def test_a_service_serving_another_tree_fails_with_the_histogram(tmp_path: Path, managers: list[ServiceManager],
                                                                 config: str, fault: str, evidence: str) -> None:
    m = manager(ref_profile(f"--fault {fault}"), tmp_path, managers)
    with pytest.raises(ConfigNotServed) as info:
        m.ensure(parse_config_name(config))
    text = str(info.value)
    assert evidence in text and "histogram [" in text, text
    assert "reports config" in text and m.launches[-1]["outcome"].startswith("failed")
    with pytest.raises(ConfigNotServed):  # remembered: no second start of a config that lied
        m.ensure(parse_config_name(config))


def test_without_the_log_the_histogram_alone_catches_it(tmp_path: Path, managers: list[ServiceManager]) -> None:
    """The command controller without a logs command reads no start-up lines: the histogram
    evidence is all there is, and it is enough."""
    m = manager(ref_profile("--fault serve-budget=8"), tmp_path, managers)
    m._controller_for_profile().startup_log = lambda: None  # type: ignore[method-assign]
    with pytest.raises(ConfigNotServed) as info:
        m.ensure(parse_config_name("bs8_b4_k4"))
    # the histogram's bound and the tokens per verify it implies are two pieces of evidence, both named
    failures = info.value.failures
    assert len(failures) == 2, failures
    assert any("accepted more than 4 drafts" in f for f in failures), failures
    assert any("tokens per verify, above the config's maximum of 5" in f for f in failures), failures


def test_metrics_catch_a_smaller_block(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--enable-metrics --decode-log-interval 2 --fault serve-block-size=4"), tmp_path, managers)
    m._controller_for_profile().startup_log = lambda: None  # type: ignore[method-assign]
    with pytest.raises(ConfigNotServed) as info:
        m.ensure(parse_config_name("bs8_b8_k4"))
    assert any("/metrics sglang:spec_num_draft_tokens is 4 while a request decodes, the config's block size is 8" in f
               for f in info.value.failures), info.value.failures


def test_startup_lines_catch_a_smaller_block_without_the_probe(tmp_path: Path, managers: list[ServiceManager]) -> None:
    m = manager(ref_profile("--enable-metrics --decode-log-interval 2 --fault serve-block-size=4", copy_probe=False),
                tmp_path, managers)
    with pytest.raises(ConfigNotServed) as info:
        m.ensure(parse_config_name("bs8_b8_k4"))
    assert any("start-up line says block_size=4" in f for f in info.value.failures), info.value.failures


def test_an_external_service_is_probed_once_its_server_info_matches(tmp_path: Path, managers: list[ServiceManager]) -> None:
    """No log to read there: the copy probe's histogram alone fails the config."""
    from tests.refserver_helpers import RefServer, config_args

    server = RefServer([*config_args("bs8_b4_k4_w2048"), "--clock-scale", "100", "--fault", "serve-budget=8"], tmp_path).wait_ready()
    try:
        raw = yaml.safe_load(REFERENCE.read_text())
        profile = parse_profile({"name": "shared", "controller": "external", "url": server.url, "port": server.port,
                                 "default_window": raw["default_window"], "config_args": raw["config_args"],
                                 "applied": raw["applied"], "health_path": "/health", "lossless": "golden"})
        m = manager(profile, tmp_path, managers)
        with pytest.raises(ConfigNotServed) as info:
            m.ensure(parse_config_name("bs8_b4_k4"))
        assert any("accepted more than 4 drafts" in f for f in info.value.failures), info.value.failures
    finally:
        server.stop()


def test_measured_requests_above_the_bound_make_the_cell_invalid(tmp_path: Path) -> None:
    """With the probe off, the throughput cell's own requests carry the histogram evidence."""
    from pytest_ddtree.measure import load
    from tests.refserver_helpers import RefServer, config_args

    server = RefServer([*config_args("bs8_b4_k4"), "--clock-scale", "100", "--fault", "serve-budget=8"], tmp_path).wait_ready()
    try:
        cell = load.Cell("c2_tiny", concurrency=2, context_tokens=48, output_tokens=32, requests=4, warmup_requests=0)
        result = load.run_cell(server.url, cell, speculative=True, accept_bound=4)
    finally:
        server.stop()
    assert not result.valid
    assert any("the config did not apply" in p and "more than 4 drafts" in p for p in result.problems()), result.problems()


def _health_run(pytester: pytest.Pytester, engine_args: str) -> tuple[pytest.RunResult, list[dict[str, Any]]]:
    """suites/test_health.py for bs8_b8_k4 through the plugin, against the shipped reference profile
    (metrics on) with ``engine_args``; the launches it recorded."""
    from tests.suite_helpers import run_suite

    raw = yaml.safe_load(REFERENCE.read_text())
    raw["command"] = raw["command"].replace("--clock-scale 10", f"--clock-scale 50 {engine_args}")
    raw["pool"] = 1
    profile = pytester.path / "profile.yaml"
    profile.write_text(yaml.safe_dump(raw))
    result = run_suite(pytester, profile, suite="test_health.py")
    launches = [json.loads(line)["launch"] for path in (pytester.path / "results").glob("records-*.jsonl")
                for line in path.read_text().splitlines() if '"kind": "launch"' in line]
    return result, launches


@pytest.mark.slow
def test_a_gauge_with_sglangs_cadence_passes_the_config(pytester: pytest.Pytester) -> None:
    """0.5.23's cadence with a decode-log interval the probe never reaches: the gauge reads 0 while
    the probe's request decodes; that is no evidence, and bs8_b8_k4 passes (it used to fail with
    'spec_num_draft_tokens is 0, the config's block size is 8')."""
    result, launches = _health_run(pytester, "--decode-log-interval 100000")
    assert result.ret == 0 and result.parseoutcomes().get("passed") == 3, result.stdout.str()[-3000:]
    evidence = next(launch["applied_evidence"] for launch in launches if launch.get("outcome") == "ready")
    assert evidence["spec_num_draft_tokens"] == 0.0 and not evidence["failures"]
    assert "spec_num_draft_tokens" not in evidence["fields"]["block_size"]["detail"]


@pytest.mark.slow
def test_another_block_size_served_while_decoding_fails_with_the_metric(pytester: pytest.Pytester) -> None:
    """The same cadence with an interval the probe passes, on an engine that reports block size 8
    and serves 4: the gauge, read while a request decodes, is the evidence in the failure."""
    result, _ = _health_run(pytester, "--decode-log-interval 2 --fault serve-block-size=4")
    out = result.stdout.str()
    assert result.ret == 1 and "/metrics sglang:spec_num_draft_tokens is 4 while a request decodes, the config's block size is 8" in out, out[-3000:]
