"""KV-slot bookkeeping: which pool slots a request's tokens, drafts and accepted tokens live in.

Call sites (each a `_cpu` branch beside a Triton kernel of the same name, the reference
`tests/sglang_cpu/check_kernels.py` runs under TRITON_INTERPRET=1 and compares element by element):
`kernels/ops/speculative/cache_locs.py` (`assign_draft_cache_locs_contiguous`,
`assign_extend_cache_locs`), `srt/mem_cache/allocation.py` (`assign_req_to_token_pool`),
`kernels/ops/speculative/eagle.py` (`fill_accept_out_cache_loc`, `fill_bonus_tokens`),
`kernels/ops/kvcache/cache_move.py` (`copy_all_layer_kv_cache_tiled`: SGLang calls it once at
start-up, and to move accepted drafts' KV) and `srt/layers/attention/intel_amx_backend.py:438`
(`build_draft_decode_metadata_cpu`, checked against `generate_draft_decode_kv_indices` in
`cache_locs.py`: the same slots, laid out as one `req_to_token` row per draft branch).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from .calls import logged


def _spans(start_offset: Tensor, end_offset: Tensor) -> list[tuple[int, int, int]]:
    """(start, end, offset into the packed out_cache_loc) per request."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    offsets = [0]
    for start, end in zip(starts, ends):
        offsets.append(offsets[-1] + end - start)
    return list(zip(starts, ends, offsets))


@logged
def assign_req_to_token_pool_cpu(req_pool_indices: Tensor, req_to_token: Tensor, start_offset: Tensor,
                                 end_offset: Tensor, out_cache_loc: Tensor, pool_len: int) -> None:
    """Writes request i's new slots, packed in ``out_cache_loc``, into its row at [start, end)."""
    for req, (start, end, offset) in zip(req_pool_indices.tolist(), _spans(start_offset, end_offset)):
        req_to_token[req, start:end] = out_cache_loc[offset:offset + end - start].to(req_to_token.dtype)


@logged
def assign_extend_cache_locs_cpu(req_pool_indices: Tensor, req_to_token: Tensor, start_offset: Tensor,
                                 end_offset: Tensor, out_cache_loc: Tensor, pool_len: int) -> None:
    """The reverse: request i's row at [start, end), packed into ``out_cache_loc``."""
    for req, (start, end, offset) in zip(req_pool_indices.tolist(), _spans(start_offset, end_offset)):
        out_cache_loc[offset:offset + end - start] = req_to_token[req, start:end].to(out_cache_loc.dtype)


@logged
def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: Tensor, req_to_token: Tensor, seq_lens: Tensor,
                                           out_cache_loc: Tensor, pool_len: int, topk: int,
                                           speculative_num_steps: int) -> None:
    """Request i's ``topk * steps`` draft slots, from ``seq_lens[i]`` on, to its block of ``out_cache_loc``."""
    width = topk * speculative_num_steps
    for i, (req, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width:(i + 1) * width] = req_to_token[req, seq_len:seq_len + width].to(out_cache_loc.dtype)


@logged
def build_draft_decode_metadata_cpu(req_to_token: Tensor, req_pool_indices: Tensor, seq_lens: Tensor, topk: int,
                                    num_steps: int, pool_len: int) -> Tensor:
    """One ``req_to_token`` row per draft branch (request i, branch t at row ``i * topk + t``): the
    request's prefix, then the branch's ``num_steps`` slots (``seq_len + t * num_steps`` on, the layout
    `assign_draft_cache_locs_contiguous` hands out)."""
    rows = req_to_token[req_pool_indices.long()]
    draft = rows.repeat_interleave(topk, dim=0)
    for i, seq_len in enumerate(seq_lens.tolist()):
        for t in range(topk):
            own = rows[i, seq_len + t * num_steps:seq_len + (t + 1) * num_steps]
            draft[i * topk + t, seq_len:seq_len + num_steps] = own
    return draft


@logged
def fill_accept_out_cache_loc_cpu(accept_index: Tensor, out_cache_loc: Tensor, accept_out_cache_loc: Tensor) -> None:
    """The slots of the accepted tokens (``accept_index`` != -1, in order), packed."""
    flat = accept_index.reshape(-1)
    accepted = flat[flat != -1].long()
    accept_out_cache_loc[:accepted.numel()] = out_cache_loc[accepted].to(accept_out_cache_loc.dtype)


@logged
def fill_bonus_tokens_cpu(accept_tokens: Tensor, accept_lens: Tensor, bonus_tokens: Tensor,
                          accept_stride: int) -> None:
    """Request i's last accepted token (``accept_lens`` counts the bonus token itself)."""
    rows = torch.arange(accept_lens.numel()) * accept_stride
    picked = accept_tokens.reshape(-1)[rows + accept_lens.long() - 1]
    bonus_tokens.view(-1)[:picked.numel()] = picked.to(bonus_tokens.dtype)


@logged
def copy_all_layer_kv_cache_cpu(data_ptrs: Tensor, strides: Tensor, tgt_loc: Tensor, src_loc: Tensor) -> None:
    """Row ``src_loc[j]`` to row ``tgt_loc[j]`` in every buffer (a layer's K or V), by address and row
    stride in bytes as SGLang hands them (`memory_pool.py` `_init_data_ptrs_and_strides`)."""
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist()):
        memory = (ctypes.c_uint8 * (rows * stride)).from_address(address)
        buffer = torch.frombuffer(memory, dtype=torch.uint8).view(rows, stride)
        buffer[tgt] = buffer[src]  # gathers first: safe where targets and sources overlap
