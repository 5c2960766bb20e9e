"""First vs second 500-token request after a cold start: cProfile (mode cprof) or torch.profiler (mode torch)."""
import cProfile, io, pstats, sys, time
mode, out, tag = sys.argv[1], sys.argv[2], sys.argv[3]
import engine.bench.startup as su
orig, n = su.ttft, [0]


def wrapped(runner, sched, prompt):
    n[0] += 1
    if mode == "cprof":
        pr = cProfile.Profile(); pr.enable()
        t = orig(runner, sched, prompt)
        pr.disable()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40)
        s2 = io.StringIO(); pstats.Stats(pr, stream=s2).sort_stats("cumtime").print_stats(60)
        open(f"{out}/cprof{tag}_{n[0]}.txt", "w").write(f"{t}\n" + s.getvalue() + s2.getvalue())
        return t
    import torch
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t = orig(runner, sched, prompt)
    open(f"{out}/torch{tag}_{n[0]}.txt", "w").write(f"{t}\n" + p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
                                               + p.key_averages().table(sort_by="self_cuda_time_total", row_limit=30))
    p.export_chrome_trace(f"{out}/trace{tag}_{n[0]}.json")
    return t


su.ttft = wrapped
sys.argv = ["freetoken", "bench", "startup"] + sys.argv[4:5]
from freetoken_cli.main import app
app()
