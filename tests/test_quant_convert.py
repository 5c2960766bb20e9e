"""`freetoken convert --quant`: round trips from a float checkpoint (the engine against
transformers on the dequantized experts), one-line refusals that leave nothing behind, what a
budget holds, budget invariance, and the exact q* merge with quantized experts."""
import json

import pytest
import torch
from conftest import greedy, load, prefill_logits
from test_cli import cli, one_line_error, tiny_hf  # noqa: F401  (tiny_hf: a fixture)

import qpack
import tiny
from engine.moe.layout import SlotLayout
from freetoken_kernels import ref as kref
from freetoken_kernels.quant import quantize

GROUP = {"int4": 16, "int8": 32, "fp8": 16, "mxfp4": None}


@pytest.fixture(scope="module")
def float_hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("qconv") / "hf"
    return tiny.build("qwen3_moe", d, fused=True), d


@pytest.fixture(scope="module")
def int4_ftw(float_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("int4") / "ftw"
    assert cli("convert", float_hf[1], out, "--dtype", "fp32", "--quant", "int4", "--group-size", 16).exit_code == 0
    return out


def dequantized_reference(model, engine):
    """The transformers model with every routed expert replaced by the engine's dequantized one."""
    with torch.no_grad():
        for layer, v in zip(model.model.layers, engine.runtime.store.views):
            E = v["down"].shape[0]
            layer.mlp.experts.gate_up_proj.copy_(torch.stack([v["gate_up"].dequant(e) for e in range(E)]))
            layer.mlp.experts.down_proj.copy_(torch.stack([v["down"].dequant(e) for e in range(E)]))
    return model


@pytest.mark.parametrize("fmt", list(GROUP))
def test_quant_round_trip(float_hf, tmp_path, fmt):
    model, hf = float_hf
    args = ["--group-size", GROUP[fmt]] if GROUP[fmt] else []
    r = cli("convert", hf, tmp_path / "q", "--dtype", "fp32", "--quant", fmt, *args)
    assert r.exit_code == 0, r.output
    e = load(tmp_path / "q")
    layout = e.runtime.store.layout
    assert layout.dtype == fmt
    w0 = model.model.layers[0].mlp.experts.gate_up_proj[3]
    q, s, z, block = quantize(fmt, w0, GROUP[fmt] or 32)     # the bank holds exactly freetoken_kernels.quant's codes
    v = e.runtime.store.views[0]["gate_up"]
    assert torch.equal(v.q[3], q) and torch.equal(v.s[3], s) and v.block == block
    assert z is None or torch.equal(v.z[3], z)
    ref = dequantized_reference(tiny.build("qwen3_moe", tmp_path / "again", fused=True), e)
    ids = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
        want_tokens = ref.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(ids):].tolist()
    assert float((prefill_logits(e, ids) - want).norm() / want.norm()) < 1e-4
    assert greedy(e, ids, 16) == want_tokens
    o_proj = e.model.model.layers[0].self_attn.o_proj.weight
    assert torch.equal(o_proj.cpu(), model.model.layers[0].self_attn.o_proj.weight)


def test_bad_quant_options_are_refused_and_write_nothing(float_hf, int4_ftw, tmp_path):
    _, hf = float_hf
    gptq = tmp_path / "gptq"
    qpack.build("gptq", gptq)
    for args, words in [(["--quant", "int3"], ["int3", "int4, int8, fp8, mxfp4"]),
                        (["--quant", "int4", "--group-size", 48], ["48", "divide", "e.g. 32"]),
                        (["--quant", "int4", "--group-size", 0], ["--group-size 0", "divide"]),
                        (["--quant", "mxfp4", "--group-size", 16], ["32"]),
                        (["--group-size", 16], ["--quant"])]:
        one_line_error(cli("convert", hf, tmp_path / "out", *args), *words)
    one_line_error(cli("convert", gptq, tmp_path / "out", "--quant", "int4"), "already quantized", "gptq")
    one_line_error(cli("convert", int4_ftw, tmp_path / "out", "--quant", "int8"), "already converted (FTW)")
    assert not list(tmp_path.glob("*out*"))


def test_a_budget_holds_more_quantized_experts(float_hf, int4_ftw):
    H, I = 64, 32
    fp32, int4 = SlotLayout.for_experts(H, I, torch.float32), load(int4_ftw).runtime.store.layout
    assert fp32.slot_bytes == 3 * int4.slot_bytes  # 24 KiB vs 8 KiB (rows are 4 KiB-aligned)
    budget = 12 * fp32.slot_bytes
    assert load(int4_ftw, expert_budget=budget).runtime.cache.n_slots == 24  # 36 fit: every expert
    assert load(int4_ftw, expert_budget=budget // 3).runtime.cache.n_slots == 12
    # at real shapes the slot shrinks with the bits: Qwen3-30B-A3B's expert, 9.4 MB in bf16
    real = {n: quantize("int4", torch.zeros(*s), 128) for n, s in (("gate_up", (1536, 2048)), ("down", (2048, 768)))}
    bf16 = SlotLayout.for_experts(2048, 768, torch.bfloat16)
    ratio = bf16.slot_bytes / SlotLayout.for_qweights("int4", real).slot_bytes
    assert ratio == pytest.approx(16 / (4 + (16 + 8) / 128), rel=0.01)  # 4 bits + an fp16 scale and a zero a group


def test_budget_invariance(int4_ftw):
    ids = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(3)).tolist()
    full = load(int4_ftw)
    want, slot = greedy(full, ids, 24), full.runtime.store.layout.slot_bytes
    for slots in (8, 12, 20, 23):
        e = load(int4_ftw, expert_budget=slots * slot)
        assert greedy(e, ids, 24) == want
        st = e.runtime.cache.stats
        assert st.misses > 0 and st.bytes_filled == st.fetched * slot


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "device-control"])
def test_q_star_merge_is_exact_with_quantized_experts(int4_ftw, graph):
    """A layer step with misses split between the cache and the CPU sums to the all-resident result."""
    e = load(int4_ftw, expert_budget=10 * load(int4_ftw).runtime.store.layout.slot_bytes, graph=graph)
    rt = e.runtime
    rt.qstar.start(1.0, 1.0, online=False)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 64, generator=g)
    ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(6)])
    w = torch.rand(6, 2, generator=g)
    for layer in (0, 1, 2, 1):
        rt.before_step()  # device control: q* published to the device
        got = rt.forward(layer, *(t.to(e.device) for t in (x, ids, w)), prefill=False).cpu()
        v = rt.store.views[layer]
        want = kref.moe_experts(x, v["gate_up"], v["down"], ids, w)
        assert float((got - want).norm() / want.norm()) < 1e-5  # two fp32 summation orders
    rt.sync_stats()
    assert rt.cache.stats.fetched > 0 and rt.cache.stats.cpu > 0


def test_bench_quality(tiny_hf, tmp_path):
    """A quantized conversion against its float source over the default held-out text; a model
    against itself agrees exactly."""
    q = tmp_path / "int4"
    assert cli("convert", tiny_hf, q, "--quant", "int4", "--group-size", 16).exit_code == 0
    r = cli("bench", "quality", q, "--reference", tiny_hf, "--tokens", 80, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["format"] == "int4" and res["tokens"] == 80 and 0 < res["kl_mean"] < 0.5
    assert 0.5 < res["top1_agree"] <= 1 and res["ppl"] > 1 and res["ppl_ref"] > 1
    assert res["expert_bytes"] < res["expert_bytes_ref"]
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 20)
    r = cli("bench", "quality", q, "--reference", q, "--text", text, "--tokens", 50, "--device", "cpu", "--json")
    res = json.loads(r.stdout)
    assert res["kl_mean"] == pytest.approx(0, abs=1e-6) and res["top1_agree"] == 1 and res["ppl"] == res["ppl_ref"]
    one_line_error(cli("bench", "quality", q, "--reference", q, "--text", tmp_path / "none"), "--text")
