"""Emulate mma4's kernels lane by lane on the CPU (PYTHONPATH=. python3 benchmarks/results/2026-12-03-h200-vi/g16/emulate.py) (their index arithmetic transcribed, mma.sync's fragments as PTX
defines them) against the dequantized products."""
import sys, torch
sys.path.insert(0, "benchmarks/results/2026-12-03-h200-vi/g16")
import mma4
from kernels.quant import quantize
torch.manual_seed(0)
H, I, G = 512, 256, 128
def regs_to_A(wl):  # wl [32] words of one tile -> A [16, 16] bf16-values (128 + c)
    A = torch.zeros(16, 16)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        w = int(wl[lane]) & 0xFFFFFFFF
        for k, (dr, dc) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
            r = ((w >> (4 * k)) & 0x000F000F) | 0x43004300
            lo, hi = torch.tensor([r & 0xFFFF, r >> 16], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
            A[g + dr, 2 * t + dc], A[g + dr, 2 * t + dc + 1] = lo, hi
    return A
def frag_to_B(xf_flat, idx):  # idx(lane, j) -> (b0 index, b1 index) into xf_flat int32; B [16, 8]
    B = torch.zeros(16, 8)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        i0, i1 = idx(lane)
        for reg, kk in ((int(xf_flat[i0]), 2 * t), (int(xf_flat[i1]), 2 * t + 8)):
            v = torch.tensor([reg], dtype=torch.int32).view(torch.bfloat16).float()
            B[kk, g], B[kk + 1, g] = v[0], v[1]
    return B
# gate_up
w = torch.randn(2 * I, H) * 0.02
q, s, z, _ = quantize("int4", w, G, symmetric=False)
codes = torch.stack([q & 15, q >> 4], -1).view(2 * I, H)
qs = mma4.shuffle(mma4.gate_up_blocks(codes[None])).reshape(-1)
x = torch.randn(H).bfloat16(); xf = mma4.xfrag(x).reshape(-1); sx = x.float().view(H // G, G).sum(1)
ss, zs = s.float(), z
NW = 2; NG = H // 128; GW = NG // NW
h = torch.zeros(I)
for rb in range(I // 8):
    acc_g = torch.zeros(NW, 32); acc_u = torch.zeros(NW, 32)
    for warp in range(NW):
        for gi in range(GW):
            D = torch.zeros(16, 8)
            for j in range(8):
                wl = [qs[rb * (NG * 32 * 8) + ((warp * GW + gi) * 32 + lane) * 8 + j] for lane in range(32)]
                def idx(lane, j=j):
                    base = (lane % 4) * (H // 8) + (warp * GW + gi) * 16 + 2 * j
                    return base, base + 1
                D += regs_to_A(wl) @ frag_to_B(xf, idx)
            grp = warp * GW + gi
            for lane in range(32):
                g, t = lane // 4, lane % 4
                dg, du = D[g, 2 * t], D[g + 8, 2 * t]
                rg = rb * 8 + g
                acc_g[warp, lane] += ss[rg, grp] * (dg - (128 + zs[rg, grp].float()) * sx[grp])
                acc_u[warp, lane] += ss[I + rg, grp] * (du - (128 + zs[I + rg, grp].float()) * sx[grp])
    gs, us = acc_g.sum(0), acc_u.sum(0)
    for lane in range(0, 32, 4):
        h[rb * 8 + lane // 4] = gs[lane] / (1 + torch.exp(-gs[lane])) * us[lane]
wdq = (codes.float() - z.float().repeat_interleave(G, 1)) * s.float().repeat_interleave(G, 1)
gu = wdq @ x.float(); ref = torch.nn.functional.silu(gu[:I]) * gu[I:]
print("gate_up max err", float((h - ref).abs().max()), "ref max", float(ref.abs().max()))
# down
wd = torch.randn(H, I) * 0.02
qd, sd, zd, _ = quantize("int4", wd, G, symmetric=False)
cd = torch.stack([qd & 15, qd >> 4], -1).view(H, I)
qds = mma4.shuffle(cd.view(1, H // 16, 16, I)).reshape(-1)
hb = ref.bfloat16(); hf = mma4.xfrag(hb).reshape(-1); sh = hb.float().view(I // G, G).sum(1)
NG = I // 128; NW = 2; y = torch.zeros(H); wt = 0.7
for ob in range(H // (16 * NW)):
    for warp in range(NW):
        blk = ob * NW + warp
        acc0 = torch.zeros(32); acc8 = torch.zeros(32)
        for gi in range(NG):
            D = torch.zeros(16, 8)
            for j in range(8):
                wl = [qds[((blk * NG + gi) * 32 + lane) * 8 + j] for lane in range(32)]
                def idx(lane, j=j):
                    base = (lane % 4) * (I // 8) + gi * 16 + 2 * j
                    return base, base + 1
                D += regs_to_A(wl) @ frag_to_B(hf, idx)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                r0 = blk * 16 + g
                acc0[lane] += sd[r0, gi].float() * (D[g, 2 * t] - (128 + zd[r0, gi].float()) * sh[gi])
                acc8[lane] += sd[r0 + 8, gi].float() * (D[g + 8, 2 * t] - (128 + zd[r0 + 8, gi].float()) * sh[gi])
        for lane in range(0, 32, 4):
            y[blk * 16 + lane // 4] = wt * acc0[lane]; y[blk * 16 + lane // 4 + 8] = wt * acc8[lane]
wddq = (cd.float() - zd.float().repeat_interleave(G, 1)) * sd.float().repeat_interleave(G, 1)
yref = wt * (wddq @ hb.float())
print("down max err", float((y - yref).abs().max()), "ref max", float(yref.abs().max()))
