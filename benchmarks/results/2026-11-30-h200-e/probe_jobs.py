"""Probe: the CPU executor's rate by job size (distinct experts per batch-1 job), alone and while
the GPU fills experts from the same host memory by the copy engine (the profile's path) or by
the gather kernel (graph decode's path). GB/s of expert bytes over the executor's job time."""
import threading, time, torch
from engine.profile import Bench
from kernels.fill_triton import fill_rows

b = Bench(1700, 8, True)  # 16 GB of 9 MiB experts, pinned
n, slot = b.bank.shape[0], b.layout.slot_bytes
g = torch.Generator().manual_seed(0)


def cpu_rate(k: int, seconds: float = 2.0) -> tuple[float, float]:
    busy, jobs, w = 0.0, 0, torch.full((1, k), 1.0 / k)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ids = torch.randperm(n // 2, generator=g)[:k].view(1, k).int()  # first half of the bank
        job = b.cpu.submit(b.x, b.views["gate_up"], b.views["down"], ids, w, b.out)
        job.wait()
        busy, jobs = busy + job.seconds, jobs + 1
    return k * slot * jobs / busy / 1e9, busy / jobs * 1e6


def gather(stop: threading.Event, res: dict, per: int = 2) -> None:
    vic = torch.arange(per, device="cuda")
    moved, t0 = 0, time.perf_counter()
    while not stop.is_set():
        fetch = (torch.randperm(n // 2, generator=torch.Generator().manual_seed(moved))[:per] + n // 2).cuda()
        fill_rows(b.bank, b.pool, vic, fetch, 0)
        torch.cuda.synchronize()
        moved += per
    res["gbps"] = moved * slot / (time.perf_counter() - t0) / 1e9


def copy(stop: threading.Event, res: dict) -> None:
    res["gbps"] = b.h2d(1e9, stop)


for load in ("none", "copy engine", "gather kernel, 2 per launch", "gather kernel, 8 per launch"):
    for k in (1, 2, 3, 4, 8):
        stop, res = threading.Event(), {}
        fn = {"copy engine": copy, "gather kernel, 2 per launch": gather,
              "gather kernel, 8 per launch": lambda s, r: gather(s, r, 8)}.get(load)
        t = threading.Thread(target=fn, args=(stop, res)) if fn else None
        if t:
            t.start(); time.sleep(0.3)
        gbps, us = cpu_rate(k)
        stop.set()
        if t:
            t.join()
        print(f"{load:28s} k={k}: CPU {gbps:5.1f} GB/s ({us:6.0f} us per job)"
              + (f", fills {res['gbps']:5.1f} GB/s" if res else ""), flush=True)
