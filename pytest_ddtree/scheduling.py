"""xdist scheduling that keeps each config's tests on one worker, and stops feeding dead hosts.

Restarting a service is the expensive step (about ten minutes on the campaign's GPUs), so the
tests of one config must run on one worker, back to back. xdist's ``loadgroup`` does that by
appending ``@group`` to node ids on the workers, which pytest 9.2 no longer honours (node ids
are derived from a structured id there), and node ids must never be keyed on anyway (pytest-xdist's own advice).
This scheduler groups by the config name found in the test's parameter id instead: it is the
same name on every worker, whatever pytest does to node ids. Tests without a config are each
their own scope, so they spread like ``--dist load``.

In a fleet sweep each worker owns one host. When a host stops answering ssh, its worker would
otherwise go on taking configs and failing each with the ssh error, although the other hosts
could measure them. :class:`Distribution` tells :meth:`ConfigScheduling.mark_dead` which worker's
host is gone (from the failed test's report); from then on that worker gets no new config, the configs
already queued on it but not started are taken back (xdist's ``steal`` command) for the live
workers, and it shuts down after the config it was running. When every worker owns its ssh
host (no more workers than hosts), live workers are therefore not shut down as soon as the queue
is empty (xdist's default): work may still come back to them; they stop with everyone else when
the last test is done. Elsewhere xdist's pacing stays: local instances do not die this way, and
workers that share an instance take turns on its lock, so an idle one must let go at once. The
configs of a host that dies when nobody is left to take them (also when xdist's first
distribution handed out every config) stay with it. When every worker's host is dead, the
scheduler keeps handing out configs, so the run ends with every config failed fast instead of
waiting for a worker that will never come.

Beside it, the rest of how the tests are run: the main process's side of an xdist run
(:class:`Distribution`, the plugin's xdist hooks), the serial run loop of the adaptive sweep, and
the time xdist gives a worker to restore its service after Ctrl-C.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import pluggy
from xdist.scheduler import LoadScopeScheduling

from pytest_ddtree.configs import config_in_nodeid, item_config
from pytest_ddtree.session import WORKER_PROGRESS_KEY, worker_input

if TYPE_CHECKING:
    import pytest

    from pytest_ddtree.session import DDTreeSession

hookimpl = pluggy.HookimplMarker("pytest")  # pytest's own marker (pytest.hookimpl), so no pytest import


class Gateway(Protocol):
    """The part of execnet's ``Gateway`` the plugin reads: the worker's id (``gw0``)."""

    @property
    def id(self) -> str: ...


class SchedulerNode(Protocol):
    """What this scheduler uses of a worker, xdist's ``WorkerController`` (xdist.workermanage):
    xdist ships no type information, so this Protocol is the type checker's view of it."""

    @property
    def gateway(self) -> Gateway: ...

    @property
    def shutting_down(self) -> bool: ...

    def send_steal(self, indices: list[int]) -> None: ...

    def shutdown(self) -> None: ...


class WorkerNode(SchedulerNode, Protocol):
    """The ``node`` of xdist's hooks (xdist/newhooks.py) as the plugin uses it: the scheduler's
    view plus the worker's config and input; ``workeroutput`` exists only once the worker has
    finished, so it is read with ``getattr``."""

    @property
    def config(self) -> pytest.Config: ...

    @property
    def workerinput(self) -> dict[str, Any]: ...


class SchedulerLog(Protocol):
    """xdist's ``Producer`` (xdist.remote), the ``log`` its hooks hand a scheduler."""

    def __call__(self, *message: object) -> None: ...


def config_scope(nodeid: str) -> str:
    """The config name in a parametrized node id, or the node id itself when there is none."""
    name = config_in_nodeid(nodeid)
    return f"ddtree-config:{name}" if name else nodeid


class ConfigScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """LoadScopeScheduling whose scope is the DDTree config (see module docstring)."""

    def __init__(
        self, config: pytest.Config, log: SchedulerLog | None = None, progress: Callable[[str], None] | None = None,
        instances: int = 0
    ) -> None:
        super().__init__(config, log)
        self.hold_idle_workers = 0 < self.numnodes <= instances
        """Each worker owns its host (``instances``: the pool's ssh hosts, 0 for local
        services): an idle worker may wait for work given back."""
        self.dead: dict[SchedulerNode, str] = {}
        """Workers whose host stopped answering -> that host."""
        self._steals_in_flight: dict[SchedulerNode, list[str]] = {}
        """Workers -> the configs asked back from them, in the order xdist answers."""
        self._progress = progress

    def _split_scope(self, nodeid: str) -> str:
        return config_scope(nodeid)

    def _takers(self) -> list[SchedulerNode]:
        """Workers that can still take configs: host alive, not shutting down."""
        return [node for node in self.nodes if node not in self.dead and not node.shutting_down]

    def mark_dead(self, node: SchedulerNode, nodeid: str, host: str) -> None:
        """``node``'s host is unreachable (seen while running ``nodeid``): feed it no more configs.

        The config of ``nodeid`` stays with it (its remaining tests fail fast with the cached
        error); every config queued on it and not yet started goes back to the queue.
        """
        if node in self.dead or node not in self.assigned_work:
            return
        self.dead[node] = host
        if not self._takers():
            self._say(f"host {host} does not answer (worker {node.gateway.id}), and no other host is left: "
                      "the remaining configs fail there")
            return
        current = self._split_scope(nodeid)
        collection = self.registered_collections[node]
        returned = []
        for scope, unit in self.assigned_work[node].items():
            if scope == current or any(unit.values()):
                continue  # started: its tests stay with this worker
            node.send_steal([collection.index(test) for test in unit])
            self._steals_in_flight.setdefault(node, []).append(scope.removeprefix("ddtree-config:"))
            returned.append(scope.removeprefix("ddtree-config:"))
        moved = f"; asking back {', '.join(returned)} (queued there, not begun)" if returned else ""
        self._say(f"host {host} does not answer: worker {node.gateway.id} takes no more configs{moved}")
        node.shutdown()

    def remove_pending_tests_from_node(self, node: SchedulerNode, indices: list[int]) -> None:
        """The answer to a steal: these tests left ``node``'s queue; queue them for the others.

        An empty answer means the worker had already begun the config (xdist steals all or
        nothing): it stays there.
        """
        if node not in self.assigned_work:
            return
        asked = self._steals_in_flight[node].pop(0)
        if not indices:
            self._say(f"{asked} had already begun on worker {node.gateway.id} (xdist hands a worker its next test "
                      "before the current one ends): it fails there with its host")
            return
        self._say(f"{asked} came back from worker {node.gateway.id}: it goes to the other hosts")
        collection = self.registered_collections[node]
        returned: OrderedDict[str, dict[str, bool]] = OrderedDict()
        for index in indices:
            nodeid = collection[index]
            scope = self._split_scope(nodeid)
            unit = self.assigned_work[node][scope]
            del unit[nodeid]
            if not unit:
                del self.assigned_work[node][scope]
            returned.setdefault(scope, {})[nodeid] = False
        for scope in reversed(returned):  # first in line, in their original order
            self.workqueue[scope] = returned[scope]
            self.workqueue.move_to_end(scope, last=False)
        for other in self.nodes:
            self._reschedule(other)

    def remove_node(self, node: SchedulerNode) -> str | None:
        """A worker went away (finished or crashed); a steal it never answered is moot (xdist puts
        a crashed worker's unfinished tests back in the queue itself)."""
        self._steals_in_flight.pop(node, None)
        crashed: str | None = super().remove_node(node)
        return crashed

    @property
    def tests_finished(self) -> bool:
        if any(self._steals_in_flight.values()):
            return False  # tests on their way back must still be run
        return bool(super().tests_finished)

    def _reschedule(self, node: SchedulerNode) -> None:
        if node.shutting_down:
            return
        if node in self.dead and self._takers():
            node.shutdown()
            return
        if not self.workqueue:
            if not self.hold_idle_workers:
                node.shutdown()
            return  # else stay up: a dead host's configs may still come back (module docstring)
        if self._pending_of(self.assigned_work[node]) > 2:  # xdist's low-water mark
            return
        self._assign_work_unit(node)

    def _say(self, line: str) -> None:
        self.log(line)
        if self._progress is not None:
            self._progress(line)


#: The user property of a test report whose worker's host does not answer ssh (the service
#: fixture sets it; :class:`Distribution` reads it on the main process).
HOST_UNREACHABLE_PROPERTY = "ddtree_host_unreachable"


class HostReport(Protocol):
    """What the watcher reads of pytest's ``TestReport`` (xdist adds its ``node`` on the main process)."""

    @property
    def nodeid(self) -> str: ...

    @property
    def user_properties(self) -> Iterable[tuple[str, object]]: ...


class Distribution:
    """How the main process runs the tests, registered as a plugin there (as xdist's DSession is
    xdist's): under ``--ddtree-max-restarts`` the adaptive sweep's loop; under ``-n`` its side of the xdist run. It makes the scheduler by config (when ``-n``
    came without ``--dist``), joins each worker to the session (one results folder, session id and
    stamp; the channel of its progress lines), gives a worker restoring its service after Ctrl-C the
    time that takes, tells ``collected`` what the workers collected (the live page's plan), collects
    what each worker hands over, and feeds no more configs to a worker whose host does not answer ssh."""

    def __init__(self, session: DDTreeSession, in_use: Callable[[], bool], by_config: bool,
                 channel: Callable[[str], str | None], collected: Callable[[Sequence[str]], None]) -> None:
        self.session = session
        self.in_use = in_use
        self.by_config = by_config
        self.channel = channel
        self.collected = collected
        self.scheduler: ConfigScheduling | None = None

    @hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """Other runs keep pytest's own loop (None)."""
        return None if self.session.settings.max_restarts is None else run_adaptive_sweep(self.session, session)

    def _gates(self) -> bool:
        return self.in_use() and self.session.setup_problem is None

    @hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: SchedulerLog) -> ConfigScheduling | None:
        if not self.by_config:
            return None
        self.scheduler = ConfigScheduling(config, log, progress=self.session.progress,
                                          instances=ssh_instances(self.session, self.in_use()))
        return self.scheduler

    @hookimpl(optionalhook=True)
    def pytest_xdist_setupnodes(self, config: pytest.Config) -> None:
        nodes = getattr(config.pluginmanager.get_plugin("dsession"), "nodemanager", None)
        if nodes is not None and self._gates() and self.session.profile.capabilities.relaunch:
            allow_restores(nodes, self.session.profile.stop_timeout_s)

    @hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: WorkerNode) -> None:
        node.workerinput.update(worker_input(self.session.settings))
        channel = self.channel(node.workerinput["workerid"]) if self._gates() else None
        if channel is not None:
            node.workerinput[WORKER_PROGRESS_KEY] = channel

    @hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, ids: Sequence[str]) -> None:
        self.collected(list(ids))

    @hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: WorkerNode) -> None:
        """The worker's records and baseline proposals (absent if it crashed: then the collector
        reads its journal)."""
        from pytest_ddtree.records.sessionfolder import WORKEROUTPUT_KEY

        output = getattr(node, "workeroutput", None) or {}
        self.session.collector.add_worker_output(node.workerinput["workerid"], output.get(WORKEROUTPUT_KEY))

    def pytest_runtest_logreport(self, report: HostReport) -> None:
        """A test that failed because its worker's host does not answer ssh: the worker marked its report."""
        host = next((entry[1] for entry in report.user_properties if entry[0] == HOST_UNREACHABLE_PROPERTY), None)
        node = getattr(report, "node", None)  # set by xdist on the main process
        if host is not None and self.scheduler is not None and node is not None:
            self.scheduler.mark_dead(node, report.nodeid, str(host))


def ssh_instances(session: DDTreeSession, in_use: bool) -> int:
    """The scheduler's ``instances``: the pool's, where each is an ssh host (a ``host`` or a fleet).
    Only ssh hosts can be found dead: other runs keep xdist's own pacing, as does another
    project's run or a broken profile (the tests that need it report it)."""
    if not in_use or session.setup_problem is not None:
        return 0
    profile = session.profile
    return profile.pool_size if profile.host or profile.fleet.hosts else 0


def schedules_by_config(workers: object, dist: object, args: Sequence[str]) -> bool:
    """Whether :class:`ConfigScheduling` schedules the run: ``-n`` without an explicit ``--dist`` in
    ``args`` (the command line and addopts). xdist turns ``--dist no`` into ``load`` in its own
    (also tryfirst) hook, so only an explicit ``--dist`` wins."""
    return bool(workers) and dist in ("no", "load") and not any(arg.startswith("--dist") or arg == "-d" for arg in args)


def workers_beyond_cores(asked: object) -> str | None:
    """``-n 4`` on 2 cores: each worker runs a service and its load generator, so workers beyond
    the cores make every measurement describe the contention (cells come out inconclusive, or
    slow). The warning, said once at the start, or None."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not isinstance(asked, int) or asked <= cores:
        return None
    return (f"-n {asked} runs {asked} workers on {cores} CPU core(s) here: each worker runs a service and its load "
            f"generator, so the cores are shared and the throughput cells measure the contention (inconclusive, or "
            f"slower than their baseline); use -n {cores} or fewer")


def adaptive_problem(max_restarts: int | None, priors: Sequence[Path], workers: object) -> str | None:
    """Why ``--ddtree-max-restarts`` cannot run here (the usage error's message), or None: the
    adaptive sweep is serial (no ``-n``), needs the advisor extra and readable prior folders."""
    if max_restarts is None:
        return None
    from pytest_ddtree.adaptive import sweep as adaptive
    from pytest_ddtree.adaptive.advisor import AdvisorUnavailable

    if workers:
        return adaptive.XDIST_ERROR
    try:
        adaptive.check_available()
        adaptive.check_prior_dirs(priors)
    except (AdvisorUnavailable, adaptive.PriorError) as exc:
        return str(exc)
    return None


#: Seconds a worker gets, beyond the profile's stop timeout, to put its service back after Ctrl-C
#: (drop-in removal, daemon-reload and restart over ssh on a loaded box).
RESTORE_MARGIN_S = 30.0


def allow_restores(nodemanager: Any, stop_timeout_s: float) -> None:
    """On Ctrl-C xdist gives its workers ``NodeManager.EXIT_TIMEOUT`` (10 s) to finish, then
    kills them; a worker still restoring its systemd unit over ssh is killed mid-way and leaves
    its host on the sweep's config (seen on a loaded box). This session's node manager (not the
    class: nothing else in the process changes) waits as long as a restore may take."""
    nodemanager.EXIT_TIMEOUT = max(nodemanager.EXIT_TIMEOUT, stop_timeout_s + RESTORE_MARGIN_S)


def run_adaptive_sweep(ddtree: DDTreeSession, session: pytest.Session) -> bool | None:
    """pytest's run loop under ``--ddtree-max-restarts`` (serial): the adaptive sweep picks the
    configs to run (adaptive/sweep.py), each item's config its parametrized one (configs.item_config). None: pytest's
    own loop runs (nothing of a config was collected)."""
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    if session.config.option.collectonly:
        return True
    from pytest_ddtree.adaptive.sweep import SweepPlan, SweepRun, run_sweep

    plain: list[pytest.Item] = []
    by_config: dict[str, list[pytest.Item]] = {}
    for item in session.items:
        cfg = item_config(item)
        (plain if cfg is None else by_config.setdefault(cfg.name, [])).append(item)
    items = SweepRun(plain, by_config, lambda tests, after: _run_items(session, tests, after),
                     lambda skipped: session.config.hook.pytest_deselected(items=skipped))
    if not items.by_config:
        return None
    settings, max_context = ddtree.settings, ddtree.profile.max_context
    assert settings.max_restarts is not None
    cells = [w for w in ddtree.cells if max_context is None or w.context_tokens <= max_context]
    plan = SweepPlan(ddtree.selected_configs, cells, settings.max_restarts, ddtree.selection.build.default.name,
                     settings.priors, ddtree.progress)
    run_sweep(plan, items, ddtree.manager, ddtree.recorder)
    return True


def _run_items(session: pytest.Session, items: list[pytest.Item], after: pytest.Item | None) -> None:
    """pytest's own loop body over ``items``; ``after`` is the item expected to run next."""
    for index, item in enumerate(items):
        nextitem = items[index + 1] if index + 1 < len(items) else after
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
