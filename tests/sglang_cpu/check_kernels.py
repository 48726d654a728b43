"""Checks the CPU `sgl_kernel` (beside this file) against references, in SGLang's venv.

    TRITON_INTERPRET=1 PYTHONPATH=tests/sglang_cpu python tests/sglang_cpu/check_kernels.py attention|tree|cache

The references: torch SDPA for the attention ops (causal, under a tree mask and along each tree
path, GQA, soft cap, sliding window, sinks, non-causal, the draft-branch rows); for the rest,
SGLang's own Triton kernels of the same name (its XPU path) run by Triton's interpreter on this
CPU, fed trees that SGLang's `select_top_k_tokens` / `organize_draft_results` build from random
draft scores. Every compared element counts; the last line says how many agreed. A mismatch exits
non-zero with what differed (tests/test_sgl_kernel_cpu.py runs each family).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: its kernels run on this CPU
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # select_top_k_tokens is torch.compile'd: eager is enough here
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

import torch  # noqa: E402
from torch import Tensor  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sgl_kernel  # noqa: E402

CHECKED = [0]


def same(what: str, got: Tensor, want: Tensor, tol: float = 0.0) -> None:
    """``got`` equals ``want`` element for element (within ``tol`` for floats); counts the elements."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if tol:
        bad = ~torch.isclose(got.float(), want.float(), rtol=tol, atol=tol)
    else:
        bad = got.to(want.dtype) != want
    if bool(bad.any()):
        where = bad.nonzero()[:5].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {want.numel()} elements differ, first at {where}:\n"
                             f"got  {got.reshape(-1)[:24].tolist()}\nwant {want.reshape(-1)[:24].tolist()}")
    CHECKED[0] += want.numel()


# ---- attention: against torch SDPA ------------------------------------------------------------------

HQ, HKV, D, POOL = 4, 2, 16, 256
TOL = 2e-2  # bf16 outputs against a float32 reference


def sdpa(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor, scale: float, cap: float = 0.0,
         sinks: Optional[Tensor] = None) -> Tensor:
    """torch SDPA over [L, H, D] rows, GQA by enable_gqa. A soft cap feeds SDPA the capped scores as
    queries against identity keys; a sink is one more key whose score is the sink logit, value 0."""
    qh, kh, vh = q.float().transpose(0, 1), keys.float().transpose(0, 1), values.float().transpose(0, 1)
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf")).expand(qh.shape[0], -1, -1)
    if cap:
        group = qh.shape[0] // kh.shape[0]
        capped = cap * torch.tanh((qh @ kh.repeat_interleave(group, 0).transpose(1, 2)) * scale / cap)
        qh, kh, vh, scale = capped, torch.eye(capped.shape[-1]).expand(qh.shape[0], -1, -1), \
            vh.repeat_interleave(group, 0), 1.0
    if sinks is not None:
        group = qh.shape[0] // kh.shape[0]
        kh, vh = kh.repeat_interleave(group, 0), vh.repeat_interleave(group, 0)
        kh = torch.cat([kh, torch.zeros(kh.shape[0], 1, kh.shape[2])], dim=1)
        vh = torch.cat([vh, torch.zeros(vh.shape[0], 1, vh.shape[2])], dim=1)
        bias = torch.cat([bias, sinks.float().view(-1, 1, 1).expand(-1, bias.shape[1], 1)], dim=-1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, scale=scale,
                                         enable_gqa=qh.shape[0] != kh.shape[0])
    return out.transpose(0, 1)


class Pool:
    """A KV pool with requests whose slots are scattered through it, as SGLang's allocator leaves them."""

    def __init__(self, seq_lens: list[int], generator: torch.Generator) -> None:
        self.k = torch.randn(POOL, HKV, D, generator=generator).bfloat16()
        self.v = torch.randn(POOL, HKV, D, generator=generator).bfloat16()
        self.req_to_token = torch.zeros(8, 128, dtype=torch.int32)
        self.reqs = torch.tensor([5, 2, 7][:len(seq_lens)])
        slots = torch.randperm(POOL - 1, generator=generator)[:sum(seq_lens)] + 1
        at = 0
        for req, n in zip(self.reqs.tolist(), seq_lens):
            self.req_to_token[req, :n] = slots[at:at + n]
            at += n

    def rows(self, req: int, n: int) -> tuple[Tensor, Tensor]:
        slots = self.req_to_token[req, :n].long()
        return self.k[slots], self.v[slots]


def run_extend(pool: Pool, q: Tensor, seq_lens: list[int], ext_lens: list[int], *, tree: Optional[Tensor] = None,
               causal: bool = True, window: int = 0, cap: float = 0.0, sinks: Optional[Tensor] = None,
               pass_kv: bool = True) -> Tensor:
    starts = [sum(ext_lens[:i]) for i in range(len(ext_lens))]
    k_ext = torch.cat([pool.rows(r, s)[0][s - e:] for r, s, e in zip(pool.reqs.tolist(), seq_lens, ext_lens)])
    v_ext = torch.cat([pool.rows(r, s)[1][s - e:] for r, s, e in zip(pool.reqs.tolist(), seq_lens, ext_lens)])
    out = torch.zeros_like(q)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q, k_ext.reshape(len(k_ext), -1) if pass_kv else None, v_ext if pass_kv else None, out, pool.k, pool.v,
        1.0, 1.0, pool.req_to_token, pool.reqs, torch.tensor(seq_lens), torch.tensor(ext_lens, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32), max(ext_lens), D ** -0.5, cap, False, window, None, sinks, tree, causal)
    return out


def check_extend(generator: torch.Generator) -> None:
    seq_lens, ext_lens = [23, 9, 40], [7, 9, 5]
    pool = Pool(seq_lens, generator)
    q = torch.randn(sum(ext_lens), HQ, D, generator=generator).bfloat16()
    sinks = torch.randn(HQ, generator=generator)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("causal", {}), ("causal, extend K/V read from the pool", {"pass_kv": False}),
        ("non-causal", {"causal": False}), ("sliding window 6", {"window": 6}), ("soft cap 0.5", {"cap": 0.5}),
        ("sinks", {"sinks": sinks}), ("window, cap and sinks", {"window": 4, "cap": 0.7, "sinks": sinks}),
    ]
    for name, options in cases:
        out = run_extend(pool, q, seq_lens, ext_lens, **options)
        at = 0
        for req, s, e in zip(pool.reqs.tolist(), seq_lens, ext_lens):
            keys, values = pool.rows(req, s)
            q_pos, k_pos = torch.arange(s - e, s)[:, None], torch.arange(s)[None, :]
            visible = k_pos <= q_pos if options.get("causal", True) else torch.ones(e, s, dtype=torch.bool)
            if options.get("window"):
                visible = visible & (q_pos - k_pos < options["window"])
            want = sdpa(q[at:at + e], keys, values, visible, D ** -0.5, options.get("cap", 0.0), options.get("sinks"))
            same(f"extend_attention_cpu ({name}), request {req}", out[at:at + e], want, TOL)
            at += e


def random_tree(n: int, generator: torch.Generator) -> list[int]:
    """parent[i] < i for i >= 1 (node 0 the root)."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, n)]


def path(parent: list[int], node: int) -> list[int]:
    nodes = []
    while node >= 0:
        nodes.append(node)
        node = parent[node]
    return nodes[::-1]


def check_tree_verify(generator: torch.Generator) -> None:
    """A verify pass under the QLEN_ONLY mask: each draft token's output is causal attention along its
    own root path (the prefix, its ancestors, itself), and SDPA under the same mask agrees."""
    n, prefixes = 6, [11, 30]
    seq_lens = [p + n for p in prefixes]
    pool = Pool(seq_lens, generator)
    parents = [random_tree(n, generator) for _ in prefixes]
    mask = torch.zeros(len(prefixes), n, n, dtype=torch.bool)
    for b, parent in enumerate(parents):
        for i in range(n):
            mask[b, i, path(parent, i)] = True
    q = torch.randn(len(prefixes) * n, HQ, D, generator=generator).bfloat16()
    out = run_extend(pool, q, seq_lens, [n] * len(prefixes), tree=mask.flatten())
    for b, (req, prefix, parent) in enumerate(zip(pool.reqs.tolist(), prefixes, parents)):
        keys, values = pool.rows(req, prefix + n)
        for i in range(n):
            chosen = list(range(prefix)) + [prefix + j for j in path(parent, i)]
            want = sdpa(q[b * n + i:b * n + i + 1], keys[chosen], values[chosen],
                        torch.ones(1, len(chosen), dtype=torch.bool), D ** -0.5)
            same(f"extend_attention_cpu (tree, path of node {i}), request {req}", out[b * n + i:b * n + i + 1], want, TOL)
        visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool), mask[b]], dim=1)
        want = sdpa(q[b * n:(b + 1) * n], keys, values, visible, D ** -0.5)
        same(f"extend_attention_cpu (tree mask), request {req}", out[b * n:(b + 1) * n], want, TOL)


def check_decode(generator: torch.Generator) -> None:
    seq_lens = [17, 4, 33]
    pool = Pool(seq_lens, generator)
    q = torch.randn(len(seq_lens), HQ, D, generator=generator).bfloat16()
    new_k = torch.randn(len(seq_lens), HKV * D, generator=generator).bfloat16()
    new_v = torch.randn(len(seq_lens), HKV * D, generator=generator).bfloat16()
    loc = torch.stack([pool.req_to_token[r, s - 1] for r, s in zip(pool.reqs.tolist(), seq_lens)]).long()
    sinks = torch.randn(HQ, generator=generator)
    for name, window, cap, sink in (("plain", 0, 0.0, None), ("window 5, cap 0.6, sinks", 5, 0.6, sinks)):
        out = torch.zeros_like(q)
        torch.ops.sgl_kernel.decode_attention_cpu(
            q, pool.k, pool.v, 1.0, 1.0, out, new_k, new_v, loc, torch.zeros(len(seq_lens), HQ, 8, D + 1),
            pool.req_to_token, pool.reqs, torch.tensor(seq_lens), D ** -0.5, cap, False, window, None, sink)
        same(f"decode_attention_cpu ({name}): K written at loc", pool.k[loc], new_k.view(-1, HKV, D))
        same(f"decode_attention_cpu ({name}): V written at loc", pool.v[loc], new_v.view(-1, HKV, D))
        for row, (req, s) in enumerate(zip(pool.reqs.tolist(), seq_lens)):
            keys, values = pool.rows(req, s)
            k_pos = torch.arange(s)[None, :]
            visible = (s - 1 - k_pos < window) if window else torch.ones(1, s, dtype=torch.bool)
            want = sdpa(q[row:row + 1], keys, values, visible, D ** -0.5, cap, sink)
            same(f"decode_attention_cpu ({name}), request {req}", out[row:row + 1], want, TOL)


def check_draft_decode(generator: torch.Generator) -> None:
    """The multi-step draft's decode: branch rows from build_draft_decode_metadata_cpu, each step's
    query seeing the prefix and its own branch's drafts so far."""
    seq_lens, topk, steps = [9, 21], 2, 3
    pool = Pool([s + topk * steps for s in seq_lens], generator)
    draft = sgl_kernel.build_draft_decode_metadata_cpu(pool.req_to_token, pool.reqs, torch.tensor(seq_lens),
                                                       topk, steps, pool.req_to_token.shape[1])
    branch_lens = torch.tensor(seq_lens).repeat_interleave(topk)
    for step in range(steps - 1):
        q = torch.randn(len(seq_lens) * topk, HQ, D, generator=generator).bfloat16()
        out = torch.zeros_like(q)
        torch.ops.sgl_kernel.decode_attention_cpu(
            q, pool.k, pool.v, 1.0, 1.0, out, None, None, torch.zeros(0, dtype=torch.long),
            torch.zeros(len(q), HQ, 8, D + 1), draft, torch.arange(len(q)), branch_lens + step + 1,
            D ** -0.5, 0.0, False, 0, None, None)
        for row in range(len(q)):
            b, t = divmod(row, topk)
            s, req = seq_lens[b], int(pool.reqs[b])
            mine = list(range(s)) + [s + t * steps + i for i in range(step + 1)]
            slots = pool.req_to_token[req, mine].long()
            want = sdpa(q[row:row + 1], pool.k[slots], pool.v[slots], torch.ones(1, len(mine), dtype=torch.bool),
                        D ** -0.5)
            same(f"decode_attention_cpu (draft step {step}, branch {t} of request {b})", out[row:row + 1], want, TOL)


def check_attention() -> None:
    generator = torch.Generator().manual_seed(43)
    check_extend(generator)
    check_tree_verify(generator)
    check_decode(generator)
    check_draft_decode(generator)


# ---- tree ops: against SGLang's Triton kernels on SGLang's own trees ----------------------------------

def draft_tree(bs: int, topk: int, steps: int, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(parent_list, top_scores_index, draft_tokens) as EAGLE's draft loop makes them
    (`speculative/eagle_worker_v2.py` draft_forward), from random draft distributions over 5 tokens."""
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    def proposals(rows: int) -> tuple[Tensor, Tensor]:
        probs = torch.softmax(torch.randn(rows, 5, generator=generator) * 3, dim=-1)
        best = torch.topk(probs, topk, dim=-1)
        return best.values, best.indices

    topk_p, topk_index = proposals(bs)
    hidden = torch.zeros(bs, 4)
    scores = None
    score_list, token_list, parents_list = [], [], []
    for i in range(steps):
        _, hidden, scores, tree_info = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
        score_list.append(tree_info[0])
        token_list.append(tree_info[1])
        parents_list.append(tree_info[2])
        topk_p, topk_index = proposals(bs * topk)
    parent_list, top_scores_index, draft_tokens = organize_draft_results(score_list, token_list, parents_list, n)
    return parent_list, top_scores_index, draft_tokens


def tree_buffers(bs: int, n: int, mask_size: int) -> list[Tensor]:
    return [torch.full((mask_size,), True), torch.full((bs * n,), -7, dtype=torch.long),
            *torch.full((3, bs, n), -1, dtype=torch.long).clone()]


def check_trees() -> None:
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton, \
        verify_tree_greedy_triton

    generator = torch.Generator().manual_seed(44)
    accepted = []
    for bs, topk, steps, n in ((2, 2, 3, 6), (3, 4, 3, 8), (1, 1, 4, 5), (2, 2, 4, 8)):
        parent_list, selected, draft_tokens = draft_tree(bs, topk, steps, n, generator)
        seq_lens = torch.randint(3, 40, (bs,), generator=generator)
        for mode in (TreeMaskMode.QLEN_ONLY, TreeMaskMode.FULL_MASK):
            size = bs * n * n + (int(seq_lens.sum()) * n if mode == TreeMaskMode.FULL_MASK else 0)
            mine, theirs = tree_buffers(bs, n, size), tree_buffers(bs, n, size)
            sgl_kernel.build_tree_kernel_efficient_cpu(parent_list, selected, seq_lens, *mine, topk, steps, n, mode)
            sgl_build_tree_kernel_triton(parent_list, selected, seq_lens, *theirs, topk, steps, n, mode)
            for name, got, want in zip(("tree_mask", "positions", "retrieve_index", "retrieve_next_token",
                                        "retrieve_next_sibling"), mine, theirs):
                same(f"build_tree_kernel_efficient_cpu {name} (bs {bs}, topk {topk}, {mode.name})", got, want)
        _, _, index, next_token, next_sibling = mine
        bonus = torch.randint(0, 5, (bs, 1), generator=generator)
        candidates = torch.cat([bonus, draft_tokens], dim=1)
        for trial in range(4):
            # targets that follow the drafts a random number of steps, then (mostly) differ
            target = torch.where(torch.rand(bs, n, generator=generator) < 0.8 - 0.2 * trial,
                                 candidates.roll(-1, 1), torch.randint(0, 5, (bs, n), generator=generator))
            outputs = []
            for verify in (sgl_kernel.verify_tree_greedy_cpu, None):
                predicts = torch.zeros(bs * n, dtype=torch.long)
                accept_index = torch.full((bs, steps + 1), -1, dtype=torch.long)
                accept_num = torch.zeros(bs, dtype=torch.long)
                if verify is None:
                    verify_tree_greedy_triton(predicts, accept_index, accept_num, candidates, index, next_token,
                                              next_sibling, target)
                else:
                    verify(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                           candidates=candidates, retrive_index=index, retrive_next_token=next_token,
                           retrive_next_sibling=next_sibling, target_predict=target)
                outputs.append((predicts, accept_index, accept_num))
            accepted += outputs[1][2].tolist()
            for name, got, want in zip(("predicts", "accept_index", "accept_token_num"), *outputs):
                same(f"verify_tree_greedy_cpu {name} (bs {bs}, topk {topk}, trial {trial})", got, want)
    # the trials walked the trees: some requests accepted nothing, some several drafts
    assert min(accepted) == 0 and max(accepted) >= 2, accepted
    check_reconstruct(generator)


def check_reconstruct(generator: torch.Generator) -> None:
    """NGRAM's tree mask (row i marks i's ancestors and itself) back to positions and links."""
    from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_triton
    from sgl_kernel.speculative import reconstruct_indices_from_tree_mask

    for bs, n in ((1, 8), (3, 8), (2, 5)):
        mask = torch.zeros(bs, n, n, dtype=torch.bool)
        for b in range(bs):
            parent = random_tree(n, generator)
            for i in range(n):
                mask[b, i, path(parent, i)] = True
        seq_lens = torch.randint(1, 50, (bs,), generator=generator)
        mine, theirs = tree_buffers(bs, n, 1)[1:], tree_buffers(bs, n, 1)[1:]
        reconstruct_indices_from_tree_mask(mask.flatten(), seq_lens, *mine, bs, n)
        reconstruct_indices_from_tree_mask_triton(mask.flatten(), seq_lens, *theirs, bs, n)
        for name, got, want in zip(("positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling"),
                                   mine, theirs):
            same(f"reconstruct_indices_from_tree_mask {name} (bs {bs}, n {n})", got, want)


# ---- cache bookkeeping: against SGLang's Triton kernels ----------------------------------------------

def check_cache() -> None:
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled
    from sglang.kernels.ops.speculative.cache_locs import assign_draft_cache_locs_contiguous, \
        assign_extend_cache_locs, generate_draft_decode_kv_indices
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    generator = torch.Generator().manual_seed(45)
    bs, pool_len = 3, 64
    reqs = torch.tensor([4, 0, 2])
    table = torch.randint(0, 1000, (6, pool_len), generator=generator, dtype=torch.int32)
    starts, ends = torch.tensor([3, 10, 0]), torch.tensor([9, 11, 20])
    packed = torch.randint(0, 1000, (int((ends - starts).sum()),), generator=generator)

    def both(name: str, run_mine: Callable[[Tensor, Tensor], None], run_theirs: Callable[[Tensor, Tensor], None],
             out: Tensor) -> None:
        mine_table, theirs_table, mine_out, theirs_out = table.clone(), table.clone(), out.clone(), out.clone()
        run_mine(mine_table, mine_out)
        run_theirs(theirs_table, theirs_out)
        same(f"{name}: req_to_token", mine_table, theirs_table)
        same(f"{name}: output", mine_out, theirs_out)

    both("assign_req_to_token_pool_cpu",
         lambda t, o: sgl_kernel.assign_req_to_token_pool_cpu(reqs, t, starts, ends, packed, pool_len),
         lambda t, o: assign_req_to_token_pool[(bs,)](reqs, t, starts, ends, packed, pool_len, 4), packed)
    out = torch.full((len(packed),), -1, dtype=torch.long)
    both("assign_extend_cache_locs_cpu",
         lambda t, o: sgl_kernel.assign_extend_cache_locs_cpu(reqs, t, starts, ends, o, pool_len),
         lambda t, o: assign_extend_cache_locs[(bs,)](reqs, t, starts, ends, o, pool_len, 4), out)
    topk, steps, seq_lens = 2, 3, torch.tensor([5, 17, 1])
    out = torch.full((bs * topk * steps,), -1, dtype=torch.long)
    both("assign_draft_cache_locs_contiguous_cpu",
         lambda t, o: sgl_kernel.assign_draft_cache_locs_contiguous_cpu(reqs, t, seq_lens, o, pool_len, topk, steps),
         lambda t, o: assign_draft_cache_locs_contiguous[(bs,)](reqs, t, seq_lens, o, pool_len, topk, steps), out)
    check_draft_rows(table, reqs, seq_lens, topk, steps, generate_draft_decode_kv_indices)

    accept_index = torch.tensor([[0, 2, -1, -1], [4, -1, -1, -1], [8, 9, 11, -1]])
    out_cache_loc = torch.randint(0, 1000, (12,), generator=generator)
    mine, theirs = torch.full((12,), -1), torch.full((12,), -1)
    sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, mine)
    fill_accept_out_cache_loc[(accept_index.numel(),)](accept_index, out_cache_loc, theirs, 16)
    same("fill_accept_out_cache_loc_cpu", mine, theirs)
    accept_tokens, accept_lens = torch.randint(0, 1000, (bs, 4), generator=generator), torch.tensor([2, 1, 3])
    mine, theirs = torch.full((bs,), -1), torch.full((bs,), -1)
    sgl_kernel.fill_bonus_tokens_cpu(accept_tokens, accept_lens, mine, 4)
    fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, theirs, 4)
    same("fill_bonus_tokens_cpu", mine, theirs)
    check_kv_copy(generator, copy_all_layer_kv_cache_tiled)


def check_draft_rows(table: Tensor, reqs: Tensor, seq_lens: Tensor, topk: int, steps: int,
                     generate: Any) -> None:
    """build_draft_decode_metadata_cpu's rows hold, per step, the KV indices the Triton backend's
    `generate_draft_decode_kv_indices` lists for that step and branch."""
    from sglang.srt.utils import next_power_of_2

    bs = len(reqs)
    draft = sgl_kernel.build_draft_decode_metadata_cpu(table, reqs, seq_lens, topk, steps, table.shape[1])
    kv_indices = torch.full((steps, 512), -1, dtype=torch.int32)
    kv_indptr = torch.zeros(steps, bs * topk + 1, dtype=torch.int32)
    positions = seq_lens.repeat_interleave(topk)
    generate[(steps, bs, topk)](reqs, table, seq_lens, kv_indices, kv_indptr, positions, table.shape[1],
                                kv_indices.shape[1], kv_indptr.shape[1], next_power_of_2(bs), next_power_of_2(steps),
                                next_power_of_2(bs * topk), 1, 0, 0)
    for step in range(steps):
        for row in range(bs * topk):
            start, end = int(kv_indptr[step, row]), int(kv_indptr[step, row + 1])
            length = int(seq_lens[row // topk]) + step + 1
            same(f"build_draft_decode_metadata_cpu (step {step}, branch row {row})", draft[row, :length],
                 kv_indices[step, start:end])


def check_kv_copy(generator: torch.Generator, tiled: Any) -> None:
    buffers = [torch.randn(40, 2, 8, generator=generator).bfloat16() for _ in range(4)]
    tgt, src = torch.tensor([3, 7, 8, 30]), torch.tensor([8, 1, 39, 30])  # 8 is read and written
    copies = [[b.clone() for b in buffers] for _ in range(2)]
    for run, group in enumerate(copies):
        ptrs = torch.tensor([b.data_ptr() for b in group], dtype=torch.uint64)
        strides = torch.tensor([b.stride(0) * b.element_size() for b in group])
        if run == 0:
            sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
        else:
            tiled[(len(group), 1)](ptrs, strides, tgt, src, len(tgt), 4, BYTES_PER_TILE=int(strides[0]))
    for layer, (mine, theirs, before) in enumerate(zip(*copies, buffers)):
        same(f"copy_all_layer_kv_cache_cpu (buffer {layer})", mine, theirs)
        same(f"copy_all_layer_kv_cache_cpu (buffer {layer}) against the rows moved", mine[tgt], before[src])


FAMILIES = {"attention": check_attention, "tree": check_trees, "cache": check_cache}


def main(argv: list[str]) -> int:
    families = argv or list(FAMILIES)
    for family in families:
        FAMILIES[family]()
    print(f"{CHECKED[0]} element checks agreed ({', '.join(families)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
