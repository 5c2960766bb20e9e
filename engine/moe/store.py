"""Host expert store: every routed expert of every MoE layer in host RAM, one [E, slot_bytes]
bank per layer in the runtime slot layout. It is the source of truth for the device cache and
the memory the CPU executor computes from. Banks are read straight into their final buffers and
pinned after they are filled when CUDA is present."""
from __future__ import annotations

import weakref
from typing import Callable

import torch

from engine.moe.layout import SlotLayout


def bank_name(layer: int) -> str:
    return f"model.layers.{layer}.mlp.experts"


def pin_(t: torch.Tensor) -> None:
    """Page-lock an existing host buffer in place (cudaHostRegister), so fills run at full PCIe
    rate; unregistered when `t` is collected, before its memory can be reused."""
    rt, ptr = torch.cuda.cudart(), t.data_ptr()
    err = rt.cudaHostRegister(ptr, t.numel() * t.element_size(), 3)  # portable | mapped (UVA reads)
    assert int(err) == 0, f"cudaHostRegister failed with {err}"
    weakref.finalize(t, rt.cudaHostUnregister, ptr)


class HostExpertStore:
    """rows [L*E, slot_bytes] uint8: row layer * E + expert, the flat id the cache uses; banks[l]
    is the [E, slot_bytes] view of one MoE layer."""

    def __init__(self, rows: torch.Tensor, n_experts: int, layout: SlotLayout):
        self.rows, self.layout = rows, layout
        self.banks = list(rows.view(-1, n_experts, layout.slot_bytes))
        self.views = [layout.views(b) for b in self.banks]  # per MoE layer: {name: [E, ...]}

    @property
    def n_experts(self) -> int:
        return self.banks[0].shape[0]

    @property
    def nbytes(self) -> int:
        return self.rows.numel()

    @staticmethod
    def empty(n_layers: int, n_experts: int, layout: SlotLayout) -> "HostExpertStore":
        from ftw import aligned_empty
        return HostExpertStore(aligned_empty((n_layers * n_experts, layout.slot_bytes), torch.uint8),
                               n_experts, layout)

    def pin(self) -> None:
        pin_(self.rows)

    @staticmethod
    def load(reader, layers: list[int], n_experts: int, layout: SlotLayout,
             progress: Callable[[int], None] | None = None) -> "HostExpertStore":
        """Read every bank straight into its place in one buffer (pin it after)."""
        store = HostExpertStore.empty(len(layers), n_experts, layout)
        for bank, layer in zip(store.banks, layers):
            reader.read(bank_name(layer), out=bank)
            if progress:
                progress(bank.numel())
        return store
