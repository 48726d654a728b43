"""Hardware profile names: reference engine, CPU, GPUs, override."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_ddtree.service import fingerprint


@dataclass(frozen=True)
class _Gpu:
    name: str


@dataclass(frozen=True)
class _Inventory:
    gpus: tuple[_Gpu, ...]
    driver_version: str | None = "580.1"
    cuda_driver_version: str | None = "13.0"


@dataclass(frozen=True)
class _Profile:
    hardware_profile: str | None = None


SGLANG = {"version": "0.5.3", "model_path": "/models/moonshotai/Kimi-K2.6",
          "speculative_draft_model_path": "/models/dflash-k26", "speculative_algorithm": "DFLASH", "tp_size": 8}


def test_reference_engine_has_a_stable_name() -> None:
    a = fingerprint.fingerprint({"version": "refserver 0.1.0"})
    assert a.name == "refserver" and a.legacy_name is None
    assert fingerprint.local_fingerprint(_Profile(), {"version": "refserver 0.1.0"}).name == "refserver"
    assert a.build["engine_version"] == "refserver 0.1.0" and len(a.digest) == 8
    # another engine version is another build of the same setup: the same folder
    assert fingerprint.fingerprint({"version": "refserver-0.2.0"}).name == "refserver"


def test_the_folder_is_the_setup_the_user_holds_fixed_and_the_build_is_recorded_beside_it() -> None:
    """GPUs, target model and tensor parallelism name the folder; engine version, drafter, algorithm
    and driver are the build under test: a new drafter or an SGLang upgrade is the same folder."""
    inv = _Inventory(tuple(_Gpu("NVIDIA H200") for _ in range(8)))
    fp = fingerprint.fingerprint(SGLANG, inventory=inv)
    assert fp.name.startswith("8xH200-Kimi-K2.6-") and fp.name.endswith(fp.digest)
    assert fp.details == {"gpu": "8xH200", "model": "Kimi-K2.6", "tp_size": 8}
    assert fp.build == {"engine_version": "0.5.3", "speculative_algorithm": "DFLASH", "drafter": "/models/dflash-k26",
                        "driver": "580.1", "cuda_driver": "13.0"}
    for change in ({"speculative_draft_model_path": "/m/other"}, {"version": "0.5.24"}, {"speculative_algorithm": "DDTREE"}):
        assert fingerprint.fingerprint(dict(SGLANG, **change), inventory=inv).name == fp.name, change
    assert fingerprint.fingerprint(SGLANG, inventory=_Inventory(inv.gpus, driver_version="590.2")).name == fp.name
    for key, other in (("tp_size", 4), ("model_path", "/models/other")):
        assert fingerprint.fingerprint(dict(SGLANG, **{key: other}), inventory=inv).name != fp.name, key
    assert fingerprint.fingerprint(SGLANG, inventory=_Inventory(inv.gpus[:4])).name != fp.name
    # the older layout's folder of the same facts: the engine version in the name, the build in the hash
    assert fp.legacy_name is not None and fp.legacy_name.startswith("8xH200-sglang-0.5.3-Kimi-K2.6-")
    assert fingerprint.fingerprint(dict(SGLANG, speculative_draft_model_path="/m/other"), inventory=inv).legacy_name != fp.legacy_name


def test_cpu_and_override() -> None:
    fp = fingerprint.fingerprint(SGLANG, inventory=_Inventory(()))
    assert fp.name.startswith("cpu-Kimi-K2.6-") and fp.legacy_name is not None and fp.legacy_name.startswith("cpu-sglang-0.5.3-")
    assert fingerprint.fingerprint(SGLANG, override="lab a/b!").name == "lab-a-b"
    assert fingerprint.fingerprint(SGLANG, override="lab").legacy_name is None
    assert fingerprint.local_fingerprint(_Profile("fleet-h200"), SGLANG).name == "fleet-h200"


def test_sanitize() -> None:
    assert fingerprint.sanitize("../../etc") == "etc"
    assert fingerprint.sanitize("") == "unknown"
    assert "/" not in fingerprint.sanitize("a/b c")


def test_backend_page_size_overlap_and_dp_enter_the_fingerprint_unless_swept() -> None:
    """Two deployments that differ only in attention backend, page size, overlap scheduling or dp
    are different baseline folders; a profile that sweeps one as an axis leaves it to the names."""
    inv = _Inventory(tuple(_Gpu("NVIDIA H200") for _ in range(8)))
    base = dict(SGLANG, attention_backend="fa3", page_size=1, disable_overlap_schedule=False, dp_size=1)
    fp = fingerprint.fingerprint(base, inventory=inv)
    assert {k: fp.details[k] for k in fingerprint.SETUP_KEYS} == {
        "attention_backend": "fa3", "page_size": 1, "disable_overlap_schedule": False, "dp_size": 1}
    for key, other in (("attention_backend", "trtllm_mha"), ("page_size", 64), ("disable_overlap_schedule", True),
                       ("dp_size", 8)):
        changed = fingerprint.fingerprint(dict(base, **{key: other}), inventory=inv)
        assert changed.name != fp.name, key
        swept = fingerprint.fingerprint(dict(base, **{key: other}), inventory=inv, swept=[fingerprint.SETUP_KEYS[key]])
        assert key not in swept.details
        assert swept.name == fingerprint.fingerprint(base, inventory=inv, swept=[fingerprint.SETUP_KEYS[key]]).name


def test_the_reference_engines_clock_is_its_accelerator_and_a_different_setup_is_said() -> None:
    """One folder name for the reference engine at every clock scale (and for every host under a
    hardware_profile override), so the recorded details are what tells two setups apart."""
    slow = fingerprint.fingerprint({"version": "refserver-0.1.0", "clock_scale": 1.0, "model_path": "refserver/tiny"})
    fast = fingerprint.fingerprint({"version": "refserver-0.1.0", "clock_scale": 10.0, "model_path": "refserver/tiny"})
    assert slow.name == fast.name == "refserver" and slow.digest != fast.digest
    assert fast.details["clock_scale"] == 10.0
    assert "clock_scale" not in fingerprint.fingerprint({"version": "0.5.23", "clock_scale": 3}).details  # SGLang's is no accelerator
    assert fingerprint.setup_differences(fast.details, slow.details) == ["clock_scale '10.0' when blessed, '1.0' here"]
    assert fingerprint.setup_differences(fast.details, fast.details) == []
    assert fingerprint.setup_differences({"clock_scale": 10.0, "tp_size": 8}, {"clock_scale": 10, "tp_size": 8.0}) == []
    # a fact the older bless did not record is no evidence; a hostile value is cut short, a nested one ignored
    older = {k: v for k, v in fast.details.items() if k != "clock_scale"}
    assert fingerprint.setup_differences(older, slow.details) == []
    hostile = {"gpu": "x" * 500, "model": {"nested": 1}, "tp\nevil": "cpu"}
    (said,) = fingerprint.setup_differences(hostile, {**slow.details, "model": "other", "tp\nevil": "cpu"})
    assert said == f"gpu {'x' * 60!r} when blessed, 'cpu' here"


def test_a_log_tail_leaves_out_the_harness_s_own_health_polls(tmp_path: Path) -> None:
    from pytest_ddtree.service.base import tail_file

    log = tmp_path / "server.log"
    polls = [f'INFO:     127.0.0.1:{40000 + i} - "GET /health_generate HTTP/1.1" 503' for i in range(25)]
    log.write_text("\n".join(["loading weights", "RuntimeError: CUDA out of memory", *polls,
                              'INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200']) + "\n")
    tail = tail_file(log, 5).splitlines()
    assert tail == ["(25 access lines of the harness's own health polls left out)", "loading weights",
                    "RuntimeError: CUDA out of memory", 'INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200']
