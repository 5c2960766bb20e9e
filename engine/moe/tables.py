"""Residency tables of the expert cache: which slot holds which flat id `layer * E + expert`, and
the recency that picks victims. One interface (ResidencyTables), two implementations:
HostTables, Python lists for the eager path, and DeviceTables, int64 tensors on the device that
the graph path's plan kernel updates without a host sync. Both make the decisions of
freetoken_kernels.ref.plan."""
from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Protocol, runtime_checkable

import torch

from freetoken_kernels import ref


@runtime_checkable
class ResidencyTables(Protocol):
    """What the cache, the runtime and the prefill streamer use of either implementation."""

    @property
    def owned(self) -> int:
        """Slots that hold an expert."""

    def install_block(self, slot: int, flat: int, n: int) -> None:
        """Slots slot..slot+n hold flat ids flat..flat+n."""

    def plan(self, ids: torch.Tensor, base: int, q: float, cold: bool = False) -> tuple:
        """One layer step (see HostTables.plan) -> (route slots [T*K] (a CPU tensor) with -1 =
        CPU, victim slots, fetched expert ids, hits, misses)."""

    def resident(self, base: int, n: int) -> torch.Tensor:
        """The slots of flat ids base..base+n (-1: not resident), a CPU int64 tensor [n]."""

    def reserve(self, n: int) -> list[int]:
        """Take the n least recently used slots out of the cache (prefill buffers)."""

    def release(self, slots: list[int]) -> None:
        """Return reserved slots as empty, least recently used."""

    def adopt(self, old) -> tuple[list[int], list[int]]:
        """Take over, into these empty tables, the most recently used experts of `old` (tables of
        the same kind and another size) that fit, keeping their order of recency, and its demand
        history -> (slots, flat ids): the rows to copy into the new pool."""


def distinct(ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """The distinct expert ids of ids [T, K] (-1 left out), ascending, and their route counts."""
    uniq, counts = torch.unique(ids[ids >= 0], return_counts=True)
    return uniq, counts.tolist()


class HostTables:
    """The semantics of freetoken_kernels.ref.plan with Python work per distinct expert of a layer step
    (its routes are mapped with tensor ops, so a long prefill chunk costs little). An ordered LRU
    replaces the sort over last_use: slots touched in one step move to the end in slot order,
    which is exactly the (last_use, slot) order the reference sorts by; cold fills move to the
    front in slot order, where the reference's last_use of -1 puts them. `cold` holds the slots
    whose reference last_use is -1 (never used, released, or filled cold), which lead the order
    by slot."""

    def __init__(self, n_slots: int, n_flat: int, n_layers: int):
        self.n_layers = n_layers
        self.slot_of = [-1] * n_flat      # flat id -> slot or -1
        self.owner_of = [-1] * n_slots    # slot -> flat id or -1
        self.seen = [-1] * n_flat         # flat id -> clock of its last demand
        self.lru = OrderedDict.fromkeys(range(n_slots))  # least recently used first
        self.cold = set(range(n_slots))
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
        slots = list(self.lru)[:n]
        for s in slots:
            if self.owner_of[s] >= 0:
                self.slot_of[self.owner_of[s]] = -1
                self.owner_of[s] = -1
            del self.lru[s]
        self.cold.difference_update(slots)
        return slots

    def release(self, slots: list[int]) -> None:
        for s in slots:
            self.lru[s] = None
        self.cold.update(slots)
        self._cold_first()

    def _cold_first(self) -> None:
        """Put the cold slots first in line, by slot."""
        for s in sorted(self.cold, reverse=True):
            self.lru.move_to_end(s, last=False)

    def adopt(self, old: HostTables) -> tuple[list[int], list[int]]:
        # the kept experts take the last slots in their LRU order: the empty slots before them stay
        # first in line, as the reference's (last_use, slot) order puts them
        assert not self.owned, "adopt into empty tables"
        S = len(self.owner_of)
        kept = [s for s in old.lru if old.owner_of[s] >= 0][-S:]
        flats = [old.owner_of[s] for s in kept]
        slots = list(range(S - len(flats), S))
        for s, f in zip(slots, flats):
            self.install(s, f)
        self.cold = set(range(S - len(flats))) | {n for n, o in zip(slots, kept) if o in old.cold}
        self.seen, self.clock = list(old.seen), old.clock
        return slots, flats

    def resident(self, base: int, n: int) -> torch.Tensor:
        return torch.tensor(self.slot_of[base:base + n], dtype=torch.int64)

    def plan(self, ids: torch.Tensor, base: int, q: float, cold: bool = False):
        """ids [T, K] (CPU) expert ids of the layer whose flat ids start at `base` (-1: routed
        elsewhere) -> (route slots [T*K] with -1 = CPU or elsewhere, victim slots, fetched expert
        ids, hits, misses). cold: the fills enter as least recently used (see freetoken_kernels.ref.plan)."""
        self.clock += 1
        experts, routes = distinct(ids)
        uniq = [base + e for e in experts.tolist()]
        counts = dict(zip(uniq, routes))
        hit_slots = {self.slot_of[f] for f in uniq if self.slot_of[f] >= 0}
        misses = sorted((f for f in uniq if self.slot_of[f] < 0), key=lambda f: (-self.seen[f], -counts[f], f))
        # the least recently used slots, as many as the misses (not the hits', not the reserved)
        head = list(itertools.islice((s for s in self.lru if s not in hit_slots), len(misses)))
        room = next((i for i, s in enumerate(head) if self.owner_of[s] >= 0), len(head))
        recurring = any(ref.recurs(self.seen[f], self.clock, self.n_layers) for f in misses)
        n = min(ref.split_fetch(len(misses), q, max(room, recurring)), len(self.lru) - len(hit_slots))
        victims = head[:n]
        assert len(victims) == n, "a routed step ran out of slots (reserved prefill buffers?)"
        for s, f in zip(victims, misses):
            self.install(s, f)
        for s in sorted(hit_slots.union(() if cold else victims)):
            self.lru.move_to_end(s)
        for s in sorted(victims, reverse=True) if cold else ():
            self.lru.move_to_end(s, last=False)
        self.cold.difference_update(hit_slots)
        (self.cold.update if cold else self.cold.difference_update)(victims)
        for f in uniq:
            self.seen[f] = self.clock
        flat = ids.flatten()
        route = torch.full_like(flat, -1)
        live = flat >= 0
        route[live] = torch.tensor([self.slot_of[f] for f in uniq], dtype=torch.int64)[
            torch.searchsorted(experts, flat[live])]
        return route, victims, [f - base for f in misses[:n]], len(hit_slots), len(misses)


class DeviceTables:
    """slot_of [L*E], owner_of [S], last_use [S], seen [L*E], clock [1]: int64 on the device,
    read and written by the plan kernel (engine.moe.device_control); the methods here are the
    eager interface (prefill, loading), one sync each."""

    def __init__(self, n_slots: int, n_flat: int, n_experts: int, device: torch.device):
        i64 = dict(dtype=torch.int64, device=device)
        self.slot_of, self.seen = torch.full((n_flat,), -1, **i64), torch.full((n_flat,), -1, **i64)
        self.owner_of, self.last_use = torch.full((n_slots,), -1, **i64), torch.full((n_slots,), -1, **i64)
        self.clock, self.n_experts = torch.zeros(1, **i64), n_experts

    @property
    def tensors(self) -> tuple:
        return self.slot_of, self.owner_of, self.last_use, self.seen

    def clear(self) -> None:
        for t in self.tensors:
            t.fill_(-1)
        self.clock.zero_()

    def install_block(self, slot: int, flat: int, n: int) -> None:
        """Empty slots at load time."""
        dev = self.slot_of.device
        self.slot_of[flat:flat + n] = torch.arange(slot, slot + n, device=dev)
        self.owner_of[slot:slot + n] = torch.arange(flat, flat + n, device=dev)

    def plan(self, ids: torch.Tensor, base: int, q: float, cold: bool = False):
        clock = int(self.clock) + 1
        self.clock.fill_(clock)
        route, vic, fetch, hits, misses = ref.plan(ids.to(self.slot_of.device), base // self.n_experts,
                                                   self.n_experts, *self.tensors, clock, q, cold)
        return route.flatten().cpu(), vic.tolist(), fetch.tolist(), hits, misses

    def reserve(self, n: int) -> list[int]:
        idx = torch.argsort(self.last_use, stable=True)[:n]
        old = self.owner_of[idx]
        self.slot_of[old[old >= 0]] = -1
        self.owner_of[idx] = -1
        self.last_use[idx] = torch.iinfo(torch.int64).max  # last in line for victims
        return idx.tolist()

    def release(self, slots: list[int]) -> None:
        self.last_use[torch.tensor(slots, dtype=torch.long, device=self.last_use.device)] = -1

    def adopt(self, old: DeviceTables) -> tuple[list[int], list[int]]:
        # as HostTables.adopt; the kept slots keep their last_use, so ties stay in slot order
        assert not self.owned, "adopt into empty tables"
        S = self.owner_of.numel()
        order = torch.argsort(old.last_use, stable=True)  # least recently used first
        kept = order[old.owner_of[order] >= 0][-S:]
        flats, slots = old.owner_of[kept], torch.arange(S - kept.numel(), S, device=kept.device)
        self.owner_of[slots], self.last_use[slots], self.slot_of[flats] = flats, old.last_use[kept], slots
        self.seen.copy_(old.seen)
        self.clock.copy_(old.clock)
        return slots.tolist(), flats.tolist()

    def resident(self, base: int, n: int) -> torch.Tensor:
        return self.slot_of[base:base + n].to("cpu", copy=True)  # a copy even on the CPU: callers may edit it

    @property
    def owned(self) -> int:
        return int((self.owner_of >= 0).sum())
