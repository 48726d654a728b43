"""What each sandbox tier costs and what it stops, measured on this machine.

    python benchmarks/bench_sandbox.py [--runs 12] [--humaneval] [--tiers bwrap,unshare]

Per tier (run as root; a tier that does not work here is reported, not measured):

* latency: wall time of one trivial run (median and p90 of ``--runs``), one at a time;
* throughput: runs per second with ``sandbox.default_workers()`` runs in parallel;
* the bundled problems' reference solutions (25) and, with ``--humaneval``, the 164
  HumanEval canonical solutions: all must pass, and how long the set takes;
* hostile payloads: the memfd bomb (how far it got before the kernel stopped it), the disk
  fill (bytes written before the tmpfs cap), a 1,050-deep tree (verdict, clean-up).

Exit status 1 when a reference solution fails or a payload is not contained.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from pytest_ddtree import coding, sandbox
from pytest_ddtree.sandbox import Limits, RunResult, TestPlan, Verdict, parse_tests

TRIVIAL = ("def f(x):\n    return x + 1\n", parse_tests("f(1) == 2", "f"))
PAYLOADS = {
    "memfd bomb (50 x 15 MiB)": (
        "import os\nFDS = []\ndef f(x):\n    for i in range(50):\n        fd = os.memfd_create(f'm{i}')\n"
        "        os.write(fd, b'x' * (15 << 20))\n        FDS.append(fd)\n        os.write(2, b'.')\n    return x\n",
        "f(1) == 1",
    ),
    "disk fill (8 MiB files)": (
        "import os\ndef f(x):\n    n = 0\n    try:\n        while n < 256:\n            with open(f'fill{n}', 'wb') as fh:\n"
        "                fh.write(b'x' * (8 << 20))\n            n += 1\n    except OSError:\n        pass\n    return n\n",
        "f(1) == -1",
    ),
    "deep tree (1,050 dirs)": (
        "import os\ndef f(x):\n    for i in range(1050):\n        os.mkdir('d')\n        os.chdir('d')\n    return x\n",
        "f(1) == 1",
    ),
}


def one(tier: str, code: str, plan: TestPlan, limits: Limits | None = None) -> RunResult:
    return sandbox._execute(tier, code, plan, limits or Limits(wall_s=20.0, cpu_s=10.0), want_uid=os.getuid() == 0)


def measure(tier: str, runs: int, humaneval: bool) -> tuple[list[str], bool]:
    lines: list[str] = []
    ok = True
    probe = one(tier, *TRIVIAL)
    if probe.verdict is not Verdict.PASSED:
        return [f"| {tier} | not available here: {probe.message.splitlines()[0][:100]} |"], True
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        one(tier, *TRIVIAL)
        times.append(time.perf_counter() - t0)
    workers = sandbox.default_workers()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _i: one(tier, *TRIVIAL), range(runs)))
    rate = runs / (time.perf_counter() - t0)
    p90 = sorted(times)[max(0, int(len(times) * 0.9) - 1)]
    lines.append(f"| {tier} | latency median {statistics.median(times):.2f} s, p90 {p90:.2f} s | {rate:.2f} runs/s with {workers} workers |")

    sets = [("bundled (25)", coding.load_problems())]
    if humaneval:
        sets.append(("HumanEval (164)", coding.load_humaneval()))
    for name, problems in sets:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda p: one(tier, p.preamble + "\n" + p.reference_solution, p.test_plan()), problems))
        failed = [p.id for p, r in zip(problems, results) if r.verdict is not Verdict.PASSED]
        ok &= not failed
        lines.append(f"| {tier} | {name}: {len(problems) - len(failed)}/{len(problems)} references pass | {time.perf_counter() - t0:.1f} s |")

    for name, (code, tests) in PAYLOADS.items():
        res = one(tier, code, parse_tests(tests, "f"), Limits(wall_s=30.0, cpu_s=10.0, memory_bytes=256 << 20))
        left = sandbox.find_leftovers(uid=res.uid) if res.uid is not None else []
        contained = res.verdict is not Verdict.PASSED and not left and not os.path.lexists(res.workdir)
        if name.startswith("deep"):
            contained = res.verdict is Verdict.PASSED and res.cleanup_error is None and not os.path.lexists(res.workdir)
        ok &= contained
        detail = " / ".join(res.message.splitlines()[:2])[:110] if res.message else "passed"
        if name.startswith("memfd"):
            detail += f"; {res.stderr.count('.') * 15} MiB written first"
        lines.append(f"| {tier} | {name}: {'contained' if contained else 'NOT CONTAINED'} | {res.duration_s:.1f} s, {detail} |")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--humaneval", action="store_true")
    parser.add_argument("--tiers", default="bwrap,unshare")
    args = parser.parse_args(argv)
    if os.getuid() != 0:
        print("run as root: the bwrap and unshare tiers drop to a per-run uid", file=sys.stderr)
        return 2
    print(f"detected: {sandbox.isolation().describe()}")
    print("| tier | what | figure |\n| --- | --- | --- |")
    all_ok = True
    for tier in args.tiers.split(","):
        lines, ok = measure(tier.strip(), args.runs, args.humaneval)
        all_ok &= ok
        print("\n".join(lines), flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
