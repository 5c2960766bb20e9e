"""Where one decode step's GPU time goes, per miss policy: kernel and copy totals over a few
graph-replayed decode steps, and the ordered timeline of one MoE layer step with the gaps between
its operations. Usage (GPU): python3 -m engine.bench.step_profile ROUTING [LAYERS] [BUDGET] [OUTDIR] [SHAPE]
[DEVICE] [QUANT] [DEPTH] (QUANT: the experts in int4, int8, fp8 or mxfp4, as `bench decode --quant`, or
bf16; DEPTH: the prompt's tokens, the context the steps decode at). The span beyond the GPU's busy time
is the host's: what a step costs outside the graph."""
from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace

from torch.profiler import ProfilerActivity, profile

from engine.bench.decode import bench_scheduler, decode_once, decode_runtime
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic
from engine.profile import load_or_measure


def short(name: str) -> str:
    return name.split("(")[0].split("<")[0][:48]


def report(p, n_steps: int, n_layers: int, kind: str) -> None:
    ev = [e for e in p.events() if e.device_type.name == kind]
    ev.sort(key=lambda e: e.time_range.start)
    tot = defaultdict(float)
    for e in ev:
        tot[short(e.name)] += e.time_range.elapsed_us()
    busy = sum(tot.values())
    span = ev[-1].time_range.end - ev[0].time_range.start if ev else 0
    print(f"  per step: GPU busy {busy / n_steps:.0f} us of {span / n_steps:.0f} us span "
          f"({len(ev) / n_steps:.0f} operations)")
    for name, us in sorted(tot.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {us / n_steps:8.1f} us  {name}")
    plans = [i for i, e in enumerate(ev) if "plan" in e.name]
    if len(plans) > n_layers + 2:  # one whole MoE layer step in the middle of the run
        a, b = plans[len(plans) // 2], plans[len(plans) // 2 + 1]
        t0 = ev[a].time_range.start
        print("  one layer, from its plan kernel (start us, duration us, gap before):")
        for j in range(a, b + 1):
            e, prev = ev[j], ev[j - 1]
            print(f"    {e.time_range.start - t0:7.1f} {e.time_range.elapsed_us():7.1f} "
                  f"{e.time_range.start - prev.time_range.end:6.1f}  {short(e.name)}")


def main(routing: str, layers: int = 12, budget: str = "2GiB", out: str | None = None,
         shape: str = "qwen3-30b-a3b", device: str = "cuda", quant: str | None = None, depth: int = 32) -> None:
    cfg = EngineConfig(model="synthetic", device=device, expert_budget=parse_size(budget), cpu_threads=8,
                       max_context=max(4096, depth + 64))
    quant = None if quant == "bf16" else quant
    runner = load_synthetic(cfg, shape, layers, quant=quant)
    prof = load_or_measure(8, say=print, fmt=runner.runtime.store.layout.dtype)
    prompts, sched = [[i % runner.cfg.vocab_size for i in range(100, 100 + depth)]], bench_scheduler(runner)
    store = runner.runtime.store
    everything = store.nbytes + (1 << 30)
    for pol, b in (("fetch", cfg.expert_budget), ("adaptive", cfg.expert_budget), ("cpu", cfg.expert_budget),
                   ("fetch", everything)):
        c = replace(cfg, moe_policy=pol, expert_budget=b)
        decode_runtime(runner, c, routing, prof)
        decode_once(sched, prompts, 8)
        dt = decode_once(sched, prompts, 16)[0] / 16
        kind = runner.device.type.upper()
        p = profile(activities=[getattr(ProfilerActivity, kind)])
        decode_once(sched, prompts, 6, p)
        label = "all resident" if b == everything else f"{pol} {budget}"
        print(f"{label}: {dt * 1e3:.2f} ms per token ({1 / dt:.1f} tok/s), {layers} layers, depth {depth}")
        report(p, 6, layers, kind)
        if out:
            p.export_chrome_trace(f"{out}/{label.replace(' ', '_')}.json")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) if a.isdigit() else a for a in sys.argv[2:]))
