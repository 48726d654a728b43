"""Prefix cache of the reference engine: a token radix tree after SGLang's ``RadixCache``.

Why: SGLang reuses the KV cache of any cached prefix of a new prompt; the reused tokens are
reported as ``meta_info.cached_tokens`` and prefill computes only the rest, so cells whose
requests share a prefix (a long system prompt, a repeated document) measure faster than cells
that do not, and a harness that forgets to flush between cells measures the cache, not the
config. The engine models that: prefill costs only the uncached tokens (engine.py ``_prefill``).

Follows sgl-project/sglang python/sglang/srt/mem_cache/radix_cache.py (``RadixCache``) with
page size 1, no lock references and no KV values (the engine simulates time, not memory):

* ``match_prefix`` walks from the root and returns the length of the longest cached prefix,
  splitting the node where the match ends inside it (``_match_prefix_helper``, ``_split_node``)
  and refreshing the access stamps of the path (LRU);
* the scheduler caps a match at ``len(prompt) - 1`` (schedule_batch.py
  ``Req._compute_max_prefix_len``: at least one token must be computed for the next-token
  logits), and at ``logprob_start_len`` when input logprobs are asked for;
* ``insert`` adds a sequence, sharing its longest cached prefix (``_insert_helper``); the engine
  inserts a request's prompt when its prefill is done (batch_result_processor.py
  ``checkpoint_kv_cache``) and prompt + output minus the last token (the tokens whose KV exists)
  when it finishes (mem_cache/common.py ``release_kv_cache``);
* when the cached tokens exceed ``capacity`` the least recently used leaves are evicted, a parent
  becoming a leaf joining the candidates (``evict``);
* ``reset`` empties it (``/flush_cache``: scheduler.py ``flush_cache`` -> ``tree_cache.reset()``).

Access stamps are a counter, not a clock, so eviction order is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "parent", "key", "last_access")

    def __init__(self, key: list[int], parent: _Node | None, stamp: int) -> None:
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.key = key
        self.last_access = stamp


def _common_prefix(node_key: list[int], key: Sequence[int], offset: int) -> int:
    """How many leading tokens of ``node_key`` equal ``key[offset:]``."""
    n = min(len(node_key), len(key) - offset)
    if list(key[offset : offset + n]) == node_key[:n]:
        return n
    i = 0
    while i < n and node_key[i] == key[offset + i]:
        i += 1
    return i


class RadixCache:
    """Longest-prefix matching over token sequences, bounded by ``capacity`` tokens (see module)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"prefix cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.stamp = 0
        self.root = _Node([], None, 0)
        self.size = 0  # tokens held

    def reset(self) -> None:
        self.root = _Node([], None, self.stamp)
        self.size = 0

    def _tick(self) -> int:
        self.stamp += 1
        return self.stamp

    def match_prefix(self, key: Sequence[int], limit: int | None = None) -> int:
        """Length of the longest cached prefix of ``key[:limit]``."""
        if limit is not None and limit < len(key):
            key = key[: max(0, limit)]
        return self._walk(key, self._tick())[1]

    def _walk(self, key: Sequence[int], stamp: int) -> tuple[_Node, int]:
        """Follow ``key`` down the tree, stamping what it touches; a match that ends inside a node
        splits it there (``_match_prefix_helper``). Returns the deepest node and the matched length."""
        node = self.root
        node.last_access = stamp
        matched = 0
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            child.last_access = stamp
            n = _common_prefix(child.key, key, matched)
            matched += n
            if n < len(child.key):
                node = self._split(child, n)
                break
            node = child
        return node, matched

    def insert(self, key: Sequence[int]) -> int:
        """Cache ``key``; returns how many of its leading tokens were cached already."""
        stamp = self._tick()
        node, matched = self._walk(key, stamp)
        if matched < len(key):
            rest = list(key[matched:])
            node.children[rest[0]] = _Node(rest, node, stamp)
            self.size += len(rest)
            if self.size > self.capacity:
                self.evict(self.size - self.capacity)
        return matched

    def _split(self, child: _Node, at: int) -> _Node:
        """Split ``child`` after ``at`` tokens; returns the new upper node (radix_cache.py ``_split_node``)."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:at], parent, child.last_access)
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        return upper

    def evict(self, num_tokens: int) -> int:
        """Drop least recently used leaves until ``num_tokens`` are freed (or nothing is left)."""
        heap: list[tuple[int, int, _Node]] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root:
                heap.append((node.last_access, id(node), node))
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.size -= freed
        return freed
