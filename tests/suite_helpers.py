"""Helpers shared by the tests that run the real suites and engines through pytester.

One place derives test profiles from the shipped reference profile and runs a suite the way a
user would, so that a change to the profile format or the options is made once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.service.client import SGLangClient
from tests.polling import wait_until

REPO = Path(__file__).resolve().parent.parent
REFERENCE_PROFILE = REPO / "suites" / "services" / "reference.yaml"
MATRIX = REPO / "suites" / "configs.yaml"


def reference_profile(
    directory: Path,
    engine_args: str = "",
    *,
    clock_scale: float | None = None,
    command_prefix: str = "",
    filename: str = "profile.yaml",
    **overrides: Any,
) -> Path:
    """Write a copy of the reference profile with extra engine flags (faults) and overrides."""
    raw = yaml.safe_load(REFERENCE_PROFILE.read_text())
    command = raw["command"]
    if clock_scale is not None:
        command = command.replace("--clock-scale 10", f"--clock-scale {clock_scale:g}")
    raw["command"] = command_prefix + command.replace("{config_args}", f"{engine_args} {{config_args}}".strip())
    if "control" in overrides:
        set_control(raw, str(overrides.pop("control")))
    # the control of every process on every cell (the defaults leave it out of sessions of one or two configs
    # and measure it on three cells): the tests of the control need one; tests of those defaults set them
    raw.update({"control_min_configs": 1, "control_cells": None})
    raw.update(overrides)
    path = directory / filename
    path.write_text(yaml.safe_dump(raw))
    return path


def set_control(raw: dict[str, Any], control: str) -> None:
    """Name a profile's control (with ``none``, the reference profile's control launch keys stay,
    unused, as in a user's copy of it)."""
    raw["control"] = control


def run_suite(
    pytester: pytest.Pytester,
    profile: Path,
    *args: str,
    suite: str | None = None,
    config: str | None = "bs8_b8_k4",
    timeout: float = 180,
) -> pytest.RunResult:
    """Run one suite file (or a test file in pytester.path when suite is None) against ``profile``;
    ``config=None`` gives no --ddtree-config (the build's default config)."""
    target = [str(REPO / "suites" / suite)] if suite else []
    return pytester.runpytest_subprocess(
        *target,
        f"--ddtree-service={profile}",
        f"--ddtree-matrix={MATRIX}",
        f"--ddtree-results={pytester.path / 'results'}",
        f"--ddtree-baselines={pytester.path / 'baselines'}",
        *([f"--ddtree-config={config}"] if config is not None else []),
        "-p", "no:cacheprovider", "-rA",
        *args,
        timeout=timeout,
    )


def wait_healthy(url: str, timeout: float = 15.0, what: str = "the service") -> SGLangClient:
    """Poll /health_generate until 200 (a restarting service refuses or answers 503 meanwhile)."""
    client = SGLangClient(url, timeout=5)

    def healthy() -> bool:
        try:
            return client.health("/health_generate") == 200
        except Exception:  # noqa: BLE001 - restarting
            return False

    wait_until(healthy, timeout, f"{what} to answer /health_generate", interval=0.1)
    return client


def default_sigint() -> None:
    """``preexec_fn`` for a child that a test will send SIGINT: give it SIGINT's default
    disposition. A test run started in the background by a non-interactive shell (``cmd &``, as a
    CI wrapper or ``nohup`` loop does) has SIGINT ignored, every child inherits that, and Python
    then never raises KeyboardInterrupt: the test would measure how it was launched."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
