"""The reads under every FTW reader, without torch (ftw.early runs before torch is imported)."""
from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

from .spec import ALIGN, CHUNK_BYTES, FTWError

PIECE_BYTES = 16 << 20   # one thread's request of a large read
READ_THREADS = 8         # requests in flight


def open_direct(path: Path) -> int | None:
    """An O_DIRECT fd of a shard, or None where the filesystem refuses direct I/O (EINVAL at the
    open or at a first aligned read, which is tried here, before any concurrent use)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return None
    try:
        os.preadv(fd, [memoryview(mmap.mmap(-1, ALIGN))], 0)  # page-aligned
    except OSError as e:
        os.close(fd)
        if e.errno != errno.EINVAL:
            raise
        return None
    return fd


def open_shard(path: Path, direct: bool = True) -> tuple[int | None, int]:
    """(an O_DIRECT fd or None, a buffered fd) of a shard: the two a read's pieces go through."""
    return open_direct(path) if direct else None, os.open(path, os.O_RDONLY)


def pread(fd: int, dst: memoryview, offset: int) -> None:
    """Fill `dst` from file offset `offset`, at most CHUNK_BYTES per syscall."""
    pos = 0
    while pos < len(dst):
        got = os.preadv(fd, [dst[pos:pos + CHUNK_BYTES]], offset + pos)
        if got == 0:
            raise FTWError(f"a shard ended early at byte {offset + pos} (it changed after opening); "
                           "re-run `freetoken convert`")
        pos += got


def pieces(direct: int | None, plain: int, dst: memoryview, offset: int, addr: int) -> list[tuple]:
    """The reads (fd, part of dst, its file offset) that fill `dst` from file offset `offset`, of
    PIECE_BYTES each: O_DIRECT needs an aligned buffer, offset and length, so the aligned body goes
    through `direct` (where there is one and `addr`, dst's address, and offset are aligned), the
    tail through `plain`."""
    body = len(dst) - len(dst) % ALIGN if direct is not None and (addr | offset) % ALIGN == 0 else 0
    parts = ((direct, dst[:body], offset), (plain, dst[body:], offset + body))
    return [(fd, d[a:a + PIECE_BYTES], off + a) for fd, d, off in parts for a in range(0, len(d), PIECE_BYTES)]
