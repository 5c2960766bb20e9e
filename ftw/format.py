"""FTW constants (from ftw.spec), the per-tensor index entry, and the one error type.

An FTW checkpoint is a directory: `ftw.json` (the index), shard files holding raw
little-endian tensor bytes at 4096-aligned offsets, and side files copied verbatim
(config.json, tokenizer files). FORMAT.md is the normative spec; this module and ftw.spec (the
part that needs no torch) are the single home of every number and name in it, shared by the
writer and the readers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import torch

from .spec import (ALIGN, CHUNK_BYTES, FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, READ_VERSIONS,  # noqa: F401
                   SHARD_BYTES, SHARD_NAME, FTWError, align_up)

# every dtype FTW stores, by its index name: the one table of dtype names in FreeToken
DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2)}


def dtype_name(dtype: torch.dtype) -> str:
    """The index spelling of `dtype` ("bfloat16", ...); FTWError if FTW cannot store it."""
    name = str(dtype).removeprefix("torch.")
    if DTYPES.get(name) != dtype:
        raise FTWError(f"FTW v{FORMAT_VERSION} cannot store dtype {dtype}; use one of {', '.join(DTYPES)}")
    return name


def is_safe_relpath(name: str) -> bool:
    """True for a relative POSIX path that stays inside the FTW directory."""
    p = PurePosixPath(name)
    return bool(name) and "\\" not in name and not p.is_absolute() and ".." not in p.parts


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of contiguous CPU tensor `t` as a writable memoryview over its memory (no copy)."""
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the index: where its bytes are and what they mean."""
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    shard: str                # shard file name inside the FTW directory
    offset: int               # byte offset in the shard, a multiple of ALIGN
    nbytes: int               # numel * itemsize; the extent on disk is align_up(nbytes)
    crc32: int                # zlib.crc32 of the nbytes tensor bytes
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": dtype_name(self.dtype), "shape": list(self.shape), "shard": self.shard,
                "offset": self.offset, "nbytes": self.nbytes, "crc32": self.crc32, "meta": self.meta}

    @classmethod
    def from_json(cls, name: str, e: dict[str, Any]) -> TensorInfo:
        """Parse one index entry; KeyError/TypeError/ValueError on a malformed one."""
        if not isinstance(e["meta"], dict):
            raise TypeError(f"meta of tensor {name!r} is not an object")
        return cls(name, DTYPES[e["dtype"]], tuple(int(s) for s in e["shape"]), str(e["shard"]),
                   int(e["offset"]), int(e["nbytes"]), int(e["crc32"]), e["meta"])
