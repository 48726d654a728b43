"""The speculative tree kernels: build an EAGLE tree, verify it greedily, rebuild NGRAM's links.

Call sites: `kernels/ops/speculative/spec_tree.py` (`build_tree_kernel_efficient_func`,
`verify_tree_greedy_func`: on a CPU these, with `verify_tree_greedy_cpu` called by keyword with the
CUDA op's `retrive_*` spelling) and `kernels/ops/speculative/reconstruct_tree.py:48-50` (NGRAM
imports `sgl_kernel.speculative.reconstruct_indices_from_tree_mask`). Each follows SGLang's own
Triton kernel of the same name in those files (its XPU path), step for step where the kernel walks
the tree (the per-request loops run over at most the draft tokens); `tests/sglang_cpu/
check_kernels.py` runs those Triton kernels under TRITON_INTERPRET=1 on trees built by SGLang's
`select_top_k_tokens` / `organize_draft_results` and compares every output element.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .calls import logged


FULL_MASK, QLEN_ONLY = 0, 1  # spec_tree.TreeMaskMode


def _parent_node(selected: list[int], parents: list[int], node: int, topk: int) -> int:
    """The tree node (0 = the root) that draft node ``node`` (1-based) hangs from, or -1."""
    parent_tb = selected[node - 1] // topk
    if parent_tb == 0:
        return 0
    parent_token = parents[parent_tb]
    return selected.index(parent_token) + 1 if parent_token in selected else -1


# long because: the Triton kernel's tree walk kept in one piece, so it reads against spec_tree.py:52-208
@logged
def build_tree_kernel_efficient_cpu(
    parent_list: Tensor, selected_index: Tensor, verified_seq_len: Tensor, tree_mask: Tensor,
    positions: Tensor, retrieve_index: Tensor, retrieve_next_token: Tensor, retrieve_next_sibling: Tensor,
    topk: int, depth: int, draft_token_num: int, tree_mask_mode: int,
) -> None:
    """Fills the tree mask, positions and retrieve_* links of `sgl_build_tree_kernel_efficient_triton`."""
    n, mode = draft_token_num, int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(f"sgl_kernel.build_tree_kernel_efficient_cpu: tree_mask_mode {mode} "
                                  "(bit-packed) is not implemented; SGLang's CPU path uses QLEN_ONLY")
    seq_lens = verified_seq_len.tolist()
    prefix_sum = 0
    for b, seq_len in enumerate(seq_lens):
        selected = selected_index[b].tolist()
        parents = parent_list[b].tolist() if parent_list.dim() > 1 else parent_list.tolist()
        next_token = retrieve_next_token[b]
        for node in range(n - 1, 0, -1):
            retrieve_index[b, node] = b * n + node
            parent = _parent_node(selected, parents, node, topk)
            if parent < 0:
                continue
            if int(next_token[parent]) != -1:
                retrieve_next_sibling[b, node] = next_token[parent]
            next_token[parent] = node
        retrieve_index[b, 0] = b * n
        for node in range(n):
            if mode == FULL_MASK:
                row = n * n * b + prefix_sum * n + (seq_len + n) * node + seq_len
            else:
                row = n * n * b + n * node
            tree_mask[row] = True
            tree_mask[row + 1:row + n] = False
            ancestors = 0
            cur = node - 1
            while node > 0 and ancestors < depth:  # the node itself, then up to the root
                ancestors += 1
                tree_mask[row + 1 + cur] = True
                parent = _parent_node(selected, parents, cur + 1, topk)
                if parent <= 0:
                    break
                cur = parent - 1
            positions[b * n + node] = seq_len + ancestors
        prefix_sum += seq_len


@logged
def verify_tree_greedy_cpu(
    predicts: Tensor, accept_index: Tensor, accept_token_num: Tensor, candidates: Tensor,
    retrive_index: Tensor, retrive_next_token: Tensor, retrive_next_sibling: Tensor, target_predict: Tensor,
) -> None:
    """`verify_tree_greedy_kernel_triton`: from the root, follow the child whose token is the target's."""
    bs, n = candidates.shape
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        tokens, index = candidates[b].tolist(), retrive_index[b].tolist()
        first_child, sibling = retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist()
        last = index[0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, accept_index.shape[1]):
            cur = first_child[cur]
            while cur != -1 and tokens[cur] != target[last]:
                cur = sibling[cur]
            if cur == -1:
                break
            predicts[last] = target[last]
            accepted += 1
            accept_index[b, accepted] = index[cur]
            last = index[cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


@logged
def reconstruct_indices_from_tree_mask_cpu(
    tree_mask: Tensor, verified_seq_len: Tensor, positions: Tensor, retrieve_index: Tensor,
    retrieve_next_token: Tensor, retrieve_next_sibling: Tensor, batch_size: int, draft_token_num: int,
) -> None:
    """The contract in `reconstruct_tree.py`'s docstring: ``tree_mask[b, i, j]`` marks j an ancestor of i."""
    n = draft_token_num
    if batch_size == 0:
        return
    node = torch.arange(n)
    # ancestors[b, i, j]: j is a strict ancestor of i
    ancestors = tree_mask.reshape(-1)[:batch_size * n * n].view(batch_size, n, n).bool() & (node[None, :] < node[:, None])
    parent = torch.where(ancestors, node, -1).amax(-1)  # [b, i]
    first_child = torch.where(ancestors, node[None, :, None], n).amin(1)  # [b, j]: least i that j is an ancestor of
    same_parent = (parent[:, :, None] == parent[:, None, :]) & (node[:, None] > node[None, :])  # [b, k, tid]
    first_sibling = torch.where(same_parent, node[None, :, None], n).amin(1)
    _put(positions, ancestors.sum(-1) + verified_seq_len[:batch_size].view(-1, 1))
    _put(retrieve_index, torch.arange(batch_size * n))
    _put(retrieve_next_token, torch.where(first_child < n, first_child, -1))
    _put(retrieve_next_sibling, torch.where((parent >= 0) & (first_sibling < n), first_sibling, -1))


def _put(out: Tensor, values: Tensor) -> None:
    """The first ``values.numel()`` elements of ``out`` (a contiguous buffer of any shape), in order."""
    out.view(-1)[:values.numel()] = values.reshape(-1).to(out.dtype)
