"""Prefill attention through ref.paged_attention: FlashAttention (the new path) against the masked SDPA
(memory-efficient kernel) it replaced, Qwen3-30B-A3B heads (32 q, 4 kv, 128), bf16, H200; median of 5.
Also: FlashAttention's op with grouped K/V unexpanded against expanded; and an end-to-end check on the
synthetic model (2 layers): prefill logits and greedy tokens (chunked prefill) flash vs masked."""
import statistics, sys, json
import torch
from kernels import ref
dev, dt, page = "cuda", torch.bfloat16, 16
Hq, Hkv, D = 32, 4, 128
flash = ref._flash_prefill
def timed(fn, n=5):
    for _ in range(2): fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)
rows = []
g = torch.Generator(device=dev).manual_seed(0)
for ql, ctx in [(16384, 16384), (8192, 16384), (200, 16584), (16384, 65536), (512, 65536)]:
    P = ctx // page + 2
    k, v = (torch.randn(P, page, Hkv, D, device=dev, dtype=dt, generator=g) for _ in range(2))
    pt = torch.arange(1, P, device=dev, dtype=torch.int32)[None]
    q = torch.randn(ql, Hq, D, device=dev, dtype=dt, generator=g)
    call = lambda: ref.paged_attention(q, k, v, pt, [ql], [ctx], D ** -0.5)
    new = timed(call); o_new = call()
    ref._flash_prefill = lambda *a: False
    old = timed(call); o_old = call()
    ref._flash_prefill = flash
    seen = ql * (ctx - ql) + ql * (ql + 1) / 2
    tflop = 4 * seen * D * Hq / 1e12
    r = {"q": ql, "ctx": ctx, "flash_ms": new, "masked_ms": old, "speedup": old / new,
         "flash_tflops": tflop / new * 1e3, "masked_tflops": tflop / old * 1e3,
         "max_diff": (o_new.float() - o_old.float()).abs().max().item(), "max_ref": o_old.float().abs().max().item()}
    rows.append(r); print(r, flush=True)
# grouped K/V unexpanded through the op (what the code could use instead of expanding)
q4 = torch.randn(1, Hq, 4096, D, device=dev, dtype=dt, generator=g)
k4, v4 = (torch.randn(1, Hkv, 8192, D, device=dev, dtype=dt, generator=g) for _ in range(2))
try:
    a = torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4, 0.0, True, scale=D ** -0.5)[0]
    e = torch.ops.aten._scaled_dot_product_flash_attention(q4, *(t.repeat_interleave(Hq // Hkv, 1) for t in (k4, v4)), 0.0, True, scale=D ** -0.5)[0]
    print("gqa unexpanded vs expanded max diff", (a.float() - e.float()).abs().max().item())
except Exception as ex:
    print("gqa unexpanded:", type(ex).__name__, str(ex)[:200])
sys.path.insert(0, "tests")
from conftest import greedy, prefill_logits
from freetoken_cli.common import engine_config
from engine.loader import load_synthetic
runner = load_synthetic(engine_config(None, "cuda", "16GiB", "fetch", 8, 8192), "qwen3-30b-a3b", 2)
ids = torch.randint(0, runner.cfg.vocab_size, (6000,), generator=torch.Generator().manual_seed(1)).tolist()
l_new = prefill_logits(runner, ids).float(); t_new = greedy(runner, ids, 16)
ref._flash_prefill = lambda *a: False
l_old = prefill_logits(runner, ids).float(); t_old = greedy(runner, ids, 16)
ref._flash_prefill = flash
e2e = {"logits_max_diff": (l_new - l_old).abs().max().item(), "logits_max": l_old.abs().max().item(),
       "argmax_agree": (l_new.argmax(-1) == l_old.argmax(-1)).float().mean().item(),
       "greedy_flash": t_new, "greedy_masked": t_old}
print(e2e)
json.dump({"rows": rows, "e2e": e2e}, open(sys.argv[1], "w"), indent=1)
