"""The CPU executor's job time by the experts a job holds (batch 1), per format: median us a job and GB/s of expert
bytes, jobs back to back or 240 us apart (a decode layer step), alone or beside a host-to-device copy loop (the
fills). python3 cpujobs.py FMTS [THREADS]"""
import json, statistics, sys, threading, time
import torch
from kernels.cpu_executor import CPUExecutor, _constant_bank, expert_bytes

fmts = sys.argv[1].split(","); threads = int(sys.argv[2]) if len(sys.argv) > 2 else None
stop = threading.Event()
def copier():  # the fills: pinned host -> device, 64 MiB at a time
    src = torch.empty(64 << 20, dtype=torch.uint8).pin_memory(); dst = torch.empty_like(src, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        while not stop.is_set():
            dst.copy_(src, non_blocking=True); s.synchronize()
ex = CPUExecutor(threads)
for fmt in fmts:
    per = expert_bytes(fmt); n = max(16, (2 << 30) // per)
    gu, dn = _constant_bank(fmt, n, 2048, 768)
    x, out = torch.randn(1, 2048).bfloat16(), torch.empty(1, 2048)
    for copy in (False, True):
        th = None
        if copy:
            stop.clear(); th = threading.Thread(target=copier, daemon=True); th.start(); time.sleep(0.2)
        for gap in (0.0, 240e-6):
            for k in (1, 2, 4, 8):
                w = torch.full((1, k), 1 / k); i, ts = 0, []
                t_end = time.perf_counter() + 0.6
                while time.perf_counter() < t_end:
                    ids = (torch.arange(k) + i).remainder(n).view(1, k).contiguous()
                    job = ex.submit(x, gu, dn, ids, w, out); job.wait(); ts.append(job.seconds); i += k
                    if gap:
                        t = time.perf_counter() + gap
                        while time.perf_counter() < t: pass
                med = statistics.median(ts[3:])
                print(json.dumps({"fmt": fmt, "threads": ex.threads, "copy": copy, "gap_us": gap * 1e6, "experts": k,
                                  "jobs": len(ts), "us": round(med * 1e6, 1), "GBps": round(k * per / med / 1e9, 1)}), flush=True)
        if th: stop.set(); th.join()
    del gu, dn
ex.close()
