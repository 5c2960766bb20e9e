"""The prefix cache of models with sliding-window layers: a radix tree of the full-attention
layers' pages plus a bounded LRU set of windows hanging on its nodes. A running sequence frees the
sliding layers' pages behind its window (engine.kv.paged.SlidingPool), so a cached prefix can be
reused only where the sliding layers' KV of the window before its end was kept: a window is those
pages for the prefix ending at a node's page (kept at a finished or preempted sequence's end and
at each prompt's end, which the next turn of a conversation continues). A new request resumes at
the deepest window its prompt continues."""
from __future__ import annotations

from collections import Counter, OrderedDict

from engine.kv.paged import KVPool
from engine.kv.radix import Node, RadixCache


class SlidingPrefixCache(RadixCache):
    def __init__(self, kv: KVPool):
        super().__init__(kv)
        self.sliding = kv.sliding
        self.windows: OrderedDict[Node, list[int]] = OrderedDict()  # node -> its window's pages, LRU first

    def keep(self, tokens: list[int], pages: list[int], sliding: list[int]) -> None:
        """Donate the full pages of `tokens` (whose KV is in `pages`, the sliding layers' in
        `sliding`) and keep the window of the prefix ending at the last of them."""
        node = self.insert(tokens, pages)
        d = len(tokens) // self.kv.page_size
        window = sliding[self.sliding.first_live(d * self.kv.page_size):d]
        if node is self.root or self.sliding.dummy in window:
            return
        if node not in self.windows:
            self.sliding.share(window)
            self.windows[node] = window
        self.windows.move_to_end(node)

    def resume(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        """The pages of the longest cached prefix of `tokens` with a window (at least one token
        left to compute) and its sliding pages, the dummy page before the window, both
        referenced for the caller."""
        ps, node, path = self.kv.page_size, self.root, []
        for key in self._keys(tokens, (len(tokens) - 1) // ps):
            node = node.children.get(key)
            if node is None:
                break
            path.append(node)
        d = max((i + 1 for i, nd in enumerate(path) if nd in self.windows), default=0)
        if not d:
            return [], []
        now = next(self.clock)
        for nd in path[:d]:
            nd.last = now
        self.windows.move_to_end(path[d - 1])
        pages, window = [nd.page for nd in path[:d]], self.windows[path[d - 1]]
        self.kv.share(pages)
        self.sliding.share(window)
        self.hit_tokens += d * ps
        return pages, [self.sliding.dummy] * (d - len(window)) + window

    def make_room(self, n: int, sliding: int = 0) -> bool:
        """Windows go, least recently used first, until the sliding pool has `sliding` free pages."""
        freed = 0
        while sliding > len(self.sliding.free) and self.windows:
            free = len(self.sliding.free)
            self.dropped(next(iter(self.windows)))
            freed += len(self.sliding.free) - free
        return super().make_room(n) | (freed > 0)

    def evictable_windows(self) -> int:
        """Sliding pages only windows hold (what dropping them all would give back)."""
        held = Counter(p for w in self.windows.values() for p in w)
        return sum(self.sliding.refs[p] == n for p, n in held.items())

    def dropped(self, node: Node) -> None:
        if node in self.windows:
            self.sliding.release(self.windows.pop(node))
