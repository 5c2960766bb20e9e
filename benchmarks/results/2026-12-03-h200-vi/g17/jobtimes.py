"""Probe: a CPU job's own time, batch 1, k distinct experts, along the executor alone (submit, wait:
job.seconds) and the CUDA-graph branch's protocol (flags written from Python, the poller's own time
per job from Poller.stats), alone and beside a busy link: copy-engine fills (what the profile and
g13 used) or the fill kernel (what graph decode uses: SMs reading pinned host memory). Jobs 200 us
apart, as decode's layer steps. One JSON row per (format, threads, load, path, k): median and p90 us.
python3 jobtimes.py FMT[,FMT] THREADS[,THREADS] [N] [LOADS (none,copy,kernel)]"""
import json, statistics, sys, threading, time
import torch
from engine.profile import Bench, llc_bytes
from kernels import cpu_executor
from kernels.fill_triton import fill_rows

fmts, counts = sys.argv[1].split(","), [int(t) for t in sys.argv[2].split(",")]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 150
LOADS = sys.argv[4].split(",") if len(sys.argv) > 4 else ["none", "copy", "kernel"]


def gap(us=200):
    t = time.perf_counter() + us * 1e-6
    while time.perf_counter() < t:
        pass


def executor(b, k):
    n, w, out = b.bank.shape[0], torch.full((1, k), 1.0 / k), []
    for i in range(N):
        ids = (torch.arange(k) + i * k).remainder(n).view(1, k).int()
        job = b.cpu.submit(b.x, b.views["gate_up"], b.views["down"], ids, w, b.out)
        job.wait()
        out.append(job.seconds)
        gap()
    return out


def poller(b, k):
    gu, down, H = b.views["gate_up"], b.views["down"], b.views["down"].shape[1]
    act = b.cpu.act_dtype(gu)
    flags, nfill = torch.zeros(3, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    x, ids, w, o = torch.zeros(1, H, dtype=act), torch.zeros(1, k, dtype=torch.int64), torch.full((1, k), 1 / k), torch.zeros(1, H)
    x.copy_(b.x)
    p = b.cpu.poller(flags, nfill, x, ids, w, o, [gu], [down], model_dtype=b.x.dtype)
    n, own, wall = gu.shape[0], [], []
    try:
        p.stats()
        for i in range(N):
            ids[0] = (torch.arange(k) + i * k) % n
            v = 1 | (1 << 20)
            flags[2] = v
            t0 = time.perf_counter()
            flags[0] = v
            while int(flags[1]) != v:
                pass
            wall.append(time.perf_counter() - t0)
            flags[1] = 0
            jobs, _, secs, _, _ = p.stats()
            assert jobs == 1
            own.append(secs)
            gap()
    finally:
        p.close()
    return own, wall


def busy_link(b, kind, stop):
    s = torch.cuda.Stream()
    n, slots = b.bank.shape[0], b.pool.shape[0]
    vic = torch.arange(slots, device="cuda")
    with torch.cuda.stream(s):
        i = 0
        while not stop.is_set():
            if kind == "copy":
                for j in range(slots):
                    b.pool[j].copy_(b.bank[(i + j) % n], non_blocking=True)
            else:
                fill_rows(b.bank, b.pool, vic, (torch.arange(slots, device="cuda") + i) % n, 0)
            i += slots
            s.synchronize()


def stat(xs):
    xs = sorted(xs)
    return round(statistics.median(xs) * 1e6, 1), round(xs[int(0.9 * len(xs))] * 1e6, 1)


for fmt in fmts:
    slot = cpu_executor.expert_bytes("bf16" if fmt == "bfloat16" else fmt)
    cuda = torch.cuda.is_available()  # the CPU machine: no link load, a dry run
    b = Bench(max(96, -(-3 * llc_bytes() // slot)), cuda=cuda, fmt=fmt)
    for nt in counts:
        b.use_threads(nt)
        for load in LOADS if cuda else ("none",):
            stop = threading.Event()
            th = None if load == "none" else threading.Thread(target=busy_link, args=(b, load, stop), daemon=True)
            if th:
                th.start()
                time.sleep(0.3)
            for k in (1, 2, 4):
                ex = executor(b, k)
                own, wall = poller(b, k)
                row = {"format": fmt, "threads": nt, "load": load, "experts": k, "slot_bytes": slot,
                       "executor_us": stat(ex), "poller_own_us": stat(own), "poller_wall_us": stat(wall)}
                print(json.dumps(row), flush=True)
            if th:
                stop.set()
                th.join()
    b.cpu.close()
