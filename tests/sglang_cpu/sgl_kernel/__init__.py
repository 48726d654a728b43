"""An import-only stand-in for `sgl_kernel`, so real SGLang 0.5.23 serves on a CPU box.

The CPU build of sgl_kernel is not on the package index, and SGLang imports names from it at
import time (`srt/mem_cache/memory_pool.py` -> `kernels/ops/kvcache/cache_move.py:10` imports
`copy_all_layer_kv_cache_cpu`); plain non-speculative serving with `--attention-backend
torch_native` calls none of them. Every attribute is a function that, when called, appends its
name to the file named by DDTREE_SGL_KERNEL_CALLS (so a test can prove nothing called it) and
raises, so a kernel that is really needed fails loudly instead of computing nothing.
`sgl_kernel.scalar_type` is left missing on purpose: `layers/quantization/utils.py:21-45` falls
back to its own mock on ImportError.
"""

from __future__ import annotations

import os
from typing import Callable, NoReturn

CALLS_LOG_ENV = "DDTREE_SGL_KERNEL_CALLS"


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__"):
        raise AttributeError(name)

    def not_available(*args: object, **kwargs: object) -> NoReturn:
        log = os.environ.get(CALLS_LOG_ENV)
        if log:
            with open(log, "a", encoding="utf-8") as calls:
                calls.write(name + "\n")
        raise RuntimeError(f"sgl_kernel.{name} was called: the test stand-in has no kernels")

    not_available.__name__ = name
    return not_available
