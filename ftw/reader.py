"""Open, validate and read an FTW directory (spec: FORMAT.md).

Opening checks what is cheap to check (index format and version, shard sizes, side-file
sha256) and fails with one actionable line. Reads land directly in the destination tensor with
os.preadv, through O_DIRECT when the buffer is aligned and the filesystem allows it (tmpfs and
some others refuse it; then buffered reads are used). A large tensor, or chosen rows of one (a
rank's experts of a bank), is read as PIECE_BYTES pieces by a pool of threads, all of a call's
pieces in flight together: several requests in flight keep a fast disk busy, and the page
faults of fresh destination memory (as costly as the transfer itself in a VM) are taken on
several cores while other pieces are in flight. A read never writes past the tensor's own bytes,
so `out` may be a view into a larger buffer. Reads may come from several threads at once.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

import torch

from .format import (ALIGN, FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, READ_VERSIONS, FTWError, TensorInfo,
                     align_up, byte_view, is_safe_relpath)
from .io import READ_THREADS, open_shard, pieces, pread


def aligned_empty(shape: Iterable[int], dtype: torch.dtype, align: int = ALIGN) -> torch.Tensor:
    """Uninitialised CPU tensor whose data pointer is `align`-aligned and whose allocation
    extends to a multiple of `align` past it, so O_DIRECT reads can land in it directly."""
    shape = tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.empty(align_up(nbytes, align) + align, dtype=torch.uint8)
    skip = -raw.data_ptr() % align
    return raw[skip:skip + nbytes].view(dtype).view(shape)


class FTWReader:
    """An opened, validated FTW directory; see the module docstring."""

    def __init__(self, path: str | os.PathLike, direct: bool = True, threads: int = READ_THREADS) -> None:
        self._fds: dict[str, tuple] = {}  # shard -> (O_DIRECT fd, or None if refused; plain fd)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ftw-read") if threads > 1 else None
        self.path = Path(path)
        self.use_direct = direct and hasattr(os, "O_DIRECT")
        self.direct_bytes = 0            # bytes read through O_DIRECT so far
        index = _load_index(self.path)
        self._shards, self._files, self._infos = _parse(self.path, index)
        self.fingerprint: str = index["fingerprint"]
        self.meta: dict[str, Any] = index["meta"]
        _check_contents(self.path, self._shards, self._files)

    def names(self) -> list[str]:
        """Tensor names in the order they were written."""
        return list(self._infos)

    def info(self, name: str) -> TensorInfo:
        if name not in self._infos:
            raise FTWError(f"no tensor {name!r} in {self.path}; see FTWReader.names()")
        return self._infos[name]

    def file(self, arcname: str) -> Path:
        """Path of copied side file `arcname` inside the FTW directory."""
        if arcname not in self._files:
            raise FTWError(f"no side file {arcname!r} in {self.path}; it has {sorted(self._files)}")
        return self.path / arcname

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Tensor `name` on the CPU; read straight into `out` (same dtype and numel) if given."""
        info = self.info(name)
        out = aligned_empty(info.shape, info.dtype) if out is None else out
        if not (out.device.type == "cpu" and out.is_contiguous() and out.dtype == info.dtype
                and out.numel() == math.prod(info.shape)):
            raise ValueError(f"out for {name!r} must be a contiguous CPU {info.dtype} tensor "
                             f"with the numel of {info.shape}")
        self._read_spans(info.shard, [(byte_view(out), info.offset, out.data_ptr())])
        return out

    def read_rows(self, name: str, rows: list[int], out: torch.Tensor) -> torch.Tensor:
        """Rows `rows` (ascending indices along dim 0) of tensor `name` into out [len(rows), ...]
        (a rank's experts of a bank): each run of consecutive rows is one span, the spans' pieces
        all in flight at once, through O_DIRECT where rows are aligned."""
        info = self.info(name)
        row = info.nbytes // info.shape[0] if info.shape and info.shape[0] else 0
        if not (out.device.type == "cpu" and out.is_contiguous() and out.dtype == info.dtype
                and tuple(out.shape) == (len(rows), *info.shape[1:]) and all(0 <= r < info.shape[0] for r in rows)
                and rows == sorted(set(rows))):
            raise ValueError(f"out for rows of {name!r} must be a contiguous CPU {info.dtype} tensor of "
                             f"[len(rows), *{info.shape[1:]}], rows ascending within {info.shape[:1]}")
        dst, spans, i = byte_view(out), [], 0
        while i < len(rows):
            n = 1
            while i + n < len(rows) and rows[i + n] == rows[i] + n:
                n += 1
            spans.append((dst[i * row:(i + n) * row], info.offset + rows[i] * row, out.data_ptr() + i * row))
            i += n
        self._read_spans(info.shard, spans)
        return out

    def verify(self, names: Iterable[str] | None = None) -> None:
        """Recompute per-tensor checksums; FTWError naming the tensor and shard on mismatch."""
        for name in self.names() if names is None else names:
            info = self.info(name)
            got = zlib.crc32(byte_view(self.read(name)))
            if got != info.crc32:
                raise FTWError(f"tensor {name!r} in shard {info.shard} of {self.path} is corrupt (crc32 "
                               f"{got:08x}, index {info.crc32:08x}); {_reconvert(self.path)}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for fds in self._fds.values():
            for fd in fds:
                if fd is not None:
                    os.close(fd)
        self._fds = {}

    def __enter__(self) -> FTWReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _open(self, shard: str) -> tuple:
        """(O_DIRECT fd, or None where the filesystem refuses direct I/O; plain fd) of a shard."""
        with self._lock:
            if shard not in self._fds:
                self._fds[shard] = open_shard(self.path / shard, self.use_direct)
            return self._fds[shard]

    def _read_spans(self, shard: str, spans: list[tuple[memoryview, int, int]]) -> None:
        """Fill each (dst, file offset, dst's address) of `spans` from `shard`. O_DIRECT needs an
        aligned buffer, offset and length: a span's aligned body goes direct, its tail buffered.
        All spans' pieces (ftw.io.pieces) go to the pool's threads at once."""
        direct, plain = self._open(shard)
        reads = [piece for dst, offset, addr in spans for piece in pieces(direct, plain, dst, offset, addr)]
        body_bytes = sum(len(d) for fd, d, _ in reads if direct is not None and fd == direct)
        if self._pool is None or len(reads) <= 1:
            for piece in reads:
                pread(*piece)
        else:
            for job in [self._pool.submit(pread, *piece) for piece in reads]:
                job.result()
        with self._lock:
            self.direct_bytes += body_bytes


def _reconvert(path: Path) -> str:
    return f"re-run `freetoken convert SRC {path} --force`"


def _load_index(path: Path) -> dict[str, Any]:
    """Parse ftw.json and check its format and version."""
    f = path / INDEX_NAME
    if not f.is_file():
        raise FTWError(f"{path} is not an FTW directory (no {INDEX_NAME}); "
                       "convert the model with `freetoken convert SRC OUT`")
    try:
        index = json.loads(f.read_bytes())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise FTWError(f"{f} is corrupt ({e}); {_reconvert(path)}") from e
    fmt = index.get("format") if isinstance(index, dict) else None
    if fmt != FORMAT_NAME:
        raise FTWError(f"{f} is not an FTW index (format {fmt!r}); convert the model with "
                       f"`freetoken convert SRC {path}`")
    v = index.get("version")
    if type(v) is int and v > FORMAT_VERSION:
        raise FTWError(f"{path} was written by a newer FreeToken (format v{v}); upgrade freetoken")
    if v not in READ_VERSIONS or type(v) is not int:
        raise FTWError(f"{path} has FTW format version {v!r}, not {FORMAT_VERSION}; {_reconvert(path)}")
    return index


def _parse(path: Path, index: dict) -> tuple[dict[str, int], dict[str, str], dict[str, TensorInfo]]:
    """Shards, side files and tensor entries of an index, checked for consistency."""
    try:
        shards = {str(k): int(v) for k, v in index["shards"].items()}
        files = {str(k): str(v) for k, v in index["files"].items()}
        infos = {n: TensorInfo.from_json(n, e) for n, e in index["tensors"].items()}
        if not isinstance(index["fingerprint"], str) or not isinstance(index["meta"], dict):
            raise TypeError("fingerprint must be a string and meta an object")
        bad = [n for n in [*shards, *files] if not is_safe_relpath(n)]
        bad += [i.name for i in infos.values() if not _entry_ok(i, shards)]
        if bad:
            raise ValueError(f"bad entry {bad[0]!r}")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FTWError(f"{path / INDEX_NAME} is corrupt ({type(e).__name__}: {e}); "
                       f"{_reconvert(path)}") from e
    return shards, files, infos


def _entry_ok(i: TensorInfo, shards: dict[str, int]) -> bool:
    return (i.shard in shards and i.offset % ALIGN == 0 and i.offset >= 0
            and i.nbytes == math.prod(i.shape) * i.dtype.itemsize
            and i.offset + align_up(i.nbytes) <= shards[i.shard])


def _check_contents(path: Path, shards: dict[str, int], files: dict[str, str]) -> None:
    """Every shard has its recorded size; every side file its recorded sha256."""
    for name, size in shards.items():
        have = (path / name).stat().st_size if (path / name).is_file() else None
        if have != size:
            what = "missing" if have is None else "truncated" if have < size else "larger than recorded"
            raise FTWError(f"shard {name} of {path} is {what} ({have} bytes, index says {size}); "
                           f"{_reconvert(path)}")
    for arc, digest in files.items():
        p = path / arc
        if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != digest:
            raise FTWError(f"{p} was modified after conversion (missing or sha256 differs from "
                           f"{INDEX_NAME}); {_reconvert(path)}")
