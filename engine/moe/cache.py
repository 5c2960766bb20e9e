"""The device expert cache: ONE pool of slots shared by all MoE layers. A slot holds every
tensor of one (layer, expert) pair; residency is tracked on flat ids `layer * E + expert` with
the tables slot_of [L*E], owner_of [S], last_use [S] and one global LRU clock."""
from __future__ import annotations

import math
from dataclasses import astuple, dataclass

import torch

from engine.errors import UserError
from engine.moe.layout import SlotLayout, expert_bias
from engine.moe.tables import DeviceTables, HostTables, ResidencyTables


@dataclass
class CacheStats:
    """Expert-cache counters since load, kept by ExpertCache and changed only through record();
    `after - before` is what happened in between, `a + b` sums two spans."""
    hits: int = 0            # distinct (layer, expert) demands found resident
    misses: int = 0          # distinct demands not resident
    fetched: int = 0         # misses filled over the link
    cpu: int = 0             # misses computed on the CPU
    bytes_filled: int = 0
    bytes_cpu: int = 0       # expert bytes the CPU read for its routes
    scan_steps: int = 0      # prefill layer steps run in scan mode (long chunks)
    stream_layers: int = 0   # of those, layers streamed whole into a prefill buffer

    def record(self, *, slot_bytes: int = 0, hits: int = 0, misses: int = 0, fetched: int = 0,
               streamed: int = 0, scan: bool = False) -> None:
        """Count layer steps: `hits` and `misses` distinct demands, of which `fetched` were filled
        over the link and the rest ran on the CPU; `streamed` experts loaded as one whole layer
        into a prefill buffer; `scan`: one step of a long prefill chunk. slot_bytes: one expert."""
        self.hits += hits
        self.misses += misses
        self.fetched += fetched
        self.cpu += misses - fetched
        self.bytes_filled += (fetched + streamed) * slot_bytes
        self.bytes_cpu += (misses - fetched) * slot_bytes
        self.scan_steps += scan
        self.stream_layers += streamed > 0

    def __add__(self, other: CacheStats) -> CacheStats:
        return CacheStats(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def __sub__(self, other: CacheStats) -> CacheStats:
        return CacheStats(*(a - b for a, b in zip(astuple(self), astuple(other))))

    @property
    def hit_rate(self) -> float:
        return self.hits / max(1, self.hits + self.misses)


def slots_for_budget(budget: int, layout: SlotLayout, n_experts: int) -> int:
    slots = budget // layout.slot_bytes
    if slots < n_experts:
        mib = n_experts * layout.slot_bytes / 2**20
        raise UserError(f"expert budget {budget / 2**20:.2f} MiB holds {slots} experts but one layer has "
                        f"{n_experts} ({mib:.2f} MiB); raise --expert-budget to at least {math.ceil(mib)}MiB")
    return slots


class ExpertCache:
    def __init__(self, layout: SlotLayout, n_slots: int, n_layers: int, n_experts: int,
                 device: torch.device, device_tables: bool = False):
        self.layout = layout
        self.pool = torch.empty(n_slots, layout.slot_bytes, dtype=torch.uint8, device=device)
        self.w = layout.views(self.pool)                  # {name: [S, ...]}
        self.bias = expert_bias(self.w)
        self.n_experts = n_experts
        # graph mode: control on the device; eager control: one sync per layer step
        self.tables: ResidencyTables = (DeviceTables(n_slots, n_layers * n_experts, n_experts, device)
                                        if device_tables else HostTables(n_slots, n_layers * n_experts, n_layers))
        self.stats = CacheStats()

    @property
    def n_slots(self) -> int:
        return self.pool.shape[0]

    @property
    def occupancy(self) -> float:
        return self.tables.owned / self.n_slots
