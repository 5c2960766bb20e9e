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
from freetoken_kernels import ref


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
    stream_layers: int = 0   # of those, layers streamed into prefill buffers
    stream_passes: int = 0   # the passes of those layers (one a buffered group of experts)

    def record(self, *, slot_bytes: int = 0, hits: int = 0, misses: int = 0, fetched: int = 0,
               streamed: int = 0, passes: int = 0, scan: bool = False) -> None:
        """Count layer steps: `hits` and `misses` distinct demands, of which `fetched` were filled
        over the link and the rest ran on the CPU; `streamed` experts of one layer loaded into
        prefill buffers, computed in `passes`; `scan`: one step of a long prefill chunk.
        slot_bytes: one expert."""
        self.hits += hits
        self.misses += misses
        self.fetched += fetched
        self.cpu += misses - fetched
        self.bytes_filled += (fetched + streamed) * slot_bytes
        self.bytes_cpu += (misses - fetched) * slot_bytes
        self.scan_steps += scan
        self.stream_layers += streamed > 0
        self.stream_passes += passes

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
        self.layout, self.n_layers, self.n_experts = layout, n_layers, n_experts
        self.device, self.device_tables = device, device_tables
        self._allocate(n_slots)
        self.stats = CacheStats()

    def _allocate(self, n_slots: int) -> None:
        self.pool = torch.empty(n_slots, self.layout.slot_bytes, dtype=torch.uint8, device=self.device)
        self.w = self.layout.views(self.pool)             # {name: [S, ...]}
        n_flat = self.n_layers * self.n_experts
        # graph mode: control on the device; eager control: one sync per layer step
        self.tables: ResidencyTables = (DeviceTables(n_slots, n_flat, self.n_experts, self.device)
                                        if self.device_tables else HostTables(n_slots, n_flat, self.n_layers))

    def resize(self, n_slots: int, least: int = 1) -> None:
        """Replace the pool and tables by empty ones of n_slots, freeing the old pool first so the
        device never holds both (keep `tables` beforehand for adopt()). Another program may take
        the freed memory meanwhile: then the largest size that fits, down to `least` slots (the
        old size at most; keep the device's state consistent), and the error raised."""
        before = self.n_slots
        self.pool = self.w = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            self._allocate(n_slots)
        except torch.cuda.OutOfMemoryError:
            fits = (torch.cuda.mem_get_info(self.device)[0] // self.layout.slot_bytes - 1
                    if self.device.type == "cuda" else before)
            for n in dict.fromkeys((min(before, fits), *(before >> k for k in range(1, 64)))):
                if least <= n <= before:
                    try:
                        self._allocate(n)
                        break
                    except torch.cuda.OutOfMemoryError:
                        continue
            else:
                self._allocate(least)  # the floor; out of memory even there is the caller's error
            raise

    def adopt(self, old: ResidencyTables, rows: torch.Tensor) -> None:
        """Keep the most recently used experts of `old` tables that fit: their rows copied from
        the host store (rows [L*E, slot_bytes], the source of truth) into the new pool."""
        slots, flats = self.tables.adopt(old)
        ref.fill_rows(rows, self.pool, torch.tensor(slots), torch.tensor(flats), 0)

    @property
    def bias(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The slots' expert biases (engine.moe.layout.expert_bias), views of the pool."""
        return expert_bias(self.w)

    @property
    def n_slots(self) -> int:
        return self.pool.shape[0]

    @property
    def nbytes(self) -> int:
        return self.pool.numel()

    @property
    def holds_all(self) -> bool:
        """Whether every expert has a slot (then all are resident once loaded)."""
        return self.n_slots >= self.n_layers * self.n_experts

    @property
    def occupancy(self) -> float:
        return self.tables.owned / self.n_slots
