"""Executor throughput vs thread count, with 0/1/2 spinning processes beside it (poller, CUDA host thread)."""
import json, multiprocessing as mp, statistics, sys, time
import psutil, torch
from kernels.cpu_executor import CPUExecutor

def spin():
    while True:
        pass

def main():
    H, I, E, K = 2048, 768, 128, 8
    torch.manual_seed(0)
    wgu = (torch.randn(E, 2 * I, H) * 0.02).to(torch.bfloat16)
    wd = (torch.randn(E, H, I) * 0.02).to(torch.bfloat16)
    x, out = torch.randn(1, H), torch.empty(1, H)
    per = 3 * I * H * 2
    cores = psutil.cpu_count(logical=False)
    print("cores", cores, "logical", psutil.cpu_count(), flush=True)
    rows = []
    for spinners in (0, 1, 2):
        procs = [mp.Process(target=spin, daemon=True) for _ in range(spinners)]
        for p in procs: p.start()
        for n in [1, 2, 4, 8, 10, 12, 13, 14, 15, 16]:
            if n > cores: continue
            ex = CPUExecutor(n)
            ts = []
            for rep in range(300):
                ids = torch.randperm(E)[:K].view(1, K)
                w = torch.rand(1, K)
                t0 = time.perf_counter(); ex.run(x, wgu, wd, ids, w, out); ts.append(time.perf_counter() - t0)
            ts = ts[50:]
            med = statistics.median(ts); p90 = sorted(ts)[int(0.9 * len(ts))]
            r = {"spinners": spinners, "threads": n, "med_us": med * 1e6, "p90_us": p90 * 1e6, "GBps": K * per / med / 1e9}
            rows.append(r); print(json.dumps(r), flush=True)
            ex.close()
        for p in procs: p.terminate()
    json.dump(rows, open(sys.argv[1], "w"))

if __name__ == "__main__":
    main()
