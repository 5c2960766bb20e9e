"""Where a graph decode step's wall time goes on the host: the batch's build, the forward call (graph
replay and its input copies; with a CPU branch it waits for the step), the GPU's time for the step
(CUDA events around the forward), the rest of the step (sampling, bookkeeping). Medians over the timed
steps. Usage: python3 hoststep.py [bf16|int4] [STEPS]"""
import statistics, sys, time
from dataclasses import replace
import torch
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic
from engine.profile import load_or_measure
from engine.bench.decode import bench_scheduler, decode_once, decode_runtime, random_prompt
import engine.scheduler as S

quant = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "bf16" else None
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 64
cfg = EngineConfig(model="synthetic", device="cuda", expert_budget=parse_size("16GiB"), cpu_threads=8, max_context=4096)
runner = load_synthetic(cfg, "qwen3-30b-a3b", 8, quant=quant)
prof = load_or_measure(8, say=lambda *a: None, fmt=runner.runtime.store.layout.dtype)
rec = {"build": [], "forward": [], "gpu": [], "step": []}
build0, fwd0, step0 = S.ForwardBatch.build, runner.forward, S.Scheduler._step
on = [False]

def build(*a, **k):
    t = time.perf_counter(); r = build0(*a, **k)
    if on[0]: rec["build"].append(time.perf_counter() - t)
    return r

def forward(batch, kv):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter(); e0.record(); r = fwd0(batch, kv); e1.record()
    if on[0]:
        rec["forward"].append(time.perf_counter() - t); rec["gpu"].append((e0, e1))
    return r

def step(self):
    t = time.perf_counter(); r = step0(self)
    if on[0]: rec["step"].append(time.perf_counter() - t)
    return r

S.ForwardBatch.build, runner.forward, S.Scheduler._step = staticmethod(build), forward, step
for label, budget, batch in (("all resident", "16GiB", 1), ("all resident", "16GiB", 8), ("adaptive 1152MiB uniform", "1152MiB", 1)):
    decode_runtime(runner, replace(cfg, moe_policy="adaptive", expert_budget=parse_size(budget)), "uniform", prof)
    sched = bench_scheduler(runner, batch)
    prompts = [random_prompt(runner, 1024, i) for i in range(batch)]
    decode_once(sched, prompts, 16)
    for k in rec: rec[k].clear()
    on[0] = True
    sec, _ = decode_once(sched, prompts, steps)
    on[0] = False
    torch.cuda.synchronize()
    gpu = [a.elapsed_time(b) / 1e3 for a, b in rec["gpu"]]
    med = lambda xs: statistics.median(xs) * 1e6
    print(f"{label}, batch {batch}, depth 1024, {'int4' if quant else 'bf16'}: {sec / steps * 1e3:.3f} ms a step "
          f"({batch * steps / sec:.1f} tok/s); medians us: step {med(rec['step']):.0f}, build {med(rec['build']):.0f}, "
          f"forward call {med(rec['forward']):.0f}, GPU (events) {med(gpu):.0f}, step - GPU {med(rec['step']) - med(gpu):.0f}",
          flush=True)
    if sched.prefix:
        sched.prefix.evict(sched.prefix.pages)
