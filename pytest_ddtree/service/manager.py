"""The per-worker service manager: one instance, one config at a time, failures remembered.

``ensure(config)`` is what the ``ddtree_service`` fixture calls before each test. It restarts
only when the config changes (tests are ordered so each config starts once per worker), and it
remembers a failed start so that the other tests of that config fail at once with the same
reason instead of spending another ten-minute restart each. A service that dies mid-run is
noticed on the next ``ensure`` and fails the rest of its config; the next config starts fresh.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from pytest_ddtree.service import http as http_mod, ports
from pytest_ddtree.service.client import SGLangClient
from pytest_ddtree.service import proof as proof_mod, proving
from pytest_ddtree.configs import DDTreeConfig
from pytest_ddtree.service.plain import is_plain
from pytest_ddtree.service.proof import Proof
from pytest_ddtree.records.launch_shapes import ControllerEntry, LaunchEntry
from pytest_ddtree.records import bill
from pytest_ddtree.service.base import (
    ConfigNotAvailable,
    ConfigNotServed,
    ExternalConfigMismatch,
    GpuWait,
    Launch,
    Runner,
    ServiceDiedError,
    ServiceError,
    ServiceStartError,
)
from pytest_ddtree.service.protocol import Controller, ControllerContext
from pytest_ddtree.service import kinds
from pytest_ddtree.service.external import HEALTH_TIMEOUT_S
from pytest_ddtree.service.manager_params import (
    ClientFactory,
    Clients as Clients,
    GpuMemoryFn,
    GpuReleaseFn,
    Hooks as Hooks,
    HostTools as HostTools,
    Pacing as Pacing,
    Placement as Placement,
    default_gpu_memory,
    default_gpu_release,
)
from pytest_ddtree.service.pool import InstanceLock, resolve_instance
from pytest_ddtree.service.profile import ServiceProfile
from pytest_ddtree.service.readiness import HealthClient, wait_ready
from pytest_ddtree.service.calibration import WHEN_END, WHEN_START, CalibrationRun, run_calibration
from pytest_ddtree.service.ssh import HostLock, LocalHost, SSHHost, make_host, unreachable_host


REFERENCE_LABEL = "lossless-reference"
"""The launch name of the non-speculative reference (``lossless_args``) in logs and records."""

READY_HEALTH_TIMEOUT_S = HEALTH_TIMEOUT_S
"""Each health poll's deadline as a whole: SGLang's launcher polls with timeout=5 (sglang 0.5.23 sglang/test/test_utils.py:704)."""


PORT_RACE_RETRIES = 2
"""How often a start that lost its auto-chosen port (EADDRINUSE in the log) is retried."""

_PORT_TAKEN = ("address already in use", "errno 98", "eaddrinuse")


def _lost_port_race(err: ServiceStartError) -> bool:
    if isinstance(err, ports.PortTaken):
        return True
    return err.exit_code is not None and any(marker in err.log_tail.lower() for marker in _PORT_TAKEN)


def _add_controller_entry(record: LaunchEntry, entry: ControllerEntry) -> None:
    """The controller's keys on its launch's entry. A cast: mypy does not update a TypedDict from
    another of some of its keys, though every key of a ``ControllerEntry`` is a ``LaunchEntry``'s."""
    record.update(cast(LaunchEntry, entry))


@dataclass(frozen=True)
class Refusal:
    """Why a config's tests get no service: skipped (the config is not available here) or failed (the
    reason: exit code, log tail, key-by-key diff), and the host that did not answer ssh, which the main
    process then sends no more configs."""

    message: str
    skipped: bool
    unreachable_host: str | None = None


@dataclass
class RunningService:
    """A ready, verified service instance, as the ``ddtree_service`` fixture hands it out.

    ``config`` is None only for auxiliary instances (the lossless reference), which run no
    speculative config. ``launch_command`` is None for external services (we did not launch them).
    """

    url: str
    client: SGLangClient
    server_info: dict[str, object]  # the service's own answer: read key by key, checked where used
    config: DDTreeConfig | None
    profile: ServiceProfile
    launch_command: str | None
    instance: int
    ready_s: float = 0.0
    log_path: Path | None = None
    name: str = ""
    proof: Proof | None = None
    """What the service's behaviour proved about each config field (None: the reference)."""

    def accept_bound(self) -> int | None:
        """min(block_size - 1, budget) of the running config: no verify may accept more drafts."""
        return proof_mod.accept_bound(proving.proof_values(self.profile, self.config)) if self.config is not None else None


@dataclass
class _Slot:
    """One running (or failed) launch: its controller and what it serves."""

    controller: Controller
    launch: Launch
    service: RunningService | None = None
    record: LaunchEntry | None = None  # its entry in the manager's launches, once it is launched
    client: SGLangClient | None = None  # the one HTTP client of this launch (health polls, then the service's)

    def stop(self) -> None:
        """Stop the service and close its client (its kept-alive connections)."""
        try:
            self.controller.stop()
        finally:
            self.close_client()

    def close_client(self) -> None:
        client, self.client = self.client, None
        close = getattr(client, "close", None)
        if callable(close):
            close()


class ServiceManager:
    """Owns one pool instance for one worker: restarts, readiness, verification, cleanup.

    It holds the profile's controller (made by the profile's kind, service/kinds.py) and asks
    the kind's capabilities at each step, never its name: whether to relaunch or adopt, which
    GPU wait, whether a scheduler places the launch.
    """

    def __init__(
        self,
        profile: ServiceProfile,
        placement: Placement = Placement(),
        *,
        pacing: Pacing = Pacing(),
        hooks: Hooks = Hooks(),
        clients: Clients = Clients(),
        tools: HostTools = HostTools(),
    ) -> None:
        # A host pool's entry (host, url, unit...) applied: one ordinary profile from here on.
        self.profile = profile = profile.for_instance(placement.instance_index)
        self.can = profile.capabilities
        """What this profile's controller can do (base.Capabilities)."""
        self.instance = placement.instance_index
        self.log_dir = Path(placement.log_dir)
        self.progress = hooks.progress
        self.ready_timeout_s = pacing.ready_timeout_s if pacing.ready_timeout_s is not None else profile.ready_timeout_s
        self.poll_interval = pacing.poll_interval
        self.progress_interval = pacing.progress_interval
        self.client_factory: ClientFactory = clients.factory or (lambda url, t: SGLangClient(url, t, profile.info_timeout_s))
        self.client_timeout_s = profile.request_timeout_s if clients.timeout_s is None else clients.timeout_s
        self.tools = tools
        fleet = profile.fleet
        self.host: LocalHost | SSHHost = make_host(
            profile.host, fleet.ssh_options, connect_timeout_s=fleet.connect_timeout_s,
            command_timeout_s=fleet.command_timeout_s, sudo=fleet.sudo,
        )
        self._gpu_memory, self._gpu_release = self._gpu_readers(tools)
        self._on_ready = hooks.on_ready
        lock_dir = placement.lock_dir
        self._lock = InstanceLock(Path(lock_dir), f"{profile.name}-{self.instance}") if lock_dir is not None else None
        # A scheduler's job is its own allocation: nothing on the host to take turns on.
        self._host_lock: HostLock | None = (
            None if self.can.placed_by_scheduler
            else self.host.lock(fleet.lock_path or f"/tmp/pytest-ddtree-{profile.unit or profile.name}.lock")
        )
        self._controller: Controller | None = None
        self._current: _Slot | None = None
        self._failed: dict[str, ServiceError] = {}
        self._starts = 0
        self._gpu_baseline: int | None = None
        self._baseline_taken = False
        self.launches: list[LaunchEntry] = []
        """Every launch (config, command, env, drop-in, outcome), for the repro package."""
        self.calibrations: list[CalibrationRun] = []
        """The calibration probe's runs: before the first launch, after the last stop (the session records them)."""
        self._config_launches = 0
        self.purpose: str | None = None
        """What the launches asked for now are for (``records.bill.launching_for``: the control's, a relaunch's);
        None: a config's launch is the config's, the non-speculative one the lossless reference's."""

    def _gpu_readers(self, tools: HostTools) -> tuple[GpuMemoryFn | None, GpuReleaseFn | None]:
        """The GPU memory reading and release wait before a launch, as the controller can take it."""
        if self.can.gpu_wait is GpuWait.NONE:
            # Not the harness's GPUs: a batch job's (a new job only gets GPUs nobody holds, and
            # this machine's or the login node's say nothing about them), or somebody else's server.
            return None, None
        gpu_memory, gpu_release = tools.gpu_memory, tools.gpu_release
        if self.host.remote:
            # The GPUs that matter are the host's: nvidia-smi there, not NVML here.
            from pytest_ddtree.service.gpu import HostGpus

            host_gpus = HostGpus(self.host)
            if gpu_memory is default_gpu_memory:
                gpu_memory = host_gpus.memory_used_bytes
            if gpu_release is default_gpu_release:
                gpu_release = host_gpus.wait_release
        return gpu_memory, gpu_release

    # -- public API ---------------------------------------------------------------------------
    @property
    def config_launches(self) -> int:
        """How many times this manager launched a speculative config (a restart each; the
        non-speculative reference and adopted external services are not counted): the figure
        the adaptive sweep reports as restarts spent."""
        return self._config_launches

    @property
    def current(self) -> RunningService | None:
        """The service currently in force, if any."""
        return self._current.service if self._current is not None else None

    @property
    def systemd_unit_text(self) -> str | None:
        """``systemctl cat`` of the unit as its controller found it on its host (None for
        controllers without a unit, or before the first start)."""
        return self._controller.unit_text if self._controller is not None else None

    def snapshot_runner(self) -> Runner | None:
        """Where the package's environment snapshot is taken, as the controller says: the ssh
        host that ran the service, the node of the running job (a step in its allocation), or
        None (this machine)."""
        if self._controller is None:
            return self.host if self.host.remote else None
        return self._controller.snapshot_runner(self.host)

    def ensure_for_tests(self, config: DDTreeConfig) -> RunningService | Refusal:
        """:meth:`ensure`, with a failure as what the config's tests report (:class:`Refusal`) rather than raised."""
        try:
            return self.ensure(config)
        except ConfigNotAvailable as exc:
            return Refusal(str(exc), skipped=True)
        except ServiceError as exc:
            return Refusal(str(exc), skipped=False, unreachable_host=unreachable_host(exc))

    def ensure(self, config: DDTreeConfig) -> RunningService:
        """A ready service running ``config``; restart only when the config changes.

        Raises the cached ServiceError for a config that failed before (no retry),
        ServiceDiedError when the service died since the last test, ExternalConfigMismatch (a
        failure with the key diff) for an external service running another config.
        """
        name = config.name
        if name in self._failed:
            raise self._failed[name]
        slot = self._current
        if slot is not None and slot.service is not None:
            if slot.service.config == config or self._same_launch(slot, config):
                self._check_alive(slot, name)
                self._shared(slot, bill.CONFIGS)
                slot.service.config = config
                return slot.service
            if not self.can.relaunch:
                # Nothing to restart: just check that the running config is the asked one.
                return self._adopt_external(slot, config)
        self._switch_away()
        return self._start(config)

    def ensure_reference(self) -> RunningService:
        """The non-speculative reference: the profile's ``lossless_args`` launched in this
        instance's own slot, in place of a config.

        Why the same slot and not a second instance beside it: on a GPU two copies of a large
        model rarely fit, so the reference takes the instance lock, waits for the previous
        instance's GPU memory and restarts like any config (the next ``ensure`` restarts the
        config). Callers cache what they measure on it: it is launched once per process.
        """
        name = REFERENCE_LABEL
        if name in self._failed:
            raise self._failed[name]
        problem = self.profile.reference_launch_problem()
        if problem is not None:
            raise ConfigNotAvailable(problem)
        slot = self._current
        if slot is not None and slot.service is not None and slot.service.config is None:
            self._check_alive(slot, name)
            self._shared(slot, bill.LOSSLESS_REFERENCE)
            return slot.service
        self._switch_away()
        return self._start(None)

    def _shared(self, slot: _Slot, default: str) -> None:
        """A running launch serves another purpose too (the control measured on the lossless
        reference's launch): its record says so, and the bill charges its restart once."""
        record, purpose = slot.record, self.purpose or default
        if record is not None and record.get("purpose") != purpose:
            also = record.setdefault("also_for", [])
            if purpose not in also:
                also.append(purpose)

    def release(self) -> None:
        """Stop the current service and let other workers have the instance."""
        self._switch_away()

    def abandon(self, config_name: str, reason: str) -> None:
        """Stop ``config_name``'s service, past a deadline (wedged or too slow to measure): its remaining
        tests fail at once with ``reason``; the next config starts a fresh service."""
        self._failed[config_name] = ServiceDiedError(f"the service stopped answering in time: {reason}", config_name=config_name,
                                                     hint="the service was stopped; the next config starts a fresh one")
        if self._current is not None:
            self._set_outcome(self._current, f"abandoned: {reason.splitlines()[0][:300]}")
        self._switch_away()

    def close(self) -> list[str]:
        """Stop everything started here, restore the systemd default; return problems seen.

        Never raises: it runs at session end and on Ctrl-C, where an exception would hide the
        test results. The plugin should print the returned problems.
        """
        problems: list[str] = []
        controller = self._controller
        current, self._current = self._current, None
        if current is not None:
            current.close_client()
        if controller is not None:
            try:
                controller.stop()
            except Exception as exc:  # noqa: BLE001
                problems.append(f"stopping {controller.describe()}: {exc}")
            else:
                if self.calibrations:  # the server stopped, the default config not restored yet
                    self._calibrate(WHEN_END)
            try:
                controller.restore_default()
            except Exception as exc:  # noqa: BLE001
                problems.append(f"restoring the default config of {controller.describe()}: {exc}")
            try:
                controller.close()
            except Exception as exc:  # noqa: BLE001
                problems.append(f"closing {controller.describe()}: {exc}")
        if self._lock is not None:
            self._lock.release()
        if self._host_lock is not None:
            self._host_lock.release()
        self.host.close()
        for problem in problems:
            self._say(f"service cleanup problem: {problem}")
        return problems

    # -- internals ----------------------------------------------------------------------------
    def _calibrate(self, when: str) -> None:
        """One run of the profile's calibration probe on the service's host (none without one);
        its failure is the run's, reported at the session end, never the launch's."""
        command = self.profile.render_calibration_command()
        if command is None:
            return
        self._say(f"calibration probe ({when}) on {self.host.name}: {command}")
        run = run_calibration(self.host, command, timeout_s=self.profile.calibration_timeout_s, when=when,
                              instance=self.instance)
        self.calibrations.append(run)
        figures = ", ".join(f"{k} {v:.4g}" for k, v in run.figures.items())
        self._say(f"calibration probe ({when}): {figures or run.error} ({run.seconds:.1f} s)")

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def _log_path(self, label: str) -> Path:
        self._starts += 1
        while True:
            path = self.log_dir / f"{label}-{self.instance}-{self._starts}.log"
            if not path.exists():
                return path
            self._starts += 1

    def _controller_for_profile(self) -> Controller:
        if self._controller is None:
            context = ControllerContext(
                profile=self.profile, host=self.host, instance=self.instance, log_dir=self.log_dir, progress=self.progress,
                health_client=self.client_factory, systemctl=self.tools.systemctl, journalctl=self.tools.journalctl,
            )
            self._controller = kinds.make_controller(context)
        return self._controller

    def _check_alive(self, slot: _Slot, name: str) -> None:
        try:
            info = slot.controller.failure()
        except ServiceError as exc:  # the host stopped answering (ssh): the config cannot go on there
            err = ServiceDiedError(
                f"cannot check the service any more: {exc}", config_name=name,
                log_tail="<unavailable: the host does not answer>",
                hint="the remaining tests of this config cannot run on this host",
            )
            self._failed[name] = err
            self._set_outcome(slot, f"lost: {str(exc).splitlines()[0]}")
            self._current = None
            slot.close_client()
            raise err from None
        if info is None:
            return
        err = ServiceDiedError(
            f"the service exited during the run: {info.description}",
            exit_code=info.exit_code,
            log_tail=info.log_tail,
            config_name=name,
            hint="the remaining tests of this config cannot run; the next config starts a fresh service",
        )
        self._failed[name] = err
        self._set_outcome(slot, f"died: {info.description}")
        self._switch_away()
        raise err

    def _switch_away(self) -> None:
        slot, self._current = self._current, None
        if slot is not None and self.can.relaunch:
            self._say(f"stopping {slot.controller.describe()}")
            try:
                slot.stop()
            except ServiceError as exc:  # e.g. the host went away; the next start says so for its config
                self._say(f"could not stop {slot.controller.describe()}: {str(exc).splitlines()[0]}")
        elif slot is not None:
            slot.close_client()
        if self._lock is not None and self._lock.held:
            self._lock.release()
            time.sleep(0.05)  # let a worker blocked on the lock get it before we re-lock

    def _wait_gpu_release(self) -> None:
        """Before a launch, wait until the previous instance's GPU memory is freed.

        Process profiles compare against what was in use before our first launch (other
        tenants, other workers' instances). A systemd unit already holds the GPU when the
        session starts, so there the threshold is "driver overhead only" (gpu.py's None).
        Without NVML or a GPU this returns at once.
        """
        if self._gpu_memory is None or self._gpu_release is None:
            return
        threshold: int | None
        if self.can.gpu_wait is GpuWait.DRIVER_ONLY:
            threshold = None
        else:
            if not self._baseline_taken:
                self._baseline_taken = True
                try:
                    self._gpu_baseline = self._gpu_memory()
                except Exception:  # noqa: BLE001 - no NVML: skip quietly
                    self._gpu_baseline = None
                return  # nothing of ours ran yet: nothing to wait for
            if self._gpu_baseline is None:
                return
            threshold = self._gpu_baseline
        released = self._gpu_release(threshold, self.profile.gpu_release_timeout_s, self.progress)
        if not released:
            self._say(
                f"GPU memory was not released within {self.profile.gpu_release_timeout_s:.0f} s; starting "
                "anyway (a start that runs out of memory will say so in its log)"
            )

    def _start(self, config: DDTreeConfig | None) -> RunningService:
        """Start ``config``; a launch that lost its auto-chosen port to another process is
        retried on a fresh port (that is the harness's race, not the config's failure)."""
        attempts = PORT_RACE_RETRIES + 1 if self.profile.port == "auto" and not isinstance(self.profile.pool, tuple) else 1
        for attempt in range(attempts):
            try:
                return self._start_once(config)
            except ServiceStartError as err:
                if attempt + 1 == attempts or not _lost_port_race(err):
                    raise
                name = config.name if config is not None else REFERENCE_LABEL
                self._failed.pop(name, None)
                self._say(f"{name}: the chosen port was taken before the service bound it; retrying on another port")
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self, config: DDTreeConfig | None) -> RunningService:
        """Launch ``config`` (None: the non-speculative reference with ``lossless_args``)."""
        name = config.name if config is not None else REFERENCE_LABEL
        if self._lock is not None:
            self._lock.acquire(self.progress)
        controller = self._controller_for_profile()
        instance_slot = resolve_instance(self.profile, self.instance)
        extra_args = self.profile.lossless_args if config is None else None
        unplanned = Launch(
            name=name,
            command="",
            port=instance_slot.port,
            url=instance_slot.url,
            env=self.profile.render_env(config),
            log_path=self._log_path(name) if self.can.log_file else None,
        )
        launch = controller.plan(unplanned, self.profile, config, extra_args)
        slot = _Slot(controller, launch)
        try:
            if self._host_lock is not None:
                self._host_lock.acquire(self._lock_owner(), self.progress, timeout_s=self.ready_timeout_s)
            controller.prepare()  # e.g. stop a unit (even its default config) before the GPU wait
            self._wait_gpu_release()
            if not self.calibrations:  # nothing of this session holds the accelerators yet
                self._calibrate(WHEN_START)
            service = self._launch_and_wait(slot, config, label=name)
            if not self.can.relaunch and config is not None:
                proving.check_external_config(self.profile, service.url, service.server_info, config)
                self._prove_external(slot, service, config)
        except ExternalConfigMismatch as err:
            self._failed[name] = err
            self._current = slot  # the external service is still usable for other configs
            raise
        except ServiceError as err:
            self._failed[name] = err
            self._set_outcome(slot, f"failed: {str(err).splitlines()[0]}")
            try:
                slot.stop()
            except ServiceError as stop_err:  # keep the start error: it is the one that explains
                self._say(f"could not stop {controller.describe()} after a failed start: {stop_err}")
            finally:
                if self._lock is not None:
                    self._lock.release()
            raise
        slot.service = service
        self._current = slot
        return service

    def _launch_and_wait(self, slot: _Slot, config: DDTreeConfig | None, label: str) -> RunningService:
        launch, controller = slot.launch, slot.controller
        external = not self.can.relaunch  # adopted: not ours to start, wait for or probe before its check
        if not external:
            self._say(f"starting {label} on {launch.url or 'a node the scheduler picks'}: {launch.command}")
        record = slot.record = self._launch_record(slot, label)
        self.launches.append(record)
        if not external and config is not None:
            self._config_launches += 1
        begin = time.monotonic()
        controller.start(launch)
        _add_controller_entry(record, controller.launch_record())
        placed = controller.await_placement(launch, self.progress, ready_timeout_s=self.ready_timeout_s,
                                            progress_interval=self.progress_interval)
        if placed is not launch:  # a batch job: the URL follows the node it got
            slot.launch = launch = placed
            _add_controller_entry(record, controller.launch_record())
            record["url"], record["port"] = launch.url, launch.port
        ready_s = 0.0
        # One client per launch: it polls health, then serves the tests; _Slot.stop closes it.
        client = slot.client = self.client_factory(launch.url, self.client_timeout_s)
        if isinstance(stream_http := getattr(client, "http", None), http_mod.ServiceHTTP):  # a stand-in may have none
            stream_http.stall = http_mod.Stall(self.profile.first_token_timeout_s, self.profile.stall_timeout_s)
        if not external:
            health_client: HealthClient = client
            ready_s = wait_ready(
                health_client,
                controller,
                self.profile.health_path,
                self.ready_timeout_s,
                self.progress,
                self.poll_interval,
                progress_interval=self.progress_interval,
                gpu_memory=self._gpu_memory,
                config_name=label,
                health_timeout_s=READY_HEALTH_TIMEOUT_S,
            )
        server_info, proof = proving.check_served(self.profile, controller, client, config, label, begin, external=external,
                                                   record=slot.record, say=self._say)
        record["outcome"] = "ready"
        record["ready_s"] = round(ready_s, 3)
        version = server_info.get("version")  # the report's environment section
        record["engine_version"] = None if version is None else str(version)
        self._say(f"{label} ready on {launch.url} after {ready_s:.1f} s")
        node = controller.placed_on()
        if self._on_ready is not None and node:
            self._on_ready(str(node))
        return RunningService(
            url=launch.url,
            client=client,
            server_info=server_info,
            config=config,
            profile=self.profile,
            launch_command=None if external else launch.command,
            instance=self.instance,
            ready_s=ready_s,
            log_path=launch.log_path,
            name=label,
            proof=proof,
        )

    def _launch_record(self, slot: _Slot, label: str) -> LaunchEntry:
        """The launch's entry in the session's record of launches, filled in as it goes."""
        launch = slot.launch
        return {
            "config": label,
            "host": self.profile.host,
            "instance": self.instance,
            "controller": slot.controller.kind,
            "command": launch.command or None,
            "env": dict(launch.env),
            "port": launch.port,
            "url": launch.url,
            "started_at": time.time(),
            "pid_of_harness": os.getpid(),
            "outcome": "starting",
            "purpose": self.purpose or (bill.LOSSLESS_REFERENCE if label == REFERENCE_LABEL else bill.CONFIGS),
        }

    def _adopt_external(self, slot: _Slot, config: DDTreeConfig) -> RunningService:
        assert slot.service is not None
        try:
            slot.service.server_info = slot.service.client.server_info()
        except Exception as exc:  # noqa: BLE001
            err = ServiceStartError(f"external service {slot.launch.url} stopped answering: {exc}", config_name=config.name)
            self._failed[config.name] = err
            raise err from None
        try:
            proving.check_external_config(self.profile, slot.service.url, slot.service.server_info, config)
            self._prove_external(slot, slot.service, config)
        except (ExternalConfigMismatch, ConfigNotServed) as err:
            self._failed[config.name] = err
            raise
        slot.service.config = config
        return slot.service

    def _prove_external(self, slot: _Slot, service: RunningService, config: DDTreeConfig) -> None:
        """What an external service's behaviour proves, once its /server_info matched ``config``
        (no log to read: the copy probe and /metrics only); a plain server drafts nothing to prove."""
        if is_plain(config):
            return
        proof = proving.prove(self.profile, slot.controller, service.client, config, service.server_info, self._say)
        service.proof = proof
        if slot.record is not None:
            slot.record["applied_evidence"] = proof.as_dict()
        if proof.failures:
            raise ConfigNotServed(config.name, [*proof.failures, *proof.notes], "<external service: no log available>")

    def _same_launch(self, slot: _Slot, config: DDTreeConfig) -> bool:
        """Whether ``config`` is what is running under another name (``bs8_b8_k4`` and
        ``bs8_b8_k4_w2048`` under a 2048 default): then a ten-minute restart buys nothing.

        Only the same field values count: two configs that differ but would render the same
        launch are refused at start (ServiceProfile.check_selection) and never share a service.
        """
        running = slot.service.config if slot.service is not None else None
        if not self.can.relaunch or not slot.launch.command or running is None:
            return False
        window = self.profile.default_window
        return running.field_values(window) == config.field_values(window)

    def _lock_owner(self) -> str:
        return f"pytest-ddtree pid {os.getpid()} on {socket.gethostname()} worker {os.environ.get('PYTEST_XDIST_WORKER', '-')}"

    @staticmethod
    def _set_outcome(slot: _Slot, outcome: str) -> None:
        if slot.record is not None:
            slot.record["outcome"] = outcome
