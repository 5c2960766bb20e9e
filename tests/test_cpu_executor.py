"""Parity of the C++ CPU expert executor (and its torch fallback) with freetoken_kernels.ref.moe_experts,
on expert banks laid out like the engine's host store: typed strided views into a byte bank."""
from __future__ import annotations

import functools
import itertools

import pytest
import torch

from freetoken_kernels import cpu_executor, ref
from freetoken_kernels.cpu_executor import CPUExecutor, cpu_executor_available
from freetoken_kernels.quant import QWeight, quantize

E = 16


@pytest.fixture(scope="module")
def ex():
    e = CPUExecutor()
    yield e
    e.close()


@pytest.fixture(scope="module")
def pools():
    """The slower paths this CPU can run, each forced through the backend argument."""
    made = {}
    for b in ("avx512", "avx2_fma", "scalar"):
        try:
            made[b] = CPUExecutor(backend=b)
        except ValueError:  # path not usable on this CPU (or no compiler)
            pass
    yield made
    for e in made.values():
        e.close()


@pytest.fixture(scope="module")
def ex_torch():
    return CPUExecutor(backend="torch")


def make_bank(H: int, I: int, dtype: torch.dtype, seed: int = 0):
    """uint8 bank [E, slot_bytes] -> typed views w_gate_up [E, 2I, H], w_down [E, H, I]."""
    g = torch.Generator().manual_seed(seed)
    esz = torch.empty((), dtype=dtype).element_size()
    gu_bytes, d_bytes = 2 * I * H * esz, H * I * esz
    bank = torch.zeros(E, gu_bytes + d_bytes + 4096, dtype=torch.uint8)  # 4 KiB slack per slot
    gu = bank[:, :gu_bytes].view(dtype).view(E, 2 * I, H)
    down = bank[:, gu_bytes:gu_bytes + d_bytes].view(dtype).view(E, H, I)
    gu.copy_(torch.randn(E, 2 * I, H, generator=g) / H ** 0.5)
    down.copy_(torch.randn(E, H, I, generator=g) / I ** 0.5)
    assert gu.stride(0) > 2 * I * H and down.stride(0) > H * I
    return gu, down


def make_routes(T: int, K: int, dtype: torch.dtype, x_dtype: torch.dtype, H: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(x_dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(dtype)
    ids[torch.rand(T, K, generator=g) < 0.25] = -1  # routes computed elsewhere
    weights = torch.rand(T, K, generator=g)
    return x, ids, weights


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


DTYPES = [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)]


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("T", [1, 3, 17])
@pytest.mark.parametrize("K", [1, 2, 8])
def test_matches_reference(ex, dtype, tol, T, K):
    check_parity(ex, dtype, tol, T, K)


@pytest.mark.parametrize("backend", [None, "avx512", "avx2_fma", "scalar"])  # None: this CPU's fastest
@pytest.mark.parametrize("fmt,group", [("bf16", 0), ("int4", 64), ("mxfp4", 32), ("int8", 64), ("fp8", 64)])
def test_a_token_gets_the_same_bits_alone_and_among_many(ex, pools, backend, fmt, group):
    """The row kernels take several routes of an expert at once (blocks of 4, 2 and 1), on every
    path: each token's output is exactly what a job of that token alone gives (a dot's chains do
    not depend on how many routes share its row)."""
    if backend is not None and backend not in pools:
        pytest.skip(f"{backend} path not usable on this machine")
    e = ex if backend is None else pools[backend]
    H, I = (200, 72) if fmt == "bf16" else (256, 128)
    gu, down = make_bank(H, I, torch.bfloat16) if fmt == "bf16" else make_qbank(fmt, H, I, group)
    x, ids, w = make_routes(37, 8, torch.int64, torch.bfloat16, H)
    out = torch.empty(37, H)
    e.run(x, gu, down, ids, w, out)
    for t in range(37):
        one = torch.empty(1, H)
        e.run(x[t:t + 1], gu, down, ids[t:t + 1], w[t:t + 1], one)
        assert torch.equal(one[0], out[t]), t


@pytest.mark.parametrize("backend", ["avx512", "avx2_fma", "scalar"])  # the slower paths, forced
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("T,K", [(1, 8), (17, 2)])
def test_forced_paths_match_reference(pools, backend, dtype, tol, T, K):
    if backend not in pools:
        pytest.skip(f"{backend} path not usable on this machine")
    check_parity(pools[backend], dtype, tol, T, K)


def check_parity(ex, dtype, tol, T, K):
    H, I = (72, 40) if K != 2 else (256, 96)  # odd sizes exercise the SIMD tails
    gu, down = make_bank(H, I, dtype)
    x, ids, w = make_routes(T, K, torch.int32 if T % 2 else torch.int64, dtype, H)
    out = torch.full((T, H), float("nan"))  # the executor overwrites out
    ex.run(x, gu, down, ids, w, out)
    assert rel_err(out, ref.moe_experts(x, gu, down, ids, w)) < tol


@pytest.mark.parametrize("fmt", ["bf16", "int8"])  # int8: its rows wait for block sums no phase 1 writes
def test_all_routes_elsewhere_gives_zero(ex, fmt):
    gu, down = make_bank(64, 32, torch.bfloat16) if fmt == "bf16" else make_qbank(fmt, 64, 32, 32)
    x, ids, w = make_routes(3, 2, torch.int64, torch.bfloat16 if fmt == "bf16" else torch.float32, 64)
    out = torch.ones(3, 64)
    ex.run(x, gu, down, torch.full_like(ids, -1), w, out)
    assert torch.equal(out, torch.zeros(3, 64))


def test_torch_fallback_matches(ex, ex_torch):
    gu, down = make_bank(72, 40, torch.bfloat16)
    x, ids, w = make_routes(5, 2, torch.int64, torch.bfloat16, 72)
    a, b = torch.empty(5, 72), torch.empty(5, 72)
    ex.run(x, gu, down, ids, w, a)
    ex_torch.run(x, gu, down, ids, w, b)
    assert ex_torch.backend == "torch"
    assert torch.equal(b, ref.moe_experts(x, gu, down, ids, w)) and rel_err(a, b) < 1e-2


def test_pool_survives_many_jobs(ex):
    gu, down = make_bank(64, 32, torch.float32)
    x, ids, w = make_routes(2, 2, torch.int64, torch.float32, 64)
    expect = ref.moe_experts(x, gu, down, ids, w)
    outs = [torch.empty(2, 64) for _ in range(4)]
    for i in range(500):
        ex.submit(x, gu, down, ids, w, outs[i % 4]).wait(timeout=10)
    futs = [ex.submit(x, gu, down, ids, w, o) for o in outs]  # several queued at once
    for f in futs:
        f.wait(timeout=10)
    assert all(rel_err(o, expect) < 1e-5 for o in outs)


@pytest.mark.parametrize("fmt", ["fp32", "int8"])  # int8: one worker writes h's block sums, the others wait
@pytest.mark.parametrize("spin_us", [0, 300])
def test_pool_serves_several_submitters_at_once(spin_us, fmt):
    """Jobs from several threads queue and each is computed whole, with the workers sleeping
    between jobs or spinning for them."""
    import ctypes
    import threading
    if not cpu_executor_available():
        pytest.skip("no C++ executor here")
    ex = CPUExecutor(3)
    ex._lib.ftmoe_pool_destroy(ex._pool)
    ex._pool = ex._lib.ftmoe_pool_create(3, (ctypes.c_int * 3)(-1, -1, -1), spin_us)
    gu, down = make_bank(64, 32, torch.float32) if fmt == "fp32" else make_qbank(fmt, 64, 32, 32, symmetric=False)
    errors = []

    def submitter(seed: int) -> None:
        for i in range(150):
            x, ids, w = make_routes(1 + i % 3, 2, torch.int64, torch.float32, 64, seed=seed * 1000 + i)
            out = torch.empty(x.shape[0], 64)
            ex.submit(x, gu, down, ids, w, out).wait(timeout=10)
            errors.append(rel_err(out, ref.moe_experts(x, gu, down, ids, w)))

    threads = [threading.Thread(target=submitter, args=(s,)) for s in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    ex.close()
    assert len(errors) == 600 and max(errors) < 1e-5


@pytest.mark.parametrize("bad", [E, 1000, -2])
def test_bad_expert_id_raises_from_wait(ex, ex_torch, bad):
    gu, down = make_bank(64, 32, torch.bfloat16)
    x, ids, w = make_routes(2, 2, torch.int64, torch.bfloat16, 64)
    ids[1, 0] = bad
    for e in (ex, ex_torch):
        fut = e.submit(x, gu, down, ids, w, torch.empty(2, 64))
        with pytest.raises((RuntimeError, IndexError)):
            fut.wait(timeout=10)
    ids[1, 0] = 0  # the pool keeps working after a failed job
    out = torch.empty(2, 64)
    ex.run(x, gu, down, ids, w, out)
    assert rel_err(out, ref.moe_experts(x, gu, down, ids, w)) < 1e-2


def test_validation_errors(ex):
    gu, down = make_bank(64, 32, torch.bfloat16)
    x, ids, w = make_routes(2, 2, torch.int64, torch.bfloat16, 64)
    with pytest.raises(ValueError, match="need x"):
        ex.submit(x, gu, down[:, :, :16], ids, w, torch.empty(2, 64))
    with pytest.raises(ValueError, match="weights must be fp32"):
        ex.submit(x, gu, down, ids, w.double(), torch.empty(2, 64))
    with pytest.raises(ValueError, match="contiguous"):
        ex.submit(x, gu.transpose(1, 2), down, ids, w, torch.empty(2, 64))


def test_backend_and_threads(ex):
    assert ex.backend in ("avx512_bf16", "avx512", "avx2_fma", "scalar", "torch")
    assert ex.threads == cpu_executor.max_threads()
    assert (ex.backend != "torch") == cpu_executor_available()


def test_missing_compiler_falls_back_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setattr(cpu_executor, "_lib", None)
    monkeypatch.setattr(cpu_executor, "_lib_error", None)
    assert CPUExecutor().backend == "torch"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "falls back to torch" in err[0] and "not found" in err[0]


def test_a_built_library_loads_without_torchs_builder():
    """Once built under the engine's extension root, a new process loads the library as it is,
    without torch's builder (whose ninja and compiler checks took seconds of every start)."""
    import subprocess
    import sys
    if not cpu_executor_available():
        pytest.skip("no C++ compiler here")
    code = ("import sys, engine; from freetoken_kernels import cpu_executor as c; assert c._library() is not None; "
            "print('torch.utils.cpp_extension' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600) for _ in range(2)]
    assert [r.stdout.strip() for r in runs][1:] == ["False"], [r.stdout + r.stderr for r in runs]  # the first may build


def test_loading_the_library_runs_only_baseline_instructions():
    """The code the loader runs (static initialisers, and what they call inside the library) uses
    no AVX / AVX-512 instruction (VEX or EVEX encoded): the SIMD paths are picked at run time, so
    a CPU without them must still load the library. A table built in an AVX-512 region did not."""
    import re
    import shutil
    import subprocess
    lib = cpu_executor._library()
    if lib is None or shutil.which("objdump") is None:
        pytest.skip("no built library or no objdump here")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib._name], capture_output=True, text=True,
                         check=True).stdout
    funcs = dict(re.findall(r"^[0-9a-f]+ <([^>]+)>:\n(.*?)(?:\n\n|\Z)", asm, re.S | re.M))
    todo = [f for f in funcs if f.startswith("_GLOBAL__sub_I")]
    assert todo, "no static initialiser found: the check would pass vacuously"
    seen = set()
    while todo:
        f = todo.pop()
        if f in seen or f not in funcs:  # outside the library (@plt): libc, libstdc++
            continue
        seen.add(f)
        wide = [ln for ln in funcs[f].splitlines() if re.search(r":\tv[a-z0-9]+\s|%[yz]mm|%k[0-7]\b", ln)]
        assert not wide, (f, wide[:3])
        todo += re.findall(r"\b(?:call|jmp)\s+[0-9a-f]+ <([^>+]+)>", funcs[f])  # calls, tail calls


def test_more_threads_than_allowed_are_capped(monkeypatch):
    """A pool never has more workers than the cores left beside the host threads (on a 4-core
    machine: 2), however many are asked for, and still computes."""
    monkeypatch.setattr(cpu_executor, "_core_cpus", lambda: [0, 1, 2, 3])
    assert cpu_executor.max_threads() == 4 - cpu_executor.HOST_THREADS
    e = CPUExecutor(16)
    try:
        assert e.threads == cpu_executor.max_threads() and CPUExecutor(1).threads == 1
        gu, down = make_bank(64, 32, torch.float32)
        x, ids, w = make_routes(3, 2, torch.int64, torch.float32, 64)
        out = torch.empty(3, 64)
        e.run(x, gu, down, ids, w, out)
        assert rel_err(out, ref.moe_experts(x, gu, down, ids, w)) < 1e-5
    finally:
        e.close()


def poller_step(flags, nfill, x_h, ids_h, w_h, out_h, layer, x, ids, w, n_fill=0, fill_after=0.0):
    """One layer step of the in-graph CPU branch driven from Python as the GPU stream would: stage,
    write go, write fill once the (simulated) fills landed (fill_after None: never), wait for done."""
    import time
    T = x.shape[0]
    x_h[:T], ids_h[:T], w_h[:T], nfill[0] = x, ids, w, n_fill
    v = (layer + 1) | (T << 20)
    flags[0] = v
    if fill_after is not None:
        time.sleep(fill_after)
        flags[2] = v                                 # the fills landed
    deadline = time.time() + 10
    while int(flags[1]) != v or (fill_after is not None and int(flags[2]) != 0):  # answered, fill consumed
        assert time.time() < deadline, "the poller did not answer"
    flags[1] = 0
    return out_h[:T].clone()


def start_poller(ex, banks, H: int, K: int, Tmax: int = 2):
    """A poller over banks [(w_gate_up, w_down)] per layer -> (poller, its staging buffers)."""
    x_h = torch.zeros(Tmax, H, dtype=ex.act_dtype(banks[0][0]))
    ids_h, w_h = torch.full((Tmax, K), -1, dtype=torch.int64), torch.zeros(Tmax, K)
    out_h, flags, nfill = torch.zeros(Tmax, H), torch.zeros(3, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    buffers = (flags, nfill, x_h, ids_h, w_h, out_h)
    return ex.poller(*buffers, [b[0] for b in banks], [b[1] for b in banks]), buffers


@pytest.mark.parametrize("workers", [0, 2])
def test_poller_computes_its_jobs_beside_other_submitters(workers):
    """The poller computes units of its own job instead of waiting on the workers: with no worker
    at all its steps are still answered, and with workers busy on jobs that another thread
    submits meanwhile, every result of both is right."""
    import ctypes
    import threading
    if not cpu_executor_available():
        pytest.skip("no C++ executor here")
    ex = CPUExecutor(1)
    ex._lib.ftmoe_pool_destroy(ex._pool)
    ex._pool = ex._lib.ftmoe_pool_create(workers, (ctypes.c_int * 2)(-1, -1), 0)
    H, K = 64, 2
    banks = [make_bank(H, 32, torch.float32, seed=s) for s in range(2)]
    poller, buffers = start_poller(ex, banks, H, K)
    errors, stop = [], threading.Event()

    def submitter() -> None:
        for i in range(10_000):
            if stop.is_set():
                return
            x, ids, w = make_routes(1 + i % 3, K, torch.int64, torch.float32, H, seed=i)
            out = torch.empty(x.shape[0], H)
            ex.submit(x, *banks[0], ids, w, out).wait(timeout=10)
            errors.append(rel_err(out, ref.moe_experts(x, *banks[0], ids, w)))

    other = threading.Thread(target=submitter) if workers else None
    try:
        if other:
            other.start()
        steps = 0
        while steps < 40 or (workers and len(errors) < 20):  # both sides busy for a while
            x, ids, w = make_routes(2, K, torch.int64, torch.float32, H, seed=100 + steps)
            got = poller_step(*buffers, steps % 2, x, ids, w)
            assert rel_err(got, ref.moe_experts(x, *banks[steps % 2], ids, w)) < 1e-5
            steps += 1
        assert poller.stats()[0] == steps
    finally:
        stop.set()
        if other:
            other.join()
        poller.close()
        ex.close()
    assert max(errors, default=0) < 1e-5


@pytest.mark.parametrize("fmt", [None, "int4", "int8", "fp8", "mxfp4"])  # None: fp32 banks
def test_poller_serves_the_graph_protocol_and_times_fills(ex, fmt):
    """The in-graph CPU branch driven from Python as the GPU stream would: stage, write go, write
    fill once the (simulated) fills landed, wait for done. Results match the reference, a step
    with no CPU route answers zeros, the fills are timed from go to the fill flag, a fill flag the
    poller never saw (descheduled while the stream moved on) does not stop it from serving the
    next go, and a bad flag answers zeros and surfaces as an error instead of a hang."""
    if ex.backend == "torch":
        pytest.skip("no C++ executor here")
    H, I, K = 64, 32, 2
    banks = [make_bank(H, I, torch.float32, seed=s) if fmt is None else
             make_qbank(fmt, H, I, 32, symmetric=False, seed=s) for s in range(2)]
    poller, buffers = start_poller(ex, banks, H, K)
    step = functools.partial(poller_step, *buffers)
    try:
        x, ids, w = make_routes(2, K, torch.int64, torch.float32, H)
        got = step(1, x, ids, w, n_fill=3, fill_after=0.02)
        assert rel_err(got, ref.moe_experts(x, *banks[1], ids, w)) < 1e-5
        none = torch.full_like(ids, -1)
        assert step(0, x, none, w, n_fill=2, fill_after=0.01).abs().sum() == 0  # no CPU route: zeros
        jobs, experts, seconds, fills, fill_seconds = poller.stats()
        assert jobs == 1 and experts == len(set(ids[ids >= 0].tolist())) and seconds > 0
        # 0.03 s of fills from go to flag, less however late a busy host let the poller see each go
        assert fills == 5 and 0.01 <= fill_seconds < 5
        step(1, x, ids, w, n_fill=1, fill_after=None)     # its fill flag is never seen ...
        got = step(0, x, ids, w, n_fill=1, fill_after=0.0)  # ... and the next go is still served
        assert rel_err(got, ref.moe_experts(x, *banks[0], ids, w)) < 1e-5
        assert poller.stats()[0] == 2
        step(7, x, ids, w, n_fill=0, fill_after=0.0)      # no layer 7: zeros and an error, no hang
        with pytest.raises(RuntimeError, match="bad layer"):
            poller.stats()
    finally:
        poller.close()


# ---- quantized banks (freetoken_kernels/quant.py layout) ----

def qbank(experts: dict, fmt: str, group: int, symmetric: bool = True, scale_dtype=torch.float16):
    """Each expert of {name: [E, N, K]} quantized on its own, the parts of all names laid one after
    another in one uint8 row per expert, as a host bank holds them: {name: QWeight of views}."""
    parts = {n: [quantize(fmt, w[e], group, scale_dtype, symmetric) for e in range(len(w))]
             for n, w in experts.items()}
    return qweights(fmt, {n: [p[:3] for p in ps] for n, ps in parts.items()},
                    {n: ps[0][3] for n, ps in parts.items()})


def qweights(fmt: str, parts: dict, blocks: dict) -> dict:
    """{name: per expert (q, s, z)} -> {name: QWeight} of views into one byte bank with 4 KiB slack
    per expert (so every part has its own non-trivial expert stride)."""
    first = [(n, j, t) for n, ps in parts.items() for j, t in enumerate(ps[0]) if t is not None]
    offs, off = [], 0
    for _, _, t in first:
        offs.append(off)
        off += -(-t.numel() * t.element_size() // 64) * 64
    E = len(next(iter(parts.values())))
    bank = torch.zeros(E, off + 4096, dtype=torch.uint8)
    views = {n: [None, None, None] for n in parts}
    for (n, j, t), o in zip(first, offs):
        v = bank[:, o:o + t.numel() * t.element_size()].view(t.dtype).view(E, *t.shape)
        v.copy_(torch.stack([p[j] for p in parts[n]]))
        views[n][j] = v
    return {n: QWeight(fmt, *views[n], blocks[n]) for n in parts}


@functools.lru_cache(maxsize=None)
def make_qbank(fmt: str, H: int, I: int, group: int, symmetric: bool = True, seed: int = 0):
    gu, down = make_bank(H, I, torch.float32, seed)
    w = qbank({"gate_up": gu, "down": down}, fmt, group, symmetric)
    return w["gate_up"], w["down"]


QFORMATS = [("int4", True), ("int4", False), ("int8", True), ("int8", False), ("fp8", True), ("mxfp4", True)]


def check_qparity(ex, fmt, symmetric, T, K, H=96, I=64, group=32, tol=1e-5):
    gu, down = make_qbank(fmt, H, I, group, symmetric)
    x, ids, w = make_routes(T, K, torch.int32 if T % 2 else torch.int64, torch.float32, H)
    out = torch.full((T, H), float("nan"))
    ex.run(x, gu, down, ids, w, out)
    assert rel_err(out, ref.moe_experts(x, gu, down, ids, w)) < tol


@pytest.mark.parametrize("fmt,symmetric", QFORMATS)
@pytest.mark.parametrize("T", [1, 3, 17])
@pytest.mark.parametrize("K", [1, 2, 8])
def test_quantized_matches_reference(ex, fmt, symmetric, T, K):
    check_qparity(ex, fmt, symmetric, T, K)


@pytest.mark.parametrize("backend", ["avx512", "avx2_fma", "scalar"])  # the slower paths, forced
@pytest.mark.parametrize("fmt,symmetric", QFORMATS)
@pytest.mark.parametrize("T,K", [(1, 8), (17, 2), (17, 8)])  # (17, 8): ~6 routes an expert, rows four at a time
def test_quantized_forced_paths_match_reference(pools, backend, fmt, symmetric, T, K):
    if backend not in pools:
        pytest.skip(f"{backend} path not usable on this machine")
    check_qparity(pools[backend], fmt, symmetric, T, K)


def test_int4_zero_points_of_every_value(ex, pools):
    """int4 zero points from 0 to 16 (a gptq-format checkpoint stores them minus one) and past it,
    changing from block to block, on every row kernel: each as the reference dequantizes it."""
    gu, down = make_bank(192, 128, torch.float32, 3)
    w = qbank({"gate_up": gu, "down": down}, "int4", 64, symmetric=False)
    g = torch.Generator().manual_seed(0)
    for q in w.values():
        q.z.copy_(torch.randint(0, 21, q.z.shape, generator=g, dtype=torch.uint8))
    x, ids, rw = make_routes(3, 4, torch.int64, torch.float32, 192)
    x = x.bfloat16().float()
    expected = ref.moe_experts(x, w["gate_up"], w["down"], ids, rw)
    for pool in [ex, *pools.values()]:
        out = torch.full((3, 192), float("nan"))
        pool.run(x, w["gate_up"], w["down"], ids, rw, out)
        assert rel_err(out, expected) < 1e-5, pool.backend


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,group,symmetric", [("int4", 64, True), ("int4", 64, False), ("mxfp4", 32, True)])
@pytest.mark.parametrize("T,K", [(1, 8), (3, 2), (17, 4)])
def test_int4_and_mxfp4_through_bf16_dot_products(ex, x_dtype, fmt, group, symmetric, T, K):
    """int4 blocks of a multiple of 64 values and mxfp4 on an AVX-512 BF16 CPU: codes and
    activations meet in bf16 dot products, the activations as two bf16 (16 significant bits; a bf16
    model's x is exact in the first), so the result is ~3e-6 from the fp32 reference where the fp32
    paths are ~3e-7."""
    if ex.backend != "avx512_bf16":
        pytest.skip("no AVX-512 BF16 here")
    gu, down = make_qbank(fmt, 192, 128, group, symmetric)
    x, ids, w = make_routes(T, K, torch.int64, torch.float32, 192)
    x = x.to(x_dtype).float()
    out = torch.full((T, 192), float("nan"))
    ex.run(x, gu, down, ids, w, out)
    assert rel_err(out, ref.moe_experts(x, gu, down, ids, w)) < 1e-5
    if x_dtype == torch.bfloat16:  # a bf16 model's x, as the model hands it over: h rounded to bf16 too
        ex.run(x.bfloat16(), gu, down, ids, w, out)
        assert rel_err(out, experts_h_bf16(x, gu, down, ids, w)) < 1e-5
        assert rel_err(out, ref.moe_experts(x, gu, down, ids, w)) > 1e-4  # it was rounded


def experts_h_bf16(x, gu, down, ids, w):
    """ref.moe_experts in fp32 on the exact dequantized weights, the intermediate rounded to bf16."""
    out = torch.zeros(x.shape)
    for (t, k), e in zip(itertools.product(range(ids.shape[0]), range(ids.shape[1])), ids.flatten().tolist()):
        if e >= 0:
            h = ref.act_and_mul(x[t:t + 1] @ ref.expert_weight(gu, e, torch.float32).t()).bfloat16().float()
            out[t] += w[t, k] * (h @ ref.expert_weight(down, e, torch.float32).t())[0]
    return out


@pytest.mark.parametrize("backend", ["default", "avx512", "avx2_fma", "scalar"])
@pytest.mark.parametrize("fmt,group", [("int4", 48), ("int4", 24), ("int4", 3), ("int8", 24), ("int8", 8),
                                       ("fp8", 16), ("fp8", 24)])
def test_quantized_block_sizes(ex, pools, backend, fmt, group):
    """Blocks of several vectors, blocks ending mid-vector (a scalar tail), odd int4 blocks (that
    start mid-byte)."""
    e = ex if backend == "default" else pools.get(backend)
    if e is None:
        pytest.skip(f"{backend} path not usable on this machine")
    check_qparity(e, fmt, False, 3, 2, H=96, I=48, group=group)


@pytest.mark.parametrize("fmt,scale_dtype,bk", [(f, d, None) for f in ("int4", "int8", "fp8")
                                                 for d in (torch.float32, torch.bfloat16, torch.float16)]
                         + [("mxfp4", torch.uint8, None), ("int4", torch.float16, 64), ("int4", torch.float16, 128)])
def test_quantized_scale_dtypes_and_partial_blocks(ex, pools, fmt, scale_dtype, bk):
    """Parts drawn at random in the layout's general form: every scale dtype, every code (fp8
    subnormals too), blocks of several rows (fp8) and last blocks that overhang the matrix
    (ceil(N / bn) x ceil(K / bk) scales; for int4 and mxfp4 also a row whose end is not a whole
    chunk of the SIMD paths; int4 in blocks of 64 and 128 also through the BF16 dot products, H
    then a whole block or two and a short one)."""
    g = torch.Generator().manual_seed(3)
    H, I, (bn, bk) = 80 + (bk or 0), 48, {"fp8": (32, 48), "int8": (1, 24)}.get(fmt, (1, bk or 32))

    def parts(N, K):
        q = torch.randint(0, 256, (N, K // 2 if fmt in ("int4", "mxfp4") else K), generator=g, dtype=torch.uint8)
        if fmt == "fp8":
            q = q.masked_fill((q & 0x7F) == 0x7F, 0).view(torch.float8_e4m3fn)  # no NaN codes
        nb, kb = -(-N // bn), -(-K // bk)
        s = torch.randint(118, 130, (nb, kb), generator=g, dtype=torch.uint8) if fmt == "mxfp4" else \
            (torch.rand(nb, kb, generator=g) / K).to(scale_dtype)
        z = torch.randint(0, 16 if fmt == "int4" else 256, (nb, kb), generator=g, dtype=torch.uint8) \
            if fmt in ("int4", "int8") else None
        return q, s, z

    w = qweights(fmt, {"gate_up": [parts(2 * I, H) for _ in range(E)], "down": [parts(H, I) for _ in range(E)]},
                 {"gate_up": (bn, bk), "down": (bn, bk)})
    x, ids, rw = make_routes(5, 4, torch.int64, torch.float32, H)
    expect = ref.moe_experts(x, w["gate_up"], w["down"], ids, rw)
    for e in [ex, *pools.values()]:
        out = torch.empty(5, H)
        e.run(x, w["gate_up"], w["down"], ids, rw, out)
        assert rel_err(out, expect) < 1e-5, e.backend


@pytest.mark.parametrize("fmt,symmetric", QFORMATS)
def test_quantized_torch_fallback_is_the_reference(ex_torch, fmt, symmetric):
    gu, down = make_qbank(fmt, 96, 64, 32, symmetric)
    x, ids, w = make_routes(5, 2, torch.int64, torch.bfloat16, 96)
    out = torch.empty(5, 96)
    ex_torch.run(x, gu, down, ids, w, out)
    assert torch.equal(out, ref.moe_experts(x.float(), gu, down, ids, w))


def test_quantized_bad_expert_id_and_validation(ex, ex_torch):
    gu, down = make_qbank("int4", 96, 64, 32)
    x, ids, w = make_routes(2, 2, torch.int64, torch.float32, 96)
    ids[1, 0] = E
    for e in (ex, ex_torch):
        with pytest.raises((RuntimeError, IndexError)):
            e.submit(x, gu, down, ids, w, torch.empty(2, 96)).wait(timeout=10)
    ids[1, 0] = 0
    fgu, fdown = make_bank(96, 64, torch.float32)
    with pytest.raises(ValueError, match="two QWeights"):
        ex.submit(x, gu, fdown, ids, w, torch.empty(2, 96))
    bad = QWeight("int4", gu.q, gu.s[:, :, :1], gu.z, gu.block)  # scales of the wrong shape
    with pytest.raises(ValueError, match="two QWeights"):
        ex.submit(x, bad, down, ids, w, torch.empty(2, 96))
    with pytest.raises(ValueError, match="contiguous"):
        ex.submit(x, QWeight("int4", gu.q, gu.s.transpose(1, 2).contiguous().transpose(1, 2), gu.z, gu.block),
                  down, ids, w, torch.empty(2, 96))


@pytest.mark.parametrize("fmt", ["bf16", "int4", "int8", "fp8", "mxfp4"])
def test_expert_gbps_probe(fmt):
    for tokens in (1, 5):  # batch 1, and five routes per expert
        gbps = cpu_executor.expert_gbps(fmt, threads=1, seconds=0.05, bank_bytes=1 << 20, shape=(64, 32), group=32,
                                        tokens=tokens)
        assert gbps > 0
    with pytest.raises(ValueError, match="supported"):
        cpu_executor.expert_gbps("int3", threads=1, seconds=0.01)


@pytest.mark.parametrize("gate_up,down", [(("int4", 32), ("int8", 32)), (("int4", 64), ("int4", 32)),
                                           (("int4", 32), ("int4", 64))])
def test_quantized_banks_of_two_formats(ex, pools, gate_up, down):
    """Each bank takes its own format's kernel (a checkpoint may keep down_proj wider), and with it
    its own activation layout (int4 in blocks of 64 through the BF16 dot products, or not)."""
    gu, dn = make_qbank(gate_up[0], 128, 64, gate_up[1], False)[0], make_qbank(down[0], 128, 64, down[1], False)[1]
    x, ids, w = make_routes(3, 2, torch.int64, torch.float32, 128)
    for e in [ex, *pools.values()]:
        out = torch.empty(3, 128)
        e.run(x, gu, dn, ids, w, out)
        assert rel_err(out, ref.moe_experts(x, gu, dn, ids, w)) < 1e-5, e.backend


# ---- expert biases and gpt-oss's clamped SwiGLU ----

OSS_ACT = ref.ExpertAct(alpha=1.702, limit=0.9, shift=1.0)  # a limit the test's sums cross


def make_bias(H: int, I: int, seed: int = 2):
    """float32 biases ([E, 2I], [E, H]) as strided views of one bank, as the slot layout holds them."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(E, 2 * I + H + 64, generator=g)
    return rows[:, :2 * I], rows[:, 2 * I:2 * I + H]


@pytest.mark.parametrize("backend", ["default", "avx512", "avx2_fma", "scalar", "torch"])
@pytest.mark.parametrize("fmt,group", [(None, 0), ("bf16", 0), ("int4", 32), ("int4", 64), ("mxfp4", 32)])
def test_biases_and_clamped_swiglu_match_reference(ex, pools, ex_torch, backend, fmt, group):
    """Every path adds the gate_up and down biases and applies the clamped activation (the limit
    cuts part of the gate and up sums) as the reference does; T > 1 shares experts. None: fp32
    banks; int4 in blocks of 64 takes the BF16 dot products where the CPU has them (default)."""
    e = {"default": ex, "torch": ex_torch}.get(backend, pools.get(backend))
    if e is None:
        pytest.skip(f"{backend} path not usable on this machine")
    H, I = 128, 64
    gu, down = make_qbank(fmt, H, I, group) if group else \
        make_bank(H, I, torch.bfloat16 if fmt == "bf16" else torch.float32)
    bias = make_bias(H, I)
    x, ids, w = make_routes(5, 3, torch.int64, torch.float32, H)
    want = ref.moe_experts(x, gu, down, ids, w, OSS_ACT, bias)
    gu_sum = x @ gu.dequant(0).t() if group else x @ gu[0].float().t()
    assert 0.1 < (gu_sum.abs() > OSS_ACT.limit).float().mean() < 0.9
    out = torch.full((5, H), float("nan"))
    e.run(x, gu, down, ids, w, out, OSS_ACT, bias)
    assert rel_err(out, want) < (1e-2 if fmt == "bf16" else 1e-5)  # bf16: activations rounded
    assert rel_err(want, ref.moe_experts(x, gu, down, ids, w)) > 0.1  # the options matter


def test_poller_applies_biases_and_the_activation(ex):
    if ex.backend == "torch":
        pytest.skip("no C++ executor here")
    H, I, K = 64, 32, 2
    banks, biases = [make_bank(H, I, torch.float32, seed=s) for s in range(2)], [make_bias(H, I, s) for s in range(2)]
    x_h = torch.zeros(2, H, dtype=ex.act_dtype(banks[0][0]))
    buffers = (torch.zeros(3, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), x_h,
               torch.full((2, K), -1, dtype=torch.int64), torch.zeros(2, K), torch.zeros(2, H))
    poller = ex.poller(*buffers, [b[0] for b in banks], [b[1] for b in banks], OSS_ACT, biases)
    try:
        x, ids, w = make_routes(2, K, torch.int64, torch.float32, H)
        got = poller_step(*buffers, 1, x, ids, w)
        assert rel_err(got, ref.moe_experts(x, *banks[1], ids, w, OSS_ACT, biases[1])) < 1e-5
    finally:
        poller.close()


def test_bias_validation(ex):
    gu, down = make_bank(64, 32, torch.float32)
    x, ids, w = make_routes(2, 2, torch.int64, torch.float32, 64)
    b_gu, b_d = make_bias(64, 32)
    with pytest.raises(ValueError, match="biases must be float32"):
        ex.run(x, gu, down, ids, w, torch.empty(2, 64), OSS_ACT, (b_gu.half(), b_d))
    with pytest.raises(ValueError, match="biases must be float32"):
        ex.run(x, gu, down, ids, w, torch.empty(2, 64), OSS_ACT, (b_gu[:, :10], b_d))


def _permuted(K: int, chunk: int) -> torch.Tensor:
    """Where element k of a row goes for a kernel of this chunk: evens then odds within each whole
    chunk (the low then the high nibbles of its codes), a short tail in place."""
    pos = torch.arange(K)
    whole = K - K % chunk if chunk else 0
    o = pos[:whole] % chunk
    pos[:whole] = pos[:whole] - o + (o % 2) * (chunk // 2) + o // 2
    return pos


@pytest.mark.parametrize("K", [2048 + 40, 40, 768])
def test_activation_rows_are_laid_out_as_the_kernels_read_them(K):
    """A job's x row for each reader: fp32 in the chunk order; for the BF16 dot products (64-value
    chunks) bf16 hi = round-to-nearest-even of x, then lo = bf16(x - hi) (0 where hi overflowed)
    after the K hi values, the vector path bit for bit the elementwise definition: ties, overflow
    to infinity, infinities, NaN, subnormals, signed zeros."""
    import ctypes
    if not cpu_executor_available():
        pytest.skip("no C++ executor here")
    lib = CPUExecutor(1)._lib
    g = torch.Generator().manual_seed(K)
    x = torch.randn(K, generator=g) * torch.logspace(-30, 30, K).index_select(0, torch.randperm(K, generator=g))
    special = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                            0x7FC00001, 0x00000001, 0x80400000, 0x00000000, 0x80000000, 0x3F80FFFF, 0x7F7F8000],
                           dtype=torch.int64).to(torch.int32).view(torch.float32)
    x[:len(special)] = special
    x[-len(special):] = special
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())
    for chunk in (0, 32, 64):
        out = torch.full((K,), -1.0)
        lib.ftmoe_put_x(ptr(out), ptr(x), K, 0, chunk)  # A_F32
        want = torch.empty(K).index_copy_(0, _permuted(K, chunk), x)
        assert torch.equal(out.view(torch.int32), want.view(torch.int32)), chunk
    if not lib.ftmoe_cpu_features() & 2:
        return  # the BF16 dot products' rows: only where they run (AVX-512 BF16)
    out = torch.zeros(2 * K, dtype=torch.int16)
    lib.ftmoe_put_x(ptr(out), ptr(x), K, 2, 64)  # A_BF16X2
    hi = x.bfloat16()
    lo = torch.where(hi.float().isinf(), 0.0, x - hi.float()).bfloat16()
    pos = _permuted(K, 64)
    for got, w in ((out[:K][pos], hi), (out[K:][pos], lo)):
        got = got.view(torch.bfloat16)
        assert torch.equal(got.isnan(), w.isnan())
        ok = ~w.isnan()
        assert torch.equal(got[ok].view(torch.int16), w[ok].view(torch.int16))
