"""Waiting for a state in tests: poll a condition until a deadline, never sleep a fixed time.

A fixed sleep is either too short on a busy machine (the test flakes) or too long everywhere
(the suite crawls); a poll returns as soon as the state is reached and fails with what it was
waiting for when it is not.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T | None], timeout: float, what: str | Callable[[], str],
               interval: float = 0.02) -> T:
    """The first truthy value of ``condition()``; AssertionError naming ``what`` after ``timeout`` s.
    (A condition that answers None until it holds gives its value without the None.) ``what`` may
    be a function, called at the timeout: a message with what the state was then (a log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
