"""Start real reference-engine processes for tests (owned by the refserver tests).

Why a helper and not conftest: the lead owns tests/conftest.py; refserver tests need
to start many engines at once (startup overlaps), read their logs on failure and stop
them reliably, which this small class does with the standard library + requests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typing import Any, Iterator

import pytest
import requests
import yaml

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.service.manager import ServiceManager
from pytest_ddtree.service.pool import free_port  # one port-picking policy for tests and harness
from pytest_ddtree.service.process import live_process_groups
from pytest_ddtree.service.profile import ServiceProfile, parse_profile
from tests.polling import wait_until

REPO = Path(__file__).resolve().parent.parent




def config_args(name: str) -> list[str]:
    """``bs8_b8_k4[_w2048]`` -> launch flags (NONE -> no speculation: no speculative flag at all, as the
    shipped profiles' plain launch; the config's flags imply DFLASH)."""
    if name == "NONE":
        return []
    args: list[str] = []
    for part in name.split("_"):
        if part.startswith("bs"):
            args += ["--speculative-dflash-block-size", part[2:]]
        elif part.startswith("b"):
            args += ["--speculative-num-draft-tokens", part[1:]]
        elif part.startswith("k"):
            args += ["--speculative-eagle-topk", part[1:]]
        elif part.startswith("w") and part != "wnone":
            args += ["--speculative-draft-window-size", part[1:]]
    return args


class RefServer:
    """One ``python -m pytest_ddtree.refserver`` process on a free 127.0.0.1 port."""

    #: A free port can be taken by another listener between the pick and the bind (other test
    #: processes on the machine start engines too); like the harness, start again on a fresh one.
    PORT_ATTEMPTS = 3

    def __init__(self, args: list[str], log_dir: Path, name: str = "refserver", extra_env: dict[str, str] | None = None) -> None:
        self.args = args
        self.extra_env = dict(extra_env or {})  # a build's variables (the SubSir dialect reads them)
        self.name = name
        self.log_dir = log_dir
        self._attempts = 0
        self._launch()

    def _launch(self) -> None:
        self._attempts += 1
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.log_dir / f"{self.name}-{self.port}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(self.extra_env)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest_ddtree.refserver", "--port", str(self.port), *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> RefServer:
        wait_until(self._healthy, timeout, lambda: f"refserver {self.url} to be ready:\n{self.log()[-3000:]}", interval=0.03)
        return self

    def _healthy(self) -> bool:
        """Whether /health answers 200; a start that lost its port to another process starts again
        on a fresh one (up to ``PORT_ATTEMPTS``), any other exit is an error with the log."""
        if self.proc.poll() is not None:
            if "Address already in use" in self.log() and self._attempts < self.PORT_ATTEMPTS:
                self._log.close()
                self._launch()
                return False
            raise RuntimeError(f"refserver exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            return requests.get(self.url + "/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def get(self, path: str, **kw: object) -> requests.Response:
        return requests.get(self.url + path, timeout=kw.pop("timeout", 30), **kw)  # type: ignore[arg-type]

    def post(self, path: str, **kw: object) -> requests.Response:
        return requests.post(self.url + path, timeout=kw.pop("timeout", 60), **kw)  # type: ignore[arg-type]

    def info(self) -> dict[str, object]:
        data: dict[str, object] = self.get("/server_info").json()
        return data

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def start_many(specs: dict[str, list[str]], log_dir: Path) -> dict[str, RefServer]:
    """Start several servers at once (their start-ups overlap), then wait for all."""
    servers = {name: RefServer(args, log_dir, name) for name, args in specs.items()}
    try:
        for s in servers.values():
            s.wait_ready()
    except Exception:
        for s in servers.values():
            s.stop()
        raise
    return servers


REFERENCE = Path(__file__).resolve().parent.parent / "suites" / "services" / "reference.yaml"

BS8_B8_K4 = parse_config_name("bs8_b8_k4")


def ref_profile(extra: str = "", **overrides: Any) -> ServiceProfile:
    raw = yaml.safe_load(REFERENCE.read_text())
    raw["command"] = raw["command"] + (" " + extra if extra else "")
    raw.update(overrides)
    return parse_profile(raw)


@pytest.fixture
def managers(tmp_path: Path) -> Iterator[list[ServiceManager]]:
    made: list[ServiceManager] = []
    yield made
    for m in made:
        m.close()
    assert live_process_groups() == []
