"""Probe (issue 20): g36's int4 decode GEMVs on mma.sync from registers, reading the tree's own int4 slots (codes two
a byte, row-major, low nibble first; fp16 scales and uint8 zero points per group of 128) instead of codes shuffled
at convert time. The dot's K order is permuted: lane (g, t) loads 16 bytes of each of its two rows, the columns
32t .. 32t + 31 of a group, and (w >> 4s) & 0x000F000F | 0x43004300 makes a bf16x2 register of codes s and s + 4
of a word w (128 + code, exact), the A fragment of 8 tiles; x is read permuted to match, within 8 columns the
words (x0, x4), (x1, x5), (x2, x6), (x3, x7) (`permute_x`). Beside g16/mma4.py's kernels (shuffled codes) and the
tree's GEMVs, bench_quant's method (16 calls in one CUDA graph over 256 slots, 8 routes, T = 1). Four variants:
x's permuted words made outside the timed kernels (as mma4.py does) or paired from x's own words by two PRMTs a
tile in the kernel; the group sums of x made outside or by a second MMA a tile (A all ones); beside them, the
outside prep's own time (torch ops in a graph).
python3 mma4k.py [NW,...] [H] [I] on a GPU; python3 mma4k.py --emulate interprets the generated PTX for a warp on
the CPU (tests/test_moe_mma.py's interpreter since the path landed), on the operands the kernels' index arithmetic
loads, against the plain dot products."""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "g16"), os.path.join(HERE, "..", "..", "..", "..", "tests")]
from freetoken_kernels import moe_triton as m  # noqa: E402
from test_moe_mma import run_asm  # noqa: E402  (the PTX interpreter of the tensor-core path's tests)

SHIFTS = [(m_, s0) for m_ in range(4) for s0 in (0, 2)]   # tile j = 2m + s0 / 2: word m, codes s0, s0 + 1 (+ 4)


def tile_asm_k(xperm=False, sums=False):
    """$0 $1: the raw sums (128 + c) . x of rows g and g + 8, $2: the group's sum of x (sums: one more MMA a tile,
    A all ones; else 0); $3-$6 row g's words, $7-$10 row g + 8's; $11-$26 x's words: b0, b1 of tiles 0-7, or
    (xperm) x's own words of the lane's 32 columns, paired by PRMT here (b0 = low halves of words i and i + 2,
    b1 = their high halves)."""
    lines = ["{", ".reg .b32 a0, a1, a2, a3, s, b0, b1, one;", ".reg .f32 d0, d1, d2, d3, e0, e1, e2, e3;",
             "mov.b32 one, 0x3F803F80;"] + [f"mov.f32 {r}, 0f00000000;" for r in ("d0", "d1", "d2", "d3", "e0", "e1", "e2", "e3")]
    for j, (mw, s0) in enumerate(SHIFTS):
        wg, wu = f"${3 + mw}", f"${7 + mw}"
        for k, (w, sh) in enumerate([(wg, s0), (wu, s0), (wg, s0 + 1), (wu, s0 + 1)]):   # A regs: g, g+8, g (+8 k), g+8
            if sh:
                lines += [f"shr.u32 s, {w}, {4 * sh};", f"lop3.b32 a{k}, s, 0x000F000F, 0x43004300, 0xEA;"]
            else:
                lines.append(f"lop3.b32 a{k}, {w}, 0x000F000F, 0x43004300, 0xEA;")
        if xperm:   # x words i = 4m + s0 / 2 and i + 2 hold x[8m + s0 (+1)] and x[8m + s0 + 4 (+1)]
            i = 4 * mw + s0 // 2
            lines += [f"prmt.b32 b0, ${11 + i}, ${13 + i}, 0x5410;", f"prmt.b32 b1, ${11 + i}, ${13 + i}, 0x7632;"]
            b = "b0, b1"
        else:
            b = f"${11 + 2 * j}, ${12 + 2 * j}"
        lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{d0, d1, d2, d3}}, {{a0, a1, a2, a3}}, {{{b}}}, {{d0, d1, d2, d3}};")
        if sums:
            lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{e0, e1, e2, e3}}, {{one, one, one, one}}, {{{b}}}, {{e0, e1, e2, e3}};")
    lines += ["mov.f32 $0, d0;", "mov.f32 $1, d2;", "mov.f32 $2, e0;", "}"]
    return "\n".join(lines)


CONS = "=r,=r,=r," + ",".join(["r"] * 24)


def permute_x(x):
    """x [..., K] bf16 -> int32 [..., K / 2]: within each 8 columns the words (x0, x4), (x1, x5), (x2, x6), (x3, x7)."""
    return x.unflatten(-1, (-1, 2, 4)).transpose(-1, -2).contiguous().view(torch.int32).flatten(-3)


def emulate():
    """tile_asm_k's PTX, interpreted for a warp (run_asm), on the operands the kernels' index arithmetic loads (lane
    (g, t): words grp * 16 + 4t + i of rows g and g + 8; x's words grp * 64 + 16t + i, permuted outside or x's
    own), against the plain dot products (128 + code) . x of the two rows over the group and the group's sum of x."""
    torch.manual_seed(0)
    K = 256
    codes = torch.randint(0, 16, (16, K), dtype=torch.uint8)
    q = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous().view(torch.int32)        # the tree's packing
    x = torch.randn(K).bfloat16()
    for xperm in (False, True):
        for sums in (False, True):
            xs = x.view(torch.int32) if xperm else permute_x(x)
            for grp in range(K // 128):
                ops = [[int(q[g + dr, grp * 16 + 4 * t + i]) for dr in (0, 8) for i in range(4)] +
                       [int(xs[grp * 64 + 16 * t + i]) for i in range(16)] for g, t in (divmod(lane, 4) for lane in range(32))]
                out = run_asm(tile_asm_k(xperm, sums), ops)
                cols = slice(grp * 128, grp * 128 + 128)
                want = (128.0 + codes[:, cols].double()) @ x[cols].double()
                for lane, (d0, d2, e0) in enumerate(out):
                    g = lane // 4
                    assert abs(d0 - want[g]) < 1e-9 and abs(d2 - want[g + 8]) < 1e-9, (xperm, sums, grp, lane)
                    assert abs(e0 - (float(x[cols].double().sum()) if sums else 0.0)) < 1e-9, (xperm, sums, grp, lane)
    print("emulated: tile_asm_k's PTX, x permuted outside or paired by PRMT, gives the group dot products exactly, "
          "and the ones-MMA the group sums")


def kernels():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from mma4 import _split8

    @gluon.jit
    def _split4(v):  # [A, B, 4] -> 4 x [A, B]
        a, b = gl.split(gl.reshape(v, [v.shape[0], v.shape[1], 2, 2]))
        a0, a2 = gl.split(a)
        a1, a3 = gl.split(b)
        return a0, a1, a2, a3

    @gluon.jit
    def _group(q_g, q_u, xp, NW: gl.constexpr, S4: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr):
        wg0, wg1, wg2, wg3 = _split4(gl.load(q_g))
        wu0, wu1, wu2, wu3 = _split4(gl.load(q_u))
        xa, xb = gl.split(gl.reshape(gl.load(xp), [NW, 32, 8, 2]))
        x0, x1, x2, x3, x4, x5, x6, x7 = _split8(xa)
        y0, y1, y2, y3, y4, y5, y6, y7 = _split8(xb)
        xs = [gl.convert_layout(t, S4) for t in (x0, y0, x1, y1, x2, y2, x3, y3, x4, y4, x5, y5, x6, y6, x7, y7)]
        ws = [gl.convert_layout(t, S4) for t in (wg0, wg1, wg2, wg3, wu0, wu1, wu2, wu3)]
        return gl.inline_asm_elementwise(asm, cons, ws + xs,
                                         dtype=(gl.float32, gl.float32, gl.float32), is_pure=True, pack=1)

    @gluon.jit
    def gate_up(q_ptr, sq_s, sq_r, s_ptr, ss_s, ss_r, z_ptr, sz_s, sz_r, slot_ptr, xp_ptr, sx_ptr, h_ptr, I,
                H: gl.constexpr, NW: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr, SUMS: gl.constexpr):
        """A program: a route and 8 intermediate rows (gate row g and up row g, as MMA rows g and g + 8), its warps
        1/NW of the groups each, summed across warps; h = silu(gate) * up."""
        r, rb = gl.program_id(0), gl.program_id(1)
        L4: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
        L16: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
        S4: gl.constexpr = gl.SliceLayout(2, L4)
        slot = gl.load(slot_ptr + r).to(gl.int64)
        warp = gl.arange(0, NW, layout=gl.SliceLayout(1, S4))[:, None]
        lane = gl.arange(0, 32, layout=gl.SliceLayout(0, S4))[None, :]
        j4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L4)))[None, None, :]
        warp16 = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L16)))[:, None, None]
        lane16 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L16)))[None, :, None]
        j16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, L16)))[None, None, :]
        NG: gl.constexpr = H // 128
        GW: gl.constexpr = NG // NW
        row_g = rb * 8 + lane // 4                                   # [1, 32]: gate row; up row I + row_g
        qg = q_ptr + slot * sq_s + row_g[:, :, None] * sq_r + (lane[:, :, None] % 4) * 4 + j4
        qu = qg + I * sq_r
        acc_g = gl.zeros([NW, 32], gl.float32, S4)
        acc_u = gl.zeros([NW, 32], gl.float32, S4)
        for gi in gl.static_range(GW):
            grp = warp * GW + gi                                     # [NW, 1]
            off = (warp[:, :, None] * GW + gi) * 16
            dg, du, sx = _group(qg + off, qu + off, xp_ptr + (warp16 * GW + gi) * 64 + (lane16 % 4) * 16 + j16,
                                NW, S4, asm, cons)
            if not SUMS:
                sx = gl.load(sx_ptr + grp)
            zg = gl.load(z_ptr + slot * sz_s + row_g * sz_r + grp).to(gl.float32)
            zu = gl.load(z_ptr + slot * sz_s + (I + row_g) * sz_r + grp).to(gl.float32)
            sg = gl.load(s_ptr + slot * ss_s + row_g * ss_r + grp).to(gl.float32)
            su = gl.load(s_ptr + slot * ss_s + (I + row_g) * ss_r + grp).to(gl.float32)
            acc_g += sg * (dg - (128.0 + zg) * sx)
            acc_u += su * (du - (128.0 + zu) * sx)
        gs = gl.sum(acc_g, axis=0)
        us = gl.sum(acc_u, axis=0)
        hv = gs / (1.0 + gl.exp(-gs)) * us
        ln = gl.arange(0, 32, layout=gl.SliceLayout(0, S4))
        gl.store(h_ptr + r * I + rb * 8 + ln // 4, hv, mask=ln % 4 == 0)

    @gluon.jit
    def down(q_ptr, sq_s, sq_r, s_ptr, ss_s, ss_r, z_ptr, sz_s, sz_r, slot_ptr, hp_ptr, sh_ptr, rw_ptr, y_ptr, H,
             I: gl.constexpr, NW: gl.constexpr, asm: gl.constexpr, cons: gl.constexpr, SUMS: gl.constexpr):
        """A program: a route and NW blocks of 16 output rows, a warp a block over every group; y = weight * (W h)."""
        r, ob = gl.program_id(0), gl.program_id(1)
        L4: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
        L16: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [NW, 1, 1], [2, 1, 0])
        S4: gl.constexpr = gl.SliceLayout(2, L4)
        slot = gl.load(slot_ptr + r).to(gl.int64)
        wt = gl.load(rw_ptr + r)
        warp = gl.arange(0, NW, layout=gl.SliceLayout(1, S4))[:, None]
        lane = gl.arange(0, 32, layout=gl.SliceLayout(0, S4))[None, :]
        j4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L4)))[None, None, :]
        lane16 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L16)))[None, :, None]
        warp16 = gl.arange(0, NW, layout=gl.SliceLayout(1, gl.SliceLayout(2, L16)))[:, None, None]
        j16 = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, L16)))[None, None, :]
        NG: gl.constexpr = I // 128
        row0 = (ob * NW + warp) * 16 + lane // 4                      # [NW, 32]: rows g and g + 8 of the block
        q0 = q_ptr + slot * sq_s + row0[:, :, None] * sq_r + (lane[:, :, None] % 4) * 4 + j4
        hb = hp_ptr + r * (I // 2) + (lane16 % 4) * 16 + j16 + warp16 * 0
        acc0 = gl.zeros([NW, 32], gl.float32, S4)
        acc8 = gl.zeros([NW, 32], gl.float32, S4)
        for gi in gl.static_range(NG):
            d0, d8, sh = _group(q0 + gi * 16, q0 + 8 * sq_r + gi * 16, hb + gi * 64, NW, S4, asm, cons)
            if not SUMS:
                sh = gl.load(sh_ptr + r * NG + gi)
            z0 = gl.load(z_ptr + slot * sz_s + row0 * sz_r + gi).to(gl.float32)
            z8 = gl.load(z_ptr + slot * sz_s + (row0 + 8) * sz_r + gi).to(gl.float32)
            s0 = gl.load(s_ptr + slot * ss_s + row0 * ss_r + gi).to(gl.float32)
            s8 = gl.load(s_ptr + slot * ss_s + (row0 + 8) * ss_r + gi).to(gl.float32)
            acc0 += s0 * (d0 - (128.0 + z0) * sh)
            acc8 += s8 * (d8 - (128.0 + z8) * sh)
        first = lane % 4 == 0
        gl.store(y_ptr + r * H + row0, wt * acc0, mask=first)
        gl.store(y_ptr + r * H + row0 + 8, wt * acc8, mask=first)

    return gate_up, down


def main():
    gate_up, down = kernels()
    nws = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4,8").split(",")]
    H = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    I = int(sys.argv[3]) if len(sys.argv) > 3 else 768
    S, K, calls, G = 256, 8, 16, 128
    torch.manual_seed(0)
    (wgu, wd), per_slot = m._bench_weights("int4", S, H, I, G)          # the tree's slots: one expert in every slot
    x = torch.randn(1, H, device="cuda").bfloat16()
    sets = [torch.randperm(S, device="cuda")[:K].to(torch.int32) for _ in range(calls)]
    rw = torch.rand(K, device="cuda")
    xp, sx = permute_x(x[0]), x[0].float().view(H // G, G).sum(1).contiguous()
    wdq_gu, wdq_d = wgu.dequant(0), wd.dequant(0)
    gu = wdq_gu @ x[0].float()
    href = torch.nn.functional.silu(gu[:I]) * gu[I:]
    hb = href.bfloat16()
    yref = rw[:, None] * (wdq_d @ hb.float())[None]
    hp = permute_x(hb).reshape(1, -1).repeat(K, 1).contiguous()
    xw, hw = x[0].contiguous().view(torch.int32), hb.view(torch.int32).reshape(1, -1).repeat(K, 1).contiguous()
    sh = hb.float().view(I // G, G).sum(1).reshape(1, -1).repeat(K, 1).contiguous()
    print(json.dumps({"device": torch.cuda.get_device_name(), "H": H, "I": I}), flush=True)

    def q32(w):
        return w.q.view(torch.int32)
    qg, qd = q32(wgu), q32(wd)
    h = torch.empty(K, I, device="cuda")
    y = torch.empty(K, H, device="cuda")
    # variants: x permuted outside (xp) or by PRMT in the kernel (x's own words); the group sums of x outside or
    # by a second MMA a tile (A all ones)
    for nw, xperm, sums in [(nw, xperm, sums) for nw in nws for xperm in (False, True) for sums in (False, True)]:
        asm = tile_asm_k(xperm, sums)
        xa, ha = (xw, hw) if xperm else (xp, hp)

        def run(i):
            gate_up[(K, I // 8)](qg, qg.stride(0), qg.stride(1), wgu.s, wgu.s.stride(0), wgu.s.stride(1), wgu.z,
                                 wgu.z.stride(0), wgu.z.stride(1), sets[i], xa, sx, h, I, H=H, NW=nw, asm=asm,
                                 cons=CONS, SUMS=sums, num_warps=nw)

        def run2(i):
            down[(K, H // (16 * nw))](qd, qd.stride(0), qd.stride(1), wd.s, wd.s.stride(0), wd.s.stride(1), wd.z,
                                      wd.z.stride(0), wd.z.stride(1), sets[i], ha, sh, rw, y, H, I=I, NW=nw, asm=asm,
                                      cons=CONS, SUMS=sums, num_warps=nw)
        tag = ("x by PRMT" if xperm else "x permuted outside") + (", sums by MMA" if sums else ", sums outside")
        for name, fn, out, ref, frac in (("mmak " + tag, run, h, href[None], 2 / 3),
                                         ("mmak_down " + tag, run2, y, yref, 1 / 3)):
            try:
                fn(0)
                torch.cuda.synchronize()
                err = float((out - ref).abs().max())
                us = m._graph_us(fn, calls)
                print(json.dumps({"kernel": name, "warps": nw, "us": round(us, 2), "err": err,
                                  "ref_max": float(ref.abs().max()), "GBps": round(K * frac * per_slot / us / 1e3, 1)}),
                      flush=True)
            except Exception as e:
                print(json.dumps({"kernel": name, "warps": nw, "error": str(e)[:2000]}), flush=True)
    us = m._graph_us(lambda i: (permute_x(x[0]), x[0].float().view(H // G, G).sum(1)), calls)
    print(json.dumps({"kernel": "x's permuted words and group sums by torch (the outside prep)", "us": round(us, 2)}), flush=True)
    (bi, bh, bo, bi2), warps = m.BLOCKS["int4"]
    us = m._graph_us(lambda i: m.moe_experts(x, wgu, wd, sets[i].view(1, K).long(), rw.view(1, K), reduce=False), calls)
    print(json.dumps({"kernel": "tree (both GEMVs)", "warps": warps, "us": round(us, 2),
                      "GBps": round(K * per_slot / us / 1e3, 1)}), flush=True)


if __name__ == "__main__":
    emulate() if "--emulate" in sys.argv else main()
