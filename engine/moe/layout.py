"""Slot layout: how every tensor of one (layer, expert) pair sits in one flat byte row.

The host bank of a layer is [E, slot_bytes] and the device cache is [S, slot_bytes] with the
same layout, so a fill copies one contiguous row and lookups work on flat ids."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.base import DTYPES

ALIGN = 4096  # keeps rows page-aligned for direct I/O and wide copies


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


@dataclass(frozen=True)
class SlotLayout:
    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]  # name, dtype, shape, byte offset
    slot_bytes: int

    @staticmethod
    def build(specs: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> "SlotLayout":
        entries, off = [], 0
        for name, dt, shape in specs:
            entries.append((name, _dtype_name(dt), tuple(shape), off))
            n = dt.itemsize
            for s in shape:
                n *= s
            off += -(-n // 256) * 256
        return SlotLayout(tuple(entries), -(-off // ALIGN) * ALIGN)

    @staticmethod
    def for_experts(hidden: int, inter: int, dtype: torch.dtype) -> "SlotLayout":
        return SlotLayout.build([("gate_up", dtype, (2 * inter, hidden)), ("down", dtype, (hidden, inter))])

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """rows [N, slot_bytes] uint8 -> {name: typed strided view [N, *shape]}."""
        assert rows.dtype == torch.uint8 and rows.shape[-1] == self.slot_bytes
        out = {}
        for name, dt, shape, off in self.entries:
            dtype = DTYPES[dt]
            n = dtype.itemsize
            for s in shape:
                n *= s
            out[name] = rows[:, off:off + n].view(dtype).view(rows.shape[0], *shape)
        return out

    def to_meta(self) -> dict:
        return {"slot_bytes": self.slot_bytes, "entries": [list(e[:2]) + [list(e[2]), e[3]] for e in self.entries]}

    @staticmethod
    def from_meta(meta: dict) -> "SlotLayout":
        return SlotLayout(tuple((n, d, tuple(s), o) for n, d, s, o in meta["entries"]), meta["slot_bytes"])
