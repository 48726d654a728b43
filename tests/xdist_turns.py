"""How one ``pytest tests -n 2 --dist loadfile`` run orders its modules and keeps its measurements apart.

Timing-sensitive modules (those that use the ``measurement_turn`` fixture) measure an engine
that stands for an accelerator; two of them at once on a 2-core box measure each other. Seen
in CI: the main job's c8_short TTFT read +46% (+61% in its confirmation) against committed
baselines while, by xdist's default order (modules with the fewest tests last), the other
one-test measuring modules ran beside it. ``machine_share.measurement_turn`` keeps *runs*
apart; within a run this scheduler does, without leaving a worker idle while other work is left:

* the modules run in collection order, which tests/conftest.py makes longest first (LPT); xdist
  would otherwise re-sort them by their number of tests (``--loadscope-reorder``, its default),
  which hands the several-minute one-test modules out last;
* a worker is never handed a timing-sensitive module while another worker holds one (running or
  queued): it takes the next other module, and waits only when nothing else is left.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

#: The fixture that marks a module as timing-sensitive (tests/conftest.py).
MEASURING_FIXTURE = "measurement_turn"


@functools.lru_cache(maxsize=None)
def module_measures(path: str) -> bool:
    """Does the test module at ``path`` (a file, or a nodeid's file part) take measurement turns?

    Read from its text, as the controller has only node ids: a module that names the fixture
    uses it (module-wide through ``pytestmark``, or for some of its tests)."""
    try:
        return MEASURING_FIXTURE in Path(path).read_text(encoding="utf-8")
    except OSError:
        return False


class MeasurementTurnScheduling(LoadFileScheduling):  # type: ignore[misc]
    """``--dist loadfile`` in collection order, one timing-sensitive module at a time."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.rootdir = Path(str(config.rootpath))
        config.option.loadscopereorder = False  # keep the collection's longest-first order

    def _measures(self, scope: str) -> bool:
        return module_measures(str(self.rootdir / scope))

    def _measuring_elsewhere(self, node: Any) -> bool:
        return any(self._measures(scope) and not all(work.values())
                   for other, assigned in self.assigned_work.items() if other is not node
                   for scope, work in assigned.items())

    def _assign_work_unit(self, node: Any) -> None:
        if self._measuring_elsewhere(node):
            scope = next((s for s in self.workqueue if not self._measures(s)), None)
            if scope is None:
                return  # only measuring modules are left: this worker waits for its turn (mark_test_complete)
            self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        # a worker left waiting for its turn gets work as soon as there is work it may take
        for other, assigned in self.assigned_work.items():
            if other is not node and not other.shutting_down and not self._pending_of(assigned):
                self._reschedule(other)
