"""`torch.ops.sgl_kernel.extend_attention_cpu` and `decode_attention_cpu`, in plain PyTorch.

Call sites: `srt/layers/attention/intel_amx_backend.py` (`forward_extend`, :290-313, prefill and
the speculative verify; `forward_decode`, :383-403, decode and the multi-step draft, whose rows
read a per-branch `req_to_token` built by `build_draft_decode_metadata_cpu`). The schemas are those
call sites' argument lists. A request's keys are its slots ``req_to_token[req, :seq_len]`` in the
KV pool; the extend part comes from ``k_extend`` / ``v_extend`` where given (the backend has
already written them to the pool, unless it was told not to save them). The extend queries sit at
positions ``prefix_len + i`` and see keys causally, or, in a verify, the whole prefix plus their
ancestors under the QLEN_ONLY tree mask (``[bs, n, n]`` flattened, `speculative/eagle_utils.py:
132-135`, passed only for real trees: `intel_amx_backend.py:100-123`). Soft cap
``cap * tanh(s / cap)``; a sliding window of ``sliding_window_size`` (SGLang passes the layer's
window + 1; 0 or less is none) keeps keys with ``q_pos - k_pos < sliding_window_size``; a sink is
one more logit per head in the softmax's denominator; GQA maps query head h to KV head
``h // (Hq / Hkv)``. Checked against torch SDPA (and its own masks) by
`tests/sglang_cpu/check_kernels.py`.

Per request a loop; within one, every query and head at once. ``attn_logits`` is the C++ kernel's
split-K scratch: nothing to keep here.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .calls import record_call


EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int max_len_extend, float sm_scale, float logit_cap, bool is_cross_attention, "
    "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
)
DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, float key_scale, "
    "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
    "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
)


def attend(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor, sm_scale: float, logit_cap: float,
           sinks: Optional[Tensor]) -> Tensor:
    """Softmax attention of ``q`` [Lq, Hq, D] over ``keys`` [Lk, Hkv, D] / ``values`` [Lk, Hkv, Dv]
    where ``visible`` [Lq, Lk] allows, in float32; returns [Lq, Hq, Dv]."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.float().repeat_interleave(group, dim=1)
    values = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(-1, 1, 1).expand(-1, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def _window(visible: Tensor, q_pos: Tensor, k_pos: Tensor, sliding_window_size: int) -> Tensor:
    if sliding_window_size <= 0:
        return visible
    return visible & (q_pos[:, None] - k_pos[None, :] < sliding_window_size)


def _pool_rows(buffer: Tensor, slots: Tensor, scale: float) -> Tensor:
    rows = buffer[slots].float()
    return rows * scale if scale != 1.0 else rows


def _no_cross_attention(is_cross_attention: bool, name: str) -> None:
    if is_cross_attention:
        raise NotImplementedError(f"sgl_kernel.{name}: cross-attention (encoder keys) is not implemented "
                                  "in this CPU stand-in; the lane's decoder-only models do not need it")


# long because: one kernel's argument list, as SGLang's call site passes it (22 arguments)
def extend_attention_cpu(
    q_extend: Tensor, k_extend: Optional[Tensor], v_extend: Optional[Tensor], o_extend: Tensor,
    k_buffer: Tensor, v_buffer: Tensor, key_scale: float, value_scale: float, req_to_token: Tensor,
    req_pool_indices: Tensor, seq_lens: Tensor, extend_seq_lens: Tensor, extend_start_loc: Tensor,
    max_len_extend: int, sm_scale: float, logit_cap: float, is_cross_attention: bool,
    sliding_window_size: int, encoder_lens: Optional[Tensor], sinks: Optional[Tensor],
    tree_mask: Optional[Tensor], is_causal: bool,
) -> None:
    record_call("extend_attention_cpu")
    _no_cross_attention(is_cross_attention, "extend_attention_cpu")
    kv_heads = k_buffer.shape[1:]
    mask_offset = 0
    for req, seq_len, ext_len, start in zip(req_pool_indices.tolist(), seq_lens.tolist(),
                                            extend_seq_lens.tolist(), extend_start_loc.tolist()):
        prefix_len = seq_len - ext_len
        slots = req_to_token[req, :seq_len].long()
        keys = _pool_rows(k_buffer, slots, key_scale)
        values = _pool_rows(v_buffer, slots, value_scale)
        if k_extend is not None and v_extend is not None:
            keys[prefix_len:] = k_extend.reshape(-1, *kv_heads)[start:start + ext_len].float()
            values[prefix_len:] = v_extend.reshape(-1, *v_buffer.shape[1:])[start:start + ext_len].float()
        q_pos = torch.arange(prefix_len, seq_len)
        k_pos = torch.arange(seq_len)
        if is_causal:
            visible = k_pos[None, :] <= q_pos[:, None]
        else:
            visible = torch.ones(ext_len, seq_len, dtype=torch.bool)
        if tree_mask is not None:
            tree = tree_mask[mask_offset:mask_offset + ext_len * ext_len].view(ext_len, ext_len).bool()
            visible[:, prefix_len:] &= tree
            mask_offset += ext_len * ext_len
        visible = _window(visible, q_pos, k_pos, sliding_window_size)
        out = attend(q_extend[start:start + ext_len], keys, values, visible, sm_scale, logit_cap, sinks)
        o_extend[start:start + ext_len] = out.to(o_extend.dtype)


# long because: one kernel's argument list, as SGLang's call site passes it (19 arguments)
def decode_attention_cpu(
    query: Tensor, k_buffer: Tensor, v_buffer: Tensor, key_scale: float, value_scale: float,
    output: Tensor, key: Optional[Tensor], value: Optional[Tensor], loc: Tensor, attn_logits: Tensor,
    req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, sm_scale: float, logit_cap: float,
    is_cross_attention: bool, sliding_window_size: int, encoder_lens: Optional[Tensor],
    sinks: Optional[Tensor],
) -> None:
    record_call("decode_attention_cpu")
    _no_cross_attention(is_cross_attention, "decode_attention_cpu")
    if key is not None and value is not None:
        slots = loc.long()
        k_buffer[slots] = key.reshape(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[slots] = value.reshape(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    for row, (req, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        slots = req_to_token[req, :seq_len].long()
        k_pos = torch.arange(seq_len)
        visible = _window(torch.ones(1, seq_len, dtype=torch.bool), k_pos[-1:], k_pos, sliding_window_size)
        out = attend(query[row:row + 1], _pool_rows(k_buffer, slots, key_scale),
                     _pool_rows(v_buffer, slots, value_scale), visible, sm_scale, logit_cap, sinks)
        output[row] = out[0].to(output.dtype)


_LIBRARY = torch.library.Library("sgl_kernel", "FRAGMENT")
_LIBRARY.define(EXTEND_SCHEMA)
_LIBRARY.define(DECODE_SCHEMA)
_LIBRARY.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
_LIBRARY.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
