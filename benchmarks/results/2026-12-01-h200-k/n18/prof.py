"""Run the CLI with chosen calls profiled (torch.profiler: CPU and CUDA time per op; cProfile: Python).
PROF_TURNS=4,5 profiles bench agent's reuse-on turns; bench startup's two prefills are always profiled."""
import cProfile, io, os, pstats, sys, time
import torch
from torch.profiler import profile, ProfilerActivity

def profiled(label, fn, *a, **kw):
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    pr, tp = cProfile.Profile(), os.environ.get("PROF_TORCH") == "1"
    if tp:
        p = profile(activities=acts); p.__enter__()
    py = os.environ.get("PROF_PY", "1") == "1"  # cProfile too (slows the host's Python)
    if py:
        pr.enable()
    t0 = time.perf_counter(); r = fn(*a, **kw); dt = time.perf_counter() - t0
    if py:
        pr.disable()
    print(f"\n===== {label}: {dt:.3f} s", file=sys.stderr)
    if tp:
        p.__exit__(None, None, None)
        if os.environ.get("PROF_TRACE"):
            os.makedirs(os.environ["PROF_TRACE"], exist_ok=True)
            p.export_chrome_trace(os.path.join(os.environ["PROF_TRACE"], label.replace(" ", "_") + ".json"))
        key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        print(p.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60), file=sys.stderr)
    if py:
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[-5000:], file=sys.stderr)
    return r

from engine.bench import agent, startup
turns = {int(t) for t in os.environ.get("PROF_TURNS", "").split(",") if t}
orig_turn, count = agent.replay_turn, [0]
def replay(runner, sched, prompt, answer):
    count[0] += 1
    k = count[0] - 1  # the first call is bench agent's untimed earlier request
    turn, mode = (k + 1) // 2, "on" if k % 2 else "off"
    if k and turn in turns:
        return profiled(f"agent turn {turn} {mode}", orig_turn, runner, sched, prompt, answer)
    return orig_turn(runner, sched, prompt, answer)
agent.replay_turn = replay
orig_ttft = startup.ttft
def ttft(*a):
    count[0] += 1
    return profiled(f"startup prefill {count[0]}", orig_ttft, *a)
startup.ttft = ttft
from freetoken_cli.main import app
app(prog_name="freetoken")
