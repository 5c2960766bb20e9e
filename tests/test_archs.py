"""DeepSeek-V2/V3 (MLA, group-limited routing) and GLM-4.5 beyond the shared parity suite:
transformers' greedy tokens under every miss policy at the full and a one-layer expert budget,
on both control paths; multi-token-prediction layers ignored at conversion; DeepSeek checkpoints
whose rotary rows are not interleaved, and Kimi-K2's model_type."""
import logging

import pytest
import torch
from conftest import greedy, load, prefill_logits
from test_parity import prompt, rel_err
from test_policies import POLICIES

NEW_ARCHS = ["deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss"]


def reference_tokens(ref, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "device-control"])
@pytest.mark.parametrize("arch", NEW_ARCHS)
def test_every_policy_and_budget_matches_transformers(tiny_model, arch, graph):
    ref, _, ftw = tiny_model(arch)
    ids = prompt()
    want = reference_tokens(ref, ids, 32)
    full = load(ftw)
    slot, E = full.runtime.store.layout.slot_bytes, full.cfg.num_experts
    for budget in (None, E * slot):
        for policy in POLICIES:
            e = load(ftw, expert_budget=budget, moe_policy=policy, graph=graph)
            e.runtime.qstar.start(1.0, 1.0, online=False)  # q* = 0.5: misses on both sides
            assert greedy(e, ids, 32) == want, (budget, policy)
            st = e.runtime.cache.stats
            assert st.fetched + st.cpu == st.misses
            if budget is not None and policy != "fetch":
                assert st.cpu > 0, policy


def test_mtp_layers_are_ignored_at_conversion(tmp_path, caplog):
    """DeepSeek-V3 and GLM checkpoints append multi-token-prediction layers after
    num_hidden_layers (dense tensors and a full expert set); conversion skips them and says so."""
    import tiny
    from safetensors.torch import save_file

    from engine.convert import convert
    ref = tiny.build("deepseek_v3", tmp_path / "hf")
    n = ref.config.num_hidden_layers
    mtp = {f"model.layers.{n}.{name}": torch.randn(4, 64) for name in
           ("eh_proj.weight", "enorm.weight", "self_attn.kv_a_proj_with_mqa.weight",
            "mlp.experts.0.gate_proj.weight", "mlp.gate.e_score_correction_bias")}
    save_file(mtp, str(tmp_path / "hf" / "mtp.safetensors"))
    with caplog.at_level(logging.WARNING, logger="freetoken.convert"):
        convert(tmp_path / "hf", tmp_path / "ftw")
    assert [r.getMessage() for r in caplog.records] == [f"ignoring 5 tensors of layers >= {n} (multi-token "
                                                         "prediction, unused by decoding)"]
    ids = prompt()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert rel_err(prefill_logits(load(tmp_path / "ftw"), ids), want) < 1e-4


@pytest.mark.parametrize("model_type, kw", [("deepseek_v3", {"rope_interleave": False}),
                                           ("kimi_k2", {"n_group": 1, "topk_group": 1})])
def test_deepseek_variants(tmp_path, model_type, kw):
    """A DeepSeek-V3 checkpoint whose rotary rows are not interleaved; Kimi-K2's config, which
    names the DeepSeek-V3 architecture kimi_k2."""
    import json

    import tiny

    from engine.convert import convert
    ref = tiny.build("deepseek_v3", tmp_path / "hf", **kw)
    cfg = tmp_path / "hf" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_type": model_type}))
    convert(tmp_path / "hf", tmp_path / "ftw")
    ids = prompt()
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0]
    assert rel_err(prefill_logits(load(tmp_path / "ftw"), ids), want) < 1e-4


def test_correction_bias_stays_float32(tmp_path):
    """A bf16 conversion keeps e_score_correction_bias in float32 (it ranks experts by
    differences bf16 cannot resolve), and so does the loaded model."""
    import tiny

    from engine.convert import convert
    from ftw import FTWReader
    tiny.build("glm4_moe", tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ftw", dtype="bf16")
    reader = FTWReader(tmp_path / "ftw")
    assert reader.info("model.layers.1.mlp.gate.e_score_correction_bias").dtype == torch.float32
    assert reader.info("model.layers.1.mlp.gate.weight").dtype == torch.bfloat16
    block = load(tmp_path / "ftw").model.moe_blocks()[0]
    assert block.gate.e_score_correction_bias.dtype == torch.float32


def test_gpt_oss_sliding_layers_read_only_their_window(tiny_model):
    """Decoding past the window: the sliding layers' KV in pages wholly before every window is
    garbage (NaN) and the logits do not change, in prefill chunks and single-token steps; the
    full-attention layers still read the whole context."""
    from engine.kv.batch import ForwardBatch
    runner = load(tiny_model("gpt_oss")[2])
    cfg, kv, page = runner.cfg, runner.kv, runner.kv.page_size
    assert cfg.sliding_layer_ids and cfg.attention_layer_ids and page < cfg.sliding_window < 64
    assert kv.sliding.k.shape[0] == len(cfg.sliding_layer_ids) and kv.k.shape[0] == len(cfg.attention_layer_ids)
    ids = prompt(70, seed=3)
    want = prefill_logits(runner, ids)
    pages, sliding = kv.alloc(5), kv.sliding.alloc(5)
    got = []
    for a, b in zip([0, 40, 55] + list(range(56, 70)), [40, 55] + list(range(56, 71))):
        gone = sliding[:max(0, a - cfg.sliding_window + 1) // page]  # before the window of this step's first query
        kv.sliding.k[:, gone] = kv.sliding.v[:, gone] = float("nan")
        batch = ForwardBatch.build([(ids[a:b], a, pages)], page, runner.device, all_logits=True, sliding=[sliding])
        got.append(runner.model(batch, kv))
    assert rel_err(torch.cat(got), want) < 1e-5


def test_gpt_oss_reference_clamps_at_the_config_limit(tiny_model):
    """The tiny checkpoint's swiglu_limit clamps, and transformers' experts (the parity reference)
    apply the activation the engine reads from config.json, whatever transformers' version (5.17
    hard-codes limit 7.0; tiny.build sets the config's)."""
    import json

    from engine.models import model_config
    from freetoken_kernels import ref
    model, hf, _ = tiny_model("gpt_oss")
    act = model_config(json.loads((hf / "config.json").read_text())).expert_act
    gate_up = torch.linspace(-3, 3, 64).view(2, 32)          # gate and up interleaved, past the limit
    assert act.limit < 3.0
    want = ref.act_and_mul(torch.cat((gate_up[:, ::2], gate_up[:, 1::2]), -1), act)
    for layer in model.model.layers:
        torch.testing.assert_close(layer.mlp.experts._apply_gate(gate_up), want)


def test_gpt_oss_synthetic_shape():
    """--synthetic gpt-oss-120b: the released config's architecture, experts with biases in the
    slot (bf16 and MXFP4 bytes per MoE layer as the README states them)."""
    from engine.synthetic import expert_layout, synthetic_config
    cfg = synthetic_config("gpt-oss-120b", layers=4)
    assert cfg.moe_layer_ids == [0, 1, 2, 3] and [cfg.window(i) for i in range(4)] == [128, None, 128, None]
    assert cfg.attention_sinks and cfg.router_bias and cfg.expert_bias and cfg.expert_act.limit == 7.0
    assert cfg.rope["rope_type"] == "yarn" and cfg.rope["factor"] == 32.0
    per_layer = {q: expert_layout(cfg, q).slot_bytes * cfg.num_experts / 2**30 for q in (None, ("mxfp4", 32))}
    assert round(per_layer[None], 2) == 5.94 and round(per_layer["mxfp4", 32], 2) == 1.58
