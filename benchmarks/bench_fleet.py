#!/usr/bin/env python3
"""Fleet benchmark: a sweep over three ssh hosts against the same sweep on one host (prints figures).

Why: the point of a host pool is wall time. A real restart is dominated by loading the model
(minutes); here each fake host (a real sshd on 127.0.0.1 with its own fake systemd, see
tests/fleet_helpers.py) runs the reference engine with ``--load-seconds`` standing for that load
time. The same ``pytest suites`` sweep runs twice: ``-n 3`` over the three-host pool, then ``-n 1``
on a pool of one of those hosts. Printed: wall time of each, their ratio (target <= 45%), how
often each config was started on which host (counted from the fake systemd journals: each config
exactly once), and whether every host is back on its default config.

With three hosts the sweep needs ceil(N/3) restarts back to back against N on one host, so the
ratio cannot drop below ceil(N/3)/N: 50% for the shipped matrix's four ``bs8_b*_k4`` configs,
37.5% for the eight ``bs8_b*_k4*`` ones (with and without a draft window), the default here.

Usage: python benchmarks/bench_fleet.py [--configs GLOB] [--load-seconds 45] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_ddtree.configs import parse_config_name  # noqa: E402
from pytest_ddtree.measure.matrix import load_matrix  # noqa: E402
from pytest_ddtree.selection import select  # noqa: E402
from pytest_ddtree.service.profile import load_profile, parse_profile  # noqa: E402
from tests.fleet_helpers import SshFleet  # noqa: E402

SUITE_ARGS = ["--ddtree-cell=c1_short", "--ddtree-coding-limit=1", "--ddtree-coding-max-tokens=128", "-k", "not lossless"]
"""Small gates: the figure is about restarts. Lossless is left out: a new profile has no golden
transcripts, and its reference instance would add one more restart to both sides."""


def run_sweep(fleet: SshFleet, hosts: list[int], workers: int, configs: str, work: Path) -> dict[str, Any]:
    raw = fleet.pool_profile(name=f"fleet{len(hosts)}", hosts=hosts)
    raw["ready_timeout_s"] = 300
    profile_path = work / f"fleet{len(hosts)}.yaml"
    profile_path.write_text(yaml.safe_dump(raw))
    before = [len(h.starts()) for h in fleet.hosts]
    argv = [sys.executable, "-m", "pytest", "suites", f"--ddtree-config={configs}", "-n", str(workers),
            f"--ddtree-service={profile_path}", f"--ddtree-results={work / f'results{len(hosts)}'}",
            "-p", "no:cacheprovider", "-q", *SUITE_ARGS]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    profile = parse_profile(raw)
    starts: dict[str, list[str]] = {}
    restored = []
    for host in (fleet.hosts[i] for i in hosts):
        new = host.starts()[before[host.index]:]
        restored.append(not host.dropin.exists() and (not new or new[-1] == fleet.default_command(host)))
        if not new:
            continue
        instance = profile.for_instance(hosts.index(host.index))
        for command in new[:-1]:
            name = next((c for c in SELECTED if instance.render_command(parse_config_name(c), instance.port if isinstance(instance.port, int) else None) == command), "other")
            starts.setdefault(name, []).append(host.target)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return {"hosts": len(hosts), "workers": workers, "wall_s": round(wall, 1), "exit": proc.returncode,
            "summary": summary, "starts": starts, "restored": all(restored),
            "failed": [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))],
            "tail": proc.stdout[-3000:]}


SELECTED: list[str] = []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="bs8_b*_k4*")
    ap.add_argument("--load-seconds", type=float, default=45.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    # the fleet's hosts run the reference engine, so its profile's build selects what the sweep runs
    engine = load_profile(REPO / "suites" / "services" / "reference.yaml")
    SELECTED.extend(c.name for c in select([args.configs], load_matrix(REPO / "suites" / "configs.yaml"), engine).configs)
    bound = math.ceil(len(SELECTED) / 3) / len(SELECTED)
    print(f"configs {args.configs}: {len(SELECTED)} ({', '.join(SELECTED)}); three-host lower bound {bound:.1%}")
    print(f"reference engine --load-seconds {args.load_seconds:g} per start; gates: {' '.join(SUITE_ARGS)}")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        fleet = SshFleet(Path(tmp) / "fleet", n=3, load_seconds=args.load_seconds).start()
        try:
            pool = run_sweep(fleet, [0, 1, 2], 3, args.configs, Path(tmp))
            single = run_sweep(fleet, [0], 1, args.configs, Path(tmp))
        finally:
            fleet.close()
    ratio = pool["wall_s"] / single["wall_s"]
    print()
    print("| sweep | wall s | exit | configs started (each once?) | every host restored | pytest |")
    print("| --- | --- | --- | --- | --- | --- |")
    for result in (pool, single):
        counts = {name: len(where) for name, where in result["starts"].items()}
        once = sorted(counts) == sorted(SELECTED) and set(counts.values()) == {1}
        print(f"| {result['hosts']} host(s), -n {result['workers']} | {result['wall_s']} | {result['exit']} | "
              f"{len(counts)}/{len(SELECTED)} ({'yes' if once else counts}) | {'yes' if result['restored'] else 'NO'} | {result['summary']} |")
    print()
    print("which host measured what (three-host sweep):")
    for name in SELECTED:
        print(f"  {name}: {', '.join(pool['starts'].get(name, ['-']))}")
    verdict = "PASS" if ratio <= 0.45 else "MISS"
    print(f"\nthree hosts / one host = {pool['wall_s']} s / {single['wall_s']} s = {ratio:.1%} (target <= 45%: {verdict})")
    if args.json:
        args.json.write_text(json.dumps({"configs": SELECTED, "pool": pool, "single": single, "ratio": ratio}, indent=2))
    for result in (pool, single):
        for line in result["failed"]:
            print(f"  {result['hosts']}-host run: {line[:220]}")
        if result["exit"] not in (0, 1):
            print(f"\n{result['hosts']}-host run tail:\n{result['tail']}")
    return 0 if ratio <= 0.45 else 1


if __name__ == "__main__":
    sys.exit(main())
