"""MXFP4 (`quant_method: mxfp4`, the format gpt-oss ships in; OCP microscaling): a weight
W [..., N, K] is stored as two tensors beside its name,
  NAME_blocks  uint8 [..., N, K / 32, 16]: 32 e2m1 codes a block, two a byte, the even k in the
               low nibble
  NAME_scales  uint8 [..., N, K / 32]: one e8m0 exponent a block, scale = 2 ** (e - 127)
(transformers' convert_moe_packed_tensors reads them the same way before transposing to
gpt-oss's [E, K, N] parameters). Fused expert tensors keep their leading expert axis; a
qwen3_moe-shaped checkpoint stores `mlp.experts.gate_up_proj_blocks` [E, 2I, H / 32, 16] (gate
rows first) and `down_proj_blocks` [E, H, I / 32, 16]. This is freetoken_kernels.quant's mxfp4 layout."""
from __future__ import annotations

from engine.formats.base import QParts, Scheme, check_shape, need


class MXFP4(Scheme):
    method, fmt = "mxfp4", "mxfp4"
    parts = {"_blocks": "", "_scales": ""}

    def unpack(self, name: str, t: dict) -> QParts:
        need(name, t, "_blocks", "_scales")
        blocks, scales = t["_blocks"], t["_scales"]
        check_shape(f"{name}_scales", scales, blocks.shape[:-1])
        check_shape(f"{name}_blocks", blocks, (*scales.shape, 16))
        return blocks.flatten(-2), scales, None, (1, 32)
