"""Four device checks that keep real SGLang 0.5.23 from serving DFLASH on a CPU, bypassed at import.

Only the DFLASH server of the lane has this folder on its PYTHONPATH (tests/sglang_lane.py,
``dflash_env``), so Python imports this module at start-up in the server and in the scheduler
processes it spawns. No SGLang file is edited: an import hook runs each patch right after its
module is first imported. Each patch removes a check that assumes a GPU and nothing else; the
CPU path the check refuses is SGLang's own (the intel_amx backend verifies a chain like any
tree, the draft runs on the same backend as the target), which EAGLE3, STANDALONE and NGRAM
already take on this CPU with no patch.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


def _device_gate(module: ModuleType) -> None:
    """sglang/srt/arg_groups/speculative_hook.py:291-301 (``_handle_dflash``) refuses any device
    but cuda, npu and xpu ("DFLASH speculative decoding is not supported by CpuSRTPlatform on
    device 'cpu'"). A device check only: nothing after it in ``_handle_dflash`` reads the device
    but the dp-attention branch, which the lane does not use. While ``_handle_dflash`` runs, the
    platform it sees answers the gate's two questions (out-of-tree? supports DFLASH?) with yes once,
    then is the real platform for everything after the gate."""
    original = getattr(module, "_handle_dflash")
    real = getattr(module, "current_platform")

    class GateOpen:
        asked = False

        def is_out_of_tree(self) -> bool:
            if not GateOpen.asked:
                GateOpen.asked = True
                return True
            return bool(real.is_out_of_tree())

        def supports_speculative_algorithm(self, algorithm: str) -> bool:
            return algorithm == "DFLASH" or bool(real.supports_speculative_algorithm(algorithm))

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    @functools.wraps(original)
    def handle_dflash(server_args: Any) -> None:
        GateOpen.asked = False
        setattr(module, "current_platform", GateOpen())
        try:
            original(server_args)
        finally:
            setattr(module, "current_platform", real)

    setattr(module, "_handle_dflash", handle_dflash)


def _draft_backends(module: ModuleType) -> None:
    """sglang/srt/arg_groups/choices.py:103-111 lists the draft attention backends without the CPU's
    intel_amx, so DFLASH's draft resolution (arg_groups/speculative_hook.py:886-935) and the draft
    worker (speculative/draft_worker_common.py:32-62) fall back to flashinfer, a CUDA library,
    and the draft worker crashes. intel_amx is the backend the target verifies with and that the
    EAGLE3 draft worker already inherits on a CPU (speculative/draft_utils.py:46-61). Added through
    the list's own extension point (choices.py:227, ``add_draft_attention_backend_choices``)."""
    module.add_draft_attention_backend_choices(["intel_amx"])


def _verify_topk(module: ModuleType) -> None:
    """sglang/srt/speculative/dflash_info.py:27-44: ``DFlashVerifyInput`` has ``topk = 1`` but no
    ``tree_topk``, which sglang/srt/layers/attention/intel_amx_backend.py:115 reads of every
    verify input (the GPU backends never ask). DFLASH verifies a chain, so its tree topk is 1: the
    backend's causal path, exactly what its comment there says a chain is."""
    module.DFlashVerifyInput.tree_topk = 1


def _cpu_record_stream(module: ModuleType) -> None:
    """sglang/srt/speculative/dflash_worker_v2.py:2481 calls ``record_stream`` on ``seq_lens`` for the
    current stream of the device, a hint to CUDA's caching allocator; on a CPU tensor torch raises.
    A CPU has no stream-ordered allocator to tell, so ``record_stream`` of a CPU tensor does nothing
    in this process; any other tensor keeps torch's own."""
    import torch

    original: Callable[..., Any] = torch.Tensor.record_stream

    @functools.wraps(original)
    def record_stream(self: Any, stream: Any) -> None:
        if self.device.type != "cpu":
            original(self, stream)

    setattr(torch.Tensor, "record_stream", record_stream)


#: Module name -> the patch applied once it has been imported.
PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "sglang.srt.arg_groups.speculative_hook": _device_gate,
    "sglang.srt.arg_groups.choices": _draft_backends,
    "sglang.srt.speculative.dflash_info": _verify_topk,
    "sglang.srt.speculative.dflash_worker_v2": _cpu_record_stream,
}


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds the patched modules as the ordinary path finder does, and patches each once it has run."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, PatchAfterImport())
