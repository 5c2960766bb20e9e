"""Device-resident expert-cache control (Triton): freetoken_kernels.ref.plan in ONE single-program launch.

Reads and updates the residency tables, clock and q on the device, so a decode step never
syncs with the host. Routes are deduplicated and misses ranked by pairwise comparison of the
N = T*K routes ([BLOCK_N, BLOCK_N] tiles, N <= 256); victims are the F smallest composite keys
(last_use, slot) over S slots, found in one pass over blocks of S that keep the F best in
registers (iterative min-extraction of the few keys below the running threshold). The step's hits
count as last used at the clamp during that pass, like reserved slots (their last_use is set to
the step's clock after it), so a block of slots costs one load and one comparison a slot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_IDX = 20                                   # slot index bits of a key (S < 2^20)
IDX, IDX_MASK = tl.constexpr(_IDX), tl.constexpr((1 << _IDX) - 1)
LU_MAX = tl.constexpr(1 << 40)              # last_use is clamped here (clocks stay far below):
                                            # reserved slots and, during the scan, this step's hits
INF, NEG = tl.constexpr(1 << 62), tl.constexpr(-(1 << 62))   # empty / inert candidate
DEAD = tl.constexpr((1 << 62) + 1)          # key already taken or out of range


@triton.jit
def _smallest(last_use, S, n, ln, BLOCK_S: tl.constexpr):
    """In lanes ln < n, the n smallest keys (last_use, slot) over S slots, in one pass over blocks
    of S that keeps them in registers (min-extraction of the few keys below the running threshold);
    the other lanes hold NEG (inert)."""
    cand = tl.where(ln < n, INF, NEG).to(tl.int64)
    for s0 in range(0, tl.where(n > 0, S, 0), BLOCK_S):        # none wanted: no scan
        offs = s0 + tl.arange(0, BLOCK_S)                        # [BLOCK_S] slots
        ms = offs < S
        lu = tl.minimum(tl.load(last_use + offs, mask=ms, other=0).to(tl.int64), LU_MAX)
        key = tl.where(ms, ((lu + 1) << IDX) + offs, DEAD)
        n_take = tl.minimum(tl.sum((key < tl.max(cand, axis=0)).to(tl.int32), axis=0), n)
        for _ in range(0, n_take):                               # keys below the threshold
            mk = tl.min(key, axis=0)
            pos = tl.where(mk < tl.max(cand, axis=0), tl.argmax(cand, axis=0), -1)
            cand = tl.where(ln == pos, mk, cand)
            key = tl.where(key == mk, DEAD, key)
    return cand


# S (the cache's slots) is not specialized: an elastic resize to a count that is not a multiple of
# 16 would otherwise compile a second variant inside the re-capture (4.3 s measured on the H200)
@triton.jit(do_not_specialize=["S"])
def _plan_kernel(ids_ptr, slot_of, owner_of, last_use, seen, clock_ptr, q_ptr, route_ptr,
                 vic_ptr, fetch_ptr, counts_ptr, N, S, n_out, base, n_layers,
                 x_ptr, w_ptr, xh_ptr, idsh_ptr, wh_ptr, nh_ptr, go_ptr, done_ptr, go, NX,
                 BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_O: tl.constexpr,
                 STAGE: tl.constexpr, BLOCK_X: tl.constexpr):
    c = tl.load(clock_ptr) + 1                                   # this step's clock
    ln = tl.arange(0, BLOCK_N)                                   # [BLOCK_N] route lanes
    lane = ln < N
    eid = tl.load(ids_ptr + ln, mask=lane, other=-1).to(tl.int64)
    valid = eid >= 0                                             # -1: a route computed elsewhere
    fid = tl.where(valid, eid, 0) + base                         # flat ids
    eq = (fid[:, None] == fid[None, :]) & valid[None, :]         # [BLOCK_N, BLOCK_N]
    cnt = tl.sum(eq.to(tl.int32), axis=1)                        # routes of this lane's expert
    first = valid & (tl.sum((eq & (ln[None, :] < ln[:, None])).to(tl.int32), axis=1) == 0)
    slot = tl.load(slot_of + fid, mask=valid, other=-1)
    sn = tl.load(seen + fid, mask=valid, other=0)
    hit = slot >= 0
    hitf, missf = first & hit, first & ~hit                      # one lane per distinct expert
    n_hit = tl.sum(hitf.to(tl.int32), axis=0)
    n_miss = tl.sum(missf.to(tl.int32), axis=0)
    # rank among the distinct misses: seen desc, then routed tokens desc, then id asc
    tie_id = (cnt[None, :] == cnt[:, None]) & (fid[None, :] < fid[:, None])  # [n, m]: m first?
    before = (sn[None, :] > sn[:, None]) | ((sn[None, :] == sn[:, None]) & (
        (cnt[None, :] > cnt[:, None]) | tie_id))
    rank = tl.sum((before & missf[None, :]).to(tl.int32), axis=1)       # [BLOCK_N]
    # F = split_fetch(M, q, least) in float64 like the Python reference, capped by unprotected slots
    qv = tl.load(q_ptr).to(tl.float64)
    qs = tl.where((qv > 0.0) & (qv < 1.0), qv, 0.5)
    m = n_miss.to(tl.float64)
    f0 = (qs * m).to(tl.int32)
    f1 = f0 + 1
    cost0 = tl.maximum(f0.to(tl.float64) / qs, (m - f0.to(tl.float64)) / (1.0 - qs))
    cost1 = tl.maximum(f1.to(tl.float64) / qs, (m - f1.to(tl.float64)) / (1.0 - qs))
    f = tl.where((f1 <= n_miss) & (cost1 <= cost0), f1, f0)
    f = tl.where(qv >= 1.0, n_miss, tl.where(qv <= 0.0, 0, f))
    split = (qv > 0.0) & (qv < 1.0)
    recurring = tl.sum((missf & (sn >= 0) & (sn >= c - n_layers)).to(tl.int32), axis=0) > 0
    f = tl.minimum(tl.where(split & recurring, tl.maximum(f, 1), f), S - n_hit)
    # candidates: the fs smallest keys (last_use, slot); the hits are protected by last_use at the clamp;
    # with a split, at least the first in line, to see whether it is empty
    fs = tl.minimum(tl.where(split & (n_miss > 0), tl.maximum(f, 1), f), S - n_hit)
    tl.store(last_use + slot, LU_MAX, mask=hitf)
    tl.debug_barrier()                                           # before any lane's scan reads it
    cand = _smallest(last_use, S, fs, ln, BLOCK_S)
    first_in_line = tl.min(tl.where(ln < fs, cand, INF), axis=0) & IDX_MASK
    if (fs > 0) & (fs < tl.minimum(n_miss, S - n_hit)):
        if tl.load(owner_of + first_in_line) < 0:               # empty (the cache filling): a candidate a miss
            fs = tl.minimum(n_miss, S - n_hit)
            cand = _smallest(last_use, S, fs, ln, BLOCK_S)
    scanned = ln < fs
    crank = tl.sum(((cand[None, :] < cand[:, None]) & scanned[None, :]).to(tl.int32), axis=1)
    # as many fills as the empty slots first in line take at least (they evict nothing)
    own = tl.load(owner_of + (cand & IDX_MASK), mask=scanned, other=-1)
    f = tl.maximum(f, tl.min(tl.where(scanned & (own >= 0), crank, fs), axis=0))
    act = scanned & (crank < f)
    tl.store(vic_ptr + crank, cand & IDX_MASK, mask=act)   # victims in LRU order
    got = valid & ~hit & (rank < f)                              # routes whose expert is fetched
    tl.store(fetch_ptr + rank, fid - base, mask=got & first)
    pad = tl.arange(0, BLOCK_O)
    tl.store(vic_ptr + pad, -1, mask=(pad >= f) & (pad < n_out))
    tl.store(fetch_ptr + pad, -1, mask=(pad >= f) & (pad < n_out))
    tl.debug_barrier()                                           # victims visible to all lanes
    vic = tl.load(vic_ptr + rank, mask=got, other=-1).to(tl.int64)
    old = tl.load(owner_of + vic, mask=got & first, other=-1)    # evicted flat ids
    tl.debug_barrier()                                           # all reads before any write
    tl.store(slot_of + old, -1, mask=(old >= 0) & got & first)
    tl.store(slot_of + fid, vic, mask=got & first)
    tl.store(owner_of + vic, fid, mask=got & first)
    tl.store(last_use + vic, c, mask=got & first)
    tl.store(last_use + slot, c, mask=hitf)
    tl.store(seen + fid, c, mask=first)
    tl.store(route_ptr + ln, tl.where(hit, slot, vic), mask=lane)  # -1 where not valid
    tl.store(counts_ptr, n_hit)
    tl.store(counts_ptr + 1, n_miss)
    tl.store(counts_ptr + 2, f)
    tl.store(counts_ptr + 3, tl.load(counts_ptr + 3) + n_hit)   # running totals: no extra launch
    tl.store(counts_ptr + 4, tl.load(counts_ptr + 4) + n_miss)
    tl.store(counts_ptr + 5, tl.load(counts_ptr + 5) + f)
    tl.store(clock_ptr, c)
    if STAGE:
        if n_miss > f:  # the CPU branch's inputs into mapped host memory, its answer cleared, then its go flag
            tl.store(done_ptr, 0)
            tl.store(idsh_ptr + ln, tl.where(hit | got | ~valid, -1, fid - base), mask=lane)
            tl.store(wh_ptr + ln, tl.load(w_ptr + ln, mask=lane, other=0.0).to(tl.float32), mask=lane)
            tl.store(nh_ptr, f.to(tl.int64))
            for i0 in range(0, NX, BLOCK_X):
                o = i0 + tl.arange(0, BLOCK_X)
                tl.store(xh_ptr + o, tl.load(x_ptr + o, mask=o < NX).to(xh_ptr.dtype.element_ty), mask=o < NX)
            tl.debug_barrier()                                   # every lane's writes before the flag
            tl.atomic_xchg(go_ptr, go, sem="release", scope="sys")


def plan(ids: torch.Tensor, layer: int, n_experts: int, slot_of: torch.Tensor,
         owner_of: torch.Tensor, last_use: torch.Tensor, seen: torch.Tensor, clock: torch.Tensor,
         q: torch.Tensor, out_route: torch.Tensor, out_victims: torch.Tensor,
         out_fetch: torch.Tensor, out_counts: torch.Tensor, block_s: int | None = None, stage=None) -> None:
    """ref.plan on device tensors, no host sync. clock [1] int64 is incremented first and the
    new value used (as ExpertRuntime does); q [1] fp32. Writes out_route [T, K] (-1 = CPU),
    out_victims / out_fetch [>= min(T*K, S)] (F entries, then -1), out_counts [6] =
    (hits, misses, F) of this step, then the same three summed over steps (added to in place).
    Tables are updated in place exactly as ref.plan does. stage = (x [T, H], weights [T, K], x_h,
    ids_h, w_h, n_h, go, done, value) also stages the CPU routes for the C++ poller, in the same
    launch: rows 0..T of x_h [Tmax, H] (its dtype) = x, ids_h [Tmax, K] = where(route < 0, ids,
    -1), w_h [Tmax, K] fp32 = weights, n_h [1] int64 = F; then go [1] int32 (mapped host
    memory) = value, ordered after all of those writes. A step that leaves no route to the CPU
    stages nothing and sets done [1] int32 (mapped) = value instead, the poller's answer."""
    N, S = ids.numel(), owner_of.numel()
    n_out = out_victims.numel()
    assert N <= 256 and S < 2 ** _IDX and out_fetch.numel() == n_out >= min(N, S)
    assert out_route.is_contiguous() and out_route.numel() == N and out_counts.numel() >= 6
    block_n = max(16, triton.next_power_of_2(N))
    block_s = block_s or min(triton.next_power_of_2(S), 4096)
    x, w, x_h, ids_h, w_h, n_h, go, done, value = stage or (ids, ids, ids, ids, ids, ids, ids, ids, 0)
    assert stage is None or (x.is_contiguous() and w.is_contiguous() and w.numel() == N)
    _plan_kernel[(1,)](ids.contiguous(), slot_of, owner_of, last_use, seen, clock, q, out_route,
                       out_victims, out_fetch, out_counts, N, S, n_out, layer * n_experts,
                       slot_of.numel() // n_experts, x, w, x_h, ids_h, w_h, n_h, go, done, value, x.numel(),
                       STAGE=stage is not None, BLOCK_X=1024, BLOCK_N=block_n, BLOCK_S=block_s, BLOCK_O=triton.next_power_of_2(n_out),
                       num_warps=max(4 if block_n <= 64 else 8, min(16, block_s // 256)))


def bench_plan(T: int = 1, K: int = 8, S: int = 800, E: int = 128, L: int = 48,
               q: float = 0.5, steps: int = 256) -> dict:
    """H200 timing of one plan launch per MoE layer step over random routing (us per call)."""
    from triton.testing import do_bench
    dev = "cuda"
    slot_of, seen = (torch.full((L * E,), -1, dtype=torch.int64, device=dev) for _ in range(2))
    owner_of, last_use = (torch.full((S,), -1, dtype=torch.int64, device=dev) for _ in range(2))
    clock = torch.zeros(1, dtype=torch.int64, device=dev)
    qt = torch.tensor([q], dtype=torch.float64, device=dev)
    ids = [torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(T)]) for _ in range(steps)]
    route = torch.empty(T, K, dtype=torch.int64, device=dev)
    vic, fetch = (torch.empty(T * K, dtype=torch.int64, device=dev) for _ in range(2))
    counts = torch.zeros(6, dtype=torch.int64, device=dev)
    step = [0]

    def one():
        step[0] += 1
        plan(ids[step[0] % steps], step[0] % L, E, slot_of, owner_of, last_use, seen, clock,
             qt, route, vic, fetch, counts)
    ms = do_bench(one)
    nbytes = 8 * (3 * S + 3 * T * K)                             # tables read, roughly
    return {"us": ms * 1e3, "GB/s": nbytes / ms / 1e6, "bytes": nbytes}
