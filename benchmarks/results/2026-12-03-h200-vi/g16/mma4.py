"""Probe: the int4 decode GEMVs (gate_up, down) on mma.sync m16n8k16 from registers (Gluon + inline PTX), codes
shuffled so that one 32-bit word holds a lane's A fragment of a 16 x 16 tile (gate rows 0-7, up rows 8-15 of a
block of 8 intermediate rows), two codes a LOP3 into bf16x2 (128 + c, exact), the zero point taken out after the dot
with the group's sum of x (down: blocks of 16 output rows). Against the tree's kernels (default tiles), bench_quant's method (16 calls in
one CUDA graph over 256 slots, group 128, 8 routes, T = 1). python3 mma4.py [NW,...] [H] [I]
(H and I from the command line, and the package by its current name, since the forty-second run, whose g36b.sh
ran it at larger expert shapes)"""
import json, sys
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from freetoken_kernels import moe_triton as m
from freetoken_kernels.quant import quantize


def tile_asm(n):  # n tiles; operands: $0 $1 outputs (gate, up sums); words $2..; x regs after
    lines = ["{", ".reg .b32 a0, a1, a2, a3, s;", ".reg .f32 d0, d1, d2, d3;",
             "mov.f32 d0, 0f00000000;", "mov.f32 d1, 0f00000000;", "mov.f32 d2, 0f00000000;", "mov.f32 d3, 0f00000000;"]
    for j in range(n):
        w = f"${2 + j}"
        b0, b1 = f"${2 + n + 2 * j}", f"${3 + n + 2 * j}"
        lines += [f"lop3.b32 a0, {w}, 0x000F000F, 0x43004300, 0xEA;",
                  f"shr.u32 s, {w}, 4;", "lop3.b32 a1, s, 0x000F000F, 0x43004300, 0xEA;",
                  f"shr.u32 s, {w}, 8;", "lop3.b32 a2, s, 0x000F000F, 0x43004300, 0xEA;",
                  f"shr.u32 s, {w}, 12;", "lop3.b32 a3, s, 0x000F000F, 0x43004300, 0xEA;",
                  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d0, d1, d2, d3}, {a0, a1, a2, a3}, "
                  f"{{{b0}, {b1}}}, {{d0, d1, d2, d3}};"]
    lines += ["mov.f32 $0, d0;", "mov.f32 $1, d2;", "}"]
    return "\n".join(lines)


ASM8 = tile_asm(8)
CONS8 = "=r,=r," + ",".join(["r"] * 24)


@gluon.jit
def _split8(v):  # [A, B, 8] -> 8 x [A, B]
    a, b = gl.split(gl.reshape(v, [v.shape[0], v.shape[1], 4, 2]))
    a0, a1 = gl.split(gl.reshape(a, [v.shape[0], v.shape[1], 2, 2]))
    b0, b1 = gl.split(gl.reshape(b, [v.shape[0], v.shape[1], 2, 2]))
    e0, e4 = gl.split(a0)
    e2, e6 = gl.split(a1)
    e1, e5 = gl.split(b0)
    e3, e7 = gl.split(b1)
    return e0, e1, e2, e3, e4, e5, e6, e7


@gluon.jit
def _mma_group(wp, xp, NW: gl.constexpr, S8: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
    """One group of 128 columns: a lane's 8 code words (wp [NW, 32, 8]) and x fragments (xp [NW, 32, 16]), 8 MMAs
    -> the raw sums (128 + c) . x of block rows g and g + 8 ([NW, 32] each)."""
    w = gl.load(wp)
    xv = gl.load(xp)
    w0, w1, w2, w3, w4, w5, w6, w7 = _split8(w)
    xa, xb = gl.split(gl.reshape(xv, [NW, 32, 8, 2]))
    x0, x1, x2, x3, x4, x5, x6, x7 = _split8(xa)
    y0, y1, y2, y3, y4, y5, y6, y7 = _split8(xb)
    xs = [gl.convert_layout(t, S8) for t in (x0, y0, x1, y1, x2, y2, x3, y3, x4, y4, x5, y5, x6, y6, x7, y7)]
    ws = [gl.convert_layout(t, S8) for t in (w0, w1, w2, w3, w4, w5, w6, w7)]
    return gl.inline_asm_elementwise(asm, cons, ws + xs, dtype=(gl.float32, gl.float32), is_pure=True, pack=1)


@gluon.jit
def _gate_up_mma(q_ptr, sq_s, s_ptr, z_ptr, sz_s, sz_r, slot_ptr, xf_ptr, sx_ptr, h_ptr, I, H: gl.constexpr,
                 NW: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
    """A program: a route and 8 intermediate rows (a block of 16: gate rows, then up rows), its warps 1/NW of the
    columns each, summed across warps at the end; h = silu(gate) * up."""
    r, rb = gl.program_id(0), gl.program_id(1)
    L8: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
    L16: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
    S8: gl.constexpr = gl.SliceLayout(2, L8)
    slot = gl.load(slot_ptr + r).to(gl.int64)
    warp = gl.arange(0, NW, layout=gl.SliceLayout(1, S8))[:, None]          # [NW, 1]
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, S8))[None, :]          # [1, 32]
    j8 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L8)))[None, None, :]
    warp16 = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L16)))[:, None, None]
    lane16 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L16)))[None, :, None]
    j16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, L16)))[None, None, :]
    NG: gl.constexpr = H // 128                                   # groups of a row
    GW: gl.constexpr = NG // NW                                   # groups a warp
    qb = q_ptr + slot * sq_s + rb * (NG * 32 * 8)
    row_g = rb * 8 + lane // 4                                    # gate row; up row I + row_g
    acc_g = gl.zeros([NW, 32], gl.float32, S8)
    acc_u = gl.zeros([NW, 32], gl.float32, S8)
    for gi in gl.static_range(GW):   # unrolled: every group's loads may be issued before the first MMA
        grp = warp * GW + gi                                      # [NW, 1]
        dg, du = _mma_group(qb + ((warp[:, :, None] * GW + gi) * 32 + lane[:, :, None]) * 8 + j8,
                            xf_ptr + (lane16 % 4) * (H // 8) + (warp16 * GW + gi) * 16 + j16, NW, S8, asm, cons)
        sx = gl.load(sx_ptr + grp)
        zg = gl.load(z_ptr + slot * sz_s + row_g * sz_r + grp).to(gl.float32)
        zu = gl.load(z_ptr + slot * sz_s + (I + row_g) * sz_r + grp).to(gl.float32)
        sg = gl.load(s_ptr + slot * sz_s + row_g * sz_r + grp).to(gl.float32)
        su = gl.load(s_ptr + slot * sz_s + (I + row_g) * sz_r + grp).to(gl.float32)
        acc_g += sg * (dg - (128.0 + zg) * sx)
        acc_u += su * (du - (128.0 + zu) * sx)
    gs = gl.sum(acc_g, axis=0)                                    # [32]
    us = gl.sum(acc_u, axis=0)
    hv = gs / (1.0 + gl.exp(-gs)) * us
    ln = gl.arange(0, 32, layout=gl.SliceLayout(0, S8))
    gl.store(h_ptr + r * I + rb * 8 + ln // 4, hv, mask=ln % 4 == 0)


@gluon.jit
def _down_mma(q_ptr, sq_s, s_ptr, z_ptr, sz_s, sz_r, slot_ptr, hf_ptr, sh_ptr, rw_ptr, y_ptr, H, I: gl.constexpr,
              NW: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
    """A program: a route and NW blocks of 16 output rows, a warp a block over every column; y = weight * (W h)."""
    r, ob = gl.program_id(0), gl.program_id(1)
    L8: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
    L16: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
    S8: gl.constexpr = gl.SliceLayout(2, L8)
    slot = gl.load(slot_ptr + r).to(gl.int64)
    wt = gl.load(rw_ptr + r)
    warp = gl.arange(0, NW, layout=gl.SliceLayout(1, S8))[:, None]
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, S8))[None, :]
    j8 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, L8)))[None, None, :]
    warp16 = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L16)))[:, None, None]
    lane16 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L16)))[None, :, None]
    j16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, L16)))[None, None, :]
    NG: gl.constexpr = I // 128
    blk = ob * NW + warp                                          # [NW, 1]
    row0 = blk * 16 + lane // 4                                   # rows g and g + 8 of the block
    qb = q_ptr + slot * sq_s
    hb = hf_ptr + r * (I // 2) + (lane16 % 4) * (I // 8) + warp16 * 0
    acc0 = gl.zeros([NW, 32], gl.float32, S8)
    acc8 = gl.zeros([NW, 32], gl.float32, S8)
    for gi in gl.static_range(NG):   # unrolled, as above
        d0, d8 = _mma_group(qb + ((blk[:, :, None] * NG + gi) * 32 + lane[:, :, None]) * 8 + j8,
                            hb + gi * 16 + j16, NW, S8, asm, cons)
        sh = gl.load(sh_ptr + r * NG + gi)
        z0 = gl.load(z_ptr + slot * sz_s + row0 * sz_r + gi).to(gl.float32)
        z8 = gl.load(z_ptr + slot * sz_s + (row0 + 8) * sz_r + gi).to(gl.float32)
        s0 = gl.load(s_ptr + slot * sz_s + row0 * sz_r + gi).to(gl.float32)
        s8 = gl.load(s_ptr + slot * sz_s + (row0 + 8) * sz_r + gi).to(gl.float32)
        acc0 += s0 * (d0 - (128.0 + z0) * sh)
        acc8 += s8 * (d8 - (128.0 + z8) * sh)
    first = lane % 4 == 0
    gl.store(y_ptr + r * H + row0, wt * acc0, mask=first)
    gl.store(y_ptr + r * H + row0 + 8, wt * acc8, mask=first)


def shuffle(blocks):
    """blocks [S, NB, 16, K] uint8 codes (0..15; a block's 16 rows as the MMA's A rows) -> int32 words
    [S, NB, K/128, 32, 8]: word (block, group, lane, tile) holds the lane's A fragment of that 16 x 16 tile."""
    S, NB, _, K = blocks.shape
    c = blocks.to(torch.int64).view(S, NB, 16, K // 128, 8, 16)        # s, block, row, group, tile, col
    word = torch.zeros(S, NB, K // 128, 32, 8, dtype=torch.int64)
    # a0,a1: row g, cols 2t, 2t+1; a2,a3: row g+8; a4..a7: the same, cols + 8; a_2k in bits 4k, a_2k+1 in 16 + 4k
    parts = [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for e, (dr, dc) in enumerate(parts):
            v = c[:, :, g + dr, :, :, 2 * t + dc]                      # [S, NB, group, tile]
            word[:, :, :, lane] |= v << (4 * (e // 2) + 16 * (e % 2))
    return ((word + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)


def gate_up_blocks(codes):
    """codes [S, 2I, H] -> [S, I/8, 16, H]: block rb = gate rows rb*8 .. rb*8+7, then the same up rows."""
    S, I2, H = codes.shape
    gate, up = codes[:, :I2 // 2].reshape(S, -1, 8, H), codes[:, I2 // 2:].reshape(S, -1, 8, H)
    return torch.cat([gate, up], 2)


def xfrag(x):
    """x [H] bf16 -> int32 [4 tig, H/16 tiles, 2]: b0 = (x[k0+2tig], x[k0+2tig+1]), b1 = (x[k0+2tig+8], +9)."""
    H = x.numel()
    xt = x.view(torch.int16).view(H // 16, 16)
    out = torch.empty(4, H // 16, 2, 2, dtype=torch.int16, device=x.device)
    for tig in range(4):
        out[tig, :, 0] = xt[:, 2 * tig:2 * tig + 2]
        out[tig, :, 1] = xt[:, 2 * tig + 8:2 * tig + 10]
    return out.view(torch.int32).view(4, H // 16, 2).contiguous()


def check_layout():
    """On the CPU: the shuffled words give each lane the A fragment of mma.sync m16n8k16 (row-major A: a0,a1 row
    g, cols 2t, 2t+1; a2,a3 row g+8; a4..a7 the same at cols + 8) of [gate rows rb*8.. ; up rows], and xfrag the B
    fragment (b0 = k 2t, 2t+1; b1 = k 2t+8, 2t+9)."""
    torch.manual_seed(0)
    S, I, H = 1, 16, 256
    codes = torch.randint(0, 16, (S, 2 * I, H), dtype=torch.uint8)
    blocks = gate_up_blocks(codes)
    words = shuffle(blocks)
    spots = [(0, 0), (8, 0), (0, 8), (8, 8)]                          # (row, col) of a lane's reg k, past g, 2t
    for rb in range(I // 8):
        for grp in range(H // 128):
            for j in range(8):
                A = torch.zeros(16, 16, dtype=torch.int64)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    w = int(words[0, rb, grp, lane, j]) & 0xFFFFFFFF
                    for k, (dr, dc) in enumerate(spots):
                        r = (w >> (4 * k)) & 0x000F000F
                        A[g + dr, 2 * t + dc], A[g + dr, 2 * t + dc + 1] = r & 0xFFFF, r >> 16
                k0 = grp * 128 + j * 16
                want = torch.cat([codes[0, rb * 8:rb * 8 + 8, k0:k0 + 16], codes[0, I + rb * 8:I + rb * 8 + 8, k0:k0 + 16]])
                assert (A == want.to(torch.int64)).all() and (A == blocks[0, rb, :, k0:k0 + 16]).all(), (rb, grp, j)
    x = torch.randn(H).bfloat16()
    xf, xi = xfrag(x), x.view(torch.int16)
    for tile in range(H // 16):
        for t in range(4):
            b0, b1 = int(xf[t, tile, 0]) & 0xFFFFFFFF, int(xf[t, tile, 1]) & 0xFFFFFFFF
            got = [b0 & 0xFFFF, b0 >> 16, b1 & 0xFFFF, b1 >> 16]
            assert got == [int(xi[tile * 16 + k]) & 0xFFFF for k in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9)]


def main():
    check_layout()
    nws = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4,8").split(",")]
    H = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    I = int(sys.argv[3]) if len(sys.argv) > 3 else 768
    S, K, calls, G = 256, 8, 16, 128
    torch.manual_seed(0)
    w = torch.randn(2 * I, H, device="cuda") * 0.02
    q, s, z, block = quantize("int4", w, G, symmetric=False)  # codes two a byte, s fp16, z uint8
    codes = torch.stack([q & 15, q >> 4], -1).view(2 * I, H).cpu()  # low nibble first (kernels.quant's order)
    words = shuffle(gate_up_blocks(codes[None])).to("cuda")                          # [1, I/8, H/128, 32, 8]
    qs = words.reshape(1, -1).repeat(S, 1).contiguous()
    ss = s.float().reshape(1, 2 * I, H // G).repeat(S, 1, 1).contiguous()
    zs = z.reshape(1, 2 * I, H // G).repeat(S, 1, 1).contiguous()
    x = torch.randn(H, device="cuda").bfloat16()
    xf = xfrag(x)
    sx = x.float().view(H // G, G).sum(1).contiguous()
    wdq = (codes.to("cuda").float() - z.float().repeat_interleave(G, 1)) * s.float().repeat_interleave(G, 1)
    gu = wdq @ x.float()
    ref = torch.nn.functional.silu(gu[:I]) * gu[I:]
    print(json.dumps({"device": torch.cuda.get_device_name(), "H": H, "I": I, "ref_norm": float(ref.norm())}), flush=True)
    sets = [torch.randperm(S, device="cuda")[:K].to(torch.int32) for _ in range(calls)]
    h = torch.empty(K, I, device="cuda")
    for nw in nws:
        def run(i):
            _gate_up_mma[(K, I // 8)](qs, qs.stride(0), ss, zs, zs.stride(0), zs.stride(1), sets[i], xf, sx, h, I, H=H,
                                     NW=nw, asm=ASM8, cons=CONS8, num_warps=nw)
        try:
            run(0); torch.cuda.synchronize()
            err = float((h - ref[None]).abs().max())
            us = m._graph_us(run, calls)
            print(json.dumps({"kernel": "mma", "warps": nw, "us": round(us, 2), "err": err,
                              "GBps": round(K * (qs[0].numel() * 4 + ss[0].numel() * 2 + zs[0].numel()) / us / 1e3, 1)}), flush=True)
        except Exception as e:
            print(json.dumps({"kernel": "mma", "warps": nw, "error": str(e)[:2000]}), flush=True)
    # the tree's gate_up kernel alone, default tile
    (wgu, wd), per_slot = m._bench_weights("int4", S, H, I, G)
    xx = x.view(1, H)
    (bi, bh, bo, bi2), warps = m.BLOCKS["int4"]
    parts, fmt = m._weight_args(wgu, bh)
    hh = torch.empty(K, I, device="cuda")
    (b_gu, b_d), (a, clamp) = m.bias_args(None, xx), m.act_args(m.SILU)
    def run2(i):
        m._gate_up_kernel[(K, triton.cdiv(I, bi))](xx, *parts, sets[i], hh, *b_gu, H, I, K, xx.stride(0), *a, m._F23, **fmt,
                                                   BLOCK_I=bi, BLOCK_H=bh, EVEN_K=True, BIAS=False, CLAMP=clamp, num_warps=warps)
    us = m._graph_us(run2, calls)
    print(json.dumps({"kernel": "gemv", "warps": warps, "us": round(us, 2),
                      "GBps": round(K * (2 / 3) * per_slot / us / 1e3, 1)}), flush=True)
    # down: the same on [H, I] weights, h from the reference (rounded to bf16), a weight per route
    wdn = torch.randn(H, I, device="cuda") * 0.02
    qd, sd, zd, _ = quantize("int4", wdn, G, symmetric=False)
    cd = torch.stack([qd & 15, qd >> 4], -1).view(H, I).cpu()
    qds = shuffle(cd.view(1, H // 16, 16, I)).to("cuda").reshape(1, -1).repeat(S, 1).contiguous()
    sds = sd.float().reshape(1, H, I // G).repeat(S, 1, 1).contiguous()
    zds = zd.reshape(1, H, I // G).repeat(S, 1, 1).contiguous()
    hb = ref.bfloat16()
    hf = xfrag(hb).reshape(1, -1).repeat(K, 1).contiguous()
    sh = hb.float().view(I // G, G).sum(1).reshape(1, -1).repeat(K, 1).contiguous()
    rw = torch.rand(K, device="cuda")
    wddq = (cd.to("cuda").float() - zd.float().repeat_interleave(G, 1)) * sd.float().repeat_interleave(G, 1)
    yref = rw[:, None] * (wddq @ hb.float())[None]
    y = torch.empty(K, H, device="cuda")
    for nw in nws:
        def run3(i):
            _down_mma[(K, H // (16 * nw))](qds, qds.stride(0), sds, zds, zds.stride(0), zds.stride(1), sets[i], hf, sh,
                                           rw, y, H, I=I, NW=nw, asm=ASM8, cons=CONS8, num_warps=nw)
        try:
            run3(0); torch.cuda.synchronize()
            err = float((y - yref).abs().max())
            us = m._graph_us(run3, calls)
            print(json.dumps({"kernel": "mma_down", "warps": nw, "us": round(us, 2), "err": err, "yref_max": float(yref.abs().max()),
                              "GBps": round(K * (qds[0].numel() * 4 + sds[0].numel() * 2 + zds[0].numel()) / us / 1e3, 1)}), flush=True)
        except Exception as e:
            print(json.dumps({"kernel": "mma_down", "warps": nw, "error": str(e)[:2000]}), flush=True)
    parts, fmt = m._weight_args(wd, bi2)
    hh2 = hh.clone()
    def run4(i):
        m._down_kernel[(K, triton.cdiv(H, bo))](hh2, *parts, sets[i], rw, y, *b_d, H, I, m._F23, XDT=m._TL[xx.dtype], **fmt,
                                               BLOCK_O=bo, BLOCK_I=bi2, EVEN_K=I % bi2 == 0, BIAS=False, num_warps=warps)
    us = m._graph_us(run4, calls)
    print(json.dumps({"kernel": "gemv_down", "warps": warps, "us": round(us, 2),
                      "GBps": round(K * (1 / 3) * per_slot / us / 1e3, 1)}), flush=True)
    n = 64 << 20
    a_, b_ = torch.empty(n, dtype=torch.int32, device="cuda"), torch.empty(n, dtype=torch.int32, device="cuda")
    cu = m._graph_us(lambda i: b_.copy_(a_), 4)
    print(json.dumps({"copy_GBps": round(2 * n * 4 / cu / 1e3, 1)}), flush=True)


if __name__ == "__main__":
    main()
