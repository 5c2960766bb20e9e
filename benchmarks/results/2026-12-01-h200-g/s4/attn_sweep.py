"""Paged decode attention at depth (B = 1, Qwen3-30B-A3B heads: 32 q, 4 kv, D 128, page 16): the split kernel's
tile settings against the default, K+V bytes read per second; context 32k with the page table as wide as 32k and 64k."""
import itertools, json, sys
import torch, triton
from triton.testing import do_bench_cudagraph
from kernels.attention_triton import _split_kernel, combine_splits, paged_decode_attention, LOG2E
sys.path.insert(0, ".probe")
import attn_old  # the kernel before: git show a06234b:kernels/attention_triton.py > .probe/attn_old.py

Hq, Hkv, D, page = 32, 4, 128, 16
res = []
for ctx, span in ((32768, 32768), (32768, 65536), (1024, 65536)):
    n_pages = span // page
    k = torch.randn(n_pages, page, Hkv, D, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    pt = torch.randperm(n_pages, device="cuda", dtype=torch.int32).view(1, n_pages)
    lens = torch.full((1,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(1, Hq, D, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * ctx * Hkv * D * 2
    ref = paged_decode_attention(q, k, v, pt, lens, D ** -0.5)
    for name, fn in (("default", paged_decode_attention), ("default_old", attn_old.paged_decode_attention)):
        ms = do_bench_cudagraph(lambda: fn(q, k, v, pt, lens, D ** -0.5))
        res.append({"ctx": ctx, "span": span, "cfg": name, "us": ms * 1e3, "GB/s": nbytes / ms / 1e6}); print(res[-1], flush=True)
    for old, block_n, n_split, warps, stages in itertools.product((0, 1), (64, 128), (128, 256, 512), (4, 8), (2, 3)):
        n_blocks = triton.cdiv(span, block_n)
        if n_split > n_blocks: continue
        chunk = triton.cdiv(n_blocks, n_split) * block_n
        part = torch.empty(1, Hq, n_split, D, device="cuda"); ml = torch.empty(1, Hq, n_split, 2, device="cuda")
        out = torch.empty(1, Hq, D, dtype=q.dtype, device="cuda")
        def f():
            kern, extra = (attn_old._split_kernel, (chunk,)) if old else (_split_kernel, ())
            kern[(1, Hkv, n_split)](q, k, v, pt, lens, q, part, ml, D ** -0.5 * LOG2E, D, Hq, *extra, 0,
                q.stride(0), q.stride(1), *k.stride()[:3], *v.stride()[:3], pt.stride(0), G=Hq // Hkv, PAGE=page,
                NSPLIT=n_split, PREC="tf32", SINK=False, BLOCK_G=16, BLOCK_D=128, BLOCK_N=block_n,
                num_warps=warps, num_stages=stages)
            combine_splits(part, ml, out)
        try:
            f(); torch.cuda.synchronize()
            ok = torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
            ms = do_bench_cudagraph(f)
        except Exception as e:
            print("fail", block_n, n_split, warps, stages, str(e)[:100]); continue
        res.append({"ctx": ctx, "span": span, "cfg": ["old" if old else "new", block_n, n_split, warps, stages], "ok": ok, "us": ms * 1e3,
                    "GB/s": nbytes / ms / 1e6})
    best = sorted((r for r in res if r["ctx"] == ctx and r["span"] == span and isinstance(r["cfg"], list)), key=lambda r: r["us"])[:6]
    for r in best: print("best", r, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=0)
