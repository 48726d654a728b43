"""`sgl_kernel.speculative`: where NGRAM imports the tree-mask reconstruction from
(`kernels/ops/speculative/reconstruct_tree.py:48-50`); the kernel itself is in `tree.py`."""

from __future__ import annotations

from .tree import reconstruct_indices_from_tree_mask_cpu as reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
