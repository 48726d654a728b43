"""A CPU `sgl_kernel` in plain PyTorch: what real SGLang 0.5.23 calls to serve, and speculate, on a CPU.

The CPU build of sgl_kernel is not on the package index. SGLang imports names from it at import
time (`srt/mem_cache/memory_pool.py` -> `kernels/ops/kvcache/cache_move.py:10` imports
`copy_all_layer_kv_cache_cpu`), and with `--prefill-attention-backend intel_amx
--decode-attention-backend intel_amx` (`srt/layers/attention/intel_amx_backend.py`) it serves
through the kernels here, speculation included: the attention ops (`attention.py`, registered as
`torch.ops.sgl_kernel.*`), the EAGLE/NGRAM tree ops (`tree.py`) and the KV-slot bookkeeping
(`cache.py`). Each module names the SGLang call sites it serves and the reference
`tests/sglang_cpu/check_kernels.py` checks it against.

Every call appends the kernel's name to the file named by DDTREE_SGL_KERNEL_CALLS (so a test can
prove what was, or was not, called). Any other name is a function that writes its name there and
raises, so a kernel that is really needed fails loudly instead of computing nothing.
`sgl_kernel.scalar_type` is left missing on purpose: `layers/quantization/utils.py:21-45` falls
back to its own mock on ImportError.
"""

from __future__ import annotations

from typing import Callable, NoReturn

from . import attention as _attention  # noqa: F401  registers torch.ops.sgl_kernel.*
from .cache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)
from .calls import CALLS_LOG_ENV, record_call
from .tree import (
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "CALLS_LOG_ENV",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask_cpu",
    "verify_tree_greedy_cpu",
]


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__"):
        raise AttributeError(name)

    def not_available(*args: object, **kwargs: object) -> NoReturn:
        record_call(name)
        raise RuntimeError(f"sgl_kernel.{name} was called: this CPU stand-in does not implement it "
                           "(tests/sglang_cpu/sgl_kernel has the kernels SGLang's intel_amx path needs)")

    not_available.__name__ = name
    return not_available
