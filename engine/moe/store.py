"""Host expert store: every routed expert of every MoE layer in host RAM, one [E, slot_bytes]
bank per layer in the runtime slot layout. It is the source of truth for the device cache and
the memory the CPU executor computes from. Banks are read straight into their final buffers, on
a background thread while the loader sets up everything that needs only their addresses, and
pinned after they are filled when CUDA is present."""
from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
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
        self.pinned = False
        self.read_seconds: float | None = None  # how long load()'s background read took
        self._loading: Future | None = None
        self._stop = threading.Event()

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
        """Page-lock the rows (once); only after wait(), since pinning fixes the pages."""
        if not self.pinned:
            pin_(self.rows)
            self.pinned = True

    @staticmethod
    def load(reader, layers: list[int], n_experts: int, layout: SlotLayout,
             progress: Callable[[int], None] | None = None) -> "HostExpertStore":
        """Start reading every bank straight into its place in one buffer, on a background
        thread; the store's addresses are usable at once, its contents after wait()."""
        store = HostExpertStore.empty(len(layers), n_experts, layout)

        def read() -> float:
            t0 = time.perf_counter()
            for bank, layer in zip(store.banks, layers):
                if store._stop.is_set():
                    break
                reader.read(bank_name(layer), out=bank)
                if progress:
                    progress(bank.numel())
            return time.perf_counter() - t0
        pool = ThreadPoolExecutor(1, thread_name_prefix="expert-read")
        store._loading = pool.submit(read)
        pool.shutdown(wait=False)
        return store

    def wait(self) -> None:
        """Block until load()'s read is done (its error raised here); at once for a store that
        is not loading."""
        if self._loading is not None:
            loading, self._loading = self._loading, None
            self.read_seconds = loading.result()

    def stop(self) -> None:
        """Abandon load()'s read (the load failed elsewhere): the bank in flight finishes, no
        other starts, and the read's own error, if any, is dropped."""
        self._stop.set()
        if self._loading is not None:
            self._loading.exception()
            self._loading = None
