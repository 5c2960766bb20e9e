"""Host expert store: every routed expert of every MoE layer in host RAM, one [E, slot_bytes]
bank per layer in the runtime slot layout. It is the source of truth for the device cache and
the memory the CPU executor computes from. Banks are read straight into their final buffers, on
a background thread while the loader sets up everything that needs only their addresses, and
pinned after they are filled when CUDA is present; or adopted from the read that ftw.early began
before torch was imported. With experts spread over ranks, a store holds and reads only its
rank's experts (engine.moe.shard), indexed by local id."""
from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait as futures_wait
from typing import Callable

import torch

from engine.moe.layout import SlotLayout
from engine.moe.shard import ExpertShard


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
    is the [E, slot_bytes] view of one MoE layer. E is the shard's local experts per layer (all
    of them on one rank)."""

    def __init__(self, rows: torch.Tensor, shard: ExpertShard, layout: SlotLayout):
        self.rows, self.layout, self.shard = rows, layout, shard
        self.banks = list(rows.view(-1, shard.n_local, layout.slot_bytes))
        self.views = [layout.views(b) for b in self.banks]  # per MoE layer: {name: [E, ...]}
        self.pinned = False
        self._pin_lock = threading.Lock()
        self.read_seconds: float | None = None  # how long load()'s background read took
        self._loading: Future | None = None
        self._stop = threading.Event()
        self._early = None  # an ftw.early read whose buffer holds the rows
        self._read = len(self.banks)  # banks read so far, in order (all: a store not loading)
        self._read_cv = threading.Condition()

    @property
    def n_experts(self) -> int:
        """Experts per layer in this store (local ids)."""
        return self.banks[0].shape[0]

    @property
    def nbytes(self) -> int:
        return self.rows.numel()

    @staticmethod
    def empty(n_layers: int, shard: ExpertShard, layout: SlotLayout) -> "HostExpertStore":
        """Uninitialised banks, but for the padding rows of a shard (zero: never routed)."""
        from ftw import aligned_empty
        store = HostExpertStore(aligned_empty((n_layers * shard.n_local, layout.slot_bytes), torch.uint8),
                                shard, layout)
        for layer, bank in enumerate(store.banks):
            bank[len(shard.owned(layer)):].zero_()
        return store

    def pin(self) -> None:
        """Page-lock the rows (once; a call while load()'s thread pins waits for it)."""
        if self._early is not None:  # page-locking pages not yet in would fault them under CUDA's lock
            self._early.faulted.wait()
        with self._pin_lock:
            if not self.pinned:
                pin_(self.rows)
                self.pinned = True

    @staticmethod
    def load(reader, layers: list[int], shard: ExpertShard, layout: SlotLayout,
             progress: Callable[[int], None] | None = None, pin: bool = False,
             after: Future | None = None) -> "HostExpertStore":
        """Start reading the shard's experts of every bank straight into their places in one
        buffer, on a background thread, once `after` (another read) is done; the store's
        addresses are usable at once, its contents after wait(). With pin, that thread first
        zeroes the buffer (its pages faulted in on every core) and page-locks it, so fills and
        the warm-up steps can read rows before the read ends (unread rows compute zeros)."""
        from ftw.early import take
        early = take(reader.path) if shard.world == 1 else None
        if early is not None and early.fits(layers, (shard.n_local, layout.slot_bytes)):
            if after is not None:
                early.yield_to(after)
            return HostExpertStore._adopt(early, shard, layout, progress, pin)
        if early is not None:
            early.close()
        store = HostExpertStore.empty(len(layers), shard, layout)

        def read() -> float:
            if pin:
                store.rows.zero_()
                store.pin()
            if after is not None:
                futures_wait([after])
            t0 = time.perf_counter()
            for i, (bank, layer) in enumerate(zip(store.banks, layers)):
                if store._stop.is_set():
                    break
                owned = shard.owned(i)
                reader.read_rows(bank_name(layer), owned, out=bank[:len(owned)])
                store._tick(progress, len(owned) * layout.slot_bytes)
            return time.perf_counter() - t0
        store._start_loading(read)
        return store

    @staticmethod
    def _adopt(early, shard: ExpertShard, layout: SlotLayout, progress: Callable[[int], None] | None,
               pin: bool) -> "HostExpertStore":
        """A store over the buffer of the banks' read that ftw.early started before torch was
        imported (its unread rows are zero, as load()'s are); its thread page-locks the buffer
        once its pages are in, then waits for that read."""
        store = HostExpertStore(torch.frombuffer(early.buffer, dtype=torch.uint8).view(-1, layout.slot_bytes),
                                shard, layout)
        store._early = early  # keeps the mapping for as long as the store

        def read() -> float:
            if pin:
                store.pin()
            return early.wait(lambda n: store._tick(progress, n))
        store._start_loading(read)
        return store

    def _start_loading(self, read: Callable[[], float]) -> None:
        """Run `read` on a thread of its own; every bank counts as read once it ends, however."""
        def run() -> float:
            try:
                return read()
            finally:
                with self._read_cv:
                    self._read = len(self.banks)
                    self._read_cv.notify_all()
        self._read = 0
        pool = ThreadPoolExecutor(1, thread_name_prefix="expert-read")
        self._loading = pool.submit(run)
        pool.shutdown(wait=False)

    def _tick(self, progress: Callable[[int], None] | None, nbytes: int) -> None:
        """The next bank (of nbytes) is read."""
        with self._read_cv:
            self._read += 1
            self._read_cv.notify_all()
        if progress:
            progress(nbytes)

    def wait_bank(self, i: int) -> None:
        """Block until bank i is read, or the read has ended (an error is raised by wait())."""
        with self._read_cv:
            self._read_cv.wait_for(lambda: self._read > i)

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
        if self._early is not None:
            self._early.close()
        if self._loading is not None:
            self._loading.exception()
            self._loading = None
