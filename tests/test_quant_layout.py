"""Quantized expert slots: the layout's views are QWeights over the byte rows (no copies), the
reference expert FFN on them equals the FFN on the dequantized weights, the layout survives the
FTW meta, and version-1 FTW directories still load."""
import json

import pytest
import torch
from conftest import greedy, load

from engine.moe.layout import SlotLayout
from freetoken_kernels import ref
from freetoken_kernels.quant import QWeight, quantize

H, I, E = 64, 32, 4


def quantized_bank(fmt: str, group: int, seed: int = 0):
    """E random experts quantized into one bank -> (layout, bank [E, slot_bytes], float weights)."""
    g = torch.Generator().manual_seed(seed)
    w = {"gate_up": torch.randn(E, 2 * I, H, generator=g) * 0.1, "down": torch.randn(E, H, I, generator=g) * 0.1}
    parts = [{n: quantize(fmt, w[n][e], group) for n in w} for e in range(E)]
    layout = SlotLayout.for_qweights(fmt, parts[0])
    bank = torch.zeros(E, layout.slot_bytes, dtype=torch.uint8)
    views = layout.views(bank)
    for e, p in enumerate(parts):
        for n, (q, s, z, _) in p.items():
            for dst, src in zip((views[n].q, views[n].s, views[n].z), (q, s, z)):
                if src is not None:
                    dst[e].copy_(src)
    return layout, bank, w


@pytest.mark.parametrize("fmt,group", [("int4", 16), ("int8", 32), ("fp8", 16), ("mxfp4", 32)])
def test_views_are_qweights_and_the_reference_runs_on_them(fmt, group):
    layout, bank, w = quantized_bank(fmt, group)
    v = layout.views(bank)
    assert set(v) == {"gate_up", "down"} and all(isinstance(q, QWeight) for q in v.values())
    assert v["gate_up"].shape == (E, 2 * I, H) and v["down"].shape == (E, H, I)
    assert v["gate_up"].q.data_ptr() == bank.data_ptr()                  # a view of the row, no copy
    assert layout.slot_bytes < SlotLayout.for_experts(H, I, torch.bfloat16).slot_bytes or fmt == "fp8"
    deq = {n: torch.stack([v[n].dequant(e) for e in range(E)]) for n in v}
    for n in w:  # the quantization is close to the float weights it came from
        assert (deq[n] - w[n]).norm() / w[n].norm() < 0.3
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    slots = torch.tensor([[0, 3], [1, -1], [2, 2], [3, 0], [-1, 1]])
    weights = torch.rand(5, 2, generator=torch.Generator().manual_seed(2))
    got = ref.moe_experts(x, v["gate_up"], v["down"], slots, weights)
    want = ref.moe_experts(x, deq["gate_up"], deq["down"], slots, weights)
    assert torch.equal(got, want)
    back = SlotLayout.from_meta(json.loads(json.dumps(layout.to_meta())))
    assert back == layout and back.dtype == fmt


def test_slot_parts_live_on_the_pool_device():
    """Codes, scales and zero points of the cache's slots are views of the pool's rows, so on
    its device whatever that is ('meta' stands in for CUDA here)."""
    from engine.moe.cache import ExpertCache
    layout, _, _ = quantized_bank("int4", 16)
    cache = ExpertCache(layout, 6, 2, E, torch.device("meta"))
    parts = [t for w in cache.w.values() for t in (w.q, w.s, w.z)]
    assert len(parts) == 6 and all(t.device.type == "meta" for t in parts)


def test_cpu_executor_runs_quantized_banks():
    """The CPU executor takes QWeight banks (on its torch path until the C++ one reads them)."""
    from freetoken_kernels.cpu_executor import CPUExecutor
    layout, bank, _ = quantized_bank("int4", 16)
    v = layout.views(bank)
    x = torch.randn(3, H)
    ids = torch.tensor([[0, 1], [2, -1], [3, 3]])
    weights = torch.rand(3, 2)
    out = torch.empty(3, H)
    CPUExecutor(1).run(x, v["gate_up"], v["down"], ids, weights, out)
    want = ref.moe_experts(x, v["gate_up"], v["down"], ids, weights)
    assert float((out - want).norm() / want.norm()) < 1e-5


def test_float_layout_meta_without_format_reads_as_float():
    layout = SlotLayout.for_experts(H, I, torch.bfloat16)
    meta = layout.to_meta()
    assert "format" not in meta and SlotLayout.from_meta(meta) == layout and layout.dtype == "bfloat16"


def test_version_1_directories_still_load(tiny_model):
    """FTW v2 only marks that banks may hold quantized experts: a v1 directory loads unchanged."""
    from ftw import FORMAT_VERSION
    _, _, ftw = tiny_model("qwen3_moe")
    index = json.loads((ftw / "ftw.json").read_text())
    assert index["version"] == FORMAT_VERSION == 2
    prompt = list(range(3, 15))
    want = greedy(load(ftw), prompt, 8)
    index["version"] = 1
    (ftw / "ftw.json").write_text(json.dumps(index))
    try:
        assert greedy(load(ftw), prompt, 8) == want
    finally:
        index["version"] = 2
        (ftw / "ftw.json").write_text(json.dumps(index))


def test_profile_measures_b_h_on_the_format(tmp_path, monkeypatch):
    """B_H is measured on experts of the model's format (in that format's bytes), and a saved
    profile is kept per format."""
    from engine import profile
    monkeypatch.setattr(profile, "llc_bytes", lambda: 0)      # the smallest bank (96 experts)
    res = profile.measure(quick=True, threads=1, fmt="int4")
    bf16 = SlotLayout.for_experts(*profile.EXPERT, torch.bfloat16).slot_bytes
    assert res["format"] == "int4" and 3.5 < bf16 / res["expert_bytes"] < 4 and res["cpu_expert_gbps"] > 0
    saved = profile.save(res)
    assert saved.name.endswith("-int4.json")
    said = []
    assert profile.load_or_measure(1, say=said.append, fmt="int4") == json.loads(saved.read_text()) and not said
    from engine.errors import UserError
    with pytest.raises(UserError, match="int4, int8, fp8, mxfp4"):
        profile.measure(quick=True, fmt="int3")


def test_a_quick_profile_is_measured_once_for_its_threads(tmp_path, monkeypatch):
    """Without a saved profile a start measures quickly and saves that measurement for its threads
    (the next start reuses it, silently); other threads measure their own; a full profile wins."""
    from engine import profile
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path))
    calls = []

    def measure(quick=False, threads=None, fmt="bfloat16"):
        calls.append(threads)
        return {"machine": profile.machine(), "quick": quick, "format": fmt, "cpu_threads": threads or 3}
    monkeypatch.setattr(profile, "measure", measure)
    said = []
    first = profile.load_or_measure(2, say=said.append)
    assert profile.load_or_measure(2, say=said.append) == first and calls == [2] and len(said) == 1
    profile.load_or_measure(None, say=said.append)
    assert calls == [2, None] and profile.default_threads() is None   # quick ones pick no threads
    full = dict(first, quick=False, cpu_threads=5)
    profile.save(full)
    assert profile.load_or_measure(2) == full and profile.default_threads() == 5 and calls == [2, None]
