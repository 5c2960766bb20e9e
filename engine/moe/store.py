"""Host expert store: every routed expert of every MoE layer in host RAM, one [E, slot_bytes]
bank per layer in the runtime slot layout. It is the source of truth for the device cache and
the memory the CPU executor computes from. Banks are read straight into their final buffers and
pinned after they are filled when CUDA is present."""
from __future__ import annotations

from typing import Callable

import torch

from engine.moe.layout import SlotLayout


def bank_name(layer: int) -> str:
    return f"model.layers.{layer}.mlp.experts"


def pin_(t: torch.Tensor) -> None:
    """Page-lock an existing host buffer in place (cudaHostRegister), so fills run at full PCIe rate."""
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    assert int(err) == 0, f"cudaHostRegister failed with {err}"


class HostExpertStore:
    def __init__(self, banks: list[torch.Tensor], layout: SlotLayout):
        self.banks = banks                                  # per MoE layer: [E, slot_bytes] uint8
        self.layout = layout
        self.views = [layout.views(b) for b in banks]       # per MoE layer: {name: [E, ...]}

    @property
    def n_experts(self) -> int:
        return self.banks[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.banks)

    @staticmethod
    def load(reader, layers: list[int], layout: SlotLayout, pin: bool,
             progress: Callable[[int], None] | None = None) -> "HostExpertStore":
        from ftw import aligned_empty
        banks = []
        for layer in layers:
            info = reader.info(bank_name(layer))
            bank = reader.read(info.name, out=aligned_empty(info.shape, torch.uint8))
            if pin:
                pin_(bank)
            banks.append(bank)
            if progress:
                progress(bank.numel())
        return HostExpertStore(banks, layout)
