"""Where a cold 16k prefill's time goes at 1/8 budget against all resident: torch.profiler over one
prompt (after a warm-up prompt), its ops by CUDA time and by host time, and the host's stall
points (synchronizations). Usage: python3 .probe/prefill_prof.py OUTDIR [budgets...]"""
import json, sys, time
from pathlib import Path
import torch
from torch.profiler import ProfilerActivity, profile
from freetoken_cli.common import engine_config
from engine.loader import load_synthetic
from engine.profile import load_or_measure
from engine.scheduler import Scheduler
from engine.bench.prefill import ttft

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
for budget in sys.argv[2:] or ["1152MiB", "16GiB"]:
    cfg = engine_config(None, "cuda", budget, "adaptive", 8, 16384 + 216)
    runner = load_synthetic(cfg, "qwen3-30b-a3b", 8)
    prof = load_or_measure(8, say=print, fmt=runner.runtime.store.layout.dtype)
    runner.runtime.qstar.use_profile(prof)
    sched = Scheduler(runner, set(), 1, runner.prefill_chunk)
    g = torch.Generator().manual_seed(0)
    prompt = lambda: torch.randint(0, runner.cfg.vocab_size, (16384,), generator=g).tolist()
    ttft(runner, sched, prompt())
    plain = [ttft(runner, sched, prompt()) for _ in range(3)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t = ttft(runner, sched, prompt())
    p.export_chrome_trace(str(out / f"trace_{budget}.json"))
    with open(out / f"ops_{budget}.txt", "w") as f:
        f.write(f"budget {budget}: TTFT {plain} unprofiled, {t:.3f} s profiled\n")
        f.write(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=60))
        f.write(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    print(budget, plain, t, flush=True)
    del runner, sched; torch.cuda.empty_cache()
