"""The test run's own scheduler (tests/xdist_turns.py): collection order, one measuring module at a time.

Driven the way xdist's DSession drives a scheduler (add_node, add_node_collection, schedule,
mark_test_complete), with stand-in workers that record what they were sent: a worker process is
not what is under test here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.xdist_turns import MeasurementTurnScheduling, module_measures


class Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[int] = []
        self.shutting_down = False
        self.gateway = type("Gateway", (), {"id": name})()

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


@pytest.fixture
def scheduler(pytester: pytest.Pytester) -> MeasurementTurnScheduling:
    for name, measures in (("m1", True), ("m2", True), ("a", False), ("b", False)):
        body = 'pytestmark = pytest.mark.usefixtures("measurement_turn")\n' if measures else ""
        tests = "".join(f"def test_{t}(): pass\n" for t in "xyz")
        (pytester.path / f"test_{name}.py").write_text(f"import pytest\n{body}{tests}")
    config = pytester.parseconfig(str(pytester.path), "--tx=2*popen", "--dist=loadfile")
    return MeasurementTurnScheduling(config)


COLLECTION = [f"test_{m}.py::test_{t}" for m in ("m1", "m2", "a", "b") for t in "xyz"]


def start(scheduler: MeasurementTurnScheduling, collection: list[str]) -> tuple[Worker, Worker]:
    one, two = Worker("gw0"), Worker("gw1")
    for w in (one, two):
        scheduler.add_node(w)
        scheduler.add_node_collection(w, collection)
    scheduler.schedule()
    return one, two


def modules(worker: Worker) -> list[str]:
    return sorted({COLLECTION[i].split("::")[0] for i in worker.sent}, key=lambda m: worker.sent.index(
        next(i for i in worker.sent if COLLECTION[i].startswith(m))))


def test_measuring_modules_are_found_by_the_fixture_they_name(pytester: pytest.Pytester, repo_root: Path) -> None:
    assert module_measures(str(repo_root / "tests" / "test_main_job.py"))
    assert not module_measures(str(repo_root / "tests" / "test_configs.py"))
    assert not module_measures(str(pytester.path / "no_such_module.py"))


def test_one_measuring_module_at_a_time_in_collection_order(scheduler: MeasurementTurnScheduling) -> None:
    one, two = start(scheduler, COLLECTION)
    # the first worker takes the first module; the second may not take the other measuring module
    assert modules(one) == ["test_m1.py"] and modules(two) == ["test_a.py"]
    # the second worker, low on work while m1 still runs, is given b, not m2
    scheduler.mark_test_complete(two, COLLECTION.index("test_a.py::test_x"))
    assert modules(two) == ["test_a.py", "test_b.py"]
    # the first worker, which holds the turn, is given m2 (xdist hands a module out before the last one ends)
    scheduler.mark_test_complete(one, COLLECTION.index("test_m1.py::test_x"))
    assert modules(one) == ["test_m1.py", "test_m2.py"]
    assert not scheduler.workqueue


def test_with_only_measuring_modules_left_the_other_worker_waits_then_ends(scheduler: MeasurementTurnScheduling) -> None:
    one, two = start(scheduler, COLLECTION[:6])
    assert modules(one) == ["test_m1.py"]
    assert two.sent == [] and not two.shutting_down  # it waits: m2 would run beside m1
    scheduler.mark_test_complete(one, 0)
    assert modules(one) == ["test_m1.py", "test_m2.py"] and two.sent == []
    assert two.shutting_down  # nothing is left for it
