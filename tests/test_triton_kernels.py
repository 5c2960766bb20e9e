"""Parity of the Triton kernels with freetoken_kernels/ref.py. Without CUDA they run under TRITON_INTERPRET=1
(fp32/fp16 only, small shapes); with CUDA the same tests run the compiled kernels, also in bf16,
plus decode-sized shapes. Low-precision results are compared with the fp32 reference computed
from the same (rounded) inputs, within two ulps of the input dtype."""
from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported
pytest.importorskip("triton")

from engine.moe.layout import SlotLayout  # noqa: E402
from freetoken_kernels import moe_mma, ref  # noqa: E402
from freetoken_kernels.attention_triton import paged_decode_attention  # noqa: E402
from freetoken_kernels.mla_triton import TILES, mla_decode_attention  # noqa: E402
from freetoken_kernels.moe_gemm_triton import moe_experts_gemm  # noqa: E402
from freetoken_kernels.moe_triton import moe_experts, moe_experts_auto  # noqa: E402
from freetoken_kernels.plan_triton import plan  # noqa: E402
from freetoken_kernels.quant import QWeight, quantize  # noqa: E402
from freetoken_kernels.router_triton import route  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _need(dtype):
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("bf16 is broken in the Triton interpreter")


def _close(out, ref32, dtype):
    """|out - ref| <= 2 ulp(dtype) * (|ref| + max|ref|/2); fp32: 1e-5 relative."""
    eps = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    scale = ref32.abs().max().item()
    torch.testing.assert_close(out.float().cpu(), ref32.cpu(), rtol=eps, atol=eps * scale / 2)


# ---------------------------------------------------------------- moe_experts
def _pool_views(S, H, I, dtype, gen):
    """Weights as strided views into a padded per-slot byte pool, like the device cache."""
    esz = torch.tensor([], dtype=dtype).element_size()
    slot_bytes = (3 * I * H * esz + 255) // 256 * 256 + 256          # padded slot stride
    pool = torch.zeros(S, slot_bytes, dtype=torch.uint8)
    flat = pool.view(dtype)
    flat[:, :3 * I * H] = (torch.randn(S, 3 * I * H, generator=gen) * 0.3).to(dtype)
    pool = pool.to(DEV)
    flat = pool.view(dtype)
    return flat[:, :2 * I * H].view(S, 2 * I, H), flat[:, 2 * I * H:3 * I * H].view(S, H, I)


BIG_BLOCKS, SMALL_BLOCKS = (8, 512, 16, 256), (4, 32, 16, 16)     # one tile / loops + tails


@pytest.mark.parametrize("xdt,wdt,blocks", [(d, d, BIG_BLOCKS) for d in DTYPES] + [
    (torch.float32, torch.float16, BIG_BLOCKS), (torch.float16, torch.float32, BIG_BLOCKS),
    (torch.float32, torch.float32, SMALL_BLOCKS), (torch.float16, torch.float16, SMALL_BLOCKS),
    (torch.bfloat16, torch.bfloat16, SMALL_BLOCKS)])
def test_moe_experts_matches_ref(xdt, wdt, blocks):
    _need(xdt), _need(wdt)
    gen = torch.Generator().manual_seed(0)
    T, K, H, I, S = 3, 4, 80, 40, 6
    wgu, wd = _pool_views(S, H, I, wdt, gen)
    assert wgu.stride(0) > 2 * I * H and not wgu.is_contiguous()
    x = torch.randn(T, H, generator=gen).to(xdt).to(DEV)
    slots = torch.randint(-1, S, (T, K), generator=gen)
    slots[0, 0], slots[1, 1], slots[2, 2] = -1, slots[0, 1], slots[0, 1]  # dead and shared routes
    w = torch.rand(T, K, generator=gen).to(DEV)
    out = moe_experts(x, wgu, wd, slots.to(DEV), w, blocks=blocks)
    ref32 = ref.moe_experts(x.float().cpu(), wgu.to(xdt).float().cpu(), wd.to(xdt).float().cpu(),
                            slots, w.float().cpu())
    assert out.dtype == torch.float32 and out.shape == (T, H)
    _close(out, ref32, xdt)


def test_moe_experts_dead_routes_and_auto():
    gen = torch.Generator().manual_seed(1)
    T, K, H, I, S = 2, 2, 48, 24, 3
    wgu, wd = _pool_views(S, H, I, torch.float32, gen)
    x = torch.randn(T, H, generator=gen).to(DEV)
    w = torch.full((T, K), float("nan"), device=DEV)          # must not leak from dead routes
    slots = torch.full((T, K), -1, dtype=torch.int64, device=DEV)
    assert torch.equal(moe_experts(x, wgu, wd, slots, w).cpu(), torch.zeros(T, H))
    slots[1, 0], w[1, 0] = 2, 0.5
    got = moe_experts_auto(x, wgu, wd, slots, torch.nan_to_num(w))
    _close(got, ref.moe_experts(x.cpu(), wgu.cpu(), wd.cpu(), slots.cpu(),
                                torch.nan_to_num(w).cpu()), torch.float32)
    assert got[0].abs().max() == 0 and got[1].abs().max() > 0
    per_route = moe_experts(x, wgu, wd, slots, torch.nan_to_num(w), reduce=False)
    assert per_route.shape == (T, K, H) and torch.equal(per_route.sum(1), moe_experts(x, wgu, wd, slots, torch.nan_to_num(w)))
    auto = moe_experts_auto(x, wgu, wd, slots, torch.nan_to_num(w), reduce=False)
    assert auto.shape == (T, K, H)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moe_experts_decode_shape_gpu(dtype):
    gen = torch.Generator().manual_seed(2)
    T, K, H, I, S = 4, 8, 2048, 768, 12
    wgu, wd = _pool_views(S, H, I, dtype, gen)
    x = torch.randn(T, H, generator=gen).to(dtype).to(DEV)
    slots = torch.randint(-1, S, (T, K), generator=gen)
    w = torch.rand(T, K, generator=gen)
    out = moe_experts(x, wgu, wd, slots.to(DEV), w.to(DEV))
    _close(out, ref.moe_experts(x.double(), wgu.double(), wd.double(), slots.to(DEV),
                                w.to(DEV).double()).float(), dtype)


# ---------------------------------------------------------------- moe_experts, quantized weights
def _qexperts(fmt, S, H, I, group, symmetric, scale_dtype, pooled, gen):
    """S random experts (gate_up [2I, H], down [H, I]), each weight quantize()d on DEV: QWeights
    of the stacked parts, or of views into the rows of the slot cache's layout (SlotLayout), and
    the dequantized fp32 weights [S, N, K] (CPU)."""
    parts = {w: [quantize(fmt, (torch.randn(n, k, generator=gen) * 0.3).to(DEV), group,
                          scale_dtype, symmetric) for _ in range(S)]
             for w, (n, k) in (("gate_up", (2 * I, H)), ("down", (H, I)))}
    qws = {}
    for w, ps in parts.items():
        q, s, z = (None if t[0] is None else torch.stack(t) for t in zip(*(p[:3] for p in ps)))
        qws[w] = QWeight(fmt, q, s, z, ps[0][3])
    deq = tuple(torch.stack([q.dequant(i) for i in range(S)]).cpu() for q in qws.values())
    if pooled:
        layout = SlotLayout.for_qweights(fmt, {w: ps[0] for w, ps in parts.items()})
        views = layout.views(torch.zeros(S, layout.slot_bytes, dtype=torch.uint8, device=DEV))
        for w, q in qws.items():
            for v, t in zip((views[w].q, views[w].s, views[w].z), (q.q, q.s, q.z)):
                if t is not None:
                    v.copy_(t)
        assert views["gate_up"].q.stride(0) > views["gate_up"].q[0].numel()
        qws = views
    return (qws["gate_up"], qws["down"]), deq


QUANT = [("int4", True), ("int4", False), ("int8", True), ("int8", False), ("fp8", True),
         ("mxfp4", True)]


@pytest.mark.parametrize("fmt,symmetric", QUANT)
@pytest.mark.parametrize("T,xdt,blocks,pooled", [(1, torch.float32, SMALL_BLOCKS, True),
                                                 (3, torch.float16, (8, 64, 32, 64), False),
                                                 (3, torch.float32, None, True)])
def test_moe_experts_quantized_matches_ref(fmt, symmetric, T, xdt, blocks, pooled):
    """Every format against the reference on the dequantized weights: tiles smaller and larger
    than a quantization block, loops with tails, dead and shared routes, stacked and pooled."""
    gen = torch.Generator().manual_seed(5)
    K, H, I, S = 4, 96, 64, 5
    scale_dtype = torch.float16 if symmetric else torch.float32
    (wgu, wd), (dgu, dd) = _qexperts(fmt, S, H, I, 32, symmetric, scale_dtype, pooled, gen)
    x = torch.randn(T, H, generator=gen).to(xdt)
    slots = torch.stack([torch.randperm(S, generator=gen)[:K] for _ in range(T)])
    slots[0, 0] = -1
    if T > 1:
        slots[1, 1], slots[2, 2] = slots[0, 1], -1
    w = torch.rand(T, K, generator=gen)
    out = moe_experts(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV), blocks=blocks)
    ref32 = ref.moe_experts(x.float(), dgu, dd, slots, w)
    assert out.dtype == torch.float32 and out.shape == (T, H)
    _close(out, ref32, torch.float32)          # fp16 x is exact in fp32: no rounding of its own
    cpu = [QWeight(q.fmt, *(None if t is None else t.cpu() for t in (q.q, q.s, q.z)), q.block)
           for q in (wgu, wd)]
    assert torch.equal(ref.moe_experts(x.float(), *cpu, slots, w), ref32)


def test_moe_experts_quantized_dead_routes_and_auto():
    gen = torch.Generator().manual_seed(6)
    T, K, H, I, S = 2, 2, 64, 32, 3
    (wgu, wd), (dgu, dd) = _qexperts("int4", S, H, I, 16, False, torch.float16, True, gen)
    x = torch.randn(T, H, generator=gen)
    slots = torch.full((T, K), -1, dtype=torch.int64)
    w = torch.full((T, K), float("nan"))                      # must not leak from dead routes
    dead = moe_experts(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV))
    assert torch.equal(dead.cpu(), torch.zeros(T, H))
    slots[1, 0], w = 2, torch.nan_to_num(w)
    w[1, 0] = 0.5
    got = moe_experts_auto(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV))
    _close(got, ref.moe_experts(x, dgu, dd, slots, w), torch.float32)
    assert got[0].abs().max() == 0 and got[1].abs().max() > 0


@pytest.mark.skipif(not CUDA, reason="needs CUDA (Gluon and inline PTX: no interpreter)")
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("T,H,I", [(1, 512, 256), (3, 2048, 768), (2, 1792, 384)])
def test_moe_mma_int4_matches_fp32_with_h_in_bf16(symmetric, T, H, I):
    """The tensor-core int4 path (taken by moe_experts_auto) against fp32 products on the dequantized weights with
    h rounded to bf16, as the path rounds it: pooled slots, dead and shared routes, groups split over 4 warps and
    (H 1792) over 2."""
    gen = torch.Generator().manual_seed(7)
    K, S = 8, 10
    (wgu, wd), (dgu, dd) = _qexperts("int4", S, H, I, 128, symmetric, torch.float16, True, gen)
    x = torch.randn(T, H, generator=gen).bfloat16()
    slots = torch.stack([torch.randperm(S, generator=gen)[:K] for _ in range(T)])
    slots[0, 0] = -1
    if T > 1:
        slots[1, 1] = slots[0, 1]
    w = torch.rand(T, K, generator=gen)
    assert moe_mma.usable(x.to(DEV), wgu, wd, ref.SILU, None)
    got = moe_experts_auto(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV))
    want = torch.zeros(T, H)
    for t, k in ((t, k) for t in range(T) for k in range(K) if slots[t, k] >= 0):
        gu = dgu[slots[t, k]] @ x[t].float()
        h = (torch.nn.functional.silu(gu[:I]) * gu[I:]).bfloat16().float()
        want[t] += w[t, k] * (dd[slots[t, k]] @ h)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=2e-3 * want.abs().max().item())
    routes = moe_mma.moe_experts(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV), reduce=False)
    assert routes.shape == (T, K, H) and routes[0, 0].abs().max() == 0
    torch.testing.assert_close(routes.sum(1), got)


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_moe_experts_with_a_scale_per_row_match_ref(fmt):
    """One scale per row and matrix (compressed-tensors' channel strategy: blocks (1, K), K differing
    between gate_up and down), through the decode GEMVs and the grouped GEMMs."""
    gen = torch.Generator().manual_seed(9)
    T, K, H, I, S = 3, 4, 96, 64, 5

    def qw(n, k):
        ws = [torch.randn(n, k, generator=gen) * 0.3 for _ in range(S)]
        if fmt == "int8":
            ps = [quantize("int8", w, k, torch.float16, False) for w in ws]
        else:
            ps = [((w / (s := w.abs().amax(1, keepdim=True) / 448)).to(torch.float8_e4m3fn), s, None, (1, k))
                  for w in ws]
        q = QWeight(fmt, *(None if t[0] is None else torch.stack(t).to(DEV) for t in zip(*(p[:3] for p in ps))),
                    ps[0][3])
        return q, torch.stack([q.dequant(i) for i in range(S)]).cpu()
    (wgu, dgu), (wd, dd) = qw(2 * I, H), qw(H, I)
    assert wgu.block == (1, H) and wd.block == (1, I)
    x = torch.randn(T, H, generator=gen)
    slots = torch.stack([torch.randperm(S, generator=gen)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=gen)
    ref32 = ref.moe_experts(x, dgu, dd, slots, w)
    for fn in (moe_experts, moe_experts_gemm):
        _close(fn(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV)), ref32, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,symmetric", QUANT)
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_moe_experts_quantized_decode_shape_gpu(fmt, symmetric, scale_dtype):
    """bf16 x at the Qwen3-30B-A3B expert shape, pooled slots, groups of 128."""
    gen = torch.Generator().manual_seed(7)
    T, K, H, I, S = 4, 8, 2048, 768, 10
    (wgu, wd), (dgu, dd) = _qexperts(fmt, S, H, I, 128, symmetric, scale_dtype, True, gen)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    slots = torch.randint(-1, S, (T, K), generator=gen)
    w = torch.rand(T, K, generator=gen)
    out = moe_experts(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV))
    _close(out, ref.moe_experts(x.double(), dgu.double(), dd.double(), slots, w.double()).float(),
           torch.float32)


def _experts(fmt, S, H, I, group, symmetric, pooled, gen, dtype=torch.float16):
    """(weights as the kernels take them, their fp32 values on the CPU): quantized as _qexperts,
    or plain `dtype` views of a slot pool."""
    if fmt == "plain":
        w = _pool_views(S, H, I, dtype, gen)
        return w, tuple(t.float().cpu() for t in w)
    return _qexperts(fmt, S, H, I, group, symmetric, dtype, pooled, gen)


def test_gemm_tiles_built_on_the_device_match_the_host_list():
    """The grouped GEMMs' tiles, built without a host sync, are the host's list (per slot in
    order, at most block_m routes each, slot -1 skipped) followed by empty rows, within the bound
    the shapes give."""
    from freetoken_kernels.moe_gemm_triton import _tiles
    gen = torch.Generator().manual_seed(3)
    for T, K, S, bm in ((24, 4, 5, 16), (7, 8, 40, 4), (50, 2, 3, 64), (1, 1, 1, 1)):
        slots = torch.randint(-1, S, (T, K), generator=gen)
        order, tiles = _tiles(slots, bm, S)
        flat = slots.reshape(-1)
        assert torch.equal(order, torch.argsort(flat, stable=True))
        want, start = [], 0
        for s, n in zip(*[t.tolist() for t in torch.unique_consecutive(flat[order], return_counts=True)]):
            want += [[s, r, min(r + bm, start + n)] for r in range(start, start + n, bm)] if s >= 0 else []
            start += n
        assert len(tiles) == -(-T * K // bm) + min(S, T * K) >= len(want)
        assert tiles[:len(want)].tolist() == want and not tiles[len(want):].any()


@pytest.mark.parametrize("fmt,symmetric", QUANT + [("plain", True)])
@pytest.mark.parametrize("xdt,blocks,pooled", [(torch.float32, (16, 16, 64, 32, 16), True),
                                               (torch.float16, (32, 32, 32, 16, 64), False)])
def test_moe_experts_gemm_matches_ref(fmt, symmetric, xdt, blocks, pooled):
    """The prefill grouped GEMMs against the reference: several tiles per slot, dead routes,
    K tails; the weights rounded to x's dtype as the reference rounds them."""
    _need(xdt)
    gen = torch.Generator().manual_seed(8)
    T, K, H, I, S = 24, 4, 96, 64, 5
    (wgu, wd), (dgu, dd) = _experts(fmt, S, H, I, 32, symmetric, pooled, gen)
    x = torch.randn(T, H, generator=gen).to(xdt)
    slots = torch.randint(-1, S, (T, K), generator=gen)
    w = torch.rand(T, K, generator=gen)
    out = moe_experts_gemm(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV), blocks=blocks)
    ref32 = ref.moe_experts(x.float(), dgu.to(xdt).float(), dd.to(xdt).float(), slots, w)
    assert out.dtype == torch.float32 and out.shape == (T, H)
    _close(out, ref32, xdt)
    # the slots in two groups, their routes written into one buffer in turn and summed once: the
    # same bits as one call (a streamed layer's passes), in the GEMMs and in the reference
    for fn, dev, args in ((moe_experts_gemm, DEV, (wgu, wd)), (ref.moe_experts, "cpu", (dgu.float(), dd.float()))):
        xs, sl, ws = x.to(dev).float() if fn is ref.moe_experts else x.to(dev), slots.to(dev), w.to(dev)
        kw = dict(blocks=blocks) if fn is moe_experts_gemm else {}
        routes = fn(xs, *args, torch.where(sl < 2, sl, -1), ws, reduce=False, **kw)
        routes = fn(xs, *args, torch.where(sl < 2, -1, sl), ws, reduce=False, routes=routes, **kw)
        assert routes.shape == (T, K, H) and torch.equal(routes.sum(1), fn(xs, *args, sl, ws, **kw))
    if CUDA:  # more than 64 routes: auto runs the GEMMs (at their default blocks; other blocks
        # change the tensor cores' summation order, so only fp32 would match `out` bit for bit)
        args = x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV)
        assert torch.equal(moe_experts_auto(*args), moe_experts_gemm(*args))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,symmetric", QUANT + [("plain", True)])
def test_moe_experts_gemm_prefill_shape_gpu(fmt, symmetric):
    gen = torch.Generator().manual_seed(9)
    T, K, H, I, S = 512, 8, 2048, 768, 16
    (wgu, wd), (dgu, dd) = _experts(fmt, S, H, I, 128, symmetric, True, gen, torch.bfloat16)
    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    slots = torch.randint(-1, S, (T, K), generator=gen)
    w = torch.rand(T, K, generator=gen)
    out = moe_experts_auto(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV))
    _close(out, ref.moe_experts(x.double(), *(d.to(torch.bfloat16).double() for d in (dgu, dd)),
                                slots, w.double()).float(), torch.bfloat16)


# ---------------------------------------------------------------- expert biases, clamped SwiGLU
OSS_ACT = ref.ExpertAct(alpha=1.702, limit=0.9, shift=1.0)  # a limit the test's sums cross


def _biases(S, H, I, gen):
    """float32 biases ([S, 2I], [S, H]) as slot-strided views of one pool, as the layout holds them."""
    rows = (torch.randn(S, 2 * I + H + 64, generator=gen)).to(DEV)
    return rows[:, :2 * I], rows[:, 2 * I:2 * I + H]


@pytest.mark.parametrize("kernel,fmt", [("gemv", "plain"), ("gemv", "mxfp4"), ("gemv", "int4"),
                                        ("gemm", "plain"), ("gemm", "mxfp4"), ("gemm", "int4")])
def test_moe_experts_biases_and_clamped_swiglu_match_ref(kernel, fmt):
    """gpt-oss's expert options in the decode GEMVs and the prefill grouped GEMMs: biases on
    gate_up and down, and the clamped activation with (up + 1); dead and shared routes."""
    gen = torch.Generator().manual_seed(11)
    T, K, H, I, S = (3 if kernel == "gemv" else 24), 4, 96, 64, 5
    if fmt == "plain":
        wgu, wd = _pool_views(S, H, I, torch.float32, gen)
        dgu, dd = wgu.cpu(), wd.cpu()
    else:
        (wgu, wd), (dgu, dd) = _qexperts(fmt, S, H, I, 32, True, torch.float16, True, gen)
    bias = _biases(S, H, I, gen)
    x = torch.randn(T, H, generator=gen)
    slots = torch.randint(-1, S, (T, K), generator=gen)
    slots[0, 0], slots[1, 1] = -1, slots[0, 1]
    w = torch.rand(T, K, generator=gen)
    ref32 = ref.moe_experts(x, dgu, dd, slots, w, OSS_ACT, tuple(b.cpu() for b in bias))
    assert 0.1 < ((x @ dgu[0].t()).abs() > OSS_ACT.limit).float().mean() < 0.9
    fn = moe_experts if kernel == "gemv" else moe_experts_gemm
    out = fn(x.to(DEV), wgu, wd, slots.to(DEV), w.to(DEV), OSS_ACT, bias)
    _close(out, ref32, torch.float32)
    assert (out.cpu() - ref.moe_experts(x, dgu, dd, slots, w)).abs().max() > 0.1  # the options matter


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "mxfp4"])
def test_moe_experts_gpt_oss_shape_gpu(fmt):
    """gpt-oss-120b's experts (H = I = 2880, not a multiple of the GEMV tiles) with biases and the
    clamped SwiGLU, bf16 x: the decode GEMVs and the prefill grouped GEMMs."""
    gen = torch.Generator().manual_seed(14)
    K, H, I, S = 4, 2880, 2880, 6
    act = ref.ExpertAct(alpha=1.702, limit=7.0, shift=1.0)
    if fmt == "bf16":
        wgu, wd = _pool_views(S, H, I, torch.bfloat16, gen)
        dgu, dd = wgu.double(), wd.double()
    else:
        (wgu, wd), (dgu, dd) = _qexperts(fmt, S, H, I, 32, True, torch.float16, True, gen)
        dgu, dd = dgu.to(DEV).double(), dd.to(DEV).double()
    bias = _biases(S, H, I, gen)
    for T in (4, 128):  # 128 tokens: the grouped GEMMs
        x = (torch.randn(T, H, generator=gen) * 4).to(torch.bfloat16).to(DEV)
        slots = torch.randint(-1, S, (T, K), generator=gen).to(DEV)
        w = torch.rand(T, K, generator=gen).to(DEV)
        want = ref.moe_experts(x.double(), dgu, dd, slots, w.double(), act, tuple(b.double() for b in bias)).float()
        _close(moe_experts_auto(x, wgu, wd, slots, w, act, bias), want, torch.bfloat16)


@pytest.mark.gpu
def test_paged_decode_attention_gpt_oss_shape_gpu():
    """gpt-oss's attention (64 heads over 8 KV heads of 64 dims, sinks) at long contexts, full and
    with its 128-token window."""
    gen = torch.Generator().manual_seed(15)
    lens = [4096, 1, 300, 129]
    (q, k, v), pt = _attn_case(4, 64, 8, 64, 16, lens, torch.bfloat16, gen)
    sinks = (torch.randn(64, generator=gen) * 2).to(torch.bfloat16)
    for window in (None, 128):
        out = paged_decode_attention(q.to(DEV), k.to(DEV), v.to(DEV), pt.to(DEV),
                                     torch.tensor(lens, dtype=torch.int32, device=DEV), 0.125, window, sinks.to(DEV))
        _close(out, ref.paged_attention(q.float(), k.float(), v.float(), pt, [1] * 4, lens, 0.125, window,
                                        sinks.float()), torch.bfloat16)


# ---------------------------------------------------------------- paged decode attention
def _attn_case(B, Hq, Hkv, D, page, lens, dtype, gen):
    max_pages = max((c + page - 1) // page for c in lens) + 1
    P = B * max_pages + 1
    k = torch.randn(P, page, Hkv, D, generator=gen)
    v = torch.randn(P, page, Hkv, D, generator=gen)
    k[0] = v[0] = float("nan")                     # poison page: never to be read
    pt = torch.zeros(B, max_pages, dtype=torch.int32)
    perm = torch.randperm(P - 1, generator=gen) + 1
    for b, c in enumerate(lens):
        n = (c + page - 1) // page
        pt[b, :n] = perm[b * max_pages:b * max_pages + n]
        k[pt[b, n - 1], c - (n - 1) * page:] = float("nan")    # tail of the last page
        v[pt[b, n - 1], c - (n - 1) * page:] = float("nan")
    q = torch.randn(B, Hq, D, generator=gen)
    return [t.to(dtype) for t in (q, k, v)], pt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,Hkv,D,page,lens,n_split", [
    (3, 4, 2, 32, 4, [1, 13, 32], None), (3, 4, 2, 32, 4, [1, 13, 32], 1),
    (3, 4, 2, 32, 4, [5, 16, 30], 3), (2, 2, 2, 24, 16, [40, 7], 2)])
def test_paged_decode_attention_matches_ref(dtype, B, Hq, Hkv, D, page, lens, n_split):
    _need(dtype)
    gen = torch.Generator().manual_seed(3)
    (q, k, v), pt = _attn_case(B, Hq, Hkv, D, page, lens, dtype, gen)
    scale = D ** -0.5
    out = paged_decode_attention(q.to(DEV), k.to(DEV), v.to(DEV), pt.to(DEV),
                                 torch.tensor(lens, dtype=torch.int32, device=DEV), scale,
                                 n_split=n_split, block_n=16)
    ref32 = ref.paged_attention(q.float(), k.float(), v.float(), pt, [1] * B, lens, scale)
    assert out.dtype == dtype and out.shape == (B, Hq, D)
    _close(out, ref32, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window,sinks,n_split", [(7, False, None), (20, False, 2), (None, True, 3),
                                                  (20, True, 1), (6, True, 4)])
def test_paged_decode_attention_window_and_sinks(dtype, window, sinks, n_split):
    """Sliding windows (shorter and longer than a page, and than some contexts) and attention
    sinks, with the splits spread over the window: pages wholly before a window are NaN, so
    reading one fails the test, in the reference as in the kernel."""
    _need(dtype)
    gen = torch.Generator().manual_seed(12)
    B, Hq, Hkv, D, page, lens = 3, 4, 2, 32, 4, [3, 13, 30]
    (q, k, v), pt = _attn_case(B, Hq, Hkv, D, page, lens, dtype, gen)
    if window:
        for b, c in enumerate(lens):
            k[pt[b, :max(0, c - window) // page].long()] = float("nan")
    sink = (torch.randn(Hq, generator=gen) * 2).to(dtype) if sinks else None
    scale = D ** -0.5
    out = paged_decode_attention(q.to(DEV), k.to(DEV), v.to(DEV), pt.to(DEV),
                                 torch.tensor(lens, dtype=torch.int32, device=DEV), scale, window,
                                 None if sink is None else sink.to(DEV), n_split=n_split, block_n=16)
    ref32 = ref.paged_attention(q.float(), k.float(), v.float(), pt, [1] * B, lens, scale, window,
                                None if sink is None else sink.float())
    assert not ref32.isnan().any()
    _close(out, ref32, dtype)


def test_paged_attention_sinks_and_window_are_the_softmax_definition():
    """The reference's SDPA form (the sink as one more key) against the plain definition: scores,
    masked to the causal window, softmaxed together with the sink logit, which is then dropped."""
    gen = torch.Generator().manual_seed(13)
    Hq, Hkv, D, page, window = 4, 2, 8, 4, 5
    k, v = torch.randn(2, 3, page, Hkv, D, generator=gen)
    q = torch.randn(6, Hq, D, generator=gen)
    sinks = torch.randn(Hq, generator=gen)
    pt = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    got = ref.paged_attention(q, k, v, pt, [6], [10], 0.3, window, sinks)
    keys, vals = (t[pt[0].long()].flatten(0, 1)[:10].repeat_interleave(2, 1) for t in (k, v))  # [10, Hq, D]
    s = torch.einsum("thd,nhd->htn", q, keys) * 0.3
    qpos, kpos = torch.arange(4, 10)[:, None], torch.arange(10)[None]
    s = s.masked_fill(~((kpos <= qpos) & (kpos > qpos - window)), float("-inf"))
    p = torch.cat((s, sinks[:, None, None].expand(-1, 6, 1)), -1).softmax(-1)[..., :-1]
    torch.testing.assert_close(got, torch.einsum("htn,nhd->thd", p, vals), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Hq,Hkv,D", [(32, 4, 128), (16, 16, 64), (8, 2, 256)])
def test_paged_prefill_attention_flash_gpu(dtype, Hq, Hkv, D):
    """Prefill chunks (whole prompts and chunks after cached tokens, whose causal mask is aligned
    to the last key) through FlashAttention, grouped and plain heads, against the fp32
    reference's masked SDPA on the same inputs; one of the sequences is a single decode token."""
    gen = torch.Generator().manual_seed(21)
    q_lens, ctx_lens, page = [300, 5, 64, 1, 1000], [300, 37, 1100, 50, 1000], 16
    (_, k, v), pt = _attn_case(len(ctx_lens), Hq, Hkv, D, page, ctx_lens, dtype, gen)
    q = torch.randn(sum(q_lens), Hq, D, generator=gen).to(dtype)
    assert ref._flash_prefill(q.to(DEV), k.to(DEV), v.to(DEV))
    out = ref.paged_attention(q.to(DEV), k.to(DEV), v.to(DEV), pt.to(DEV), q_lens, ctx_lens, D ** -0.5)
    ref32 = ref.paged_attention(q.float(), k.float(), v.float(), pt, q_lens, ctx_lens, D ** -0.5)
    assert out.dtype == dtype and not ref32.isnan().any()
    _close(out, ref32, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_decode_attention_long_gpu(dtype):
    gen = torch.Generator().manual_seed(4)
    lens = [4096, 1, 2500, 777]
    (q, k, v), pt = _attn_case(4, 32, 4, 128, 16, lens, dtype, gen)
    out = paged_decode_attention(q.to(DEV), k.to(DEV), v.to(DEV), pt.to(DEV),
                                 torch.tensor(lens, dtype=torch.int32, device=DEV), 128 ** -0.5)
    _close(out, ref.paged_attention(q.float(), k.float(), v.float(), pt, [1] * 4, lens,
                                    128 ** -0.5), dtype)


# ---------------------------------------------------------------- MLA decode attention
def _mla_case(B, Hq, C, R, page, lens, dtype, gen):
    """Latent rows [P, page, 1, C + R] behind a shuffled page table (NaN past each sequence's
    end), and latent-space queries [B, Hq, C + R]."""
    (q, k, _), pt = _attn_case(B, Hq, 1, C + R, page, lens, torch.float32, gen)
    return q.to(dtype), k.to(dtype), pt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,C,R,page,lens,n_split,block_h", [
    (3, 5, 32, 8, 4, [1, 13, 32], None, 32), (3, 5, 32, 8, 4, [1, 13, 32], 1, 32),
    (2, 20, 48, 16, 16, [40, 7], 3, 16), (1, 16, 64, 16, 8, [77], 2, 32),
    (3, 36, 320, 24, 16, [200, 1, 90], 9, 16)])
def test_mla_decode_attention_matches_ref(dtype, B, Hq, C, R, page, lens, n_split, block_h):
    """Head blocks with a ragged tail (5, 20, 36 heads), latent and rope widths that are not powers
    of two, splits of the context (some past a sequence's end; 9 splits of a 320-wide latent, which
    the combine merges in two slices of the latent), NaN in the unused rows of each last page."""
    _need(dtype)
    gen = torch.Generator().manual_seed(5)
    q, kv, pt = _mla_case(B, Hq, C, R, page, lens, dtype, gen)
    scale = 0.3
    out = mla_decode_attention(q.to(DEV), kv.to(DEV), pt.to(DEV), torch.tensor(lens, dtype=torch.int32, device=DEV),
                               scale, C, n_split=n_split, block_n=16, block_h=block_h)
    ref32 = ref.latent_attention(q.float(), kv.float(), pt, [1] * B, lens, scale, C)
    assert out.dtype == dtype and out.shape == (B, Hq, C)
    _close(out, ref32, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_h,block_n", TILES)
def test_mla_decode_attention_deepseek_shape_gpu(dtype, block_h, block_n):
    """DeepSeek-V3's 128 heads over 512 + 64 latent rows at every tile setting bench_mla tries,
    with the default split count (one wave of programs)."""
    gen = torch.Generator().manual_seed(6)
    lens = [4096, 1, 2500, 777]
    q, kv, pt = _mla_case(4, 128, 512, 64, 16, lens, dtype, gen)
    out = mla_decode_attention(q.to(DEV), kv.to(DEV), pt.to(DEV), torch.tensor(lens, dtype=torch.int32, device=DEV),
                               192 ** -0.5, 512, block_n=block_n, block_h=block_h)
    _close(out, ref.latent_attention(q.float(), kv.float(), pt, [1] * 4, lens, 192 ** -0.5, 512), dtype)


@pytest.mark.gpu
def test_mla_decode_attention_graph_gpu():
    """Captured once in a CUDA graph, the launch follows the context lengths written into its
    ctx_lens between replays (the split count is fixed by the batch and the page table's width)."""
    gen = torch.Generator().manual_seed(7)
    lens = [1000, 3, 517]
    q, kv, pt = _mla_case(3, 128, 512, 64, 16, lens, torch.bfloat16, gen)
    args = [t.to(DEV) for t in (q, kv, pt)] + [torch.tensor(lens, dtype=torch.int32, device=DEV), 192 ** -0.5, 512]
    mla_decode_attention(*args)                                        # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mla_decode_attention(*args)
    for now in (lens, [17, 1, 300]):
        args[3].copy_(torch.tensor(now, dtype=torch.int32))
        graph.replay()
        _close(out, ref.latent_attention(q.float(), kv.float(), pt, [1] * 3, now, 192 ** -0.5, 512), torch.bfloat16)


# ---------------------------------------------------------------- plan
def _tables(L, E, S):
    return [torch.full((n,), -1, dtype=torch.int64) for n in (L * E, S, S, L * E)]


def _check_invariants(slot_of, owner_of, ids, layer, E, route):
    res = (slot_of >= 0).nonzero().flatten()
    assert torch.equal(owner_of[slot_of[res]], res)                # resident -> its slot
    occ = (owner_of >= 0).nonzero().flatten()
    assert torch.equal(slot_of[owner_of[occ]], occ)                # no slot double-booked
    flat = ids + layer * E
    placed, cpu = route >= 0, (route < 0) & (ids >= 0)
    assert torch.equal(owner_of[route[placed]], flat[placed])      # a GPU route hits its expert
    assert torch.equal(slot_of[flat[cpu]], torch.full_like(flat[cpu], -1))  # else CPU
    assert (route[ids < 0] == -1).all()                            # another rank's route: untouched


def _plan_sequence(q, L, E, K, S, t_max, steps, block_s=None, seed=0, foreign=0.0, reserved=0):
    """steps plan calls on random routing: kernel and ref.plan agree on every table and output.
    foreign: the share of routes given id -1 (another rank's expert); reserved: slots taken out
    as prefill buffers are (last_use at its maximum), which no step may pick."""
    gen = torch.Generator().manual_seed(seed)
    host = _tables(L, E, S)
    host[2][S - reserved:] = torch.iinfo(torch.int64).max
    dev = [t.clone().to(DEV) for t in host]                      # never aliases host
    clock, qt = torch.zeros(1, dtype=torch.int64, device=DEV), torch.tensor([q], dtype=torch.float64, device=DEV)
    n_out = t_max * K
    out = [torch.empty(n, dtype=torch.int64, device=DEV) for n in (n_out, n_out, 6)]
    out[2].zero_()
    totals = [0, 0, 0]
    for step in range(1, steps + 1):
        T = int(torch.randint(1, t_max + 1, (1,), generator=gen))
        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
        if foreign:
            ids = ids.masked_fill(torch.rand(ids.shape, generator=gen) < foreign, -1)
        layer = int(torch.randint(0, L, (1,), generator=gen))
        route = torch.empty(T, K, dtype=torch.int64, device=DEV)
        plan(ids.to(DEV), layer, E, *dev, clock, qt, route, *out, block_s=block_s)
        r_route, vic, fetch, hits, misses = ref.plan(ids, layer, E, *host, step, q)
        f = vic.numel()
        pad = torch.full((n_out - f,), -1, dtype=torch.int64)
        assert clock.item() == step
        totals = [a + b for a, b in zip(totals, (hits, misses, f))]
        assert out[2].tolist() == [hits, misses, f, *totals], step
        assert torch.equal(route.cpu(), r_route), step
        assert torch.equal(out[0].cpu(), torch.cat([vic, pad])), step
        assert torch.equal(out[1].cpu(), torch.cat([fetch, pad])), step
        for a, b in zip(dev, host):
            assert torch.equal(a.cpu(), b), step
        _check_invariants(host[0], host[1], ids, layer, E, r_route)
    assert (host[1][S - reserved:] == -1).all()                    # the reserved slots stayed empty
    assert host[1][:S - reserved].ge(0).all() == (q > 0)           # the pool filled up iff q > 0


@pytest.mark.parametrize("q", [0.0, 1.0, 0.37, 0.5, 1 / 3])  # 1/3: F ties decided by float64 rounding
def test_plan_matches_ref_over_a_sequence(q):
    _plan_sequence(q, L=3, E=8, K=3, S=10, t_max=3, steps=200, seed=int(q * 100))


@pytest.mark.parametrize("q", [0.0, 0.37, 1.0])
def test_plan_many_blocks_of_slots(q):
    _plan_sequence(q, L=3, E=8, K=3, S=13, t_max=3, steps=40, block_s=4, seed=7)


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0])
def test_plan_skips_routes_of_other_ranks(q):
    """Experts across ranks: a route with id -1 stays -1 and is neither a hit nor a miss."""
    _plan_sequence(q, L=3, E=8, K=3, S=10, t_max=3, steps=120, seed=30 + int(q * 10), foreign=0.4)


@pytest.mark.parametrize("q", [0.5, 1.0])
def test_plan_leaves_reserved_slots_alone(q):
    """Hits and reserved slots both rank last for eviction (in slot order, as the reference)."""
    _plan_sequence(q, L=3, E=8, K=3, S=16, t_max=2, steps=120, block_s=8, seed=40 + int(q * 10), reserved=3)


def test_plan_prefill_sized_step():
    """T*K = 256 routes (the largest tile), several blocks of slots."""
    _plan_sequence(0.6, L=2, E=64, K=8, S=100, t_max=32, steps=6, block_s=32, seed=8)


@pytest.mark.parametrize("T", [1, 3])
def test_plan_stages_the_cpu_branch(T):
    """With stage, the plan launch also writes the CPU branch's inputs (stage_cpu_inputs) and
    then, its answer flag (done) cleared, its go flag (signal), from the routes it just planned; a
    step that leaves no route to the CPU stages and signals nothing."""
    gen = torch.Generator().manual_seed(12)
    L, E, K, S, H, Tmax = 2, 8, 3, 5, 1100, 4
    dev = [t.to(DEV) for t in _tables(L, E, S)]
    clock, qt = torch.zeros(1, dtype=torch.int64, device=DEV), torch.tensor([0.5], dtype=torch.float64, device=DEV)
    host = dict(pin_memory=True) if CUDA else {}
    x_h, ids_h = torch.zeros(Tmax, H, **host), torch.full((Tmax, K), -5, dtype=torch.int64, **host)
    w_h, n_h, flags = torch.zeros(Tmax, K, **host), torch.zeros(1, dtype=torch.int64, **host), torch.zeros(2, dtype=torch.int32, **host)
    out = [torch.empty(n, dtype=torch.int64, device=DEV) for n in (T * K, T * K, 6)]
    seen = set()
    for step in range(1, 9):
        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(DEV)
        x, w = torch.randn(T, H, generator=gen).to(DEV), torch.rand(T, K, generator=gen).to(DEV)
        route = torch.empty(T, K, dtype=torch.int64, device=DEV)
        ids[0, 0] = -1  # another rank's route: staged as -1 too
        before = ids_h.clone(), x_h.clone()
        flags.fill_(7)
        qt.fill_(1.0 if step % 3 == 0 else 0.5)  # every third step fetches every miss
        plan(ids, step % L, E, *dev, clock, qt, route, *out, stage=(x, w, x_h, ids_h, w_h, n_h, flags[0:1], flags[1:2], 100 + step))
        if CUDA:
            torch.cuda.synchronize()
        cpu = bool(((route < 0) & (ids >= 0)).any())
        seen.add(cpu)
        if not cpu:
            assert flags.tolist() == [7, 7] and torch.equal(ids_h, before[0]) and torch.equal(x_h, before[1])
            continue
        assert torch.equal(ids_h[:T], torch.where(route < 0, ids, -1).cpu()) and (ids_h[T:] == -5).all()
        assert torch.equal(x_h[:T], x.cpu()) and torch.equal(w_h[:T], w.cpu()) and n_h.item() == out[2][2].item()
        assert flags.tolist() == [100 + step, 0]
    assert seen == {True, False}                                 # steps of both kinds


@pytest.mark.parametrize("full", [False, True])
def test_plan_split_fetch_and_capacity(full):
    """F for every M of one step against ref.split_fetch, at least the empty slots first in line,
    and the cap by unprotected slots."""
    E, S = 16, 6
    for q in (0.25, 0.5, 0.6, 0.9):
        for M in (1, 3, 5, 8):
            slot_of, owner_of, last_use, seen = (t.to(DEV) for t in _tables(1, E, S))
            slot_of[:2], owner_of[:2] = torch.arange(2), torch.arange(2)    # experts 0, 1 hit
            if full:                                                        # experts 12..15 fill the rest
                slot_of[12:], owner_of[2:] = torch.arange(2, S), torch.arange(12, 16)
            ids = torch.arange(M + 2).view(1, -1)
            out = [torch.empty(n, dtype=torch.int64, device=DEV) for n in (M + 2, M + 2, M + 2)]
            out.append(torch.tensor([0, 0, 0, 4, 5, 6], device=DEV))   # totals so far
            plan(ids.to(DEV), 0, E, slot_of, owner_of, last_use, seen,
                 torch.zeros(1, dtype=torch.int64, device=DEV), torch.tensor([q], device=DEV),
                 out[0].view(1, -1), *out[1:])
            f = min(ref.split_fetch(M, float(torch.tensor(q)), 0 if full else S - 2), S - 2)
            assert out[3].tolist() == [2, M, f, 6, 5 + M, 6 + f], (q, M)
            assert set(out[1][:f].tolist()) == set(range(2, 2 + f))   # LRU: slot order at equal last use


# ---------------------------------------------------------------- router
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,E,K,scoring,norm,scaling,bias,groups", [
    (1, 128, 8, "softmax", True, 1.0, False, None), (5, 60, 4, "softmax", False, 1.0, False, None),
    (3, 256, 8, "sigmoid", True, 2.5, True, None), (7, 8, 2, "sigmoid", False, 1.0, False, None),
    (4, 256, 8, "sigmoid", True, 2.5, True, (8, 4, "top2")),      # DeepSeek-V3 noaux_tc
    (3, 12, 3, "sigmoid", True, 1.5, True, (3, 2, "top2")),        # groups of 4 (not a power of two: 3)
    (5, 160, 6, "softmax", False, 16.0, False, (8, 3, "max")),     # DeepSeek-V2 group_limited_greedy
    (2, 20, 3, "softmax", False, 1.0, False, (5, 1, "max"))])
def test_router_matches_ref(dtype, T, E, K, scoring, norm, scaling, bias, groups):
    from engine.models.base import RouterSpec
    from engine.moe.router import route_ref
    _need(dtype)
    gen = torch.Generator().manual_seed(T * E)
    logits = (torch.randn(T, E, generator=gen) * 2).to(dtype)
    b = torch.randn(E, generator=gen) * 0.1 if bias else None
    n_group, topk_group, group_score = groups or (1, 1, "top2")
    spec = RouterSpec(top_k=K, scoring=scoring, norm_topk_prob=norm, scaling=scaling, bias=bias,
                      n_group=n_group, topk_group=topk_group, group_score=group_score)
    w_ref, ids_ref = route_ref(logits, spec, b)
    w, ids = route(logits.to(DEV), K, scoring, norm, scaling, None if b is None else b.to(DEV),
                   n_group, topk_group, group_score)
    assert torch.equal(ids.cpu(), ids_ref) and w.dtype == dtype
    _close(w, w_ref.float(), dtype)
    if groups:  # every chosen expert lies in one of topk_group groups
        assert all(len(set((row // (E // n_group)).tolist())) <= topk_group for row in ids.cpu())



@pytest.mark.gpu
def test_uniform_routing_on_the_device_draws_k_distinct_experts_evenly():
    """The bench's uniform routing in the router kernel: k distinct ids per token, every expert
    about equally often; a decode-sized step's layers drawn at its first layer, independently."""
    from engine.moe.replay import Uniform
    ids = Uniform(64)(0, torch.zeros(4096, 8, dtype=torch.int64, device="cuda")).cpu()
    assert ids.shape == (4096, 8) and all(len(set(r.tolist())) == 8 for r in ids)
    counts = torch.bincount(ids.flatten(), minlength=64).float()
    assert counts.min() > 0.8 * 512 and counts.max() < 1.2 * 512
    u, x = Uniform(64, n_layers=3), torch.zeros(2, 8, dtype=torch.int64, device="cuda")
    steps = [torch.stack([u(layer, x) for layer in range(3)]).cpu() for _ in range(1000)]  # [3, 2, 8] each
    assert all(len(set(r.tolist())) == 8 for s in steps for r in s.view(-1, 8))
    counts = torch.bincount(torch.stack(steps).flatten(), minlength=64).float()       # 750 an expert
    assert counts.min() > 0.8 * 750 and counts.max() < 1.2 * 750
    assert not torch.equal(steps[0][0], steps[0][1]) and not torch.equal(steps[0][0], steps[1][0])

# ---------------------------------------------------------------- attention prologue
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm,partial", [(True, 1.0), (False, 1.0), (True, 0.5)])
def test_qkv_rope_write_matches_unfused(dtype, norm, partial):
    """q/k head norm, (partial) rotary embedding and the KV writes of one launch against the
    unfused modules' plain functions; cache rows other than the written slots stay untouched."""
    from engine.layers.norm import rms_norm
    from engine.layers.rope import Rope, apply_rope
    from freetoken_kernels.attention_triton import qkv_rope_write
    _need(dtype)
    gen = torch.Generator().manual_seed(7)
    T, Hq, Hkv, D, S = 3, 4, 2, 32, 10
    qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=gen).to(dtype)
    qw, kw = (1 + 0.2 * torch.randn(D, generator=gen)).to(dtype), (1 + 0.2 * torch.randn(D, generator=gen)).to(dtype)
    rope = Rope({"rope_theta": 10000.0, "partial_rotary_factor": partial}, D, torch.device("cpu"))
    cos, sin = rope.cos_sin(torch.tensor([5, 0, 17]), dtype)
    slots = torch.tensor([7, 2, 4])
    kc, vc = torch.full((S, Hkv, D), 9.0, dtype=dtype), torch.full((S, Hkv, D), 9.0, dtype=dtype)
    kc_d, vc_d = kc.to(DEV), vc.to(DEV)
    q = qkv_rope_write(qkv.to(DEV), qw.to(DEV) if norm else None, kw.to(DEV) if norm else None, 1e-6,
                       cos.to(DEV), sin.to(DEV), slots.to(DEV), kc_d, vc_d, Hq)
    q32, k32, v32 = (t.float().view(T, -1, D) for t in qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1))
    if norm:
        q32, k32 = rms_norm(q32, qw.float(), 1e-6), rms_norm(k32, kw.float(), 1e-6)
    q32, k32 = apply_rope(q32, cos.float(), sin.float()), apply_rope(k32, cos.float(), sin.float())
    assert q.dtype == dtype and q.shape == (T, Hq, D)
    _close(q, q32, dtype)
    _close(kc_d[slots], k32, dtype)
    assert torch.equal(vc_d[slots].cpu(), v32.to(dtype))
    rest = torch.ones(S, dtype=torch.bool)
    rest[slots] = False
    assert (kc_d.cpu()[rest] == 9).all() and (vc_d.cpu()[rest] == 9).all()


# ---------------------------------------------------------------- norms
@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_kernels_match_reference(dtype):
    """RMSNorm rows of a 2-D input, a column slice (rows strided) and per-head rows of a 3-D
    one, and the residual add with the norm, against the plain functions; the weight's dtype
    promotes the result as in torch."""
    from engine.layers.norm import _rms_norm
    from freetoken_kernels.norm_triton import add_rms_norm, rms_norm
    _need(dtype)
    gen = torch.Generator().manual_seed(5)
    x, d = (torch.randn(5, 3 * 40, generator=gen).to(dtype) for _ in range(2))
    w = (1 + 0.2 * torch.randn(40, generator=gen)).to(dtype)
    for inp in (x[:, :40].contiguous(), x[:, 40:80], x.view(5, 3, 40)):
        got = rms_norm(inp.to(DEV), w.to(DEV), 1e-6)
        assert got.dtype == dtype and got.shape == inp.shape
        _close(got, _rms_norm(inp.float(), w.float(), 1e-6), dtype)
    assert rms_norm(x[:, :40].to(DEV), w.float().to(DEV), 1e-6).dtype == torch.float32
    h, y = add_rms_norm(x[:, :40].to(DEV), d[:, :40].to(DEV), w.to(DEV), 1e-6)
    want_h = x[:, :40] + d[:, :40]
    assert torch.equal(h.cpu(), want_h)
    _close(y, _rms_norm(want_h.float(), w.float(), 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias,centered", [(False, False), (True, False), (False, True)])
def test_linear_add_rms_norm_matches_linear_then_add_norm(dtype, bias, centered):
    """linear_add_rms_norm = add_rms_norm(x, F.linear(a, W, b)) for one token in one launch, the last
    program adding and normalising: its linear output against float64's, the sum bit for bit the
    unfused add's of that output, the norm the reference's (bit for bit in the interpreter; on a GPU
    its sum of squares may take another order); x a strided view, N and K not multiples of the
    tiles; called twice on one scratch with other inputs (its counter re-armed by the kernel)."""
    from freetoken_kernels.gemv_triton import counter
    from freetoken_kernels.norm_triton import add_rms_norm, linear_add_rms_norm
    _need(dtype)
    N, K = 40, 72
    gen = torch.Generator().manual_seed(bias + 2 * centered)
    x = torch.randn(1, 2 * N, generator=gen).to(dtype).to(DEV)[:, N:]
    lw = (torch.randn(N, K, generator=gen) / K ** 0.5).to(dtype).to(DEV)
    lb = (torch.randn(N, generator=gen) * 0.1).to(dtype).to(DEV) if bias else None
    w = (1 + 0.2 * torch.randn(N, generator=gen)).to(dtype).to(DEV)
    # NaN until written: a column read before its program has written it shows
    scratch = (torch.full((N,), float("nan"), dtype=dtype, device=DEV), torch.zeros(1, dtype=torch.int32, device=DEV))
    for _ in range(2):
        a = torch.randn(1, K, generator=gen).to(dtype).to(DEV)
        mix = a.double() @ lw.double().T + (0 if lb is None else lb.double())
        h, y = linear_add_rms_norm(x, a, lw, lb, w, 1e-6, centered, scratch=scratch, block_n=16, block_k=32)
        got_mix = scratch[0][None]
        _close(got_mix, mix.float(), dtype)
        want_h, want_y = add_rms_norm(x, got_mix, w, 1e-6, centered)
        assert torch.equal(h.cpu(), want_h.cpu()) and y.dtype == want_y.dtype
        if CUDA:
            _close(y, want_y.float(), dtype)
        else:
            assert torch.equal(y.cpu(), want_y.cpu())
        assert int(scratch[1]) == 0
    got = linear_add_rms_norm(x, a, lw, lb, w, 1e-6, centered, block_n=16, block_k=32)  # the device's counter
    assert all(torch.equal(g.cpu(), e.cpu()) for g, e in zip(got, (h, y))) and not counter(DEV).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_centered_and_gated_norm_kernels_match_reference(dtype):
    """The zero-centered (1 + w) norm, alone and after the residual add, and Gated DeltaNet's
    gated output norm (strided gate rows), against the plain functions, in x's dtype."""
    from engine.layers.norm import _gated_rms_norm, _rms_norm
    from freetoken_kernels.norm_triton import add_rms_norm, gated_rms_norm, rms_norm
    _need(dtype)
    gen = torch.Generator().manual_seed(6)
    x, d, g = (torch.randn(6, 2 * 32, generator=gen).to(dtype) for _ in range(3))
    w = (0.2 * torch.randn(32, generator=gen)).to(dtype)
    x, d = x[:, :32].contiguous(), d[:, :32].contiguous()
    got = rms_norm(x.to(DEV), w.to(DEV), 1e-6, True)
    assert got.dtype == dtype
    _close(got, _rms_norm(x.float(), w.float(), 1e-6, True), dtype)
    h, y = add_rms_norm(x.to(DEV), d.to(DEV), w.to(DEV), 1e-6, True)
    assert torch.equal(h.cpu(), x + d)
    _close(y, _rms_norm((x + d).float(), w.float(), 1e-6, True), dtype)
    for wt in (w, w.float()):
        got = gated_rms_norm(x.to(DEV), g[:, 32:].to(DEV), wt.to(DEV), 1e-6)
        assert got.dtype == dtype
        _close(got, _gated_rms_norm(x.float(), g[:, 32:].float(), w.float(), 1e-6), dtype)


# ---------------------------------------------------------------- CPU-branch merge
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_matches_torch(dtype):
    """The host partial sum merged back once the answer flag holds the step's value (and the
    routes summed), against plain torch; not read in a step that left no route to the CPU.
    Without the host part: the routes summed in order and cast."""
    _need(dtype)
    from freetoken_kernels.merge_triton import merge_routes
    gen = torch.Generator().manual_seed(3)
    T, K, H, Tmax = 3, 6, 1100, 4                                  # H not a multiple of the block
    host = dict(pin_memory=True) if CUDA else {}
    out, out_h = torch.randn(T, H, generator=gen), torch.randn(Tmax, H, generator=gen)
    flags = torch.tensor([0, 7], dtype=torch.int32, **host)         # go, done: the poller answered 7
    cpu = torch.tensor([2, 3, 1], device=DEV)                        # hits, misses, fills: the CPU ran
    y = merge_routes(out.to(DEV), dtype, out_h.pin_memory() if CUDA else out_h, flags[1:2], cpu, 7)
    if CUDA:
        torch.cuda.synchronize()
    assert y.dtype == dtype and torch.equal(y.cpu(), (out + out_h[:T]).to(dtype))
    per_route = torch.randn(T, K, H, generator=gen)                  # summed over the routes here
    y = merge_routes(per_route.to(DEV), torch.float32, out_h.pin_memory() if CUDA else out_h, flags[1:2], cpu, 7)
    want = out_h[:T].clone()
    for k in range(K):
        want += per_route[:, k]
    torch.testing.assert_close(y.cpu(), want, rtol=1e-6, atol=1e-6)
    flags[1] = 0                                                     # every miss filled: no wait, out_h not read
    y = merge_routes(per_route.to(DEV), torch.float32, out_h.pin_memory() if CUDA else out_h, flags[1:2],
                     torch.tensor([2, 3, 3], device=DEV), 7)
    torch.testing.assert_close(y.cpu(), want - out_h[:T], rtol=1e-5, atol=1e-5)
    assert flags.tolist() == [0, 0]
    y = merge_routes(per_route.to(DEV), dtype)                      # no CPU branch: the routes alone
    want = per_route[:, 0].clone()
    for k in range(1, K):
        want += per_route[:, k]
    assert y.dtype == dtype and torch.equal(y.cpu(), want.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,E,K,scoring,norm,scaling,bias,gate_bias,groups", [
    (64, 128, 8, "softmax", True, 1.0, False, False, None),        # Qwen3-MoE-like
    (96, 60, 4, "softmax", False, 1.0, False, False, None),        # H not a power of two
    (64, 256, 8, "sigmoid", True, 2.5, True, False, (8, 4, "top2")),  # DeepSeek-V3 noaux_tc
    (48, 32, 4, "softmax", True, 1.0, False, True, None)])         # gpt-oss: a bias in the router's linear layer
def test_fused_router_matches_linear_then_route(dtype, H, E, K, scoring, norm, scaling, bias, gate_bias, groups):
    """route_linear = route(F.linear(x, W, b)) for one token in one launch, the last program routing;
    called twice on one scratch (its counter re-armed by the kernel)."""
    from freetoken_kernels.gemv_triton import counter
    from freetoken_kernels.router_triton import route_linear
    _need(dtype)
    gen = torch.Generator().manual_seed(E + H)
    x = torch.randn(1, H, generator=gen).to(dtype).to(DEV)
    wt = (torch.randn(E, H, generator=gen) / H ** 0.5).to(dtype).to(DEV)
    gb = (torch.randn(E, generator=gen) * 0.1).to(dtype).to(DEV) if gate_bias else None
    b = (torch.randn(E, generator=gen) * 0.1).to(DEV) if bias else None
    n_group, topk_group, group_score = groups or (1, 1, "top2")
    args = (K, scoring, norm, scaling, b, n_group, topk_group, group_score)
    # NaN until written: a logit read before its program has written it shows
    scratch = (torch.full((E,), float("nan"), dtype=dtype, device=DEV), torch.zeros(1, dtype=torch.int32, device=DEV))
    logits = (x.double() @ wt.double().T + (0 if gb is None else gb.double())).to(dtype)
    w_ref, ids_ref = route(logits, *args)
    for _ in range(2):
        w, ids = route_linear(x, wt, gb, *args, scratch=scratch)
        assert torch.equal(ids.cpu(), ids_ref.cpu()) and w.dtype == dtype
        _close(w, w_ref.float(), dtype)
        _close(scratch[0][None], logits.float(), dtype)
        assert int(scratch[1]) == 0
    got = route_linear(x, wt, gb, *args)  # the device's counter
    assert all(torch.equal(g.cpu(), e.cpu()) for g, e in zip(got, (w, ids))) and not counter(DEV).any()
