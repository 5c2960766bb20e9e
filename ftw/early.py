"""Start reading an FTW directory's expert banks before torch is imported.

A start of `run` or `serve` spends seconds importing torch and the engine and reading the dense
weights before the load reaches the experts, while the disk, which bounds the start, waits.
`start(path)` needs only the index (JSON) and os.preadv: it reads every bank named like
`model.layers.N.mlp.experts`, in layer order, into one anonymous memory map (page-aligned, so
O_DIRECT reads land in it, and zero where not yet read), with as many requests in flight as
FTWReader keeps. Its pages are faulted in (zeroed) piece by piece ahead of the reads, on threads
of their own: reads into resident pages run faster, and the buffer can be page-locked once every
page is in, while the reads go on. The host expert store later adopts that buffer (`take(path)`, in
engine.moe.store) instead of reading the banks itself, pauses this read while the dense weights
are read (the load needs them first; `yield_to`), and waits for it where it would have waited
for its own. A directory whose index cannot be read starts nothing here: the load
reports it. Nothing here imports torch."""
from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import queue
import re
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from .io import READ_THREADS, open_shard, pieces, pread
from .spec import INDEX_NAME

BANK = re.compile(r"model\.layers\.(\d+)\.mlp\.experts")
FAULT_THREADS = 8

_started: dict[str, "EarlyRead"] = {}
_lock = threading.Lock()


class EarlyRead:
    """The banks (layer, shard, file offset, shape) of one directory, being read into `buffer`
    back to back in layer order."""

    def __init__(self, path: Path, banks: list[tuple[int, str, int, tuple[int, ...]]]):
        self.path, self.layers = path, [b[0] for b in banks]
        self.shapes = [b[3] for b in banks]
        sizes = [math.prod(shape) for *_, shape in banks]
        self.buffer = mmap.mmap(-1, max(1, sum(sizes)))
        self._base = ctypes.c_char.from_buffer(self.buffer)
        self.t0, self._t1 = time.perf_counter(), 0.0
        self.faulted = threading.Event()  # every page of the buffer is in
        self._go = threading.Event()      # cleared: no new piece starts (another read has the disk)
        self._go.set()
        self._fds: dict[str, tuple] = {}
        self._faults: queue.SimpleQueue = queue.SimpleQueue()
        self._reads: queue.SimpleQueue = queue.SimpleQueue()
        self._banks: list[tuple[int, list]] = []
        view, pos = memoryview(self.buffer), 0
        for (_, shard, offset, _), n in zip(banks, sizes):
            futs = []
            for fd, dst, off in pieces(*self._open(shard), view[pos:pos + n], offset, pos):
                futs.append(Future())
                self._faults.put((futs[-1], fd, dst, off, pos + off - offset))
            self._banks.append((n, futs))
            pos += n
        # daemon workers: a process that ends without adopting the read (an error elsewhere) does
        # not wait for it
        self._pending, self._pending_lock = FAULT_THREADS, threading.Lock()
        self._workers = [threading.Thread(target=self._fault, name="ftw-fault", daemon=True) for _ in range(FAULT_THREADS)]
        self._workers += [threading.Thread(target=self._work, name="ftw-early", daemon=True) for _ in range(READ_THREADS)]
        for _ in range(FAULT_THREADS):
            self._faults.put(None)
        for t in self._workers:
            t.start()

    def _fault(self) -> None:
        """Zero each piece (ctypes.memset, without the GIL) before handing it to the reads; the
        last fault thread out marks the buffer faulted and lets the read workers end."""
        base = ctypes.addressof(self._base)
        while (item := self._faults.get()) is not None:
            if not item[0].cancelled():
                ctypes.memset(base + item[4], 0, len(item[2]))
            self._reads.put(item)
        with self._pending_lock:
            self._pending -= 1
            last = self._pending == 0
        if last:
            self.faulted.set()
            for _ in range(READ_THREADS):
                self._reads.put(None)

    def _work(self) -> None:
        while (item := self._reads.get()) is not None:
            fut, fd, dst, offset, _ = item
            self._go.wait()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                pread(fd, dst, offset)
                self._t1 = max(self._t1, time.perf_counter())
                fut.set_result(None)
            except BaseException as e:
                fut.set_exception(e)

    def _open(self, shard: str) -> tuple:
        if shard not in self._fds:
            self._fds[shard] = open_shard(self.path / shard)
        return self._fds[shard]

    def yield_to(self, other: Future) -> None:
        """Start no new piece until `other` (the dense weights' read, which the load needs first)
        is done: the disk is its alone meanwhile."""
        self._go.clear()
        other.add_done_callback(lambda _: self._go.set())

    def fits(self, layers: list[int], shape: tuple[int, int]) -> bool:
        """Whether these are the banks of `layers`, each of `shape` ([experts, slot bytes])."""
        return self.layers == list(layers) and all(tuple(s) == tuple(shape) for s in self.shapes)

    def wait(self, progress: Callable[[int], None] | None = None) -> float:
        """Block until every bank is read (progress(bytes) after each, in order) -> the read's
        seconds from its start; the read's error, if any, is raised here."""
        try:
            for n, futs in self._banks:
                for f in futs:
                    f.result()
                if progress:
                    progress(n)
        finally:
            self.close()
        return self._t1 - self.t0

    def close(self) -> None:
        """Drop the pieces not started (a load that failed elsewhere) and close the files once
        the others are done."""
        for _, futs in self._banks:
            for f in futs:
                f.cancel()
        self._go.set()
        for t in self._workers:
            t.join()
        for fds in self._fds.values():
            for fd in fds:
                if fd is not None:
                    os.close(fd)
        self._fds = {}


def host_shortfall(nbytes: int) -> int:
    """How many bytes more than this machine has available (psutil) `nbytes` of new host memory
    would take; 0 when they fit."""
    import psutil
    return max(0, nbytes - psutil.virtual_memory().available)


def start(path: str | os.PathLike) -> EarlyRead | None:
    """Start reading the expert banks (uint8 rows, as the converter writes them) of the FTW
    directory `path`, once per directory; None where there are none, the index is unreadable or
    the banks do not fit in the host memory available."""
    path = Path(path).resolve()
    with _lock:
        if str(path) in _started:
            return _started[str(path)]
        try:
            tensors = json.loads((path / INDEX_NAME).read_bytes())["tensors"]
            banks = sorted((int(m.group(1)), str(e["shard"]), int(e["offset"]), tuple(int(s) for s in e["shape"]))
                           for name, e in tensors.items() if (m := BANK.fullmatch(name)) and e["dtype"] == "uint8")
            if not banks or host_shortfall(sum(math.prod(b[3]) for b in banks)):
                return None  # the load says what is missing
            _started[str(path)] = read = EarlyRead(path, banks)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return read


def started(path: str | os.PathLike) -> bool:
    """Whether start() began a read of `path` that no load has taken yet."""
    with _lock:
        return str(Path(path).resolve()) in _started


def take(path: str | os.PathLike) -> EarlyRead | None:
    """The read start() began for `path`, handed over once (None: none began)."""
    with _lock:
        return _started.pop(str(Path(path).resolve()), None)
