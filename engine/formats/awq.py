"""AWQ (`quant_method: awq`, AutoAWQ, `version: gemm`, 4 bits): a weight W [N, K] is
  qweight  int32 [K, N / 8]: 8 codes a word along N, in the interleaved order AWQ_ORDER
  qzeros   int32 [K / group, N / 8]: zero points packed the same way
  scales   float16 [K / group, N]
dequantized as W[n, k] = (code[k, n] - zero[k // group, n]) * scales[k // group, n]. Nibble i
(bits 4i..4i+3) of word c holds column 8c + AWQ_ORDER[i]. Kept as freetoken_kernels.quant's int4."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.formats.base import QParts, Scheme, check_shape, codes_to_q, need, scale_groups, unpack_int32

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def deinterleave(vals: torch.Tensor) -> torch.Tensor:
    """[R, 8 * C] values in nibble order -> [R, 8 * C] in column order."""
    r, c = vals.shape
    order = torch.tensor(AWQ_ORDER).argsort()  # column j sits at nibble order.argsort()[j]
    return vals.view(r, c // 8, 8)[..., order].reshape(r, c)


class AWQ(Scheme):
    method, fmt = "awq", "int4"
    parts = {".qweight": ".weight", ".qzeros": ".weight", ".scales": ".weight"}

    def __init__(self, qc: dict):
        bits = qc.get("bits", qc.get("w_bit"))
        version = str(qc.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm":
            raise UserError(f"AWQ with {bits} bits and version {version!r} is not supported; FreeToken reads "
                            "4-bit AWQ in the GEMM packing (version gemm)")

    def unpack(self, name: str, t: dict) -> QParts:
        need(name, t, ".qweight", ".qzeros", ".scales")
        stem = name.removesuffix(".weight")
        codes = deinterleave(unpack_int32(t[".qweight"], 4, 1))   # [K, N]
        k, n = codes.shape
        scales = t[".scales"]
        groups = scale_groups(f"{stem}.scales", scales, 0, k, name)
        check_shape(f"{stem}.scales", scales, (groups, n))
        check_shape(f"{stem}.qzeros", t[".qzeros"], (groups, n // 8))
        zeros = deinterleave(unpack_int32(t[".qzeros"], 4, 1))
        return codes_to_q(codes.t(), 4), scales.t().contiguous(), zeros.t().to(torch.uint8).contiguous(), \
            (1, k // groups)
