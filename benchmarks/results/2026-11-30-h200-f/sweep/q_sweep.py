"""Decode tok/s of adaptive at fixed q values beside the online q*, modes interleaved repeat by
repeat on one engine (trace routing). Usage: q_sweep.py TRACE BUDGETS QS REPEATS."""
import faulthandler, os, statistics, sys, time
faulthandler.dump_traceback_later(float(os.environ.get("HANG", "240")), repeat=True)
T0 = time.time()
print("start", flush=True)
from dataclasses import replace
import torch
from benchmarks.decode import decode_once
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic, rebuild_experts
from engine.moe.routing import make_routing
from engine.profile import load_or_measure

trace, budgets, qs, reps = sys.argv[1], sys.argv[2].split(","), [float(q) for q in sys.argv[3].split(",")], int(sys.argv[4])
cfg = EngineConfig(model="synthetic", device=os.environ.get("DEV", "cuda"), expert_budget=parse_size(budgets[0]), cpu_threads=8,
                   max_context=4096, moe_policy="adaptive")
engine = load_synthetic(cfg, os.environ.get("SHAPE", "qwen3-30b-a3b"))
print(f"[{time.time() - T0:.0f}s] loaded", flush=True)
prof = load_or_measure(8, say=print)
store = engine.runtime.store
prompt = torch.randint(0, engine.cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).tolist()
for b in budgets:
    rt = rebuild_experts(engine, store, replace(cfg, expert_budget=parse_size(b)),
                         make_routing(f"trace:{trace}", len(store.banks), store.n_experts, engine.cfg.router.top_k))
    rt.set_bandwidths(prof["h2d_concurrent_gbps"] or 1.0, prof["cpu_expert_concurrent_gbps"])
    est, modes = rt.estimator, ["online"] + qs
    runs, qv = {m: [] for m in modes}, {}

    def use(m):
        rt.estimator = est if m == "online" else None
        rt.policy.q_star = est.q_star if m == "online" else m

    print(f"[{time.time() - T0:.0f}s] {b} rebuilt", flush=True)
    for m in modes:
        use(m); decode_once(engine, prompt, 8)
        print(f"[{time.time() - T0:.0f}s] warm {m}", flush=True)
    for _ in range(reps):
        for m in modes:
            use(m); runs[m].append(decode_once(engine, prompt, 32)); qv[m] = rt.policy.q_star
    for m in modes:
        t = statistics.median(s for s, _ in runs[m])
        n = reps * 32
        f = sum(c["fetched"] for _, c in runs[m]) / n
        cpu = sum(c["cpu"] for _, c in runs[m]) / n
        print(f"{b:6s} q={'online' if m == 'online' else m:>6} ({qv[m]:.3f}): {32 / t:6.2f} tok/s "
              f"[{', '.join(f'{32 / s:.2f}' for s, _ in runs[m])}], fetched {f:6.1f}/tok, cpu {cpu:6.1f}/tok", flush=True)
    print(f"{b}: online B_P {est.b_p / 1e9:.1f} B_H {est.b_h / 1e9:.1f} GB/s", flush=True)
