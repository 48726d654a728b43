"""The ``slurm`` controller: each config is one batch job, on whichever node Slurm gives it.

Why a controller of its own and not ``controller: command`` templates: a job is not placed when
``sbatch`` returns. Its node, and with ``port: auto`` its port, exist only once it runs, so the
URL must follow the job; a job may wait in the queue for an hour, which is not a slow start and
needs its own deadline (``queue_timeout_s``) and its own progress (Slurm's pending reason); and
how it ended (``TIMEOUT``, ``PREEMPTED``, ``NODE_FAIL``, exit code ``0:15``) is structured data
that templates would have to scrape. The harness still only launches and watches: readiness,
the applied check and failure caching are the manager's, as for every controller.

The job script (:func:`render_job_script`) asks for one node, one task and no requeue, adds the
profile's partition, account, gres, time limit and extra ``#SBATCH`` lines, runs the profile's
set-up lines (``module load``, a virtualenv), exports the config's environment, finds the node's
address (its ``NodeAddr``, the address Slurm itself reaches it at) and a free port, publishes both
in the job's comment (``ddtree-endpoint=ADDR:PORT``: readable with ``squeue %k`` from wherever
``sbatch`` ran, no shared filesystem needed) and ``exec``s the launch command, behind the
profile's container prefix if any. ``{host}`` and ``{port}`` in the command are that address
and port.

Every Slurm command runs on the profile's ``host`` (a login node, over ssh) or here, with
``command_timeout_s``. ``squeue`` is asked at most every ``poll_interval_s``: a sweep must not
hammer a shared controller. The final state comes from ``sacct`` (State, ExitCode) and, where
accounting is not enabled, from ``scontrol show job`` (the same JobState and ExitCode, while
slurmctld still holds the job: ``MinJobAge``, 300 s by default).
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import shlex
import string
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from pytest_ddtree.configs import DDTreeConfig
    from pytest_ddtree.service.validated_profile import ServiceProfile

from pytest_ddtree.records.launch_shapes import ControllerEntry, SlurmJobEntry
from pytest_ddtree.service.base import (
    ENV_NAME_RULE,
    POLL_LINES_FACTOR,
    STARTUP_LOG_BYTES,
    Capabilities,
    ExitInfo,
    FailFn,
    GpuWait,
    Launch,
    LaunchFrom,
    ProgressFn,
    ServiceError,
    ServiceStartError,
    is_env_name,
    without_health_polls,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext, ControllerKind
from pytest_ddtree.service.ssh import COMMAND_NOT_FOUND_EXIT, Host, LocalHost, SSHHost, output_tail
from pytest_ddtree.suggest import did_you_mean

LOG_LINES = 40
LOG_BYTES = 64 * 1024
ENDPOINT_MARK = "ddtree-endpoint="
WAITING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
"""States of a job that has not started yet (CONFIGURING: its nodes are booting)."""
SQUEUE_ERRORS_TOLERATED = 5
"""squeue failures in a row (a busy or restarting slurmctld) before the job counts as lost."""
LIVE_STATES = WAITING_STATES | {"RUNNING", "SUSPENDED", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
"""States in which a job still holds or waits for resources: ``squeue`` lists it."""


# The job picks its port the way pool.free_port does here: at random below the kernel's ephemeral
# range (where outgoing connections take theirs), checked by a bind. Plain python3 of the node.
_PORT_PICKER = (
    "import random,socket\n"
    "try:\n lo=int(open(\"/proc/sys/net/ipv4/ip_local_port_range\").read().split()[0])\n"
    "except Exception:\n lo=32768\n"
    "r=random.SystemRandom()\n"
    "for _ in range(64):\n"
    " p=r.randrange(max(1024,lo-12000),lo)\n"
    " s=socket.socket()\n"
    " try:\n  s.bind((\"\",p));break\n"
    " except OSError:\n  continue\n"
    " finally:\n  s.close()\n"
    "else:\n s=socket.socket();s.bind((\"\",0));p=s.getsockname()[1];s.close()\n"
    "print(p)\n"
)


@dataclass(frozen=True)
class SlurmKeys:
    """The validated ``slurm:`` mapping of a profile (docs/fleet/slurm.md)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gres: str | None = None
    time_limit: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    constraint: str | None = None
    sbatch_options: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    container: str | None = None
    output: str | None = None
    queue_timeout_s: float = 3600.0
    poll_interval_s: float = 5.0


_STRING_KEYS = ("partition", "account", "qos", "gres", "time_limit", "mem", "constraint", "container", "output")
SLURM_KEYS = (*_STRING_KEYS, "cpus_per_task", "sbatch_options", "setup", "queue_timeout_s", "poll_interval_s")
_TIME_LIMIT = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)$")


def parse_slurm_keys(raw: Any, fail: FailFn) -> SlurmKeys:
    """Validate the ``slurm:`` mapping; every error names ``slurm.<key>``."""
    if raw is None:
        return SlurmKeys()
    if not isinstance(raw, Mapping):
        raise fail("slurm", f"must be a mapping of job options (partition, gres, time_limit...), got {raw!r}")
    unknown = sorted(set(raw) - set(SLURM_KEYS))
    if unknown:
        raise fail(f"slurm.{unknown[0]}", f"unknown key; {did_you_mean(unknown[0], sorted(SLURM_KEYS))}"
                                          f"allowed: {', '.join(sorted(SLURM_KEYS))}")
    values: dict[str, Any] = {}
    for key in _STRING_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, (str, int)) or isinstance(value, bool) or "\n" in str(value):
            raise fail(f"slurm.{key}", f"must be one line of text, got {value!r}")
        values[key] = str(value)
    limit = values.get("time_limit")
    if limit is not None and not _TIME_LIMIT.match(limit):
        raise fail("slurm.time_limit", f"not a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS), got {limit!r}")
    output = values.get("output")
    if output is not None:
        patterns = set(re.findall(r"%.", output)) - {"%j", "%x", "%%"}
        if patterns:
            raise fail("slurm.output", f"only %j (job id), %x (job name) and %% are supported here, not {sorted(patterns)}: "
                                       "the harness reads this file for the log tail")
    cpus = raw.get("cpus_per_task")
    if cpus is not None:
        if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
            raise fail("slurm.cpus_per_task", f"must be a positive integer, got {cpus!r}")
        values["cpus_per_task"] = cpus
    for key in ("sbatch_options", "setup"):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            value = [line for line in value.splitlines() if line.strip()] if key == "setup" else shlex.split(value)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail(f"slurm.{key}", f"must be a list of strings, got {value!r}")
        if key == "sbatch_options":
            bad = [v for v in value if not v.startswith("-")]
            if bad:
                raise fail("slurm.sbatch_options", f"each entry is one sbatch option such as --exclusive, got {bad[0]!r}")
        values[key] = tuple(value)
    for key in ("queue_timeout_s", "poll_interval_s"):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise fail(f"slurm.{key}", f"must be a positive number of seconds, got {value!r}")
        values[key] = float(value)
    return SlurmKeys(**values)


def render_job_script(keys: SlurmKeys, *, job_name: str, output: str, command: str, env: Mapping[str, str],
                      port: int | None, note: str = "") -> str:
    """The batch script of one launch (see the module docstring); ``port`` None: picked on the node."""
    sbatch = [
        f"--job-name={job_name}",
        f"--output={output}",
        "--nodes=1",
        "--ntasks=1",
        "--no-requeue",  # a preempted job must end (and fail its config), not come back elsewhere unseen
    ]
    for key, flag in (("partition", "partition"), ("account", "account"), ("qos", "qos"), ("gres", "gres"),
                      ("time_limit", "time"), ("cpus_per_task", "cpus-per-task"), ("mem", "mem"), ("constraint", "constraint")):
        value = getattr(keys, key)
        if value is not None:
            sbatch.append(f"--{flag}={value}")
    sbatch.extend(keys.sbatch_options)
    lines = ["#!/bin/bash"] + [f"#SBATCH {option}" for option in sbatch]
    lines.append(f"# written by pytest-ddtree{': ' + note if note else ''}")
    if keys.setup:
        lines.append("set -e  # a set-up line that fails ends the job with its error in the log")
        lines.extend(keys.setup)
        lines.append("set +e")
    for name in env:  # the profile refuses such names already; a script is never written with one
        if not is_env_name(name):
            raise ServiceStartError(f"environment variable {name!r}: {ENV_NAME_RULE}; the job script is not written")
    lines.extend(f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items()))
    lines += [
        # The node's address as Slurm knows it (NodeAddr); its host name where scontrol cannot say.
        'DDTREE_HOST=$(scontrol show node "$SLURMD_NODENAME" -o 2>/dev/null | sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        'DDTREE_HOST=${DDTREE_HOST:-$(hostname)}',
        f"DDTREE_PORT={port}" if port is not None else f"DDTREE_PORT=$(python3 -c {shlex.quote(_PORT_PICKER)})",
        'if ! scontrol update JobId="$SLURM_JOB_ID" Comment="' + ENDPOINT_MARK + '$DDTREE_HOST:$DDTREE_PORT"; then',
        '    echo "pytest-ddtree: cannot publish the endpoint in the job comment (scontrol update Comment)" >&2; exit 3',
        "fi",
        'echo "pytest-ddtree: job $SLURM_JOB_ID serves on $DDTREE_HOST:$DDTREE_PORT (node $SLURMD_NODENAME)"',
        "export DDTREE_HOST DDTREE_PORT",
        f"exec {keys.container + ' ' if keys.container else ''}{command}",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class JobStatus:
    """One look at a job: its state, Slurm's reason, its node and the endpoint it published."""

    state: str
    reason: str = ""
    node: str = ""
    endpoint: tuple[str, int] | None = None
    exit_code: str = ""
    source: str = "squeue"

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def parse_squeue_line(text: str) -> JobStatus | None:
    """``STATE|REASON|NODELIST|COMMENT`` (the format :meth:`SlurmController.poll` asks for)."""
    line = next((ln for ln in text.splitlines() if ln.count("|") >= 3), None)
    if line is None:
        return None
    state, reason, node, comment = (part.strip() for part in line.split("|", 3))
    return JobStatus(state=state.split()[0].rstrip("+") if state else "UNKNOWN", reason=reason,
                     node="" if node in ("", "(null)", "n/a") else node, endpoint=parse_endpoint(comment))


def parse_endpoint(comment: str) -> tuple[str, int] | None:
    match = re.search(re.escape(ENDPOINT_MARK) + r"(\S+):(\d+)", comment or "")
    return (match.group(1), int(match.group(2))) if match else None


def parse_scontrol_job(text: str) -> dict[str, str]:
    """``scontrol show job -o ID``'s ``Key=value`` words (values without spaces are enough here)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z]+)=(\S*)", text))


def parse_sacct(text: str) -> tuple[str, str, str] | None:
    """The job line of ``sacct -X -n -P -o JobID,State,ExitCode,Reason``: (state, exit code, reason)."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0] and parts[1]:
            return parts[1], parts[2], parts[3] if len(parts) > 3 else ""
    return None


def describe_reason(reason: str) -> str:
    """squeue's ``%r`` as said; ``None`` is a job the scheduler has not looked at yet."""
    if not reason or reason == "None":
        return "None (not yet considered by the scheduler)"
    return reason


def exit_code_number(exit_code: str) -> int | None:
    """Slurm's ``code:signal`` -> the shell's convention: ``-signal`` when a signal ended it."""
    match = re.fullmatch(r"(\d+):(\d+)", exit_code.strip())
    if not match:
        return None
    code, signal_number = int(match.group(1)), int(match.group(2))
    return -signal_number if signal_number else code


class JobStep:
    """Runs a command as a step of a running job (``srun --jobid --overlap``): on its node, in its
    allocation. The environment snapshot of the package is taken through it."""

    def __init__(self, host: Host, job_id: str, node: str) -> None:
        self.host = host
        self.job_id = job_id
        self.name = node

    def run(self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None) -> Any:
        step = ["srun", f"--jobid={self.job_id}", "--overlap", "--nodes=1", "--ntasks=1", "--quiet", *argv]
        return self.host.run(step, input_text=input_text, timeout_s=timeout_s)


@dataclass
class _Job:
    launch: Launch
    name: str
    script: str
    output: str
    job_id: str | None = None
    node: str = ""
    endpoint: tuple[str, int] | None = None
    ended: ExitInfo | None = None
    last: JobStatus | None = None
    last_poll: float = float("-inf")
    squeue_errors: int = 0
    record: SlurmJobEntry = field(default_factory=SlurmJobEntry)


class SlurmController(Controller):
    """Submits one batch job per launch, follows it through the queue, cancels it on stop."""

    kind = "slurm"

    def __init__(self, keys: SlurmKeys, host: Host, *, log_dir: str, url_template: str, port: int | str,
                 command_timeout_s: float = 60.0, stop_timeout_s: float = 30.0, progress: ProgressFn | None = None) -> None:
        self.keys = keys
        self.host = host
        self.log_dir = log_dir
        self.url_template = url_template
        self.port = port if isinstance(port, int) else None
        self.command_timeout_s = command_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.progress = progress
        self._job: _Job | None = None
        self._version: str | None = None

    # -- slurm commands -----------------------------------------------------------------------
    def _run(self, argv: Sequence[str], input_text: str | None = None) -> tuple[int, str]:
        result = self.host.run(list(argv), input_text=input_text, timeout_s=self.command_timeout_s)
        return result.returncode, (result.stdout + ("\n" + result.stderr if result.stderr else "")).strip()

    def slurm_version(self) -> str:
        """``sbatch --version`` (``slurm 22.05.8``), asked once."""
        if self._version is None:
            code, out = self._run(["sbatch", "--version"])
            self._version = out.splitlines()[0].strip() if code == 0 and out else f"<unknown: sbatch --version exited {code}>"
        return self._version

    def poll(self, force: bool = False) -> JobStatus | None:
        """The job's status from ``squeue``, at most every ``poll_interval_s`` (None: not submitted)."""
        job = self._job
        if job is None or job.job_id is None:
            return None
        now = time.monotonic()
        if job.last is not None and not force and now - job.last_poll < self.keys.poll_interval_s:
            return job.last
        code, out = self._run(["squeue", "-h", "-t", "all", "-j", job.job_id, "-o", "%T|%r|%N|%k"])
        if code != 0 and "invalid job id" not in out.lower():
            # slurmctld busy or restarting: keep the last answer; only a lasting silence is a failure.
            job.squeue_errors += 1
            job.last_poll = now
            if job.squeue_errors >= SQUEUE_ERRORS_TOLERATED:
                raise ServiceError(f"squeue failed {job.squeue_errors} times in a row for slurm job {job.job_id}: "
                                   f"{output_tail(out, 2)}")
            return job.last or JobStatus(state="PENDING", reason=f"squeue did not answer: {output_tail(out, 1)}")
        job.squeue_errors = 0
        status = parse_squeue_line(out) if code == 0 else None
        if status is None or not status.live:
            status = self._final_status(job, status)
        job.last, job.last_poll = status, now
        if status.node:
            job.node = status.node
        if status.endpoint is not None:
            job.endpoint = status.endpoint
        return status

    def _final_status(self, job: _Job, seen: JobStatus | None) -> JobStatus:
        """How an ended job ended: sacct, else scontrol (accounting disabled), else what squeue saw."""
        assert job.job_id is not None
        code, out = self._run(["sacct", "-j", job.job_id, "-X", "-n", "-P", "-o", "JobID,State,ExitCode,Reason"])
        parsed = parse_sacct(out) if code == 0 else None
        if parsed is not None and parsed[0].split()[0] not in LIVE_STATES:
            state, exit_code, reason = parsed
            return JobStatus(state=state.split()[0], reason=reason or (seen.reason if seen else ""),
                             node=seen.node if seen else job.node, exit_code=exit_code, source="sacct")
        sacct_note = "" if code == 0 else f"; sacct: {output_tail(out, 1)}"
        code, out = self._run(["scontrol", "show", "job", "-o", job.job_id])
        fields = parse_scontrol_job(out) if code == 0 else {}
        if fields.get("JobState"):
            return JobStatus(state=fields["JobState"], reason=fields.get("Reason", ""), node=fields.get("BatchHost") or job.node,
                             endpoint=parse_endpoint(fields.get("Comment", "")), exit_code=fields.get("ExitCode", ""),
                             source=f"scontrol show job{sacct_note}")
        if seen is not None:
            return seen
        return JobStatus(state="UNKNOWN", reason=f"Slurm no longer knows job {job.job_id} ({output_tail(out, 1)}{sacct_note})",
                         source="squeue")

    # -- the controller interface -------------------------------------------------------------
    def job_output(self, job_id: str | None, name: str) -> str:
        pattern = self.keys.output or f"{self.log_dir.rstrip('/')}/slurm-%j.out"
        return pattern.replace("%%", "\0").replace("%j", job_id or "%j").replace("%x", name).replace("\0", "%")

    def start(self, launch: Launch) -> None:
        name = f"ddtree-{re.sub(r'[^A-Za-z0-9_.-]', '_', launch.name)}-{secrets.token_hex(3)}"
        output = self.job_output(None, name)
        env = dict(launch.env)
        script = render_job_script(self.keys, job_name=name, output=output, command=launch.command, env=env,
                                   port=self.port, note=f"config {launch.name}")
        job = self._job = _Job(launch, name, script, output)
        job.record = {"job_name": name, "script": script, "version": self.slurm_version()}
        # Slurm does not create the log's folder, and a job that cannot open its log dies silently.
        folder = output.rsplit("/", 1)[0] if "/" in output else ""
        if folder and "%" not in folder:
            self.host.run(["mkdir", "-p", folder])
        result = self.host.run(["sbatch", "--parsable"], input_text=script, timeout_s=self.command_timeout_s)
        code, out = result.returncode, (result.stdout + "\n" + result.stderr).strip()
        # --parsable prints "ID" or "ID;cluster" on stdout; warnings go to stderr.
        words = result.stdout.strip().splitlines()
        job_id = words[-1].split(";")[0].strip() if code == 0 and words else ""
        if code != 0 or not job_id.isdigit():
            self._job = None  # nothing was queued (sbatch refuses a job as a whole)
            missing = code == COMMAND_NOT_FOUND_EXIT
            raise ServiceStartError(
                f"sbatch refused the job (exit {code}): {output_tail(out, 3)}",
                log_tail=f"$ sbatch --parsable < job script\n{out}\n--- job script ---\n{script}",
                config_name=launch.name,
                hint=("Slurm's commands (sbatch, squeue, scancel, scontrol, srun) must be on PATH where the harness "
                      "runs them: here, or on the login node named by host:") if missing else
                     ("check the profile's slurm: keys (partition, account, gres, time_limit) against `sinfo` and "
                      "`sacctmgr show assoc user=$USER`"),
            )
        job.job_id = job_id
        job.output = self.job_output(job_id, name)
        job.record.update({"job_id": job_id, "output": job.output})

    def await_placement(self, launch: Launch, progress: ProgressFn | None, *, ready_timeout_s: float,
                        progress_interval: float = 10.0) -> Launch:
        """Wait while the job is queued (``queue_timeout_s``), then until it publishes its endpoint;
        return ``launch`` with the URL and port of the node it runs on."""
        job = self._job
        assert job is not None and job.job_id is not None, "start() first"
        begin = time.monotonic()
        queue_deadline = begin + self.keys.queue_timeout_s
        running_since: float | None = None
        next_progress = begin + progress_interval
        while True:
            status = self.poll(force=True)
            assert status is not None
            now = time.monotonic()
            if status.state == "RUNNING" and job.endpoint is not None:
                host, port = job.endpoint
                job.record.update({"node": job.node, "address": host, "port": port,
                                   "queued_s": round((running_since or now) - begin, 3)})
                url = self.url_template.format(host=f"[{host}]" if ":" in host else host, port=port).rstrip("/")
                return Launch(name=launch.name, command=launch.command, port=port, url=url, env=launch.env,
                              log_path=launch.log_path, fields=launch.fields)
            if not status.live:
                info = self._ended(status)
                raise ServiceStartError(
                    f"slurm job {job.job_id} ended before it served: {info.description}",
                    exit_code=info.exit_code, log_tail=info.log_tail, elapsed=now - begin, config_name=launch.name,
                    hint="read the job's log tail; `scontrol show job` / `sacct -j` tell the rest",
                )
            if status.waiting:
                if now >= queue_deadline:
                    self._cancel_quietly()
                    raise ServiceStartError(
                        f"slurm job {job.job_id} still {status.state} after {self.keys.queue_timeout_s:.0f} s "
                        f"(queue_timeout_s); Slurm's reason: {describe_reason(status.reason)} (cancelled)",
                        log_tail=f"squeue -j {job.job_id}: {status.state} ({status.reason})",
                        elapsed=now - begin, config_name=launch.name,
                        hint="raise slurm.queue_timeout_s, ask for resources the partition can give sooner, or run when "
                             "the queue is shorter (`squeue -p PARTITION`, `sprio`)",
                    )
            else:
                running_since = running_since or now
                if now - running_since >= ready_timeout_s:
                    raise ServiceStartError(
                        f"slurm job {job.job_id} runs on {job.node or '?'} but published no endpoint after "
                        f"{ready_timeout_s:.0f} s (its set-up lines may hang)",
                        log_tail=self.log_tail(), elapsed=now - begin, config_name=launch.name,
                    )
            if progress is not None and now >= next_progress:
                next_progress = now + progress_interval
                what = (f"{status.state.lower()}, reason: {describe_reason(status.reason)}" if status.waiting
                        else f"{status.state} on {job.node}, waiting for its endpoint")
                progress(f"waiting for service {launch.name} (slurm job {job.job_id}): {now - begin:.0f} s elapsed, {what}")
            time.sleep(max(0.05, min(self.keys.poll_interval_s, queue_deadline - time.monotonic() if status.waiting else 1.0)))

    def _ended(self, status: JobStatus) -> ExitInfo:
        job = self._job
        assert job is not None
        if job.ended is None:
            details = [f"reason {status.reason}"] if status.reason and status.reason != "None" else []
            if status.exit_code:
                details.append(f"exit code {status.exit_code}")
            details.append(f"from {status.source}")
            where = f" on {job.node}" if job.node else ""
            description = f"slurm job {job.job_id}{where} is {status.state} ({', '.join(details)})"
            job.ended = ExitInfo(exit_code_number(status.exit_code), description, self.log_tail())
            job.record.update({"state": status.state, "exit_code": status.exit_code, "reason": status.reason})
        return job.ended

    def failure(self) -> ExitInfo | None:
        job = self._job
        if job is None or job.job_id is None:
            return None
        if job.ended is not None:
            return job.ended
        status = self.poll()
        assert status is not None
        if status.state == "RUNNING" or (status.waiting and job.endpoint is None):
            return None
        deadline = time.monotonic() + 10.0
        while status.state in ("COMPLETING", "SIGNALING") and time.monotonic() < deadline:
            time.sleep(0.5)  # ending: its final state (TIMEOUT, PREEMPTED...) comes once its processes are gone
            status = self.poll(force=True)
            assert status is not None
        if status.waiting:  # it ran, and is queued again: not the job that was measured
            status = JobStatus(state=status.state, reason=f"requeued by Slurm: {status.reason}", node=job.node)
        if status.live:  # requeued, suspended: the service is gone, and the job must not hold or wait for a node
            self._cancel_quietly()
        return self._ended(status)

    def stop(self) -> None:
        """``scancel`` the job (queued or running) and wait until Slurm lists it no more."""
        job, self._job = self._job, None
        if job is None:
            return
        if job.job_id is None:  # interrupted during sbatch: the job may exist under its unique name
            self._run(["scancel", f"--name={job.name}"])
            return
        code, out = self._run(["scancel", job.job_id])
        if code != 0 and "already completing or completed" not in out and "Invalid job id" not in out:
            raise ServiceError(f"scancel {job.job_id} exited {code}: {output_tail(out)}")
        deadline = time.monotonic() + self.stop_timeout_s
        where = f" on {job.node}" if job.node else ""
        while True:
            code, out = self._run(["squeue", "-h", "-t", "all", "-j", job.job_id, "-o", "%T"])
            state = out.strip().split()[0] if code == 0 and out.strip() else ""
            if state not in LIVE_STATES:
                job.record["state"] = job.record.get("state") or state or "gone"
                if self.progress is not None:  # what Slurm says now, so a Ctrl-C shows nothing is left behind
                    self.progress(f"slurm job {job.job_id}{where} stopped: squeue says {state or 'gone (no longer listed)'}")
                return
            if time.monotonic() >= deadline:
                if state in ("COMPLETING", "SIGNALING"):
                    return  # cancelled; Slurm is still killing its processes (KillWait)
                raise ServiceError(f"slurm job {job.job_id} is still {state} {self.stop_timeout_s:.0f} s after scancel")
            time.sleep(0.25)

    def _cancel_quietly(self) -> None:
        job = self._job
        if job is not None and job.job_id is not None:
            self._run(["scancel", job.job_id])

    def log_tail(self, n: int = LOG_LINES) -> str:
        job = self._job
        if job is None or job.job_id is None:
            return "<no job submitted>"
        path = shlex.quote(job.output)
        result = self.host.run_shell(f"test -e {path} || {{ echo '<no job log {job.output} (yet)>'; exit 0; }}; "
                                     f"tail -c {LOG_BYTES} {path} | tail -n {n * POLL_LINES_FACTOR}", timeout_s=self.command_timeout_s)
        return without_health_polls(result.stdout.rstrip().splitlines(), n) or f"<job log {job.output} is empty>"

    def startup_log(self) -> str | None:
        """The job log from its start (bounded): the engine's start-up lines come early, before
        megabytes of request lines."""
        job = self._job
        if job is None or job.job_id is None:
            return None
        path = shlex.quote(job.output)
        result = self.host.run_shell(f"test -e {path} || exit 66; head -c {STARTUP_LOG_BYTES} {path}", timeout_s=self.command_timeout_s)
        return result.stdout if result.returncode == 0 and result.stdout.strip() else None

    def describe(self) -> str:
        job = self._job
        if job is None or job.job_id is None:
            return "slurm controller (no job)"
        where = f" on {job.node}" if job.node else ""
        return f"slurm job {job.job_id}{where}"

    def launch_record(self) -> ControllerEntry:
        job = self._job
        record: ControllerEntry = {"slurm": job.record.copy()} if job is not None else {}
        if self.host.name != "local":
            record["login_host"] = self.host.name
        return record

    def plan(self, launch: Launch, profile: ServiceProfile, config: DDTreeConfig | None, extra_args: str | None) -> Launch:
        """The job's node (and with ``port: auto``, its port) comes once it runs (``await_placement``):
        no URL yet; the command reads both from the job script's environment."""
        unplaced = dataclasses.replace(launch, port=profile.port if isinstance(profile.port, int) else None, url="")
        return super().plan(unplaced, profile, config, extra_args)

    def placed_on(self) -> str | None:
        """The running job's node (``BatchHost``)."""
        return (self._job.node or None) if self._job is not None else None

    def snapshot_runner(self, host: LocalHost | SSHHost) -> JobStep | None:
        """A step of the running job, on its node (None: no job runs now)."""
        return self.job_step()

    def job_step(self) -> JobStep | None:
        """A runner on the node of the running job (None when no job runs now)."""
        job = self._job
        if job is None or job.job_id is None or job.ended is not None or not job.node:
            return None
        return JobStep(self.host, job.job_id, job.node)


def _check_profile(raw: Mapping[str, Any], fail: FailFn) -> SlurmKeys:
    """The ``slurm:`` job options, and a profile that lets Slurm choose the node."""
    keys = parse_slurm_keys(raw.get("slurm"), fail)
    if "pool" in raw:
        raise fail("pool", "a slurm profile has no pool: every xdist worker submits its own job (pytest -n N: N jobs)")
    if "host" not in {name for _, name, _, _ in string.Formatter().parse(str(raw["url"])) if name is not None}:
        raise fail("url", "must contain {host}: Slurm chooses the job's node (its NodeAddr fills {host})")
    return keys


def _make(context: ControllerContext) -> Controller:
    p = context.profile
    keys = p.controller_keys
    assert isinstance(keys, SlurmKeys), "the slurm profile check keeps the job options"
    # Without an output path the job log goes beside the process logs (a cluster's shared
    # filesystem); behind a login host, to sbatch's own default place there (the home).
    log_dir = "." if context.host.remote else str(context.log_dir.resolve())
    return SlurmController(keys, context.host, log_dir=log_dir, url_template=p.url, port=p.port,
                           command_timeout_s=p.fleet.command_timeout_s, stop_timeout_s=p.stop_timeout_s,
                           progress=context.progress)


KIND = ControllerKind(
    name="slurm",
    capabilities=Capabilities(launch=LaunchFrom.PROFILE_COMMAND, gpu_wait=GpuWait.NONE, placed_by_scheduler=True,
                              remote_hosts=True),
    make=_make,
    profile_keys={"slurm": ((dict, type(None)), False)},
    check_profile=_check_profile,
    keys_meaning="job options",
)
"""``controller: slurm``: one batch job per launch, on a node Slurm picks (its GPUs are the job's)."""
