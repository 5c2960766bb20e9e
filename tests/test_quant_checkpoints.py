"""Quantized checkpoints users have (block FP8, GPTQ 4/8-bit, AWQ, compressed-tensors
pack-quantized, MXFP4 with fused expert tensors, gpt-oss's MXFP4 release layout), built and
quantized by the test (tests/qpack.py)
and converted with --dtype fp32: the engine against transformers' fp32 model on the dequantized
weights, at full and one-layer expert budgets, under every miss policy, eager and with
device-resident control."""
import json
import shutil

import pytest
import torch
from conftest import greedy, load, prefill_logits

import qpack
from engine.convert import convert

POLICIES = ["adaptive", "fetch", "cpu", "static:1", "static:3"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """method -> (transformers reference, FTW dir), built and converted once."""
    made = {}

    def get(method: str):
        if method not in made:
            d = tmp_path_factory.mktemp(method)
            ref = qpack.build(method, d / "hf")
            convert(d / "hf", d / "ftw", "fp32")
            made[method] = ref, d / "ftw"
        return made[method]
    return get


def reference(ref, ids: list[int], n: int):
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0]
        tokens = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(ids):].tolist()
    return logits, tokens


@pytest.mark.parametrize("method", qpack.METHODS)
def test_matches_transformers_at_every_budget_and_policy(quantized, method):
    ref, ftw = quantized(method)
    ids = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(7)).tolist()
    want_logits, want = reference(ref, ids, 16)
    full = load(ftw)
    fmt = {"fp8": "fp8", "mxfp4": "mxfp4", "mxfp4-gpt_oss": "mxfp4", "gptq8": "int8", "ct-w8a8": "int8", "ct-fp8": "fp8",
           "ct-fp8-block": "fp8", "ct-fp8-tensor": "fp8"}.get(method, "int4")
    assert full.runtime.store.layout.dtype == fmt and full.runtime.store.layout.slot_bytes < 3 * 8 * 1024
    got = prefill_logits(full, ids)
    assert float((got - want_logits).norm() / want_logits.norm()) < 1e-4
    assert greedy(full, ids, 16) == want
    slot = full.runtime.store.layout.slot_bytes
    for graph in (False, True):
        assert greedy(load(ftw, graph=graph), ids, 16) == want
        for policy in POLICIES:  # one layer's experts in the cache
            e = load(ftw, expert_budget=8 * slot, moe_policy=policy, graph=graph)
            e.runtime.qstar.start(1.0, 1.0, online=False)  # q* = 0.5
            assert greedy(e, ids, 16) == want, (policy, graph)
            st = e.runtime.cache.stats
            assert st.misses > 0 and st.fetched + st.cpu == st.misses
            assert (st.cpu > 0) == (policy != "fetch"), (policy, graph)


def test_dense_weights_are_dequantized_to_the_dtype(quantized):
    """FP8 / int attention projections become plain --dtype tensors; routed experts stay quantized."""
    from ftw import FTWReader
    for method in ("fp8", "gptq", "awq", "compressed"):
        ref, ftw = quantized(method)
        r = FTWReader(ftw)
        q = r.read("model.layers.1.self_attn.q_proj.weight")
        assert q.dtype == torch.float32
        assert torch.equal(q, ref.model.layers[1].self_attn.q_proj.weight)
        assert r.meta["layout"]["format"] in ("fp8", "int4")
        assert not any(n.endswith(("qweight", "scales", "_scale_inv", "weight_packed")) for n in r.names())


def test_run_a_quantized_hub_layout_directory(tmp_path):
    """`run` converts a quantized HF directory like any other; a damaged one is refused in one
    line and leaves nothing behind."""
    from safetensors.torch import load_file, save_file
    from test_cli import TOKENIZER_FILES, cli, one_line_error
    from transformers import AutoTokenizer

    from engine.resolve import DEMO
    hf = tmp_path / "awq"
    qpack.build("awq", hf, vocab_size=len(AutoTokenizer.from_pretrained(DEMO)))
    for f in TOKENIZER_FILES:
        shutil.copy(DEMO / f, hf / f)
    r = cli("run", hf, "-p", "def add(a, b):", "--raw", "--max-tokens", 4, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["token_ids"]) == 4
    tensors = load_file(hf / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.5.down_proj.scales"]
    save_file(tensors, str(hf / "model.safetensors"))
    one_line_error(cli("convert", hf, tmp_path / "out"), "model.layers.1.mlp.experts.5.down_proj.scales")
    assert not list(tmp_path.glob("*out*"))
