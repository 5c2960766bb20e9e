"""Where the host's cores go, for the CPU expert threads. `Census`: CPU time of this process's
threads by name between two readings (the executor's are ft-cpu-worker and ft-cpu-poller; the
thread that runs Python is "main"); `bench decode` puts one in each row. Run as a module, a probe
of B_H (GB/s of expert bytes, batch 1, k distinct experts a step (8 by default; adaptive decode
leaves the CPU one or two), Qwen3-30B-A3B's expert shape, bf16 or a quantized format) per thread
count, with 0, 1 or 2 processes spinning beside it (what the engine's host threads do at their
busiest), along two paths: jobs submitted and waited for (the executor alone, as the
profile measures it), and the CUDA-graph CPU branch's protocol driven by a spinning thread (the
poller computing with the workers): `gbps` over the wall time, which counts this module's Python
writing the flags (10-30 us a job), and `own_gbps` over the branch's own time, go seen to done, as
graph decode's online B_H counts it. One JSON row per measurement:

    python -m engine.bench.threads [--threads 1,2,4,8,16] [--spinners 0,1,2] [--reserve N]
                                   [--format int4] [--experts 1,2,8]

`--reserve 0` lifts the cap on workers (freetoken_kernels.cpu_executor.HOST_THREADS) to show what
happens without it."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


class Census:
    """Cores busy per thread name of this process (CPU seconds per wall second) since the last
    take(), names under `least` left out."""

    def __init__(self, least: float = 0.02):
        self.least, self._last = least, self._read()

    @staticmethod
    def _read() -> tuple[float, dict[int, tuple[str, int]]]:
        threads = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after the name, which may hold spaces
            tid = int(task.name)
            name = "main" if tid == os.getpid() else stat[stat.index("(") + 1:stat.rindex(")")]
            threads[tid] = (name, int(fields[11]) + int(fields[12]))  # utime + stime, in clock ticks
        return time.monotonic(), threads

    def take(self) -> dict[str, float]:
        (t0, before), (t1, now) = self._last, self._read()
        self._last = (t1, now)
        busy: dict[str, float] = {}
        for tid, (name, ticks) in now.items():
            busy[name] = busy.get(name, 0) + ticks - before.get(tid, (name, 0))[1]
        scale = 1 / (os.sysconf("SC_CLK_TCK") * max(t1 - t0, 1e-9))
        return {n: round(v * scale, 2) for n, v in sorted(busy.items()) if v * scale >= self.least}


def poller_gbps(bench, seconds: float, k: int = 8) -> tuple[float, float]:
    """GB/s of expert bytes through the CPU-graph branch's protocol: stage k experts, write go,
    spin until done (the host thread as CUDA's default synchronisation keeps it busy); over the
    wall time and over the branch's own time (the poller's, go seen to done)."""
    gu, down, H = bench.views["gate_up"], bench.views["down"], bench.views["down"].shape[1]
    act = bench.cpu.act_dtype(gu)
    flags, nfill = torch.zeros(3, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    x, ids, w, out = (torch.zeros(1, H, dtype=act), torch.zeros(1, k, dtype=torch.int64),
                      torch.full((1, k), 1 / k), torch.zeros(1, H))
    x.copy_(bench.x)
    poller = bench.cpu.poller(flags, nfill, x, ids, w, out, [gu], [down], model_dtype=bench.x.dtype)
    n, i, t0 = gu.shape[0], 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            ids[0] = (torch.arange(k) + i) % n
            v = 1 | (1 << 20)
            flags[2] = v  # no fills in this step: their flag is up from the start
            flags[0] = v
            while int(flags[1]) != v:
                pass
            flags[1] = 0
            i += k
        wall = time.perf_counter() - t0
        _, experts, own, _, _ = poller.stats()  # raises if a job failed
    finally:
        poller.close()
    return i * bench.layout.slot_bytes / wall / 1e9, experts * bench.layout.slot_bytes / own / 1e9


def main() -> None:
    from engine.profile import Bench, busy_host_threads
    from freetoken_kernels import cpu_executor
    from freetoken_kernels.quant import FORMATS
    cores = cpu_executor._cores()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default=",".join(map(str, sorted(
        {n for n in (1, 2, 4, 8, cores - 6, cores - 4, cores - 3, cores - 2, cores - 1, cores) if n >= 1}))),
                    help="comma list of thread counts asked for")
    ap.add_argument("--spinners", default="0,1,2", help="comma list: busy processes beside the executor")
    ap.add_argument("--reserve", type=int, default=cpu_executor.HOST_THREADS,
                    help="cores kept from the workers for the host threads (0: no cap)")
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    ap.add_argument("--format", default="bfloat16", choices=["bfloat16", *FORMATS], help="the experts' weight format")
    ap.add_argument("--experts", default="8", help="comma list: distinct experts a step")
    a = ap.parse_args()
    cpu_executor.HOST_THREADS = a.reserve
    bench = Bench.beyond_llc(cuda=False, fmt=a.format)
    for spinners in map(int, a.spinners.split(",")):
        with busy_host_threads(spinners):
            for n in map(int, a.threads.split(",")):
                bench.use_threads(n)
                for k in map(int, a.experts.split(",")):
                    wall, own = poller_gbps(bench, a.seconds, k)
                    for path, rates in (("executor", {"gbps": bench.cpu_experts(a.seconds, k=k)}),
                                        ("poller", {"gbps": wall, "own_gbps": own})):
                        print(json.dumps({"path": path, "format": a.format, "experts": k, "spinners": spinners,
                                          "threads": n, "pool_threads": bench.cpu.threads, "cores": cores,
                                          "reserve": a.reserve, **{m: round(v, 2) for m, v in rates.items()}}), flush=True)
    bench.cpu.close()


if __name__ == "__main__":
    main()
