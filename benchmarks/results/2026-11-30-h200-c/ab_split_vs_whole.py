"""A/B in one process: adaptive with the split inside an expert vs whole experts only."""
import json
import sys

from benchmarks.decode import run
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic
from engine.profile import load_or_measure
from kernels import ref

grain = ref.grain
cfg = EngineConfig(model="synthetic", device="cuda", expert_budget=parse_size("8GiB"), cpu_threads=8,
                   max_context=4096, moe_policy="adaptive")
engine = load_synthetic(cfg, "qwen3-30b-a3b", None)
prof = load_or_measure(8, say=print)
out = []
for routing, budget in (("trace:/tmp/trace.npy", "8GiB"), ("model", "8GiB"), ("trace:/tmp/trace.npy", "16GiB")):
    for variant in ("split", "whole", "split", "whole"):
        ref.grain = grain if variant == "split" else (lambda rows: rows)
        for r in run(engine, engine.runtime.store, cfg, [parse_size(budget)], ["adaptive"], [routing], [None],
                     32, 3, 32, prof):
            r["variant"] = variant
            out.append(r)
            print(variant, routing[:5], budget, f"{r['tok_s']:.2f} tok/s hit {r['hit_rate']:.3f} fetched {r['fetched']:.1f} "
                  f"cpu {r['cpu']:.1f} PCIe {r['bytes_filled'] / 2**20:.0f} MiB CPU {r['bytes_cpu'] / 2**20:.0f} MiB "
                  f"q {r['q_star']:.3f} B_P {r.get('b_p_online_gbps', 0):.1f} B_H {r.get('b_h_online_gbps', 0):.1f}",
                  flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
