"""compressed-tensors `pack-quantized` (`quant_method: compressed-tensors`, llm-compressor's
w4a16 / w8a16): a weight W [N, K] is
  weight_packed      int32 [N, ceil(K * bits / 32)]: 32 / bits codes a word along K, the first
                     in the lowest bits, each stored as the signed code + 2 ** (bits - 1)
  weight_scale       [N, K / group] (strategy group; channel: [N, 1])
  weight_zero_point  asymmetric only: int32 [ceil(N * bits / 32), K / group], packed the same
                     way along N (older files: int8 [N, K / group], signed); absent = symmetric
  weight_shape       int [2] = [N, K]
dequantized as W = (code - zero_point) * scale. With both stored offset by 2 ** (bits - 1),
these are kernels.quant's unsigned int4 / int8 codes and zero points as they are."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.formats.base import QParts, Scheme, check_shape, codes_to_q, need, scale_groups, unpack_int32


class PackQuantized(Scheme):
    method = "compressed-tensors"
    parts = {f".weight_{p}": ".weight" for p in ("packed", "scale", "zero_point", "shape", "g_idx")}

    def __init__(self, qc: dict):
        groups = list((qc.get("config_groups") or {}).values())
        schemes = {(g.get("format") or qc.get("format"), _args(g)) for g in groups}
        if len(schemes) != 1:
            raise UserError("compressed-tensors checkpoints with several quantization schemes are not supported; "
                            "FreeToken reads one pack-quantized int4 or int8 weight-only scheme")
        (fmt, args), = schemes
        if fmt != "pack-quantized":
            raise UserError(f"compressed-tensors format {fmt!r} is not supported; FreeToken reads pack-quantized")
        self.bits = args[0]
        self.fmt = f"int{self.bits}"

    def unpack(self, name: str, t: dict) -> QParts:
        need(name, t, ".weight_packed", ".weight_scale", ".weight_shape")
        stem, offset = name.removesuffix(".weight"), 1 << (self.bits - 1)
        if ".weight_g_idx" in t:
            raise UserError(f"{stem}.weight_g_idx is present: activation-ordered groups are not supported; "
                            "use a checkpoint quantized without actorder")
        n, k = (int(v) for v in t[".weight_shape"].tolist())
        check_shape(f"{stem}.weight_packed", t[".weight_packed"], (n, -(-k * self.bits // 32)))
        codes = unpack_int32(t[".weight_packed"], self.bits, 1)[:, :k]
        scale = t[".weight_scale"]
        groups = scale_groups(f"{stem}.weight_scale", scale, 1, k, name)
        check_shape(f"{stem}.weight_scale", scale, (n, groups))
        zp = t.get(".weight_zero_point")
        if zp is None:
            zeros = torch.full((n, groups), offset)
        elif zp.dtype == torch.int32:
            check_shape(f"{stem}.weight_zero_point", zp, (-(-n * self.bits // 32), groups))
            zeros = unpack_int32(zp, self.bits, 0)[:n]
        else:
            check_shape(f"{stem}.weight_zero_point", zp, (n, groups))
            zeros = zp.int() + offset
        return codes_to_q(codes, self.bits), scale.contiguous(), zeros.to(torch.uint8), (1, k // groups)


def _args(group: dict) -> tuple:
    """The weight quantization of one config group, refused unless FreeToken reads it."""
    w = group.get("weights") or {}
    args = (w.get("num_bits"), w.get("type"), w.get("strategy"), w.get("group_size"), bool(w.get("actorder")),
            bool(w.get("dynamic")), group.get("input_activations") is None)
    if args[0] not in (4, 8) or args[1] != "int" or args[2] not in ("group", "channel") or any(args[4:6]) \
            or not args[6]:
        raise UserError(f"compressed-tensors scheme {w} is not supported; FreeToken reads weight-only int4 / int8 "
                        "with group or channel scales, without actorder")
    return args
