"""Quantized checkpoints for tests, written from each format's published description (a second
reading, independent of engine/formats), or, for the "ct-" methods, by compressed-tensors itself
(the library llm-compressor writes its checkpoints with): per format a packer W [N, K] -> (the
checkpoint's tensors for that weight, the weight they dequantize to by the format's own formula
or the library's own decompression), and
`build` for a tiny qwen3_moe checkpoint (gpt_oss for "mxfp4-gpt_oss", in the layout gpt-oss ships)
whose routed experts (and, where the format quantizes them in real releases, attention
projections) are quantized, with the transformers fp32 model carrying exactly the dequantized
weights as the reference."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

import tiny

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def minmax_codes(w: torch.Tensor, group: int, bits: int, symmetric: bool, scale_dtype=torch.float16):
    """Group-wise int quantization along K: codes [N, K], scales and zeros [N, K / group] with
    w ~ (code - zero) * scale (zero an integer, 2 ** (bits - 1) when symmetric)."""
    n, k = w.shape
    g = w.view(n, k // group, group)
    top = 2 ** bits - 1
    if symmetric:
        scale = (g.abs().amax(-1) / (2 ** (bits - 1) - 1)).clamp_min(1e-8)
        zero = torch.full_like(scale, 2 ** (bits - 1))
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / top).clamp_min(1e-8)
        zero = torch.round(-lo / scale).clamp(1, top)  # >= 1: a v1 GPTQ zero of 0 wraps (see gptq)
    scale = scale.to(scale_dtype)
    codes = torch.round(g / scale.float()[..., None] + zero[..., None]).clamp(0, top).reshape(n, k)
    return codes.int(), scale, zero.int()


def by_group(t: torch.Tensor, group: int) -> torch.Tensor:
    return t.repeat_interleave(group, -1)


def pack_words(vals: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Values < 2 ** bits, 32 // bits a word along `dim`, the first in the lowest bits (int32)."""
    vals = vals.movedim(dim, -1).long()
    per = 32 // bits
    words = vals.reshape(*vals.shape[:-1], -1, per)
    out = torch.zeros(words.shape[:-1], dtype=torch.long)
    for j in range(per):
        out |= words[..., j] << (bits * j)
    out = torch.where(out >= 2 ** 31, out - 2 ** 32, out)  # the same 32 bits, as a signed int32
    return out.to(torch.int32).movedim(-1, dim)


def gptq(w: torch.Tensor, group: int, bits: int = 4, symmetric: bool = False):
    """AutoGPTQ's QuantLinear (checkpoint_format gptq): qweight [K*bits/32, N] packed along K,
    qzeros [K/group, N*bits/32] holding zero - 1 packed along N, fp16 scales [K/group, N], g_idx."""
    codes, scale, zero = minmax_codes(w, group, bits, symmetric)
    k = w.shape[1]
    t = {"qweight": pack_words(codes.t(), bits, 0), "qzeros": pack_words((zero - 1).t(), bits, 1),
         "scales": scale.t().contiguous(), "g_idx": torch.arange(k, dtype=torch.int32) // group}
    return t, (codes - by_group(zero, group)).float() * by_group(scale.float(), group)


def awq(w: torch.Tensor, group: int):
    """AutoAWQ's WQLinear_GEMM: qweight [K, N/8], column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i] in
    nibble i of word c; qzeros [K/group, N/8] alike; fp16 scales [K/group, N]."""
    codes, scale, zero = minmax_codes(w, group, 4, symmetric=False)
    order = [0, 2, 4, 6, 1, 3, 5, 7]

    def pack(v):  # [R, N] -> [R, N / 8]
        out = torch.zeros(v.shape[0], v.shape[1] // 8, dtype=torch.long)
        for c in range(v.shape[1] // 8):
            for i in range(8):
                out[:, c] |= v[:, 8 * c + order[i]].long() << (4 * i)
        return torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32)
    t = {"qweight": pack(codes.t()), "qzeros": pack(zero.t()), "scales": scale.t().contiguous()}
    return t, (codes - by_group(zero, group)).float() * by_group(scale.float(), group)


def compressed(w: torch.Tensor, group: int, bits: int = 4, symmetric: bool = True):
    """compressed-tensors pack-quantized: signed codes + 2 ** (bits - 1) packed along K into
    weight_packed [N, K*bits/32]; weight_scale [N, K/group] (bf16 here); asymmetric: signed
    zero points + offset packed along N into weight_zero_point; weight_shape [N, K]."""
    codes, scale, zero = minmax_codes(w, group, bits, symmetric, torch.bfloat16)
    t = {"weight_packed": pack_words(codes, bits, 1), "weight_scale": scale,
         "weight_shape": torch.tensor(list(w.shape))}
    if not symmetric:
        t["weight_zero_point"] = pack_words(zero, bits, 0)
    return t, (codes - by_group(zero, group)).float() * by_group(scale.float(), group)


def fp8(w: torch.Tensor, block: tuple[int, int]):
    """DeepSeek-V3 block FP8: e4m3 weight, float32 weight_scale_inv per (bn, bk) block (partial
    blocks at the edges), W = weight * scale_inv."""
    bn, bk = block
    n, k = w.shape
    rows, cols = math.ceil(n / bn), math.ceil(k / bk)
    s = torch.zeros(rows, cols)
    for i in range(rows):
        for j in range(cols):
            s[i, j] = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max().clamp_min(1e-8) / 448.0
    full = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    q = (w / full).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": s}, q.float() * full


def mxfp4(w: torch.Tensor):
    """OCP MX FP4 as gpt-oss stores it: NAME_blocks [..., N, K/32, 16] (e2m1 codes, the even k in
    the low nibble), NAME_scales [..., N, K/32] (e8m0: 2 ** (e - 127))."""
    *lead, n, k = w.shape
    g = w.reshape(*lead, n, k // 32, 32)
    e = torch.floor(torch.log2(g.abs().amax(-1).clamp_min(2.0 ** -120))) - 2   # 6.0 = 1.5 * 2 ** 2
    vals = torch.tensor(E2M1)
    codes = ((g / torch.exp2(e)[..., None])[..., None] - vals).abs().argmin(-1)   # [..., N, K/32, 32]
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    back = (vals[codes] * torch.exp2(e)[..., None]).reshape(w.shape)
    return {"blocks": blocks, "scales": (e + 127).to(torch.uint8)}, back


# compressed-tensors' own schemes, as llm-compressor's presets quantize: method -> (format, weights,
# activations: none (w4a16), dynamic per token (w8a8, FP8-dynamic) or static per tensor (FP8, whose
# checkpoints carry an input_scale)
CT = {"ct-w4a16": ("pack-quantized", dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=16),
                   None),
      "ct-w8a8": ("int-quantized", dict(num_bits=8, type="int", symmetric=True, strategy="channel"), "token"),
      "ct-fp8": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="channel"), "token"),
      "ct-fp8-block": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="block",
                                               block_structure=[16, 32]), "token"),
      "ct-fp8-tensor": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="tensor"),
                        "tensor")}


def ct_scheme(method: str):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    fmt, w, act = CT[method]
    if act:
        act = QuantizationArgs(num_bits=8, type=w["type"], strategy=act, dynamic=act == "token", symmetric=True)
    return fmt, QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**w), input_activations=act)


def ct(method: str, w: torch.Tensor):
    """compressed-tensors' own quantization of W: scales and zero points from each group's range
    (its calculate_qparams, as its min-max observer), the format's compressor, and the weight
    its decompressor gives back."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils import calculate_qparams
    fmt, scheme = ct_scheme(method)
    a, (n, k) = scheme.weights, w.shape
    if a.strategy == "group":
        g = w.view(n, k // a.group_size, a.group_size)
    elif a.strategy == "block":
        bn, bk = a.block_structure
        g = w.view(n // bn, bn, k // bk, bk).transpose(1, 2).flatten(2)
    else:
        g = w.view(n if a.strategy == "channel" else 1, 1, -1)
    scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), a)
    if a.strategy == "tensor":
        scale, zero = scale.view(1), zero.view(1)
    comp = BaseCompressor.load_from_registry(fmt)
    t = comp.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zero}, scheme)
    back = comp.decompress(dict(t), scheme)["weight"].float()
    if scheme.input_activations and not scheme.input_activations.dynamic:  # calibrated: FreeToken ignores it
        t["input_scale"] = torch.tensor([0.02])
    return t, back


METHODS = ("fp8", "gptq", "gptq8", "awq", "compressed", "compressed-asym", "mxfp4", "mxfp4-gpt_oss", *CT)


def quantize_weight(method: str, w: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """One weight in `method`'s checkpoint tensors (by suffix after the weight's module name)."""
    if method == "fp8":
        t, back = fp8(w, (24, 32))  # 24 rows: blocks straddle the gate/up boundary of I = 32
        return {".weight": t["weight"], ".weight_scale_inv": t["weight_scale_inv"]}, back
    if method in CT:
        t, back = ct(method, w)
    elif method in ("gptq", "gptq8"):
        t, back = gptq(w, 16, bits=8 if method == "gptq8" else 4, symmetric=method == "gptq8")
    elif method == "awq":
        t, back = awq(w, 16)
    else:
        t, back = compressed(w, 16, symmetric=method == "compressed")
    return {f".{k}": v for k, v in t.items()}, back


def quantization_config(method: str) -> dict:
    if method in CT:
        from compressed_tensors.quantization import QuantizationConfig
        fmt, scheme = ct_scheme(method)
        return QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                                  ignore=["lm_head", "re:.*mlp.gate$"]).to_dict()
    if method == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [24, 32], "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    if method in ("gptq", "gptq8"):
        return {"quant_method": "gptq", "bits": 8 if method == "gptq8" else 4, "group_size": 16,
                "desc_act": False, "sym": method == "gptq8", "checkpoint_format": "gptq"}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}
    if method == "mxfp4":
        return {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "mlp.gate",
                                                                    "embed_tokens", "lm_head"]}
    if method == "mxfp4-gpt_oss":  # as gpt-oss-20b / 120b ship it
        return {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                    "model.layers.*.mlp.router",
                                                                    "model.embed_tokens", "lm_head"]}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
                "num_bits": 4, "type": "int", "symmetric": method == "compressed", "strategy": "group",
                "group_size": 16, "actorder": None, "dynamic": False}}},
            "ignore": ["lm_head", "re:.*mlp.gate$"]}


def build(method: str, out: Path, seed: int = 0, **kw):
    """A tiny qwen3_moe (or gpt_oss) checkpoint at `out` quantized by `method` (kw: config
    overrides); returns the transformers fp32 model holding exactly the weights the checkpoint
    dequantizes to."""
    from safetensors.torch import save_file
    oss = method == "mxfp4-gpt_oss"
    ref = tiny.build("gpt_oss" if oss else "qwen3_moe", out, seed=seed, **kw)
    tensors = {}
    with torch.no_grad():
        for name, p in ref.named_parameters():
            layer = name.split(".")[2] if name.startswith("model.layers.") else None
            if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
                if method.startswith("mxfp4"):  # fused [E, N, K]: gpt-oss keeps [E, K, N] parameters
                    w = p.data.transpose(1, 2) if oss else p.data
                    t, back = mxfp4(w.contiguous())
                    tensors[name + "_blocks"], tensors[name + "_scales"] = t["blocks"], t["scales"]
                    p.copy_(back.transpose(1, 2) if oss else back)
                    continue
                inter = p.shape[1] // 2 if name.endswith("gate_up_proj") else None
                for e in range(p.shape[0]):
                    pre = f"model.layers.{layer}.mlp.experts.{e}."
                    mats = {"gate_proj": p[e, :inter], "up_proj": p[e, inter:]} if inter else {"down_proj": p[e]}
                    for proj, w in mats.items():
                        parts, back = quantize_weight(method, w.clone())
                        tensors.update({f"{pre}{proj}{suffix}": t for suffix, t in parts.items()})
                        w.copy_(back)
            elif not method.startswith("mxfp4") and name.endswith("_proj.weight") and ".self_attn." in name:
                parts, back = quantize_weight(method, p.data.clone())  # a dense weight, dequantized at convert
                tensors.update({name.removesuffix(".weight") + suffix: t for suffix, t in parts.items()})
                p.copy_(back)
            else:
                tensors[name] = p.data.clone()
    for f in out.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(method)
    (out / "config.json").write_text(json.dumps(cfg))
    return ref
