"""Quantized expert weights: the runtime layout every kernel reads, and its plain-torch reference.

A quantized weight matrix W [N, K] (gate_up: N = 2I, K = H; down: N = H, K = I) is stored as
  q  codes  int4, mxfp4: uint8 [N, K // 2], two codes a byte along K, the even k in the low nibble
            int8:        uint8 [N, K], unsigned codes
            fp8:         float8_e4m3fn [N, K]
  s  scales [ceil(N / bn), ceil(K / bk)]: one scale per block of bn rows and bk columns;
            float16 / bfloat16 / float32, except mxfp4: uint8 e8m0 (scale = 2 ** (e - 127))
  z  zero points (int4, int8 only) uint8 [N, K // bk], the same blocks as s (bn = 1)
and dequantizes as
  int4, int8:  W[n, k] = (q[n, k] - z[n, k // bk]) * s[n, k // bk]     (symmetric: z = 8 / 128)
  fp8:         W[n, k] = float(q[n, k]) * s[n // bn, k // bk]
  mxfp4:       W[n, k] = E2M1[q[n, k]] * 2 ** (s[n, k // 32] - 127)
with block (bn, bk) = (1, group) for int4/int8, (1, 32) for mxfp4 and (bn, bk) as stored for
fp8 (128 x 128 in the published checkpoints). Every tensor carries a leading slot axis: [S, ...]
views of a slot pool or a host bank, like the unquantized [S, N, K] weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FORMATS = ("int4", "int8", "fp8", "mxfp4")
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@dataclass(frozen=True)
class QWeight:
    """One quantized weight of every slot: q [S, N, Kq], s [S, Nb, Kb], z [S, N, Kb] or None."""
    fmt: str
    q: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor | None
    block: tuple[int, int]       # (bn, bk)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(S, N, K) of the dequantized weights."""
        S, N, kq = self.q.shape
        return S, N, kq * 2 if self.fmt in ("int4", "mxfp4") else kq

    @property
    def nbytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (self.q, self.s, self.z) if t is not None)

    def dequant(self, slot: int) -> torch.Tensor:
        """W of one slot, float32 [N, K] (the reference every kernel is tested against)."""
        return dequant(self.fmt, self.q[slot], self.s[slot], None if self.z is None else self.z[slot],
                       self.block)


def unpack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K // 2] -> uint8 [..., K]: the even k from the low nibble, the odd from the high."""
    return torch.stack([q & 15, q >> 4], dim=-1).flatten(-2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K] of values 0..15 (K even) -> uint8 [..., K // 2] (inverse of unpack_nibbles)."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def _expand(t: torch.Tensor, bn: int, bk: int, n: int, k: int) -> torch.Tensor:
    """Per-block [Nb, Kb] -> per-element [n, k]."""
    return t.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def dequant(fmt: str, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None,
            block: tuple[int, int]) -> torch.Tensor:
    """One matrix (no slot axis) to float32 [N, K], by the formulas of the module docstring."""
    bn, bk = block
    if fmt in ("int4", "mxfp4"):
        codes = unpack_nibbles(q)
    elif fmt in ("int8", "fp8"):
        codes = q
    else:
        raise ValueError(f"unknown quantized format {fmt!r}; supported: {', '.join(FORMATS)}")
    n, k = codes.shape
    if fmt == "mxfp4":
        vals = torch.tensor(E2M1, dtype=torch.float32, device=q.device)[codes.long()]
        return vals * _expand(torch.exp2(s.float() - 127), bn, bk, n, k)
    if fmt == "fp8":
        return codes.float() * _expand(s.float(), bn, bk, n, k)
    return (codes.float() - _expand(z.float(), bn, bk, n, k)) * _expand(s.float(), bn, bk, n, k)


def quantize(fmt: str, w: torch.Tensor, group: int, scale_dtype: torch.dtype = torch.float16,
             symmetric: bool = True):
    """W [N, K] (float) -> (q, s, z, block) in this module's layout: group-wise absmax (symmetric)
    or min/max (asymmetric) for int4/int8, per-block absmax for fp8 (group x group blocks, float32
    scales), power-of-two block scales for mxfp4 (group fixed at 32)."""
    w = w.float()
    n, k = w.shape
    if fmt == "mxfp4":
        group = 32
    if k % group or (fmt in ("int4", "mxfp4") and k % 2):
        raise ValueError(f"group size {group} does not divide the dimension {k}")
    if fmt == "fp8":
        nb, kb = -(-n // group), k // group
        pad = torch.zeros(nb * group, k, device=w.device)
        pad[:n] = w
        amax = pad.view(nb, group, kb, group).abs().amax(dim=(1, 3)).clamp_min(1e-12)
        s = amax / torch.finfo(torch.float8_e4m3fn).max
        q = (w / _expand(s, group, group, n, k)).to(torch.float8_e4m3fn)
        return q, s, None, (group, group)
    g = w.view(n, k // group, group)
    if fmt == "mxfp4":
        amax = g.abs().amax(-1).clamp_min(2.0 ** -126)
        e = (torch.floor(torch.log2(amax)) - 2).clamp(-127, 127)   # 6 = 1.5 * 2**2: max code
        s = (e + 127).to(torch.uint8)
        vals = torch.tensor(E2M1, device=w.device)
        scaled = (g / torch.exp2(e)[..., None]).reshape(n, k)
        codes = (scaled[..., None] - vals).abs().argmin(-1)
        return pack_nibbles(codes), s, None, (1, 32)
    top = 15 if fmt == "int4" else 255
    if symmetric:
        mid = (top + 1) // 2
        s = (g.abs().amax(-1) / (mid - 1)).clamp_min(1e-12)
        z = torch.full_like(s, mid)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        s = ((hi - lo) / top).clamp_min(1e-12)
        z = torch.round(-lo / s).clamp(0, top)
    s = s.to(scale_dtype)
    codes = torch.round(g / s.float()[..., None] + z[..., None]).clamp(0, top).reshape(n, k)
    codes = codes.to(torch.uint8)
    z = z.to(torch.uint8)
    return (pack_nibbles(codes) if fmt == "int4" else codes), s, z, (1, group)
