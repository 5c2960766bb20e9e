"""Radix prefix cache over token ids at page granularity: each tree edge is one full KV page of
tokens. Finished sequences donate their full pages; new sequences reuse the longest cached
prefix. The tree holds one reference per page; unreferenced leaves are evicted LRU, and only
when the KV pool runs out of pages."""
from __future__ import annotations

import heapq
import itertools

from engine.kv.paged import KVPool


class Node:
    __slots__ = ("children", "page", "parent", "key", "last", "ckpts")

    def __init__(self, key=(), page: int = -1, parent: "Node | None" = None):
        self.children: dict[tuple, Node] = {}
        self.key, self.page, self.parent, self.last = key, page, parent, 0
        self.ckpts: list = []  # recurrent-state checkpoints below this node (engine.kv.checkpoints)


class RadixCache:
    def __init__(self, kv: KVPool):
        self.kv, self.root, self.clock = kv, Node(), itertools.count(1)
        self.pages = 0           # pages the tree holds
        self.hit_tokens = 0      # prompt tokens served from the cache, all time

    def _keys(self, tokens: list[int], n_pages: int):
        p = self.kv.page_size
        return (tuple(tokens[i * p:(i + 1) * p]) for i in range(n_pages))

    def match(self, tokens: list[int]) -> list[int]:
        """Pages of the longest cached prefix, referenced for the caller. At least one token is
        left uncached so the caller still computes the logits of the last prompt token."""
        node, pages, now = self.root, [], next(self.clock)
        for key in self._keys(tokens, (len(tokens) - 1) // self.kv.page_size):
            node = node.children.get(key)
            if node is None:
                break
            node.last = now
            pages.append(node.page)
        self.kv.share(pages)
        self.hit_tokens += len(pages) * self.kv.page_size
        return pages

    def insert(self, tokens: list[int], pages: list[int]) -> Node:
        """Donate the full pages of `tokens` (whose KV is in `pages`); -> the node of the last one."""
        node, now = self.root, next(self.clock)
        for key, page in zip(self._keys(tokens, len(tokens) // self.kv.page_size), pages):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = Node(key, page, node)
                self.kv.share([page])
                self.pages += 1
            child.last, node = now, child
        return node

    def evict(self, n: int) -> int:
        """Free up to n pages from least recently used leaves nobody else references."""
        heap = [(leaf.last, id(leaf), leaf) for leaf in self._leaves()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key]
            self.dropped(leaf)
            self.kv.release([leaf.page])
            self.pages -= 1
            freed += 1
            if parent is not self.root and not parent.children and self.kv.refs[parent.page] == 1:
                heapq.heappush(heap, (parent.last, id(parent), parent))
        return freed

    def make_room(self, n: int, sliding: int = 0) -> bool:
        """Evict until the pool has n free pages (and the sliding layers' pool `sliding`, where the
        cache holds some: engine.kv.windows), or nothing more can go; True if any went."""
        return self.evict(n - len(self.kv.free)) > 0

    def evictable(self) -> int:
        """Pages only the tree references (what evict could give back)."""
        stack, n = list(self.root.children.values()), 0
        while stack:
            node = stack.pop()
            n += self.kv.refs[node.page] == 1
            stack.extend(node.children.values())
        return n

    def dropped(self, node: Node) -> None:
        """A node leaves the tree (hybrid models drop the checkpoints it carries)."""

    def _leaves(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif self.kv.refs[node.page] == 1:
                yield node
