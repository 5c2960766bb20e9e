"""Residency tables on the host for the eager path: the semantics of kernels.ref.plan (which
the device plan kernel also implements), with O(K + F) Python work per layer step. An ordered
LRU replaces the sort over last_use: slots touched in one step move to the end in slot order,
which is exactly the (last_use, slot) order the reference sorts by; cold fills move to the front
in slot order, where the reference's last_use of -1 puts them."""
from __future__ import annotations

from collections import Counter, OrderedDict

from kernels.ref import recurs, split_fetch


class HostTables:
    def __init__(self, n_slots: int, n_flat: int, n_layers: int):
        self.n_layers = n_layers
        self.slot_of = [-1] * n_flat      # flat id -> slot or -1
        self.owner_of = [-1] * n_slots    # slot -> flat id or -1
        self.seen = [-1] * n_flat         # flat id -> clock of its last demand
        self.lru = OrderedDict.fromkeys(range(n_slots))  # least recently used first
        self.clock = 0

    def install(self, slot: int, flat: int) -> None:
        old = self.owner_of[slot]
        if old >= 0:
            self.slot_of[old] = -1
        self.slot_of[flat], self.owner_of[slot] = slot, flat

    @property
    def owned(self) -> int:
        return sum(o >= 0 for o in self.owner_of)

    def install_block(self, slot: int, flat: int, n: int) -> None:
        for i in range(n):
            self.install(slot + i, flat + i)

    def reserve(self, n: int) -> list[int]:
        """Take the n least recently used slots out of the cache (prefill buffers)."""
        slots = list(self.lru)[:n]
        for s in slots:
            if self.owner_of[s] >= 0:
                self.slot_of[self.owner_of[s]] = -1
                self.owner_of[s] = -1
            del self.lru[s]
        return slots

    def release(self, slots: list[int]) -> None:
        """Return reserved slots as empty, least recently used."""
        for s in sorted(slots, reverse=True):
            self.lru[s] = None
            self.lru.move_to_end(s, last=False)

    def missing(self, ids: list[list[int]], base: int) -> int:
        return sum(self.slot_of[base + e] < 0 for e in {e for row in ids for e in row})

    def plan(self, ids: list[list[int]], base: int, q: float, cold: bool = False):
        """ids [T][K] expert ids of the layer whose flat ids start at `base` -> (route slots
        [T*K] with -1 = CPU, victim slots, fetched expert ids, hits, misses). cold: the fills
        enter as least recently used (see kernels.ref.plan)."""
        self.clock += 1
        flat = [base + e for row in ids for e in row]
        counts = Counter(flat)
        uniq = sorted(counts)
        hit_slots = {self.slot_of[f] for f in uniq if self.slot_of[f] >= 0}
        misses = sorted((f for f in uniq if self.slot_of[f] < 0), key=lambda f: (-self.seen[f], -counts[f], f))
        recurring = any(recurs(self.seen[f], self.clock, self.n_layers) for f in misses)
        n = min(split_fetch(len(misses), q, recurring), len(self.owner_of) - len(hit_slots))
        victims = []
        for s in self.lru:
            if len(victims) == n:
                break
            if s not in hit_slots:
                victims.append(s)
        assert len(victims) == n, "a routed step ran out of slots (reserved prefill buffers?)"
        for s, f in zip(victims, misses):
            self.install(s, f)
        for s in sorted(hit_slots.union(() if cold else victims)):
            self.lru.move_to_end(s)
        for s in sorted(victims, reverse=True) if cold else ():
            self.lru.move_to_end(s, last=False)
        for f in uniq:
            self.seen[f] = self.clock
        return [self.slot_of[f] for f in flat], victims, [f - base for f in misses[:n]], len(hit_slots), len(misses)
