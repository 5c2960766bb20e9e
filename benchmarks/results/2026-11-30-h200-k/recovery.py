"""Online q* through a host-memory load and after it, on one runtime per variant (the estimator
carries across the phases): decode rounds of 32 tokens, idle, then with HOGS processes streaming
2 GB each, then after they stop; per round tok/s, q*, online B_P / B_H and CPU experts per token.
Variants: `probe` (main) and `no-probe` (engine.moe.qstar.PROBE_STEPS huge).
Usage (repository root): PYTHONPATH=. python3 recovery.py TRACE HOGS [BUDGET]"""
import multiprocessing as mp
import os
import sys
import time

from engine.bench.decode import decode_once, decode_runtime, memory_hog, random_prompt
from engine.config import EngineConfig, parse_size
from engine.loader import load_synthetic
from engine.moe import qstar as rt_mod
from engine.profile import load_or_measure


def main() -> None:
    trace, hogs = sys.argv[1], int(sys.argv[2])
    budget = parse_size(sys.argv[3] if len(sys.argv) > 3 else "8GiB")
    config = EngineConfig(model="synthetic", device="cuda", expert_budget=budget, cpu_threads=8, max_context=4096)
    engine = load_synthetic(config, "qwen3-30b-a3b")
    prof = load_or_measure(8, say=print)
    prompt = random_prompt(engine, 32)
    ctx = mp.get_context("spawn")
    t0 = time.time()
    for name, steps in (("probe", rt_mod.PROBE_STEPS), ("no-probe", 1 << 30)):
        rt_mod.PROBE_STEPS = steps
        decode_runtime(engine, config, f"trace:{trace}", prof)
        decode_once(engine, prompt, 8)
        for phase, rounds in (("idle", 3), ("load", 4), ("after", 6)):
            if phase == "load":
                stop, ready = ctx.Event(), ctx.Semaphore(0)
                procs = [ctx.Process(target=memory_hog, args=(stop, ready, 2 << 30, os.getpid()), daemon=True)
                         for _ in range(hogs)]
                [p.start() for p in procs]
                for _ in procs:
                    ready.acquire(timeout=120)
            if phase == "after":
                stop.set()
                [p.join() for p in procs]
            for r in range(rounds):
                seconds, c = decode_once(engine, prompt, 32)
                est = engine.runtime.qstar.estimator
                print(f"[{time.time() - t0:.0f} s] {name} {phase} {r + 1}: {32 / seconds:.2f} tok/s, q* "
                      f"{engine.runtime.qstar.value:.3f}, B_P {est.b_p / 1e9:.1f} / B_H {est.b_h / 1e9:.1f} GB/s, "
                      f"CPU experts per token {c.cpu / 32:.1f}", flush=True)


if __name__ == "__main__":  # the hogs are spawned: they import this file
    main()
