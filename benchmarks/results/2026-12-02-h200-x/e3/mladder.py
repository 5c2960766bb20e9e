"""cuBLAS's first use of a GEMM kernel by row count: sweep M (every value up to MAX) on the model's dense shapes and
record the spikes (first call minus second, host time with syncs); or warm a ladder of row counts and count the spikes
left at random test row counts. usage: mladder.py sweep MAX | mladder.py test RULE MAX"""
import json, random, sys, time
import torch
import torch.nn.functional as F
SHAPES = [(5120, 2048), (2048, 4096), (128, 2048)]   # qkv, o, router of the 30B-A3B shape (bf16, no bias)
mode, MAX = sys.argv[1], int(sys.argv[-1])
dev = torch.device("cuda")
ws = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) / 50 for n, k in SHAPES]
xs = [torch.randn(MAX, k, dtype=torch.bfloat16, device=dev) for _, k in SHAPES]
torch.cuda.synchronize()


def call(i, m):
    torch.cuda.synchronize(); t = time.perf_counter(); F.linear(xs[i][:m], ws[i]); torch.cuda.synchronize()
    return time.perf_counter() - t


def first_second(i, m):
    a = call(i, m); b = call(i, m)
    return (a - b) * 1e3


def ladder(rule):
    if rule == "none":
        return []
    if rule == "pow2":
        return sorted({v for k in range(14) for v in (2 ** k, 2 ** k - 1) if 0 < v <= MAX})
    if rule == "pow2half":   # 2**k, 1.5 * 2**k, each also one less
        return sorted({v for k in range(14) for b in (2 ** k, 3 * 2 ** k // 2) for v in (b, b - 1) if 0 < v <= MAX})
    if rule == "step64":
        return sorted({v for b in range(64, MAX + 1, 64) for v in (b, b - 1)} | set(range(1, 64)))
    if rule.startswith("file:"):
        return json.load(open(rule[5:]))
    raise SystemExit(rule)


if mode == "sweep":
    rows = []
    for i in range(len(SHAPES)):
        for m in range(1, MAX + 1):
            d = first_second(i, m)
            if d > 0.3:
                rows.append({"shape": SHAPES[i], "m": m, "extra_ms": round(d, 3)})
    print(json.dumps({"spikes": rows, "n": len(rows), "total_ms": round(sum(r["extra_ms"] for r in rows), 1)}))
else:
    rule = sys.argv[2]
    t0 = time.perf_counter()
    L = ladder(rule)
    for i in range(len(SHAPES)):
        for m in L:
            F.linear(xs[i][:m], ws[i])
    torch.cuda.synchronize(); warm_s = time.perf_counter() - t0
    rng = random.Random(7); tests = rng.sample(range(1, MAX + 1), 300)
    left = []
    for m in tests:
        for i in range(len(SHAPES)):
            d = first_second(i, m)
            if d > 0.3:
                left.append((SHAPES[i][0], m, round(d, 2)))
    print(json.dumps({"rule": rule, "ladder": len(L), "warm_s": round(warm_s, 3), "spikes_left": len(left),
                      "extra_ms_left": round(sum(x[2] for x in left), 1), "left": left[:40]}))
