"""Probe (with trace.patch, FT_TRACE=1): where a CPU job's thread time goes, batch 1, k distinct experts, the
executor alone (submit, wait) and the CUDA-graph branch's protocol (flags from Python, the poller computing beside
the workers); jobs 200 us apart as decode's layer steps. The pool prints its trace when it closes: per job the
threads that joined, their join latency, each phase's units and time a unit, the barrier wait, and the share of
threads x wall spent inside units. python3 trace.py FMT[,FMT] THREADS [N]"""
import sys, time
import torch
from engine.profile import Bench, llc_bytes
from kernels import cpu_executor

fmts, nt = sys.argv[1].split(","), int(sys.argv[2])
N = int(sys.argv[3]) if len(sys.argv) > 3 else 200


def gap(us=200):
    t = time.perf_counter() + us * 1e-6
    while time.perf_counter() < t:
        pass


def executor(b, k):
    n, w = b.bank.shape[0], torch.full((1, k), 1.0 / k)
    for i in range(N):
        ids = (torch.arange(k) + i * k).remainder(n).view(1, k).int()
        b.cpu.submit(b.x, b.views["gate_up"], b.views["down"], ids, w, b.out).wait()
        gap()


def poller(b, k):
    gu, down, H = b.views["gate_up"], b.views["down"], b.views["down"].shape[1]
    flags, nfill = torch.zeros(3, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    x, ids, w, o = torch.zeros(1, H, dtype=b.cpu.act_dtype(gu)), torch.zeros(1, k, dtype=torch.int64), torch.full((1, k), 1 / k), torch.zeros(1, H)
    x.copy_(b.x)
    p = b.cpu.poller(flags, nfill, x, ids, w, o, [gu], [down], model_dtype=b.x.dtype)
    n = gu.shape[0]
    try:
        for i in range(N):
            ids[0] = (torch.arange(k) + i * k) % n
            v = 1 | (1 << 20)
            flags[2] = v
            flags[0] = v
            while int(flags[1]) != v:
                pass
            flags[1] = 0
            gap()
    finally:
        p.close()


for fmt in fmts:
    slot = cpu_executor.expert_bytes("bf16" if fmt == "bfloat16" else fmt)
    b = Bench(max(96, -(-3 * llc_bytes() // slot)), cuda=torch.cuda.is_available(), fmt=fmt)
    for k in (1, 2, 8):
        for path in (executor, poller):
            b.use_threads(nt)
            print(f"{fmt} k={k} {path.__name__}:", file=sys.stderr, flush=True)
            path(b, k)
    b.cpu.close()
