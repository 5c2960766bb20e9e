"""The prefix cache of hybrid models: a radix tree of KV pages (for the softmax-attention
layers) plus a bounded LRU pool of recurrent-state checkpoints hanging on its nodes. KV pages
alone cannot be reused, since the linear-attention layers' state at the end of the prefix is
missing; a checkpoint is that state at one position p (taken at a semantic anchor). It hangs on
the node of the prefix's last full page, with the tokens of the partial page after it (`tail`)
and a shared reference to the page holding their KV. A new request restores the deepest
checkpoint its prompt continues, takes the tree's pages up to it (and a private copy of the
tail page) and prefills only the rest."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.kv.paged import KVPool
from engine.kv.radix import Node, RadixCache
from engine.kv.state import StatePool


@dataclass(eq=False)
class Checkpoint:
    slot: int                   # StatePool saved slot
    node: Node                  # the node of the last full page before p (the root if none)
    tail: tuple[int, ...]       # tokens after that page up to p (fewer than a page)
    tail_page: int              # the KV page holding the tail (-1: no tail)


class HybridPrefixCache(RadixCache):
    def __init__(self, kv: KVPool, states: StatePool):
        super().__init__(kv)
        self.states = states
        self.lru: OrderedDict[int, Checkpoint] = OrderedDict()  # by slot, least recently used first
        self.free_slots = list(range(states.n_saved - 1, -1, -1))
        self.saved = self.restored = 0                          # checkpoints taken and used, all time

    def take(self) -> int | None:
        """A saved slot for a new checkpoint (evicting the least recently used); None: no pool."""
        if not self.free_slots and self.lru:
            self._drop(next(iter(self.lru.values())))
        return self.free_slots.pop() if self.free_slots else None

    def attach(self, tokens: list[int], pages: list[int], slot: int) -> None:
        """Checkpoint `slot` holds the states after `tokens`, whose KV is in `pages`."""
        ps = self.kv.page_size
        d = len(tokens) // ps
        node = self.insert(tokens[:d * ps], pages[:d])
        tail = tuple(tokens[d * ps:])
        if any(c.tail == tail for c in node.ckpts):  # already kept (the same output twice)
            self.free_slots.append(slot)
            return
        page = pages[d] if tail else -1
        if tail:
            self.kv.share([page])
        ck = Checkpoint(slot, node, tail, page)
        node.ckpts.append(ck)
        self.lru[slot] = ck
        self.saved += 1

    def restore(self, tokens: list[int], slot: int) -> tuple[list[int], int]:
        """Restore the deepest checkpoint `tokens` continues into live state `slot` (at least one
        token left to compute) -> (KV pages for its prefix, referenced for the caller, its length)."""
        found = self._continued(tokens)
        if not found:
            return [], 0
        # every checkpoint on the prompt's path stays: the deepest non-restored go first, then the
        # shallow ones, which later edits of the history need (an older turn's thinking dropped)
        for ck, _, _ in found[1:] + found[:1]:
            self.lru.move_to_end(ck.slot)
        ck, n, path = found[0]
        now = next(self.clock)
        for nd in path:
            nd.last = now
        pages = [nd.page for nd in path]
        self.kv.share(pages)
        if ck.tail:
            if not self.kv.free:
                self.evict(1)
            pages += self.kv.alloc(1)
            self.kv.copy_page(ck.tail_page, pages[-1])
        self.states.restore(ck.slot, slot)
        self.hit_tokens += n
        self.restored += 1
        return pages, n

    def _continued(self, tokens: list[int]) -> list[tuple[Checkpoint, int, list[Node]]]:
        """The checkpoints `tokens` continues (leaving a token), deepest first: (checkpoint, its
        length, the tree nodes of its full pages)."""
        ps, node, path, found = self.kv.page_size, self.root, [], []
        while True:
            d = len(path)
            for ck in node.ckpts:
                n = d * ps + len(ck.tail)
                if n < len(tokens) and tuple(tokens[d * ps:n]) == ck.tail:
                    found.append((ck, n, list(path)))
            key = tuple(tokens[d * ps:(d + 1) * ps])
            if len(key) < ps or key not in node.children:
                return sorted(found, key=lambda f: -f[1])
            node = node.children[key]
            path.append(node)

    def evict(self, n: int) -> int:
        """Tree leaves first; when they are not enough, checkpoints too (each pins a tail page)."""
        freed = super().evict(n)
        while freed < n and self.lru:
            free = len(self.kv.free)
            self._drop(next(iter(self.lru.values())))
            freed += len(self.kv.free) - free
            freed += super().evict(n - freed)
        return freed

    def evictable(self) -> int:
        """Pages evict could give back: the tree's, and tail pages only checkpoints hold."""
        tails = sum(self.kv.refs[ck.tail_page] == 1 for ck in self.lru.values() if ck.tail_page >= 0)
        return super().evictable() + tails

    def dropped(self, node: Node) -> None:
        for ck in list(node.ckpts):
            self._drop(ck)

    def _drop(self, ck: Checkpoint) -> None:
        ck.node.ckpts.remove(ck)
        if ck.tail_page >= 0:
            self.kv.release([ck.tail_page])
        del self.lru[ck.slot]
        self.free_slots.append(ck.slot)

    def stats(self) -> dict:
        return {"state_checkpoints": len(self.lru), "state_checkpoints_max": self.states.n_saved,
                "state_checkpoint_bytes": self.states.saved_bytes, "state_checkpoints_saved": self.saved,
                "state_checkpoints_restored": self.restored}
