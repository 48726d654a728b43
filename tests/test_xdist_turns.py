"""The test run's own scheduler (tests/xdist_turns.py): collection order, one measuring module at a time.

Driven the way xdist's DSession drives a scheduler (add_node, add_node_collection, schedule,
mark_test_complete), with stand-in workers that record what they were sent: a worker process is
not what is under test here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.xdist_turns import MeasurementTurnScheduling, module_loads_cpu, module_measures, module_measures_alone


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


FIXTURES = {"j": "measurement_alone", "m1": "measurement_turn", "m2": "measurement_turn", "a": None, "b": None, "h": None}
MARKS = {"h": "sglang"}  # loads the CPU (a real SGLang server), measures nothing


@pytest.fixture
def scheduler(pytester: pytest.Pytester) -> MeasurementTurnScheduling:
    for name, fixture in FIXTURES.items():
        body = f'pytestmark = pytest.mark.usefixtures("{fixture}")\n' if fixture else ""
        body += f"pytestmark = pytest.mark.{MARKS[name]}\n" if name in MARKS else ""
        tests = "".join(f"def test_{t}(): pass\n" for t in "xyz")
        (pytester.path / f"test_{name}.py").write_text(f"import pytest\n{body}{tests}")
    config = pytester.parseconfig(str(pytester.path), "--tx=2*popen", "--dist=loadfile")
    return MeasurementTurnScheduling(config)


def start(scheduler: MeasurementTurnScheduling, *names: str) -> tuple[Worker, Worker]:
    one, two = Worker("gw0"), Worker("gw1")
    for w in (one, two):
        scheduler.add_node(w)
        scheduler.add_node_collection(w, [f"test_{name}.py::test_{t}" for name in names for t in "xyz"])
    scheduler.schedule()
    return one, two


def modules(scheduler: MeasurementTurnScheduling, worker: Worker) -> list[str]:
    """The modules sent to ``worker``, in the order it got them."""
    names = [scheduler.registered_collections[worker][i].split("::")[0][5:-3] for i in worker.sent]
    return list(dict.fromkeys(names))


def done(scheduler: MeasurementTurnScheduling, worker: Worker, name: str, tests: str = "xyz") -> None:
    for t in tests:
        scheduler.mark_test_complete(worker, scheduler.registered_collections[worker].index(f"test_{name}.py::test_{t}"))


def test_modules_are_sorted_by_the_fixture_they_name(pytester: pytest.Pytester, repo_root: Path) -> None:
    assert module_measures(str(repo_root / "tests" / "test_main_job.py"))
    assert module_measures_alone(str(repo_root / "tests" / "test_main_job.py"))
    assert module_measures(str(repo_root / "tests" / "test_throughput_suite.py"))
    assert not module_measures_alone(str(repo_root / "tests" / "test_throughput_suite.py"))
    assert not module_measures(str(repo_root / "tests" / "test_configs.py"))
    assert not module_measures(str(pytester.path / "no_such_module.py"))
    assert module_loads_cpu(str(repo_root / "tests" / "test_sglang_real.py"))
    assert not module_loads_cpu(str(repo_root / "tests" / "test_main_job.py"))


def test_a_module_that_measures_alone_has_no_measuring_neighbour(scheduler: MeasurementTurnScheduling) -> None:
    one, two = start(scheduler, "j", "m1", "m2", "a", "b")
    # j first; the other worker skips the measuring modules while j is held
    assert modules(scheduler, one) == ["j"] and modules(scheduler, two) == ["a"]
    done(scheduler, two, "a", "x")  # two runs low on work while j runs: it gets b, not m1
    assert modules(scheduler, two) == ["a", "b"]
    done(scheduler, one, "j", "x")  # one, low on work, gets m1 (nothing measuring elsewhere)
    assert modules(scheduler, one) == ["j", "m1"]
    done(scheduler, two, "a", "yz")
    done(scheduler, two, "b", "xy")  # j is still running on one: m2 waits, two gets nothing
    assert modules(scheduler, two) == ["a", "b"] and not two.shutting_down
    done(scheduler, one, "j", "yz")  # j done: the waiting worker gets m2, beside m1 (both may measure side by side)
    assert modules(scheduler, two) == ["a", "b", "m2"]
    assert not scheduler.workqueue


def test_a_module_that_measures_alone_waits_for_measuring_neighbours(scheduler: MeasurementTurnScheduling) -> None:
    one, two = start(scheduler, "m1", "j")
    assert modules(scheduler, one) == ["m1"] and modules(scheduler, two) == []  # j may not start beside m1
    done(scheduler, one, "m1", "x")  # one, low on work, takes j itself: it holds nothing else measuring
    assert modules(scheduler, one) == ["m1", "j"]
    done(scheduler, one, "m1", "yz")
    assert two.shutting_down  # nothing is left for it


def test_a_module_that_loads_the_cpu_keeps_off_the_one_that_measures_alone(scheduler: MeasurementTurnScheduling) -> None:
    one, two = start(scheduler, "j", "h", "a", "m1")
    assert modules(scheduler, one) == ["j"] and modules(scheduler, two) == ["a"]  # h waits while j runs
    done(scheduler, two, "a")
    assert modules(scheduler, two) == ["a"]  # neither h nor m1 may start beside j
    done(scheduler, one, "j")
    assert set(modules(scheduler, one) + modules(scheduler, two)) == {"j", "a", "h", "m1"}  # h and m1 side by side
