"""ConfigScheduling when a worker's host dies: the xdist scheduler driven through the calls
DSession makes, with stand-ins for the worker channels (what a worker would run and return).
The end-to-end case with real sshd hosts is tests/test_fleet.py's host-down sweep."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_ddtree.scheduling import ConfigScheduling

CONFIGS = ["bs8_b4_k4", "bs8_b8_k4", "bs8_b12_k4", "bs8_b16_k4", "bs8_b4_k4_w512"]
TESTS = ["test_a", "test_b", "test_c"]
COLLECTION = [f"suites/test_x.py::{test}[{config}]" for config in CONFIGS for test in TESTS]


@dataclass
class Gateway:
    id: str


class WorkerChannel:
    """What the main process sends one worker: its run queue, steals (all or nothing, as xdist's
    worker does) and the shutdown."""

    def __init__(self, name: str) -> None:
        self.gateway = Gateway(name)
        self.queue: list[int] = []
        self.ran: list[int] = []
        self.steals: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def send_steal(self, indices: list[int]) -> None:
        self.steals.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def configs(self, indices: list[int]) -> list[str]:
        return list(dict.fromkeys(COLLECTION[i].split("[")[1].rstrip("]") for i in indices))


def _start(pytester: pytest.Pytester, lines: list[str], instances: int = 3) -> tuple[ConfigScheduling, list[WorkerChannel]]:
    config = pytester.parseconfig("--tx=3*popen")
    sched = ConfigScheduling(config, progress=lines.append, instances=instances)
    workers = [WorkerChannel(f"gw{i}") for i in range(3)]
    for worker in workers:
        sched.add_node(worker)
        sched.add_node_collection(worker, COLLECTION)
    sched.schedule()
    return sched, workers


def _run_next(sched: ConfigScheduling, worker: WorkerChannel) -> str:
    index = worker.queue.pop(0)
    worker.ran.append(index)
    sched.mark_test_complete(worker, index)
    return COLLECTION[index]


def _answer_steals(sched: ConfigScheduling, worker: WorkerChannel) -> None:
    while worker.steals:
        asked = worker.steals.pop(0)
        stolen = asked if all(i in worker.queue for i in asked) else []
        worker.queue = [i for i in worker.queue if i not in stolen]
        sched.remove_pending_tests_from_node(worker, stolen)


def _drain(sched: ConfigScheduling, workers: list[WorkerChannel]) -> None:
    """Run queued tests (round robin) until the scheduler says the run is done, then what each
    worker still holds (DSession shuts every worker down; a worker runs its queue to the end)."""
    for _ in range(10 * len(COLLECTION)):
        if sched.tests_finished:
            for worker in workers:
                while worker.queue:
                    _run_next(sched, worker)
            return
        for worker in workers:
            if worker.queue:
                _run_next(sched, worker)
    raise AssertionError("the run never finished")


def test_dead_host_keeps_its_current_config_and_gives_back_the_queued_ones(pytester: pytest.Pytester) -> None:
    lines: list[str] = []
    sched, (gw0, gw1, gw2) = _start(pytester, lines)
    assert [w.configs(w.queue) for w in (gw0, gw1, gw2)] == [["bs8_b4_k4"], ["bs8_b8_k4"], ["bs8_b12_k4"]]
    # gw1 passes the first test of its config and, near the end of it, takes the next one.
    _run_next(sched, gw1)
    assert gw1.configs(gw1.queue) == ["bs8_b8_k4", "bs8_b16_k4"]
    # Its host dies during the second test: the report of that test names the host.
    failing = COLLECTION[gw1.queue[0]]
    sched.mark_dead(gw1, failing, "ops@gpu-1")
    assert gw1.shutting_down and gw1.configs([i for s in gw1.steals for i in s]) == ["bs8_b16_k4"]
    assert not sched.tests_finished  # the stolen tests are on their way back
    _answer_steals(sched, gw1)
    _run_next(sched, gw1)  # the failing test completes; gw1 is offered nothing new
    assert gw1.configs(gw1.queue) == ["bs8_b8_k4"]
    _drain(sched, [gw0, gw1, gw2])
    # gw1 ran only the config it held; every other config ran once, on a live worker.
    assert gw1.configs(gw1.ran) == ["bs8_b8_k4"]
    live = gw0.configs(gw0.ran) + gw2.configs(gw2.ran)
    assert sorted(live) == sorted(set(CONFIGS) - {"bs8_b8_k4"})
    assert sorted(gw0.ran + gw1.ran + gw2.ran) == list(range(len(COLLECTION)))
    assert lines == ["host ops@gpu-1 does not answer: worker gw1 takes no more configs; asking back bs8_b16_k4 (queued there, not begun)",
                     "bs8_b16_k4 came back from worker gw1: it goes to the other hosts"]
    assert sched.remove_node(gw1) is None  # it finishes with nothing pending


def test_every_host_dead_still_runs_every_config(pytester: pytest.Pytester) -> None:
    """Nobody left to take the work: the dead workers keep getting configs (each fails fast
    there) so the session ends instead of waiting for a worker that never comes."""
    lines: list[str] = []
    sched, workers = _start(pytester, lines)
    for worker in workers:
        sched.mark_dead(worker, COLLECTION[worker.queue[0]], f"host-{worker.gateway.id}")
        _answer_steals(sched, worker)
    _drain(sched, workers)
    assert sorted(i for w in workers for i in w.ran) == list(range(len(COLLECTION)))
    assert "no other host is left" in lines[-1]


def test_a_steal_that_comes_too_late_leaves_the_config_where_it_began(pytester: pytest.Pytester) -> None:
    """xdist's worker already holds the next config's first test (it needs the next item to run
    the current one): the steal answers empty and that config stays with the dead worker."""
    lines: list[str] = []
    sched, (gw0, gw1, gw2) = _start(pytester, lines)
    _run_next(sched, gw1)
    _run_next(sched, gw1)  # now running bs8_b8_k4's last test, holding bs8_b16_k4's first
    sched.mark_dead(gw1, COLLECTION[gw1.queue[0]], "ops@gpu-1")
    in_hand = gw1.queue.pop(1)
    _answer_steals(sched, gw1)
    gw1.queue.insert(1, in_hand)
    _drain(sched, [gw0, gw1, gw2])
    assert gw1.configs(gw1.ran) == ["bs8_b8_k4", "bs8_b16_k4"]
    assert "bs8_b16_k4" not in gw0.configs(gw0.ran) + gw2.configs(gw2.ran)
    assert any(line.startswith("bs8_b16_k4 had already begun on worker gw1") for line in lines), lines
    assert sorted(gw0.ran + gw1.ran + gw2.ran) == list(range(len(COLLECTION)))


def test_workers_sharing_instances_let_go_when_the_queue_is_empty(pytester: pytest.Pytester) -> None:
    """Three workers on two instances take turns on the instance lock: an idle worker that kept
    its last test (and so its lock) would block its partner forever. It is shut down instead
    (xdist's default); with an instance each, it waits for configs a dead host may give back."""
    for instances, expect_shutdown in ((2, True), (3, False)):
        sched, (gw0, gw1, gw2) = _start(pytester, [], instances=instances)
        for worker in (gw0, gw1, gw2):
            _run_next(sched, worker)  # each takes one more config; the queue is now empty
        assert not sched.workqueue
        _run_next(sched, gw2)
        assert gw2.shutting_down is expect_shutdown
