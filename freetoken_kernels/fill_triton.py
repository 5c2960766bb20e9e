"""Expert fills as a kernel: copy host-store rows straight into cache slots over UVA (the store
is pinned and mapped), with the rows and slots read from device tensors the plan kernel wrote,
so a CUDA graph can fill data-dependent misses without the host. Same semantics as
freetoken_kernels.ref.fill_rows."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fill_kernel(src_ptr, dst_ptr, vic_ptr, fetch_ptr, base, W, cnt_ptr, flag_ptr, value,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, SIGNAL: tl.constexpr):
    i, c = tl.program_id(0), tl.program_id(1)
    slot = tl.load(vic_ptr + i).to(tl.int64)
    row = (tl.load(fetch_ptr + i) + base).to(tl.int64)
    n = tl.where(slot >= 0, CHUNK, 0)  # padded entries (slot -1) copy nothing
    for off in range(0, n, BLOCK):
        o = c * CHUNK + off + tl.arange(0, BLOCK)
        m = o < W
        v = tl.load(src_ptr + row * W + o, mask=m)
        tl.store(dst_ptr + slot * W + o, v, mask=m)
    if SIGNAL:  # the last program to finish writes the flag (and re-arms the counter)
        if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) * tl.num_programs(1) - 1:
            tl.store(cnt_ptr, 0)
            tl.atomic_xchg(flag_ptr, value, sem="release", scope="sys")


def fill_rows(src: torch.Tensor, dst: torch.Tensor, victims: torch.Tensor, fetch: torch.Tensor,
              base: int, chunk_words: int = 1 << 16, signal=None) -> None:
    """src [N, B] uint8 (pinned host), dst [S, B] uint8 (device); victims, fetch [F'] int64 padded
    with -1: dst[victims[i]] = src[base + fetch[i]]. signal = (counter [1] int32 on the device,
    zero; flag [1] int32 in mapped host memory; value): flag = value once every copy is done."""
    words = src.shape[1] // 8
    s64, d64 = src.view(torch.int64), dst.view(torch.int64)
    grid = (victims.numel(), triton.cdiv(words, chunk_words))
    cnt, flag, value = signal or (victims, victims, 0)
    _fill_kernel[grid](s64, d64, victims, fetch, base, words, cnt, flag, value, CHUNK=chunk_words,
                       BLOCK=min(4096, chunk_words), SIGNAL=signal is not None)


def bench_fill(n: int = 8, slot_bytes: int = 9 << 20, rows: int = 64) -> dict:
    """H200 timing: n expert fills of slot_bytes from pinned host rows, by this kernel and by the
    copy engine (one cudaMemcpyAsync per row); GB/s of each."""
    from triton.testing import do_bench
    src = torch.empty(rows, slot_bytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(2 * n, slot_bytes, dtype=torch.uint8, device="cuda")
    vic = torch.arange(n, device="cuda")
    fetch = torch.arange(n, device="cuda") * 3 % rows

    pairs = list(zip(vic.tolist(), fetch.tolist()))

    def copy_engine():
        for s, e in pairs:
            dst[s].copy_(src[e], non_blocking=True)
    res = {}
    for name, fn in (("gather_kernel", lambda: fill_rows(src, dst, vic, fetch, 0)), ("copy_engine", copy_engine)):
        ms = do_bench(fn)
        res[name] = {"us": ms * 1e3, "GB/s": n * slot_bytes / ms / 1e6}
    return res
