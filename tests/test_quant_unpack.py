"""Each format's unpacker (engine/formats) against a second reading of the format's published
description (tests/qpack.py packs and dequantizes by the format's own formula), on random data;
and one-line refusals of what FreeToken cannot read."""
import json

import pytest
import torch

import qpack
from engine.errors import UserError
from engine.formats import SCHEMES, dequant_parts, fuse_gate_up, scheme_of
from engine.formats.base import unpack_int32

N, K = 48, 64


def weight(seed=0, n=N, k=K):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def unpack(method: str, parts: dict, name: str = "m.weight"):
    scheme = scheme_of({"quantization_config": qpack.quantization_config(method)})
    t = {scheme.split(name.removesuffix(".weight") + s)[1]: v for s, v in parts.items()}
    return scheme, scheme.unpack(name, t)


@pytest.mark.parametrize("method", ["fp8", "gptq", "gptq8", "awq", "compressed", "compressed-asym", *qpack.CT])
def test_unpacker_matches_the_published_description(method):
    """(The "ct-" methods: against compressed-tensors' own compressors and decompression.)"""
    parts, want = qpack.quantize_weight(method, weight())
    scheme, p = unpack(method, parts)
    assert torch.equal(dequant_parts(scheme.fmt, p), want)
    assert p[0].dtype in (torch.uint8, torch.float8_e4m3fn) and p[0].shape[0] == N


def test_mxfp4_unpacker_matches_the_ocp_description():
    w = torch.randn(3, N, K, generator=torch.Generator().manual_seed(1))
    t, want = qpack.mxfp4(w)
    scheme = SCHEMES["mxfp4"]({})
    assert scheme.split("x.experts.gate_up_proj_blocks") == ("x.experts.gate_up_proj", "_blocks")
    p = scheme.unpack("x", {"_blocks": t["blocks"], "_scales": t["scales"]})
    assert torch.equal(dequant_parts("mxfp4", p), want)


def test_int32_words_hold_the_first_value_in_the_lowest_bits():
    word = torch.tensor([[0x76543210]], dtype=torch.int32)
    assert unpack_int32(word, 4, 1).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert unpack_int32(torch.tensor([[-1]], dtype=torch.int32), 8, 0).flatten().tolist() == [255] * 4


def test_gptq_v2_stores_the_zero_points_as_they_are():
    parts, want = qpack.quantize_weight("gptq", weight())
    codes = unpack_int32(parts[".qzeros"], 4, 1)                    # v1: zero - 1
    v2 = {**parts, ".qzeros": qpack.pack_words(codes + 1, 4, 1)}
    scheme = SCHEMES["gptq"]({"bits": 4, "checkpoint_format": "gptq_v2"})
    p = scheme.unpack("m.weight", v2)
    assert torch.equal(dequant_parts("int4", p), want)


def test_awq_interleave_order():
    """AutoAWQ puts column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i] in nibble i of word c."""
    codes = torch.arange(8).repeat(16, 1)                    # [K=16, N=8]: column j holds code j
    t, _ = qpack.awq(torch.zeros(8, 16), 16)
    word = 0
    for i, col in enumerate([0, 2, 4, 6, 1, 3, 5, 7]):
        word |= col << (4 * i)
    t["qweight"] = torch.full((16, 1), word - 2 ** 32 if word >= 2 ** 31 else word, dtype=torch.int32)
    _, p = unpack("awq", {f".{k}": v for k, v in t.items()})
    from freetoken_kernels.quant import unpack_nibbles
    assert torch.equal(unpack_nibbles(p[0]), codes.t().to(torch.uint8))


def test_fused_gate_up_refines_blocks_that_straddle_the_boundary():
    """block FP8 with 24-row blocks and I = 32: the fused gate_up uses 8-row blocks, exactly."""
    g, u = weight(2, 32), weight(3, 32)
    (tg, wg), (tu, wu) = (qpack.fp8(w, (24, 32)) for w in (g, u))
    scheme = SCHEMES["fp8"]({"weight_block_size": [24, 32]})
    pg, pu = (scheme.unpack("w", {None: t["weight"], ".weight_scale_inv": t["weight_scale_inv"]}) for t in (tg, tu))
    fused = fuse_gate_up(pg, pu, "w")
    assert fused[3] == (8, 32) and fused[1].shape == (8, 2)
    assert torch.equal(dequant_parts("fp8", fused), torch.cat([wg, wu]))


@pytest.mark.parametrize("qc,words", [
    ({"quant_method": "gptq", "bits": 4, "desc_act": True}, ["desc_act", "act-order"]),
    ({"quant_method": "gptq", "bits": 3}, ["3 bits", "4- and 8-bit"]),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, ["gemv", "GEMM"]),
    ({"quant_method": "fp8", "activation_scheme": "static"}, ["static", "dynamic"]),
    ({"quant_method": "bitsandbytes"}, ["bitsandbytes", "fp8, gptq, awq, compressed-tensors, mxfp4"]),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}}, ["float-quantized", "8-bit int"]),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}}, ["tensor_group"]),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "block", "block_structure": [128, 128]}}}}, ["block"]),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "kv_cache_scheme": {"num_bits": 8},
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}},
     ["kv_cache_scheme"]),
])
def test_unsupported_quantization_is_refused_in_one_line(qc, words):
    with pytest.raises(UserError) as e:
        scheme_of({"quantization_config": qc})
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_missing_or_misshaped_scales_are_named():
    parts, _ = qpack.quantize_weight("gptq", weight())
    with pytest.raises(UserError, match=r"lacks m\.scales"):
        unpack("gptq", {k: v for k, v in parts.items() if k != ".scales"})
    with pytest.raises(UserError, match=r"m\.qzeros has shape"):
        unpack("gptq", {**parts, ".qzeros": parts[".qzeros"][:, :1]})
    parts, _ = qpack.quantize_weight("fp8", weight())
    with pytest.raises(UserError, match=r"m\.weight_scale_inv has shape \[1, 2\]"):
        unpack("fp8", {**parts, ".weight_scale_inv": parts[".weight_scale_inv"][:1]})
    with pytest.raises(UserError, match=r"act-order"):
        parts, _ = qpack.quantize_weight("gptq", weight())
        unpack("gptq", {**parts, ".g_idx": parts[".g_idx"].flip(0)})
    assert json.dumps(qpack.quantization_config("gptq"))  # the configs the tests write are plain JSON
