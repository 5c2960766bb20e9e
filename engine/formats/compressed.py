"""compressed-tensors (`quant_method: compressed-tensors`, llm-compressor's checkpoints): one
weight scheme, stored in one of three formats. A weight W [N, K] is
  pack-quantized   (w4a16 / w8a16) weight_packed int32 [N, ceil(K * bits / 32)]: 32 / bits codes
                   a word along K, the first in the lowest bits, each the signed code + 2 ** (bits - 1);
                   weight_shape int [2] = [N, K]
  int-quantized    (w8a8) weight int8 [N, K], the signed code
  float-quantized  (FP8, "FP8-dynamic" / "FP8-block") weight float8_e4m3fn [N, K]
with weight_scale [N, K / group] (strategy group), [N, 1] (channel), one value (tensor) or
[ceil(N / bn), ceil(K / bk)] (block, FP8 only), and for asymmetric int weights weight_zero_point
(pack-quantized: int32 [ceil(N * bits / 32), K / group] packed the same way along N; else, and
in older files, int8 [N, K / group], signed). W = (code - zero_point) * scale, or weight * scale
for FP8. With codes and zero points offset by 2 ** (bits - 1), these are freetoken_kernels.quant's unsigned
int4 / int8 codes and zero points; FP8 weights are freetoken_kernels.quant's fp8 as they are.
Activation quantization (input_activations: int8 / FP8 per token, or a static input_scale) is not
applied: activations stay in the conversion's dtype, as transformers computes them when it
decompresses such a checkpoint."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.formats.base import QParts, Scheme, check_shape, codes_to_q, fp8_parts, need, scale_groups, unpack_int32

FORMATS = {("pack-quantized", "int", 4): "int4", ("pack-quantized", "int", 8): "int8",
           ("int-quantized", "int", 8): "int8", ("float-quantized", "float", 8): "fp8"}


class CompressedTensors(Scheme):
    method = "compressed-tensors"
    parts = {**{f".weight_{p}": ".weight" for p in ("packed", "scale", "zero_point", "shape", "g_idx")},
             ".input_scale": ".weight", ".input_zero_point": ".weight"}

    def __init__(self, qc: dict):
        if qc.get("kv_cache_scheme"):
            raise UserError("compressed-tensors checkpoints with a quantized KV cache (kv_cache_scheme) are not "
                            "supported; FreeToken reads weight quantization only")
        groups = list((qc.get("config_groups") or {}).values())
        schemes = {(g.get("format") or qc.get("format"), _args(g)) for g in groups}
        if len(schemes) != 1:
            raise UserError("compressed-tensors checkpoints with several quantization schemes are not supported; "
                            "FreeToken reads one weight scheme for every quantized layer")
        (self.format, (self.bits, kind, strategy, _, block, *_)), = schemes
        self.fmt = FORMATS.get((self.format, kind, self.bits))
        if self.fmt is None:
            raise UserError(f"compressed-tensors format {self.format!r} with {self.bits}-bit {kind} weights is not "
                            "supported; FreeToken reads pack-quantized int4 / int8, int-quantized int8 and "
                            "float-quantized FP8")
        if strategy == "block" and (self.fmt != "fp8" or len(block) != 2):
            raise UserError("compressed-tensors block scales are supported for FP8 weights with a block_structure "
                            "[rows, columns] only; FreeToken reads group, channel or tensor scales for int weights")
        self.block = block if strategy == "block" else None

    def unpack(self, name: str, t: dict) -> QParts:
        stem = name.removesuffix(".weight")
        if ".weight_g_idx" in t:
            raise UserError(f"{stem}.weight_g_idx is present: activation-ordered groups are not supported; "
                            "use a checkpoint quantized without actorder")
        need(name, t, ".weight_scale")
        scale = t[".weight_scale"]
        if self.format == "pack-quantized":
            need(name, t, ".weight_packed", ".weight_shape")
            n, k = (int(v) for v in t[".weight_shape"].tolist())
            check_shape(f"{stem}.weight_packed", t[".weight_packed"], (n, -(-k * self.bits // 32)))
            codes = unpack_int32(t[".weight_packed"], self.bits, 1)[:, :k]
        else:
            need(name, t, None)
            w = t[None]
            want = torch.float8_e4m3fn if self.fmt == "fp8" else torch.int8
            if w.dtype != want:
                raise UserError(f"{name} is {w.dtype} beside its weight_scale, expected {want} for {self.format}; "
                                "the checkpoint looks damaged")
            n, k = w.shape
            if self.fmt == "fp8":  # one scale (tensor), block_structure blocks, or per row (channel, group)
                block = None if scale.numel() == 1 else self.block or \
                    (1, k // scale_groups(f"{name}_scale", scale, 1, k, name))
                return fp8_parts(f"{name}_scale", w, scale, block)
            codes = w.int() + 128
        if scale.numel() == 1:                       # strategy tensor: one scale, as a scale per row
            scale = scale.reshape(1, 1).expand(n, 1)
        groups = scale_groups(f"{stem}.weight_scale", scale, 1, k, name)
        check_shape(f"{stem}.weight_scale", scale, (n, groups))
        offset, zp = 1 << (self.bits - 1), t.get(".weight_zero_point")
        if zp is None:
            zeros = torch.full((n, groups), offset)
        elif zp.dtype == torch.int32:
            check_shape(f"{stem}.weight_zero_point", zp, (-(-n * self.bits // 32), groups))
            zeros = unpack_int32(zp, self.bits, 0)[:n]
        else:
            zeros = zp.reshape(1, 1).expand(n, 1) if zp.numel() == 1 else zp
            check_shape(f"{stem}.weight_zero_point", zeros, (n, groups))
            zeros = zeros.int() + offset
        return codes_to_q(codes, self.bits), scale.contiguous(), zeros.to(torch.uint8), (1, k // groups)


def _args(group: dict) -> tuple:
    """The weight quantization of one config group (activation quantization is not applied, so
    input_activations is not part of it), refused unless FreeToken reads it."""
    w = group.get("weights") or {}
    args = (w.get("num_bits"), w.get("type"), w.get("strategy"), w.get("group_size"),
            tuple(int(b) for b in w.get("block_structure") or ()), bool(w.get("actorder")), bool(w.get("dynamic")))
    if args[0] not in (4, 8) or args[1] not in ("int", "float") or args[2] not in ("group", "channel", "tensor", "block") \
            or any(args[5:]):
        raise UserError(f"compressed-tensors weight scheme {w} is not supported; FreeToken reads int4 / int8 and FP8 "
                        "weights with group, channel, tensor or (FP8) block scales, without actorder")
    return args
