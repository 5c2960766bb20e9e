"""The tensor-core int4 path's PTX (freetoken_kernels/moe_mma.py), interpreted for a warp on the CPU: on the
operands its kernels' index arithmetic loads, each group's MMAs give the plain dot products (128 + code) . x of the
two rows and the group's sum of x. The kernels themselves run on CUDA (tests/test_triton_kernels.py)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported, as the other kernel tests
from freetoken_kernels import moe_mma  # noqa: E402


def _bf16(v: int) -> float:
    return torch.tensor([v & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).item()


def _prmt(a: int, b: int, sel: int) -> int:  # PTX prmt.b32, default mode: byte i = byte (sel >> 4i) & 7 of b:a
    src = (b << 32) | a
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def run_asm(asm: str, ops: list[list[int]]) -> list[list[float]]:
    """Interpret moe_mma's PTX for a warp: ops [32] lists of the input operands ($3 on) -> [32] lists of $0-$2.
    mma.sync m16n8k16 row.col bf16 -> f32 as PTX defines its fragments: A reg 0 row g, k 2t, 2t + 1, reg 1 row
    g + 8, regs 2, 3 the same at k + 8; B b0 k 2t, 2t + 1, b1 k 2t + 8, 2t + 9, column g; D d0, d1 row g, columns
    2t, 2t + 1, d2, d3 row g + 8."""
    regs = [{f"${3 + i}": v & 0xFFFFFFFF for i, v in enumerate(o)} for o in ops]
    val = lambda r, a: r[a] if a in r else int(a, 16) if a.startswith("0x") else int(a)  # noqa: E731
    a_at, d_at = [(0, 0), (8, 0), (0, 8), (8, 8)], [(0, 0), (0, 1), (8, 0), (8, 1)]
    for line in asm.split("\n"):
        ins, _, rest = line.strip().rstrip(";").partition(" ")
        if ins.startswith("mma.sync"):
            assert ins == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", ins
            d, a, b, c = [g.strip(" {}").split(", ") for g in rest.split("}, {")]
            A, B, C = (torch.zeros(n, m, dtype=torch.float64) for n, m in ((16, 16), (16, 8), (16, 8)))
            for lane, r in enumerate(regs):
                g, t = divmod(lane, 4)
                for k, (dr, dc) in enumerate(a_at):
                    A[g + dr, 2 * t + dc], A[g + dr, 2 * t + dc + 1] = _bf16(val(r, a[k])), _bf16(val(r, a[k]) >> 16)
                for k, dk in enumerate((0, 8)):
                    B[2 * t + dk, g], B[2 * t + dk + 1, g] = _bf16(val(r, b[k])), _bf16(val(r, b[k]) >> 16)
                for k, (dr, dc) in enumerate(d_at):
                    C[g + dr, 2 * t + dc] = r[c[k]]
            D = A @ B + C
            for lane, r in enumerate(regs):
                g, t = divmod(lane, 4)
                for k, (dr, dc) in enumerate(d_at):
                    r[d[k]] = float(D[g + dr, 2 * t + dc])
            continue
        args = [x.strip() for x in rest.split(",")]
        for r in regs:
            if ins == "mov.f32":
                r[args[0]] = r[args[1]] if args[1] in r else 0.0
            elif ins == "mov.b32":
                r[args[0]] = val(r, args[1])
            elif ins == "shr.u32":
                r[args[0]] = val(r, args[1]) >> val(r, args[2])
            elif ins == "lop3.b32":
                assert args[4] == "0xEA"                  # (a & b) | c
                r[args[0]] = (val(r, args[1]) & val(r, args[2])) | val(r, args[3])
            elif ins == "prmt.b32":
                r[args[0]] = _prmt(val(r, args[1]), val(r, args[2]), val(r, args[3]))
            else:
                assert ins in ("{", "}", ".reg"), line
    return [[r["$0"], r["$1"], r["$2"]] for r in regs]


@pytest.mark.parametrize("seed", [0, 1])
def test_tile_asm_gives_each_groups_dot_products(seed):
    gen = torch.Generator().manual_seed(seed)
    K = 256
    codes = torch.randint(0, 16, (16, K), dtype=torch.uint8, generator=gen)
    q = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous().view(torch.int32)     # the slots' int4 packing
    x = torch.randn(K, generator=gen).bfloat16()
    xw = x.view(torch.int32)
    for grp in range(K // 128):
        # lane (g, t): words grp * 16 + 4t + i of rows g and g + 8, x's words grp * 64 + 16t + i (the kernels' offsets)
        ops = [[int(q[g + dr, grp * 16 + 4 * t + i]) for dr in (0, 8) for i in range(4)] +
               [int(xw[grp * 64 + 16 * t + i]) for i in range(16)] for g, t in (divmod(lane, 4) for lane in range(32))]
        out = run_asm(moe_mma.ASM, ops)
        cols = slice(grp * 128, grp * 128 + 128)
        want = (128.0 + codes[:, cols].double()) @ x[cols].double()
        for lane, (d0, d8, sx) in enumerate(out):
            g = lane // 4
            assert (d0, d8) == pytest.approx((float(want[g]), float(want[g + 8])), abs=1e-9)
            assert sx == pytest.approx(float(x[cols].double().sum()), abs=1e-9)

