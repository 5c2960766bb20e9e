"""A graph decode step's host time with three ways of moving a step's inputs to the device, taking turns
in one process: each input copied on its own (main before), one pageable buffer copied once (now), one
pinned buffer copied asynchronously. Medians us over 64 steps x 3 rounds: step, build, GPU (events around
the forward), step - GPU. Batch 1 and 8, all resident, bf16, depth 32 and 1024.
Usage: python3 hoststep2.py"""
import statistics, time
from dataclasses import replace
import numpy as np
import torch
import engine.kv.batch as B
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic
from engine.profile import load_or_measure
from engine.bench.decode import bench_scheduler, decode_once, decode_runtime, random_prompt
import engine.scheduler as S

def each(longs, ints, device):
    return ([torch.tensor(np.asarray(x), dtype=torch.int64, device=device) for x in longs],
            [torch.tensor(np.asarray(x), dtype=torch.int32, device=device) for x in ints])
pageable = B.to_device
def pinned(longs, ints, device):
    if device.type != "cuda": return pageable(longs, ints, device)
    longs = [np.asarray(x, np.int64) for x in longs]; ints = [np.asarray(x, np.int32) for x in ints]
    n64 = sum(x.size for x in longs)
    buf = np.empty(8 * n64 + 4 * sum(x.size for x in ints), np.uint8)
    np.concatenate([x.ravel() for x in longs], out=buf[:8 * n64].view(np.int64))
    np.concatenate([x.ravel() for x in ints], out=buf[8 * n64:].view(np.int32))
    host = torch.from_numpy(buf).pin_memory().to(device, non_blocking=True)
    out, at = ([], []), 0
    for kind, arrays, size, dt in ((0, longs, 8, torch.int64), (1, ints, 4, torch.int32)):
        for x in arrays:
            out[kind].append(host[at:at + size * x.size].view(dt).view(x.shape)); at += size * x.size
    return out
ways = {"each": each, "pageable": pageable, "pinned": pinned}

import os
DEV, SHAPE = os.environ.get("HS_DEVICE", "cuda"), os.environ.get("HS_SHAPE", "qwen3-30b-a3b")
cfg = EngineConfig(model="synthetic", device=DEV, expert_budget=parse_size("16GiB"), cpu_threads=8, max_context=4096)
runner = load_synthetic(cfg, SHAPE, 8)
prof = load_or_measure(8, say=lambda *a: None, fmt=runner.runtime.store.layout.dtype)
decode_runtime(runner, replace(cfg, moe_policy="adaptive"), "uniform", prof)
rec = {"build": [], "gpu": [], "step": []}
build0, fwd0, step0 = S.ForwardBatch.build, runner.forward, S.Scheduler._step
on = [False]
def build(*a, **k):
    t = time.perf_counter(); r = build0(*a, **k)
    if on[0]: rec["build"].append(time.perf_counter() - t)
    return r
def forward(batch, kv):
    if DEV != "cuda":
        t = time.perf_counter(); r = fwd0(batch, kv)
        if on[0]: rec["gpu"].append(time.perf_counter() - t)
        return r
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); r = fwd0(batch, kv); e1.record()
    if on[0]: rec["gpu"].append((e0, e1))
    return r
def step(self):
    t = time.perf_counter(); r = step0(self)
    if on[0]: rec["step"].append(time.perf_counter() - t)
    return r
S.ForwardBatch.build, runner.forward, S.Scheduler._step = staticmethod(build), forward, step
for batch, depth in ((1, 1024), (8, 32)):
    sched = bench_scheduler(runner, batch)
    prompts = [random_prompt(runner, depth, i) for i in range(batch)]
    decode_once(sched, prompts, 16)
    res = {w: {k: [] for k in rec} | {"tok_s": []} for w in ways}
    for _ in range(3):
        for w, fn in ways.items():
            B.to_device = fn
            for k in rec: rec[k].clear()
            on[0] = True; sec, _ = decode_once(sched, prompts, 64); on[0] = False
            if DEV == "cuda": torch.cuda.synchronize()
            res[w]["build"] += rec["build"]; res[w]["step"] += rec["step"]
            res[w]["gpu"] += [x if DEV != "cuda" else x[0].elapsed_time(x[1]) / 1e3 for x in rec["gpu"]]
            res[w]["tok_s"].append(batch * 64 / sec)
    for w, r in res.items():
        m = {k: statistics.median(v) * 1e6 for k, v in r.items() if k != "tok_s"}
        print(f"batch {batch}, depth {depth}, {w:8s}: tok/s {' '.join(f'{x:.1f}' for x in r['tok_s'])}; medians us: "
              f"step {m['step']:.0f}, build {m['build']:.0f}, GPU {m['gpu']:.0f}, step - GPU {m['step'] - m['gpu']:.0f}", flush=True)
    B.to_device = pageable
    if sched.prefix:
        sched.prefix.evict(sched.prefix.pages)
