"""Run the CLI with every Triton JIT compile logged to stderr (seconds since start, duration, kernel)."""
import sys, time
import triton
t0, open_ = time.perf_counter(), {}

def before(**kw):
    open_[id(kw.get("key", kw.get("repr")))] = time.perf_counter()
    kw_repr = kw.get("repr", "?")
    open_["last"] = (time.perf_counter(), kw_repr)
    return False

def after(**kw):
    s, r = open_.get("last", (time.perf_counter(), "?"))
    print(f"JIT [{time.perf_counter() - t0:8.2f}s] {time.perf_counter() - s:6.2f}s {r[:260]}", file=sys.stderr, flush=True)
    return False

triton.knobs.runtime.jit_cache_hook = before
triton.knobs.runtime.jit_post_compile_hook = after
from freetoken_cli.main import app
app(prog_name="freetoken")
