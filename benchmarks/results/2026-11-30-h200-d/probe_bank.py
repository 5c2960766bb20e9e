"""Scratch probe: CPU expert executor bandwidth vs where in a large bank the experts lie."""
import os, subprocess, threading, time
import torch
from engine.moe.layout import SlotLayout
from engine.moe.store import pin_
from engine.profile import llc_bytes
from kernels.cpu_executor import CPUExecutor
from kernels.fill_triton import fill_rows

print(subprocess.run("lscpu | grep -iE 'numa|model name|L3|socket'; ls /sys/devices/system/node/ | grep node", shell=True,
                     capture_output=True, text=True).stdout, "llc", llc_bytes() >> 20, "MiB")
lay = SlotLayout.for_experts(2048, 768, torch.bfloat16)
slot = lay.slot_bytes
def make(n):
    b = torch.empty(n, slot, dtype=torch.uint8); b.fill_(60); pin_(b); return b
ex = CPUExecutor(8)
pool = torch.empty(16, slot, dtype=torch.uint8, device="cuda")
x = torch.randn(1, 2048, dtype=torch.bfloat16)
out = torch.empty(1, 2048, dtype=torch.float32)

def cpu_rate(b, lo, hi, k, secs=1.0, stop=None):
    """random distinct experts in rows [lo, hi); -> (wall GB/s, C++ job GB/s)"""
    v = lay.views(b); g = torch.Generator().manual_seed(1)
    w = torch.full((1, k), 1.0 / k); done = 0; cs = 0.0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs and not (stop and stop.is_set()):
        ids = (torch.randperm(hi - lo, generator=g)[:k] + lo).view(1, k)
        f = ex.submit(x, v["gate_up"], v["down"], ids, w, out); f.wait(); cs += f.seconds; done += k
    return round(done * slot / (time.perf_counter() - t0) / 1e9, 1), round(done * slot / cs / 1e9, 1)

def fill_rate(b, lo, hi, k, secs=1.0):
    vic = torch.arange(k, device="cuda"); done = 0; s = torch.cuda.Stream(); t0 = time.perf_counter()
    with torch.cuda.stream(s):
        while time.perf_counter() - t0 < secs:
            f = torch.randint(lo, hi, (k,), device="cuda"); fill_rows(b, pool, vic, f, 0); s.synchronize(); done += k
    return round(done * slot / (time.perf_counter() - t0) / 1e9, 1)

def both(b, lo, hi, k):
    r = {}; th = threading.Thread(target=lambda: r.setdefault("f", fill_rate(b, lo, hi, k))); th.start()
    r["c"] = cpu_rate(b, lo, hi, k); th.join(); return r["f"], r["c"]

small = make(int(1e9) // slot)
big = make(int(40e9) // slot)
g1 = int(1e9) // slot
cases = [("1GB bank", small, 0, small.shape[0]), ("40GB bank, first 1GB", big, 0, g1),
         ("40GB bank, last 1GB", big, big.shape[0] - g1, big.shape[0]), ("40GB bank, all", big, 0, big.shape[0])]
cpu_rate(small, 0, g1, 2, 0.3)
for rnd in range(2):
    for name, b, lo, hi in cases:
        print(f"round {rnd} {name}: cpu (wall, job) k=1 {cpu_rate(b, lo, hi, 1)} k=2 {cpu_rate(b, lo, hi, 2)} k=4 {cpu_rate(b, lo, hi, 4)} k=8 {cpu_rate(b, lo, hi, 8)} | both k=2 {both(b, lo, hi, 2)} k=8 {both(b, lo, hi, 8)}", flush=True)
