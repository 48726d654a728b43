"""What each sandbox tier costs and what it stops, measured on this machine.

    python benchmarks/bench_sandbox.py [--runs 12] [--humaneval] [--tiers bwrap,unshare]
    python benchmarks/bench_sandbox.py --harness-cost --before REF [--rounds 5]

Per tier (run as root; a tier that does not work here is reported, not measured):

* latency: wall time of one trivial run (median and p90 of ``--runs``), one at a time;
* throughput: runs per second with ``sandbox.default_workers()`` runs in parallel;
* the bundled problems' reference solutions (25) and, with ``--humaneval``, the 164
  HumanEval canonical solutions: all must pass, and how long the set takes;
* hostile payloads: the memfd bomb (how far it got before the kernel stopped it), the disk
  fill (bytes written before the tmpfs cap), a 1,050-deep tree (verdict, clean-up).

Exit status 1 when a reference solution fails or a payload is not contained.

``--harness-cost`` measures what the harness spends per honest problem (the 25 bundled
reference answers, as the reference engine sends them), before and after a change: the
package of git revision ``--before`` (extracted to a temporary directory) and this checkout's
run alternately, each in a fresh process, ``--rounds`` times; per problem:

* judge: extracting the code from the answer and judging a recorded result document in the
  harness (decoding, comparing, a ``satisfies`` predicate): the work the bounds touch (the
  median of 15 repeats; the predicate worker's one start per session is left out);
* run: the whole sandboxed run of the extracted code (``sandbox.run_code``: launch, run,
  judge), one problem at a time: the harness-side cost of a problem.

It prints the medians over rounds of the per-problem median and total, and the change.  The
bounds must not make honest problems slower by more than 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pytest_ddtree.gates import coding_problems, coding_answers
from pytest_ddtree import sandbox
from pytest_ddtree.sandbox import Limits, RunResult, TestPlan, Verdict, parse_tests
from pytest_ddtree.sandbox.execute import execute_in_tier

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
    return execute_in_tier(tier, code, plan, limits or Limits(wall_s=20.0, cpu_s=10.0), want_uid=os.getuid() == 0)


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

    sets = [("bundled (25)", coding_problems.load_problems())]
    if humaneval:
        sets.append(("HumanEval (164)", coding_problems.load_humaneval()))
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


REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "pytest_ddtree" / "refserver" / "corpus" / "coding.jsonl"
JUDGE_REPEATS = 15  # the judge takes well under a millisecond: its median of repeats, per problem


def _cost_child() -> None:
    """One measurement in this process (whichever pytest_ddtree is first on the path): per
    problem the judge and run seconds, as JSON on stdout."""
    from pytest_ddtree.gates import coding as cod
    from pytest_ddtree import sandbox as sbx
    from pytest_ddtree.sandbox import calls, runner, values

    answers = {}
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        pair = json.loads(line)
        answers[pair["prompt"]] = pair["response"]
    sbx.isolation()
    out: dict[str, Any] = {"package": cod.__file__, "problems": {}}
    for problem in coding_problems.load_problems():
        plan = problem.test_plan()
        job = plan.to_job()
        ns: dict[str, Any] = {"__name__": "solution"}
        exec(compile(problem.reference_solution, "solution.py", "exec"), ns)  # noqa: S102 - the trusted reference
        names = {n: values.decode(nodes) for n, nodes in job["inputs"].items()}
        document = json.loads(json.dumps({"steps": [runner._step(step, ns, names) for step in job["steps"]]}))
        answer = answers[coding_problems.user_message(problem)]
        calls.judge_outcome(plan, document)  # warm: a predicate worker starts once per session, not per problem
        judge_times = []
        for _ in range(JUDGE_REPEATS):
            t0 = time.perf_counter()
            code = coding_answers.extract_code(answer)
            judged = calls.judge_outcome(plan, document)
            judge_times.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        res = sbx.run_code(code, plan, problem.entry_point)
        t2 = time.perf_counter()
        if judged.verdict != "passed" or res.verdict is not Verdict.PASSED:
            raise SystemExit(f"{problem.id}: {judged.message or res.message}")
        out["problems"][problem.id] = {"judge_s": statistics.median(judge_times), "run_s": t2 - t1}
    print(json.dumps(out))


def harness_cost(before: str, rounds: int) -> int:
    """Before (git revision ``before``) and after (this checkout), alternately; medians."""
    with tempfile.TemporaryDirectory(prefix="ddtree-bench-before-") as old:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", before, "pytest_ddtree"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        env = {**os.environ, "DDTREE_CODING_DIR": str(REPO / "suites" / "coding")}
        samples: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for r in range(rounds):
            for label, root in (("before", old), ("after", str(REPO))) if r % 2 == 0 else (("after", str(REPO)), ("before", old)):
                done = subprocess.run([sys.executable, __file__, "--_cost-child"], env={**env, "PYTHONPATH": root},
                                      capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(f"{label} round {r + 1} failed: {done.stderr[-2000:]}", file=sys.stderr)
                    return 1
                result = json.loads(done.stdout.strip().splitlines()[-1])
                if not result["package"].startswith(root):
                    print(f"{label}: measured {result['package']}, not the package under {root}", file=sys.stderr)
                    return 1
                samples[label].append(result["problems"])
                print(f"round {r + 1} {label}: done", file=sys.stderr, flush=True)

    def summary(label: str, key: str) -> tuple[float, float]:
        per_round_median = [statistics.median(p[key] for p in rnd.values()) for rnd in samples[label]]
        per_round_total = [sum(p[key] for p in rnd.values()) for rnd in samples[label]]
        return statistics.median(per_round_median), statistics.median(per_round_total)

    problems = len(samples["after"][0])
    print(f"harness-side cost per honest problem ({problems} bundled reference answers; before = {before}, "
          f"after = this checkout; {rounds} rounds alternating, medians; tier {sandbox.isolation().tier})")
    print("| what | before: median per problem | after | change | before: total per set | after | change |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key, name in (("judge_s", "extract + judge in the harness"), ("run_s", "whole sandboxed run (run_code)")):
        b_med, b_tot = summary("before", key)
        a_med, a_tot = summary("after", key)
        unit, scale = ("ms", 1e3)
        print(f"| {name} | {b_med * scale:.2f} {unit} | {a_med * scale:.2f} {unit} | {100 * (a_med / b_med - 1):+.1f}% "
              f"| {b_tot * scale:.0f} {unit} | {a_tot * scale:.0f} {unit} | {100 * (a_tot / b_tot - 1):+.1f}% |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--humaneval", action="store_true")
    parser.add_argument("--tiers", default="bwrap,unshare")
    parser.add_argument("--harness-cost", action="store_true", help="the harness's cost per honest problem, before and after")
    parser.add_argument("--before", default=None, help="git revision to compare with (--harness-cost)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--_cost-child", dest="cost_child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cost_child:
        _cost_child()
        return 0
    if args.harness_cost:
        if not args.before:
            parser.error("--harness-cost needs --before REV (the revision to compare with)")
        return harness_cost(args.before, args.rounds)
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
