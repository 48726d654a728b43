"""Profiles, managers and fakes of the service tests (a stand-in server on 127.0.0.1, a fake
systemd), shared by the service, command, HTTP, signal and fleet tests.

Why a helper module and not the test module itself: a test module importing another one ties
two test files together (the other's module-level set-up runs wherever it is imported, and a
rename there breaks tests elsewhere); tests/test_codebase.py holds test modules to importing
helpers only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from pytest_ddtree.configs import DDTreeConfig, parse_config_name
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service.manager import Clients, Hooks, Pacing, Placement, ServiceManager
from pytest_ddtree.service.profile import ServiceProfile, parse_profile


FAKES = Path(__file__).parent / "fakes"
STANDIN = FAKES / "standin_server.py"
CONFIG_ARGS = {
    "block_size": "--speculative-dflash-block-size {value}",
    "budget": "--speculative-num-draft-tokens {value}",
    "topk": "--speculative-eagle-topk {value}",
    "window": "--speculative-draft-window-size {value}",
}
APPLIED = {"speculative_dflash_block_size": "block_size", "speculative_num_draft_tokens": "budget",
           "speculative_eagle_topk": "topk", "speculative_draft_window_size": "window"}
BS8_B8_K4 = parse_config_name("bs8_b8_k4")
BS8_B12_K6 = parse_config_name("bs8_b12_k6")


def make_profile(extra: str = "", **overrides: Any) -> ServiceProfile:
    raw: dict[str, Any] = {
        "name": "standin",
        "controller": "process",
        "command": f"{{python}} {STANDIN} --port {{port}} {{config_args}} {extra}",
        "url": "http://127.0.0.1:{port}",
        "port": "auto",
        "config_args": CONFIG_ARGS,
        "applied": APPLIED,
        "ready_timeout_s": 15,
        "stop_timeout_s": 2,
    }
    raw.update(overrides)
    return parse_profile(raw)


def make_manager(profile: ServiceProfile, tmp_path: Path, lines: list[str] | None = None,
                 ready_timeout_s: float | None = None) -> ServiceManager:
    return ServiceManager(
        profile,
        Placement(0, tmp_path / "logs", tmp_path / "locks"),
        pacing=Pacing(ready_timeout_s, poll_interval=0.1, progress_interval=0.5),
        hooks=Hooks(lines.append if lines is not None else None),
        clients=Clients(lambda url, timeout: SGLangClient(url, timeout=timeout)),
    )


def failed_start(m: ServiceManager, config: DDTreeConfig) -> str:
    """The message of ``m``'s failed start of ``config`` (the manager closed after it)."""
    from pytest_ddtree.service.base import ServiceStartError

    try:
        with pytest.raises(ServiceStartError) as info:
            m.ensure(config)
    finally:
        m.close()
    return str(info.value)


def pid_alive(pid: int) -> bool:
    """True while /proc has a process with this pid that has not finished exiting.

    The leader of a process whose other threads are still running shows as a zombie before
    the process is done (a server that calls os._exit from a handler thread): only when no
    thread is left can its parent reap it, so that is when it counts as gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" or threads > 1


# -- systemd (fake systemctl/journalctl that really run the unit) -------------------------------
@pytest.fixture
def fake_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    state = tmp_path / "systemd"
    (state / "system").mkdir(parents=True)
    monkeypatch.setenv("DDTREE_FAKE_SYSTEMD", str(state))
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    yield state
    subprocess.run([str(FAKES / "systemctl"), "stop", "standin.service"], check=False)


def systemd_profile(state: Path, port: int, extra: str = "") -> ServiceProfile:
    return make_profile(
        extra,
        controller="systemd",
        unit="standin.service",
        dropin_dir=str(state / "system"),
        port=port,
        command=f"{sys.executable} {STANDIN} --port {{port}} {{config_args}} {extra}",
    )


def command_profile(work: Path, extra: str = "", prefix: str = "", **overrides: Any) -> ServiceProfile:
    work.mkdir(parents=True, exist_ok=True)
    pid, rc, log = work / "pid", work / "rc", work / "svc.log"
    raw: dict[str, Any] = {
        "name": "standin-cmd",
        "controller": "command",
        "start": (
            f"{prefix}rm -f {rc}; echo '{{name}} {{block_size}} {{budget}} {{topk}} {{window}} {{config_env}}' >> {work}/starts; "
            f"setsid sh -c '{{python}} {STANDIN} --port {{port}} {{config_args}} {extra} > {log} 2>&1; echo $? > {rc}' "
            f"< /dev/null > /dev/null 2>&1 & echo $! > {pid}"
        ),
        "status": f'if [ -e {rc} ]; then c=$(cat {rc}); echo "service exited with code $c"; [ "$c" -ne 0 ] && exit "$c"; exit 1; fi',
        "stop": (
            f"g=$(cat {pid}); kill -TERM -$g 2>/dev/null; "
            f"for i in $(seq 50); do kill -0 -$g 2>/dev/null || exit 0; sleep 0.1; done; kill -KILL -$g 2>/dev/null; true"
        ),
        "logs": f"tail -n 40 {log}",
        "restore": f"echo 'restore [{{config_args}}] {{url}}' >> {work}/restores",
        "url": "http://127.0.0.1:{port}",
        "port": "auto",
        "config_args": CONFIG_ARGS,
        "applied": APPLIED,
        "env": {"SGLANG_X": "1"},
        "ready_timeout_s": 15,
        "stop_timeout_s": 2,
        "command_timeout_s": 10,
    }
    raw.update(overrides)
    return parse_profile(raw)



def standin_profile(directory: Path, extra: str = "", **overrides: Any) -> Path:
    raw: dict[str, Any] = {
        "name": "upstream-standin",
        "controller": "process",
        "command": f"{{python}} {FAKES / 'standin_server.py'} --port {{port}} {{config_args}} {extra}",
        "url": "http://127.0.0.1:{port}",
        "port": "auto",
        "config_args": {
            "block_size": "--speculative-dflash-block-size {value}",
            "budget": "--speculative-num-draft-tokens {value}",
            "topk": "--speculative-eagle-topk {value}",
            "window": "--speculative-draft-window-size {value}",
        },
        "applied": {"speculative_dflash_block_size": "block_size", "speculative_num_draft_tokens": "budget",
                    "speculative_eagle_topk": "topk", "speculative_draft_window_size": "window"},
        "ready_timeout_s": 30,
        "stop_timeout_s": 5,
        **overrides,
    }
    path = directory / "upstream-standin.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
