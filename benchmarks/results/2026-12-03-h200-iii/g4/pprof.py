"""One cold 16k int8 prompt at 1152 MiB under torch.profiler (after a warm-up and 2 plain prompts):
chrome trace + a timeline summary of the compute stream's idle gaps and the copy stream's busy time.
Usage: python3 pprof.py OUTDIR TAG [quant]"""
import gzip, json, sys, time
from pathlib import Path
import torch
from torch.profiler import ProfilerActivity, profile
from freetoken_cli.common import engine_config
from engine.loader import load_synthetic
from engine.profile import load_or_measure
from engine.scheduler import Scheduler
from engine.bench.prefill import ttft

out, tag = Path(sys.argv[1]), sys.argv[2]; quant = sys.argv[3] if len(sys.argv) > 3 else "int8"
out.mkdir(parents=True, exist_ok=True)
cfg = engine_config(None, "cuda", "1152MiB", "adaptive", None, 16384 + 216)
runner = load_synthetic(cfg, "qwen3-30b-a3b", 8, quant=quant)
prof = load_or_measure(None, say=print, fmt=runner.runtime.store.layout.dtype)
runner.runtime.qstar.use_profile(prof)
sched = Scheduler(runner, set(), 1, runner.prefill_chunk)
g = torch.Generator().manual_seed(0)
prompt = lambda: torch.randint(0, runner.cfg.vocab_size, (16384,), generator=g).tolist()
ttft(runner, sched, prompt())
plain = [ttft(runner, sched, prompt()) for _ in range(3)]
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    t = ttft(runner, sched, prompt())
tr = out / f"trace_{tag}.json"
p.export_chrome_trace(str(tr))
ev = [e for e in json.load(open(tr))["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
streams = {}
for e in ev:
    streams.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"][:60], e["cat"]))
with open(out / f"timeline_{tag}.txt", "w") as f:
    f.write(f"{runner.runtime.store.layout.dtype} TTFT plain {plain}, profiled {t:.4f}\n")
    t0 = min(s[0][0] for s in map(sorted, streams.values()))
    for tid, xs in streams.items():
        xs.sort(); busy = sum(b - a for a, b, *_ in xs)
        f.write(f"stream {tid}: {len(xs)} ops, busy {busy/1e3:.2f} ms, span {(xs[-1][1]-xs[0][0])/1e3:.2f} ms, first at {(xs[0][0]-t0)/1e3:.2f} ms\n")
    main = max(streams, key=lambda k: sum(1 for x in streams[k] if x[3] == "kernel"))
    xs = sorted(streams[main]); gaps = []
    for (a0, b0, n0, _), (a1, b1, n1, _) in zip(xs, xs[1:]):
        if a1 - b0 > 50: gaps.append((a1 - b0, (b0 - t0) / 1e3, n0, n1))
    f.write(f"compute stream {main}: gaps > 50 us: {len(gaps)}, total {sum(g[0] for g in gaps)/1e3:.2f} ms\n")
    for gap in sorted(gaps, key=lambda g: g[1]):
        f.write(f"  at {gap[1]:8.2f} ms gap {gap[0]/1e3:6.2f} ms after {gap[2]} before {gap[3]}\n")
    for tid, xs in streams.items():
        if tid == main: continue
        xs.sort()
        f.write(f"stream {tid} ops (start ms, dur ms):\n")
        for a, b, n, c in xs[:400]:
            f.write(f"  {(a-t0)/1e3:8.2f} {(b-a)/1e3:6.3f} {c} {n}\n")
with open(tr, "rb") as a, gzip.open(str(tr) + ".gz", "wb") as b:
    b.write(a.read())
tr.unlink()
print(tag, plain, t, flush=True)
