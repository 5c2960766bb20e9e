"""Stream named tensors and side files into an FTW directory (the current version) (spec: FORMAT.md).

Tensors go to shard files as they are added, straight from their own memory, so peak RAM is
about one tensor. Everything is written into a temporary sibling directory; only a clean exit
from the with-block writes the index, fsyncs and renames it into place, so an interrupted
conversion never leaves anything at `out_dir` that looks valid.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import torch

from .format import (ALIGN, CHUNK_BYTES, FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, SHARD_BYTES,
                     SHARD_NAME, FTWError, TensorInfo, align_up, byte_view, dtype_name,
                     is_safe_relpath)


class FTWWriter:
    """Context manager writing one FTW directory: `add` tensors, `copy_file` side files."""

    def __init__(self, out_dir: str | os.PathLike, fingerprint: str, meta: dict | None = None,
                 force: bool = False, shard_bytes: int = SHARD_BYTES) -> None:
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not force:
            raise FTWError(f"{self.out_dir} already exists; pass --force to overwrite it")
        if sys.byteorder != "little":
            raise FTWError("FTW stores little-endian bytes; convert on a little-endian machine")
        self.fingerprint, self.meta = str(fingerprint), _jsonable(meta or {}, "writer meta")
        self.shard_bytes = shard_bytes
        self._tmp: Path | None = None
        self._f: BinaryIO | None = None
        self._pos = 0                                  # bytes written to the current shard
        self._shards: dict[str, int] = {}
        self._tensors: dict[str, dict[str, Any]] = {}
        self._files: dict[str, str] = {}

    def __enter__(self) -> FTWWriter:
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        # Not mkdtemp: that makes the directory 0700 and the model unreadable to other users.
        self._tmp = self.out_dir.with_name(f".{self.out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
        self._tmp.mkdir()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self._commit()
        finally:  # on any failure, remove every trace of the partial conversion
            if self._f is not None:
                self._f.close()
            if self._tmp.exists():
                shutil.rmtree(self._tmp)

    def add(self, name: str, tensor: torch.Tensor, meta: dict | None = None) -> None:
        """Append `tensor` under `name`; non-CPU or non-contiguous tensors are copied first."""
        self._require_open()
        if name in self._tensors:
            raise FTWError(f"tensor {name!r} was added twice; tensor names must be unique")
        dtype_name(tensor.dtype)
        meta = _jsonable(meta or {}, f"meta of tensor {name!r}")
        t = tensor.detach().to("cpu").contiguous()
        data = byte_view(t)
        if self._f is None or (self._pos and self._pos + align_up(len(data)) > self.shard_bytes):
            self._open_shard()
        offset, crc = self._pos, self._write(data)
        shard = Path(self._f.name).name
        info = TensorInfo(name, t.dtype, tuple(t.shape), shard, offset, len(data), crc, meta)
        self._tensors[name] = info.to_json()

    def copy_file(self, src: str | os.PathLike, arcname: str | None = None) -> None:
        """Copy side file `src` into the FTW directory as `arcname` (default: its name)."""
        self._require_open()
        src = Path(src)
        arc = arcname or src.name
        if not is_safe_relpath(arc) or arc == INDEX_NAME or arc.endswith(".ftw") or arc in self._files:
            raise FTWError(f"cannot store side file as {arc!r}: use a unique relative path that is "
                           f"not {INDEX_NAME} and does not end in .ftw")
        dst = self._tmp / arc
        dst.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            while chunk := fi.read(1 << 20):
                h.update(chunk)
                fo.write(chunk)
            fo.flush()
            os.fsync(fo.fileno())
        self._files[arc] = h.hexdigest()

    def _require_open(self) -> None:
        if self._tmp is None:
            raise FTWError("use FTWWriter as a context manager: `with FTWWriter(...) as w:`")

    def _write(self, data: memoryview) -> int:
        """Write `data` plus zero padding to the next ALIGN boundary; return its crc32."""
        crc = 0
        for i in range(0, len(data), CHUNK_BYTES):
            chunk = data[i:i + CHUNK_BYTES]
            crc = zlib.crc32(chunk, crc)
            self._f.write(chunk)
        pad = align_up(len(data)) - len(data)
        self._f.write(bytes(pad))
        self._pos += len(data) + pad
        assert self._pos % ALIGN == 0
        return crc

    def _open_shard(self) -> None:
        self._close_shard()
        self._f = open(self._tmp / SHARD_NAME.format(len(self._shards)), "wb")
        self._pos = 0

    def _close_shard(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._shards[Path(self._f.name).name] = self._pos
            self._f = None

    def _commit(self) -> None:
        """Write and fsync the index, then move the finished directory to out_dir."""
        self._close_shard()
        index = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "fingerprint": self.fingerprint,
                 "meta": self.meta, "files": self._files, "shards": self._shards,
                 "tensors": self._tensors}
        with open(self._tmp / INDEX_NAME, "w") as f:
            json.dump(index, f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self._tmp)
        old = self._tmp.with_name(self._tmp.name + "-old")
        if self.out_dir.exists():  # only reachable with force=True (checked in __init__)
            os.rename(self.out_dir, old)
        os.rename(self._tmp, self.out_dir)
        _fsync_dir(self.out_dir.parent)
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()


def _jsonable(obj: dict, what: str) -> dict:
    """`obj` as it will read back from the index (tuples become lists); FTWError if not JSON."""
    if not isinstance(obj, dict):
        raise FTWError(f"{what} must be a dict, got {type(obj).__name__}")
    try:
        return json.loads(json.dumps(obj, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise FTWError(f"{what} is not JSON-serialisable ({e}); pass plain dicts, lists, str and numbers") from e


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
