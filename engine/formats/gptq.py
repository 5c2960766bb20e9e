"""GPTQ (`quant_method: gptq`, AutoGPTQ / GPTQModel, `desc_act` false): a weight W [N, K] is
  qweight  int32 [K * bits / 32, N]: 32 / bits codes a word along K, the first in the lowest bits
  qzeros   int32 [K / group, N * bits / 32]: zero points packed the same way along N
  scales   float16 [K / group, N]
  g_idx    int32 [K] = k // group (optional; anything else is act-order, refused)
dequantized as W[n, k] = scales[g, n] * (code[k, n] - zero[g, n]), g = k // group. The original
`checkpoint_format: gptq` stores each zero point minus one (read back as stored + 1);
`gptq_v2` stores it as is. Symmetric checkpoints (`sym: true`) carry the zero 2 ** (bits - 1)
like any other. Bits 4 and 8 map to freetoken_kernels.quant's int4 / int8 with z per group."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.formats.base import QParts, Scheme, check_shape, codes_to_q, need, scale_groups, unpack_int32


class GPTQ(Scheme):
    method = "gptq"
    parts = {".qweight": ".weight", ".qzeros": ".weight", ".scales": ".weight", ".g_idx": ".weight"}

    def __init__(self, qc: dict):
        self.bits = qc.get("bits")
        if self.bits not in (4, 8):
            raise UserError(f"GPTQ with {self.bits} bits is not supported; FreeToken reads 4- and 8-bit GPTQ")
        if qc.get("desc_act"):
            raise UserError("GPTQ with desc_act (act-order) is not supported: its groups follow a permutation "
                            "of the input channels; use a checkpoint quantized with desc_act false")
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise UserError(f"GPTQ checkpoint_format {fmt!r} is not supported; FreeToken reads gptq and gptq_v2")
        self.fmt, self.zero_offset = f"int{self.bits}", int(fmt == "gptq")

    def unpack(self, name: str, t: dict) -> QParts:
        need(name, t, ".qweight", ".qzeros", ".scales")
        stem, per = name.removesuffix(".weight"), 32 // self.bits
        codes = unpack_int32(t[".qweight"], self.bits, 0)           # [K, N]
        k, n = codes.shape
        scales = t[".scales"]
        groups = scale_groups(f"{stem}.scales", scales, 0, k, name)
        check_shape(f"{stem}.scales", scales, (groups, n))
        check_shape(f"{stem}.qzeros", t[".qzeros"], (groups, -(-n // per)))
        group = k // groups
        if ".g_idx" in t and not torch.equal(t[".g_idx"].long(), torch.arange(k) // group):
            raise UserError(f"{stem}.g_idx is not k // group_size: the checkpoint is act-order (desc_act) "
                            "GPTQ, which is not supported; use one quantized with desc_act false")
        zeros = unpack_int32(t[".qzeros"], self.bits, 1)[:, :n] + self.zero_offset  # [K / group, N]
        if int(zeros.max()) > 255:
            raise UserError(f"{stem}.qzeros holds a zero point of 256 (an 8-bit gptq-format zero of 0 minus "
                            "one), which FreeToken cannot represent; use a gptq_v2 checkpoint")
        return codes_to_q(codes.t(), self.bits), scales.t().contiguous(), \
            zeros.t().to(torch.uint8).contiguous(), (1, group)
