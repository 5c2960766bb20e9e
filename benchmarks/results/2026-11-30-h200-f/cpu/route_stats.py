"""The synthetic model's own routing at decode (CPU): distinct experts per layer over 48 greedy decode
tokens and the token-to-token overlap of the top-k. Usage: route_stats.py LAYERS OUT.npy."""
import sys, numpy as np, torch
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic, rebuild_experts
from engine.moe.routing import Recorder
L = int(sys.argv[1]); out = sys.argv[2]
cfg = EngineConfig(model="synthetic", device="cpu", expert_budget=parse_size("8GiB"), cpu_threads=2, max_context=4096, moe_policy="fetch")
engine = load_synthetic(cfg, "qwen3-30b-a3b", L)
store = engine.runtime.store
rec = Recorder(out, L)
rebuild_experts(engine, store, cfg, rec)
prompt = torch.randint(0, engine.cfg.vocab_size, (32,), generator=torch.Generator().manual_seed(0)).tolist()
from engine.config import SamplingParams
from engine.scheduler import Scheduler, Sequence
sched = Scheduler(engine, set(), 1, 4096, prefix_cache=False)
seq = Sequence(list(prompt), SamplingParams(max_tokens=49, ignore_eos=True))
sched.add(seq)
while not seq.finish:
    sched.step()
gen = seq.tokens[len(prompt):]
print(f"generated tokens: {len(gen)}, {len(set(gen))} distinct")
rec.save()
t = np.load(out)[32:]  # decode tokens only
print("decode tokens", t.shape)
for l in range(L):
    ids = t[:, l]
    ov = np.mean([len(set(ids[i]) & set(ids[i - 1])) / ids.shape[1] for i in range(1, len(ids))])
    print(f"layer {l}: distinct {len(np.unique(ids))}, token-to-token overlap {ov:.2f}")
