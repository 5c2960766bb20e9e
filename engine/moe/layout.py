"""Slot layout: how every tensor of one (layer, expert) pair sits in one flat byte row.

The host bank of a layer is [E, slot_bytes] and the device cache is [S, slot_bytes] with the
same layout, so a fill copies one contiguous row and lookups work on flat ids. A layout holds
either plain float weights (entries gate_up [2I, H] and down [H, I]) or quantized ones in a
freetoken_kernels.quant format (entries gate_up.q, gate_up.s, gate_up.z, down.q, ...: codes, scales and,
for int4/int8, zero points), and for experts with biases (gpt-oss) float32 gate_up_bias [2I] and
down_bias [H]; `views` gives the expert functions a [S, N, K] tensor or a QWeight per weight
either way, so the slot size, and with it how many experts a budget holds, follows the format."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ftw.format import DTYPES, dtype_name
from freetoken_kernels.quant import QWeight

ALIGN = 4096  # keeps rows page-aligned for direct I/O and wide copies
WEIGHTS = ("gate_up", "down")
BIASES = ("gate_up_bias", "down_bias")


def bias_specs(hidden: int, inter: int) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    return [("gate_up_bias", torch.float32, (2 * inter,)), ("down_bias", torch.float32, (hidden,))]


def expert_bias(views: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(gate_up bias [N, 2I], down bias [N, H]) of slot views (freetoken_kernels.ref.ExpertBias); None
    for experts without biases."""
    return (views["gate_up_bias"], views["down_bias"]) if "gate_up_bias" in views else None


@dataclass(frozen=True)
class SlotLayout:
    entries: tuple[tuple[str, str, tuple[int, ...], int], ...]  # name, dtype, shape, byte offset
    slot_bytes: int
    fmt: str | None = None                                      # freetoken_kernels.quant format; None = float
    blocks: tuple[tuple[str, tuple[int, int]], ...] = ()        # quantized weight -> (bn, bk)

    @staticmethod
    def build(specs: list[tuple[str, torch.dtype, tuple[int, ...]]], fmt: str | None = None,
              blocks: tuple = ()) -> "SlotLayout":
        entries, off = [], 0
        for name, dt, shape in specs:
            entries.append((name, dtype_name(dt), tuple(shape), off))
            off += -(-dt.itemsize * math.prod(shape) // 256) * 256
        return SlotLayout(tuple(entries), -(-off // ALIGN) * ALIGN, fmt, blocks)

    @staticmethod
    def for_experts(hidden: int, inter: int, dtype: torch.dtype, bias: bool = False) -> "SlotLayout":
        return SlotLayout.build([("gate_up", dtype, (2 * inter, hidden)), ("down", dtype, (hidden, inter))]
                                + (bias_specs(hidden, inter) if bias else []))

    @staticmethod
    def for_qweights(fmt: str, parts: dict[str, tuple], bias: bool = False) -> "SlotLayout":
        """The layout of one expert's quantized weights {"gate_up": (q, s, z, block), "down": ...},
        each part as freetoken_kernels.quant.quantize returns it (no slot axis), and float32 biases."""
        specs = [(f"{w}.{p}", t.dtype, tuple(t.shape)) for w in WEIGHTS
                 for p, t in zip("qsz", parts[w][:3]) if t is not None]
        hidden, inter = parts["down"][0].shape[0], parts["gate_up"][0].shape[0] // 2
        return SlotLayout.build(specs + (bias_specs(hidden, inter) if bias else []), fmt,
                                tuple((w, tuple(parts[w][3])) for w in WEIGHTS))

    @property
    def dtype(self) -> str:
        """What a slot holds: the float dtype's name, or the quantized format."""
        return self.fmt or self.entries[0][1]

    def views(self, rows: torch.Tensor) -> dict[str, torch.Tensor | QWeight]:
        """rows [N, slot_bytes] uint8 -> {weight: typed strided view [N, *shape], or a QWeight of
        such views for a quantized layout} (no copies)."""
        assert rows.dtype == torch.uint8 and rows.shape[-1] == self.slot_bytes
        raw = {}
        for name, dt, shape, off in self.entries:
            dtype = DTYPES[dt]
            n = dtype.itemsize * math.prod(shape)
            raw[name] = rows[:, off:off + n].view(dtype).view(rows.shape[0], *shape)
        if self.fmt is None:
            return raw
        return {**{w: QWeight(self.fmt, raw[f"{w}.q"], raw[f"{w}.s"], raw.get(f"{w}.z"), block)
                   for w, block in self.blocks}, **{b: raw[b] for b in BIASES if b in raw}}

    def to_meta(self) -> dict:
        meta = {"slot_bytes": self.slot_bytes, "entries": [list(e[:2]) + [list(e[2]), e[3]] for e in self.entries]}
        if self.fmt:
            meta.update(format=self.fmt, blocks={w: list(b) for w, b in self.blocks})
        return meta

    @staticmethod
    def from_meta(meta: dict) -> "SlotLayout":
        return SlotLayout(tuple((n, d, tuple(s), o) for n, d, s, o in meta["entries"]), meta["slot_bytes"],
                          meta.get("format"), tuple((w, tuple(b)) for w, b in meta.get("blocks", {}).items()))
