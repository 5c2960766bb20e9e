"""Model (CPU only): a fractional split of the boundary expert whose part left to the CPU is
filled afterwards, while the GPU runs the next layer's attention (window), so it is cached.
Usage: python3 benchmarks/results/2026-11-30-h200-d/model_fractional.py /tmp/trace.npy"""
import sys, math, numpy as np
sys.path.insert(0, ".")
import engine.moe.tables as tables
from engine.moe.tables import HostTables
from kernels.ref import split_fetch
trace = np.load(sys.argv[1]); T, L, K = trace.shape; E, s = 128, 9437184
def sim(slots, bp, bh, c0, window, frac):
    tp, th = s / bp, s / bh; q = bp / (bp + bh)
    st = {}
    def patched(m, q_, rec=False):
        if not frac or m == 0:
            f = split_fetch(m, q_, rec); st["f"] = f; st["r"] = 0.0; return f
        # continuous balance incl. the job cost: (x)tp = (m-x)th + c0  ->  x = (m th + c0)/(tp+th)
        x = min(m, max(0.0, (m * th + c0) / (tp + th)))
        if rec: x = max(x, 1.0)
        f, r = int(x), x - int(x)
        st["f"], st["r"] = f, r
        return f + (1 if r > 1e-9 else 0)  # the boundary expert enters the cache (completed later)
    tables.split_fetch = patched
    t = HostTables(slots, L * E, L)
    for n in range(min(L, slots // E)): t.install_block(n * E, n * E, E)
    tot = 0.0; carry = 0.0; hits = miss = 0
    for tok in range(T):
        for l in range(L):
            _, vic, _, h, m = t.plan([trace[tok, l].tolist()], l * E, q)
            f, r = st["f"], st["r"]
            link = carry + (f + r) * tp      # the last completion's excess delays this step's fills
            cpu = (m - f - r) * th + (c0 if m - f - r > 1e-9 else 0.0)
            step = max(link, cpu)
            carry = max(0.0, (1 - r) * tp - window) if r > 1e-9 else 0.0
            if tok >= 64: tot += step; hits += h; miss += m
    return round(tot / (T - 64) * 1e3, 2), round(hits / (hits + miss), 3)
bp, bh = 48.8e9, 53.9e9
for gib, slots in [(4, 455), (8, 910), (16, 1820)]:
    print(gib, "whole", sim(slots, bp, bh, 25e-6, 115e-6, False), "fractional", sim(slots, bp, bh, 25e-6, 115e-6, True),
          "fractional, no window", sim(slots, bp, bh, 25e-6, 0.0, True))
