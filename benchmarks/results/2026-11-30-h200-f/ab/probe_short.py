"""Per-job cost of the CPU executor by job size, alone and under gather-kernel fills (2 per launch)."""
import threading, time, torch
from engine.profile import Bench
from kernels.fill_triton import fill_rows

b = Bench(1700, 8, True)
n, slot = b.bank.shape[0], b.layout.slot_bytes
g = torch.Generator().manual_seed(0)


def cpu_rate(k, seconds=1.5):
    busy, jobs, w, lat = 0.0, 0, torch.full((1, k), 1.0 / k), []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ids = torch.randperm(n // 2, generator=g)[:k].view(1, k).int()
        job = b.cpu.submit(b.x, b.views["gate_up"], b.views["down"], ids, w, b.out)
        job.wait()
        busy, jobs = busy + job.seconds, jobs + 1
        lat.append(job.seconds)
    lat.sort()
    return k * slot * jobs / busy / 1e9, busy / jobs * 1e6, lat[len(lat) // 2] * 1e6


def gather(stop, res, per=2):
    vic = torch.arange(per, device="cuda")
    moved, t0 = 0, time.perf_counter()
    while not stop.is_set():
        fetch = (torch.randperm(n // 2, generator=torch.Generator().manual_seed(moved))[:per] + n // 2).cuda()
        fill_rows(b.bank, b.pool, vic, fetch, 0)
        torch.cuda.synchronize()
        moved += per
    res["gbps"] = moved * slot / (time.perf_counter() - t0) / 1e9


for load in ("none", "gather2"):
    for k in (1, 2, 4, 8):
        stop, res = threading.Event(), {}
        t = threading.Thread(target=gather, args=(stop, res)) if load != "none" else None
        if t:
            t.start(); time.sleep(0.3)
        gbps, us, med = cpu_rate(k)
        stop.set()
        if t:
            t.join()
        print(f"{load:8s} k={k}: CPU {gbps:5.1f} GB/s ({us:6.0f} us mean, {med:6.0f} us median per job)"
              + (f", fills {res['gbps']:5.1f} GB/s" if res else ""), flush=True)
