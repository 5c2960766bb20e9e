"""FTW's numbers and names, and its one error type, without torch: what a reader needs before
torch is imported (ftw.early). ftw.format re-exports all of it beside the tensor entries."""
from __future__ import annotations

FORMAT_NAME = "ftw"
FORMAT_VERSION = 2            # written; see FORMAT.md section 6
READ_VERSIONS = (1, 2)        # read: v1 differs only in what its tensors may hold
INDEX_NAME = "ftw.json"
ALIGN = 4096                  # bytes; every tensor offset and on-disk extent is a multiple
SHARD_BYTES = 4 << 30         # start a new shard when the next tensor would pass 4 GiB
CHUNK_BYTES = 64 << 20        # bytes per read/write syscall, keeps each call bounded
SHARD_NAME = "shard-{:05d}.ftw"


class FTWError(Exception):
    """A problem with an FTW directory or its use; the message is one line saying what to do."""


def align_up(n: int, align: int = ALIGN) -> int:
    """Smallest multiple of `align` that is >= n."""
    return -(-n // align) * align
