"""What every quantized-checkpoint format shares: the Scheme interface (which checkpoint tensors
make up one weight, and how to unpack them into freetoken_kernels.quant's layout), int32 bit unpacking,
and fusing the gate and up weights of an expert into its gate_up slot weight.

A weight W [N, K] (N output features, K input features) unpacks to QParts, the tuple
(q, s, z, block) that freetoken_kernels.quant.quantize returns: codes, scales, zero points (int formats)
and the scale block (bn, bk). Leading dimensions (fused [E, ...] expert tensors) are kept."""
from __future__ import annotations

import math

import torch

from engine.errors import UserError
from freetoken_kernels.quant import dequant, pack_nibbles

QParts = tuple  # (q, s, z | None, (bn, bk)) as freetoken_kernels.quant.quantize returns them


class Scheme:
    """One quantization method's checkpoint layout. `parts` maps a checkpoint name suffix to the
    suffix of the weight it belongs to ("X.qweight" -> "X.weight"); a tensor named like the weight
    itself (fp8's "X.weight") is the part None."""
    method = ""                       # quant_method in config.json
    fmt = ""                          # the freetoken_kernels.quant format its experts are kept in
    parts: dict[str, str] = {}

    def __init__(self, qc: dict):
        """Check config.json's quantization_config; UserError for what FreeToken cannot read."""

    def split(self, name: str) -> tuple[str, str | None]:
        """Checkpoint tensor name -> (the weight it belongs to, its part; None = the tensor itself)."""
        for suffix, base in self.parts.items():
            if name.endswith(suffix):
                return name[:-len(suffix)] + base, suffix
        return name, None

    def unpack(self, name: str, t: dict) -> QParts:
        """The parts {suffix: tensor} of weight `name` -> QParts in freetoken_kernels.quant's layout."""
        raise NotImplementedError


def need(name: str, t: dict, *suffixes: str | None) -> None:
    """UserError naming the first missing part of weight `name` (None: the tensor `name` itself)."""
    for s in suffixes:
        if s not in t:
            stem = name.removesuffix(".weight") if s and s.startswith(".") else name
            raise UserError(f"checkpoint lacks {stem}{s or ''}, a part of the quantized weight {name}; "
                            "it looks incomplete, re-download it")


def check_shape(what: str, t: torch.Tensor, want: tuple) -> None:
    if tuple(t.shape) != tuple(want):
        raise UserError(f"tensor {what} has shape {list(t.shape)}, expected {list(want)}; "
                        "the checkpoint's tensors and quantization config disagree")


def scale_groups(what: str, scales: torch.Tensor, dim: int, k: int, name: str) -> int:
    """Groups the scales tensor `what` makes along `dim` of the K = k input features of `name`."""
    groups = scales.shape[dim] if scales.dim() == 2 else 0
    if not groups or k % groups:
        raise UserError(f"tensor {what} has shape {list(scales.shape)}, which does not divide the "
                        f"{k} input features of {name} into groups; the checkpoint looks damaged")
    return groups


def fp8_parts(what: str, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int] | None) -> QParts:
    """e4m3 w [..., N, K] and its scales `what` s, one per (bn, bk) block (None: one per tensor,
    stored in any shape) -> QParts of freetoken_kernels.quant's fp8 (float32 scales)."""
    n, k = w.shape[-2:]
    bn, bk = block or (n, k)
    want = (*w.shape[:-2], math.ceil(n / bn), math.ceil(k / bk))
    if block is None and s.numel() == math.prod(want):
        s = s.reshape(want)
    check_shape(what, s, want)
    return w, s.float(), None, (bn, bk)


def unpack_int32(t: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words holding 32 // bits values each, the first in the lowest bits, packed along
    `dim` -> int32 values with that dimension 32 // bits times longer."""
    if t.dtype != torch.int32:
        raise UserError(f"packed tensor of dtype {t.dtype}, expected int32; the checkpoint looks damaged")
    dim = dim % t.dim()
    per = 32 // bits
    shifts = (torch.arange(per, dtype=torch.int32) * bits).view(-1, *[1] * (t.dim() - dim - 1))
    vals = (t.unsqueeze(dim + 1) >> shifts) & ((1 << bits) - 1)
    return vals.flatten(dim, dim + 1)


def codes_to_q(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes [..., N, K] -> freetoken_kernels.quant's q: uint8, two 4-bit codes a byte along K."""
    codes = codes.to(torch.uint8)
    return pack_nibbles(codes) if bits == 4 else codes.contiguous()


def fuse_gate_up(gate: QParts, up: QParts, name: str) -> QParts:
    """gate and up [I, K] -> gate_up [2I, K] (gate rows first). Row blocks must not straddle the
    two: where I is not a multiple of bn, blocks are refined to gcd(I, bn) rows (exact, each
    fine block repeats its coarse block's scale)."""
    (qg, sg, zg, bg), (qu, su, zu, bu) = gate, up
    if bg != bu or qg.shape != qu.shape or qg.dtype != qu.dtype:
        raise UserError(f"the gate and up weights of {name} are quantized differently; FreeToken needs "
                        "both in one format and block size")
    bn, bk = bg
    rows = qg.shape[-2]
    fine = math.gcd(rows, bn)
    if fine != bn:
        sg, su = (s.repeat_interleave(bn // fine, -2)[..., :rows // fine, :] for s in (sg, su))
    zs = None if zg is None else torch.cat([zg, zu], dim=-2)
    return torch.cat([qg, qu], dim=-2), torch.cat([sg, su], dim=-2), zs, (fine, bk)


def dequant_parts(fmt: str, p: QParts) -> torch.Tensor:
    """QParts with any leading dimensions -> float32 W [..., N, K] (freetoken_kernels.quant.dequant)."""
    q, s, z, block = p
    lead = q.shape[:-2]
    flat = [t.reshape(-1, *t.shape[-2:]) if t is not None else None for t in (q, s, z)]
    out = [dequant(fmt, flat[0][i], flat[1][i], None if z is None else flat[2][i], block)
           for i in range(flat[0].shape[0])]
    return torch.stack(out).view(*lead, *out[0].shape)
