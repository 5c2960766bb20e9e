"""gate_up decode GEMV alone: as is (SPLIT 1: act, h stored) against its columns split over SPLIT
programs (raw gate/up partials stored, [SPLIT, T*K, 2I]), per format and T, in a CUDA graph of 16
calls over 256 slots (bench_quant's method). Checks sum of partials against the unsplit pre-act."""
import json, sys, time
import torch, triton
import triton.language as tl
from kernels import moe_triton as m


@triton.jit
def _gu_split(x_ptr, q_ptr, s_ptr, z_ptr, sq_s, sq_r, ss_s, ss_r, sz_s, sz_r, slot_ptr,
              g_ptr, H, I, K, sx_t, TK, FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              GK: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, SPLIT: tl.constexpr):
    r, ib, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    j = tl.arange(0, 2 * BLOCK_I)
    offs_i = ib * BLOCK_I + j // 2
    rows = offs_i + (j % 2) * I
    mi = offs_i < tl.where(slot >= 0, I, 0)
    slot = tl.maximum(slot, 0)
    q_ptr, s_ptr, z_ptr = q_ptr + slot * sq_s, s_ptr + slot * ss_s, z_ptr + slot * sz_s
    x_ptr += (r // K) * sx_t
    acc = tl.zeros([2 * BLOCK_I, BLOCK_H // GK], tl.float32)
    span = H // SPLIT
    for h0 in range(sp * span, sp * span + span, BLOCK_H):
        acc += m._row_dots(x_ptr, q_ptr, s_ptr, z_ptr, rows, mi, h0, H, sq_r, ss_r, sz_r,
                           x_ptr.dtype.element_ty, FMT, BN, BK, GK, BLOCK_H, True)
    gu = tl.sum(acc, axis=1)
    jj = ib * 2 * BLOCK_I + j
    tl.store(g_ptr + (sp * TK + r) * 2 * I + jj, gu, mask=jj < 2 * I)


H, I, S, K, group, calls = 2048, 768, 256, 8, 128, 16
t0 = time.time()
for fmt in sys.argv[1].split(","):
    (wgu, wd), per_slot = m._bench_weights(fmt, S, H, I, group)
    dflt, dw, dst = m.BLOCKS["plain" if fmt == "bf16" else fmt]
    bi, bh = dflt[0], dflt[1]
    gu_bytes = per_slot * 2 // 3
    for T in (1, 8):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        sets = [torch.randperm(S, device="cuda")[:T * K].view(T, K).reshape(-1).contiguous().to(torch.int32) for _ in range(calls)]
        parts, cfmt = m._weight_args(wgu, bh)
        h = torch.empty(T * K, I, device="cuda")
        a, clamp = (1.0, 0.0, 0.0), False
        def base(i, nw=dw):
            m._gate_up_kernel[(T * K, triton.cdiv(I, bi))](x, *parts, sets[i], h, x, 0, H, I, K, x.stride(0), *a, **cfmt,
                BLOCK_I=bi, BLOCK_H=bh, EVEN_K=True, BIAS=False, CLAMP=False, STAGES=dst, num_warps=nw)
        us = m._graph_us(base, calls)
        print(json.dumps({"fmt": fmt, "T": T, "variant": "as is", "warps": dw, "us": round(us, 2),
                          "GBps": round(T * K * gu_bytes / us / 1e3, 1)}), flush=True)
        for sp in (1, 2, 4):
            for nw in (4, 8):
                for bi2, bh2 in ((bi, bh), (bi, bh // 2) if bh >= 256 else (bi, bh)):
                    if H % (sp * bh2):
                        continue
                    p2, f2 = m._weight_args(wgu, bh2)
                    g = torch.empty(sp, T * K, 2 * I, device="cuda")
                    def run(i):
                        _gu_split[(T * K, triton.cdiv(I, bi2), sp)](x, *p2, sets[i], g, H, I, K, x.stride(0), T * K, **f2,
                            BLOCK_I=bi2, BLOCK_H=bh2, SPLIT=sp, num_warps=nw)
                    us = m._graph_us(run, calls)
                    # check: partial sums against the unsplit pre-activation through the split-1 kernel
                    run(0); torch.cuda.synchronize()
                    g1 = torch.empty(1, T * K, 2 * I, device="cuda")
                    _gu_split[(T * K, triton.cdiv(I, bi2), 1)](x, *p2, sets[0], g1, H, I, K, x.stride(0), T * K, **f2,
                        BLOCK_I=bi2, BLOCK_H=bh2, SPLIT=1, num_warps=nw)
                    err = float((g.sum(0) - g1[0]).abs().max())
                    print(json.dumps({"fmt": fmt, "T": T, "variant": f"split {sp}", "blocks": [bi2, bh2], "warps": nw,
                                      "us": round(us, 2), "GBps": round(T * K * gu_bytes / us / 1e3, 1), "err": err,
                                      "t": round(time.time() - t0)}), flush=True)
    del wgu, wd
