"""The call log: each kernel call appends its name to the file DDTREE_SGL_KERNEL_CALLS names.

A test reads it to prove what the server called (nothing, for plain torch_native serving; the
attention and tree kernels, for speculation). One open-and-append per call: cheap next to a kernel.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, TypeVar

CALLS_LOG_ENV = "DDTREE_SGL_KERNEL_CALLS"

F = TypeVar("F", bound=Callable[..., object])


def record_call(name: str) -> None:
    log = os.environ.get(CALLS_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as calls:
            calls.write(name + "\n")


def logged(fn: F) -> F:
    """``fn``, writing its name to the call log first (also when its arguments are wrong)."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        record_call(fn.__name__)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
