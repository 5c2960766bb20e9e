"""Scratch probe: does a gap between jobs (workers may fall asleep) slow the next job?"""
import ctypes, time, torch
from engine.moe.layout import SlotLayout
from kernels.cpu_executor import CPUExecutor, _core_cpus
lay = SlotLayout.for_experts(2048, 768, torch.bfloat16); slot = lay.slot_bytes
b = torch.empty(int(4e9) // slot, slot, dtype=torch.uint8); b.fill_(60); v = lay.views(b)
ex = CPUExecutor(8); lib = ex._lib
x = torch.randn(1, 2048, dtype=torch.bfloat16); out = torch.empty(1, 2048, dtype=torch.float32)
w = torch.full((1, 2), 0.5); g = torch.Generator().manual_seed(1)
pin = (ctypes.c_int * 8)(*(_core_cpus() + [-1] * 8)[:8])
for spin in [20000, 200000, 0]:
    lib.ftmoe_pool_destroy(ex._pool); ex._pool = lib.ftmoe_pool_create(8, pin, spin)
    for gap in [0, 300e-6, 1e-3]:
        cs, n = 0.0, 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.5:
            ids = torch.randperm(b.shape[0], generator=g)[:2].view(1, 2)
            f = ex.submit(x, v["gate_up"], v["down"], ids, w, out); f.wait(); cs += f.seconds; n += 1
            t1 = time.perf_counter()
            while time.perf_counter() - t1 < gap: pass
        print(f"spin {spin} pauses, gap {gap * 1e6:.0f} us: job {cs / n * 1e6:.0f} us, {2 * slot * n / cs / 1e9:.1f} GB/s", flush=True)
