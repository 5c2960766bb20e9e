"""Probe: does the order of experts change the profile's rates? The profile steps through
consecutive experts of the bank (adjacent in memory); decode asks for scattered ones. CPU
executor GB/s (its own job time) and copy-engine fill GB/s, each order alone and both sides
together, twice in alternation."""
import threading, time, torch
from engine.profile import Bench

b = Bench(1700, 8, True)  # 16 GB of 9 MiB experts, pinned
n, slot = b.bank.shape[0], b.layout.slot_bytes
g = torch.Generator().manual_seed(0)


def ids_for(order: str, k: int, i: int) -> torch.Tensor:
    if order == "consecutive":
        return (torch.arange(k) + i).remainder(n)
    return torch.randperm(n, generator=g)[:k]


def cpu_rate(order: str, k: int, seconds: float = 2.0) -> float:
    busy, i, w = 0.0, 0, torch.full((1, k), 1.0 / k)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        job = b.cpu.submit(b.x, b.views["gate_up"], b.views["down"], ids_for(order, k, i).view(1, k).int(), w, b.out)
        job.wait()
        busy, i = busy + job.seconds, i + k
    return i * slot / busy / 1e9


def h2d_rate(order: str, stop: threading.Event, res: dict) -> None:
    i, s = 0, torch.cuda.Stream()
    t0 = time.perf_counter()
    with torch.cuda.stream(s):
        while not stop.is_set():
            for j, e in enumerate(ids_for(order, 8, i).tolist()):
                b.pool[j].copy_(b.bank[e], non_blocking=True)
            i += 8
            s.synchronize()
    res["gbps"] = i * slot / (time.perf_counter() - t0) / 1e9


for rep in range(2):
    for order in ("consecutive", "random"):
        for k in (8, 2):
            print(f"rep {rep} {order:11s} CPU alone k={k}: {cpu_rate(order, k):5.1f} GB/s", flush=True)
        stop, res = threading.Event(), {}
        t = threading.Thread(target=h2d_rate, args=(order, stop, res)); t.start()
        time.sleep(1.5); stop.set(); t.join()
        print(f"rep {rep} {order:11s} fills alone: {res['gbps']:5.1f} GB/s", flush=True)
        stop, res = threading.Event(), {}
        t = threading.Thread(target=h2d_rate, args=(order, stop, res)); t.start()
        c = cpu_rate(order, 8); stop.set(); t.join()
        print(f"rep {rep} {order:11s} together k=8: CPU {c:5.1f} GB/s, fills {res['gbps']:5.1f} GB/s", flush=True)
