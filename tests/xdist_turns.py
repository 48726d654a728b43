"""How one ``pytest tests -n 2 --dist loadfile`` run orders its modules and keeps its measurements apart.

Timing-sensitive modules (those that use the ``measurement_turn`` fixture) measure an engine
that stands for an accelerator. Most judge against baselines they bless themselves and move what
they test threefold, so a neighbour's load does not decide them. A module that judges against the
committed baselines (``measurement_alone``: the main job) is decided by it: in CI the main job's
c8_short TTFT read +46% (+61% in its confirmation) against the committed baselines while, by
xdist's default order (modules with the fewest tests last), the other one-test measuring modules
ran beside it. ``machine_share.measurement_turn`` keeps *runs* apart; within a run this scheduler
does, without leaving a worker idle while there is other work:

* the modules run in collection order, which tests/conftest.py makes ``measurement_alone`` first,
  then longest first (LPT); xdist would otherwise re-sort them by their number of tests
  (``--loadscope-reorder``, its default), which hands the several-minute one-test modules out last;
* a ``measurement_alone`` module is never handed to a worker while another worker holds a
  timing-sensitive module (running or queued), nor a timing-sensitive module while another holds
  a ``measurement_alone`` one: the worker takes the next other module, and waits only when
  nothing else is left. Timing-sensitive modules of the other kind may run side by side: all of
  them in one chain took longer than the whole run had;
* a module that loads the CPU without measuring (``pytest.mark.sglang``: a real SGLang server, whose
  start-up and requests take both cores of a 2-core box) keeps off a ``measurement_alone`` module
  the same way a timing-sensitive one does, and may run beside the others (their own load moves
  them less than what they test).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

#: The fixtures that mark a module as timing-sensitive, and as one that must measure alone (tests/conftest.py).
MEASURING_FIXTURE = "measurement_turn"
ALONE_FIXTURE = "measurement_alone"
#: The mark of a module that loads the CPU heavily (pyproject.toml's markers).
LOADS_CPU_MARK = "pytest.mark.sglang"


@functools.lru_cache(maxsize=None)
def _text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def module_measures(path: str) -> bool:
    """Does the test module at ``path`` (a file, or a nodeid's file part) measure?

    Read from its text, as the main process has only node ids: a module that names one of the
    fixtures uses it (module-wide through ``pytestmark``, or for some of its tests)."""
    text = _text(path)
    return MEASURING_FIXTURE in text or ALONE_FIXTURE in text


def module_loads_cpu(path: str) -> bool:
    """Does the module at ``path`` load the CPU heavily (marked ``sglang``), measuring or not?"""
    return LOADS_CPU_MARK in _text(path)


def module_measures_alone(path: str) -> bool:
    """Must the module at ``path`` measure with no other timing-sensitive module beside it?"""
    return ALONE_FIXTURE in _text(path)


class MeasurementTurnScheduling(LoadFileScheduling):  # type: ignore[misc]
    """``--dist loadfile`` in collection order; a ``measurement_alone`` module with no other
    timing-sensitive module beside it."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.rootdir = Path(str(config.rootpath))
        config.option.loadscopereorder = False  # keep the collection's longest-first order

    def _measures(self, scope: str) -> bool:
        """Timing-sensitive, or heavy enough on the CPU to spoil a measurement beside it."""
        path = str(self.rootdir / scope)
        return module_measures(path) or module_loads_cpu(path)

    def _alone(self, scope: str) -> bool:
        return module_measures_alone(str(self.rootdir / scope))

    def _held_elsewhere(self, node: Any) -> list[str]:
        """The modules other workers hold and have not finished."""
        return [scope for other, assigned in self.assigned_work.items() if other is not node
                for scope, work in assigned.items() if not all(work.values())]

    def _may_take(self, scope: str, held: list[str]) -> bool:
        if self._alone(scope):
            return not any(self._measures(s) for s in held)
        return not (self._measures(scope) and any(self._alone(s) for s in held))

    def _assign_work_unit(self, node: Any) -> None:
        held = self._held_elsewhere(node)
        scope = next((s for s in self.workqueue if self._may_take(s, held)), None)
        if scope is None:
            return  # what is left must wait for a turn: this worker gets work again in mark_test_complete
        self.workqueue.move_to_end(scope, last=False)
        super()._assign_work_unit(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        # a worker left waiting for its turn gets work as soon as there is work it may take
        for other in list(self.assigned_work):
            if other is not node:
                self._reschedule(other)
