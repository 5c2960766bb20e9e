"""Block FP8 (`quant_method: fp8`; DeepSeek-V3, Qwen3 `-FP8`, GLM-4.5-FP8): a weight is
float8_e4m3fn W [N, K] plus `weight_scale_inv` [ceil(N / bn), ceil(K / bk)], one float32 (or
e8m0) scale per block of `weight_block_size` = [bn, bk], dequantized as W * scale (despite the
name, the scale multiplies). No `weight_block_size`: one scale for the whole tensor. Modules in
`modules_to_not_convert` are plain bf16 tensors without a scale and are read as such.
This is freetoken_kernels.quant's fp8 layout with float32 scales: experts are kept as stored."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.formats.base import QParts, Scheme, fp8_parts, need


class FP8(Scheme):
    method, fmt = "fp8", "fp8"
    parts = {".weight_scale_inv": ".weight"}

    def __init__(self, qc: dict):
        for key, want in (("activation_scheme", "dynamic"), ("fmt", "e4m3"), ("expert_dtype", "fp8")):
            if qc.get(key, want) != want:
                raise UserError(f"FP8 checkpoints with {key} {qc[key]!r} are not supported; FreeToken reads "
                                f"block FP8 with {key} {want!r} (DeepSeek-V3 / Qwen3-FP8 style)")
        block = qc.get("weight_block_size")
        self.block = tuple(int(b) for b in block) if block else None

    def unpack(self, name: str, t: dict) -> QParts:
        need(name, t, None, ".weight_scale_inv")
        w, s = t[None], t[".weight_scale_inv"]
        if w.dtype != torch.float8_e4m3fn:
            raise UserError(f"{name} is {w.dtype} beside its weight_scale_inv, expected float8_e4m3fn; "
                            "the checkpoint looks damaged")
        return fp8_parts(f"{name}_scale_inv", w, s, self.block)
