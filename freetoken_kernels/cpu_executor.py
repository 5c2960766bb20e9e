"""CPU expert executor: the routed expert FFNs of the CPU routes, computed by a persistent pool of
C++ worker threads straight from the host expert banks (freetoken_kernels/csrc/cpu_moe.cpp), with the
semantics of freetoken_kernels.ref.moe_experts. A bank is a tensor [E, N, K] (fp32/bf16/fp16) or a
freetoken_kernels.quant.QWeight (int4, int8, fp8, mxfp4), dequantized in registers, with optional float32
biases and a gated activation (freetoken_kernels.ref.ExpertAct). The library is built on
first use with torch's extension builder and called through ctypes (which releases the GIL); where
it cannot be built, one line on stderr says why and a plain-torch path gives the same result."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from freetoken_kernels import ref
from freetoken_kernels.quant import FORMATS, QWeight
from freetoken_kernels.ref import SILU, ExpertAct, ExpertBias

_SRC = Path(__file__).with_name("csrc") / "cpu_moe.cpp"
# cpu_moe.cpp Fmt codes: of plain weights and of scales, of quantized formats, of mxfp4's scales
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_QFMT = {"int4": 3, "int8": 4, "fp8": 5, "mxfp4": 6}
_E8M0 = 7
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None


# -ffp-contract=off: every expression is rounded as written, whichever compiler and however it
# vectorizes a loop (a scalar a * b - c fused in one instantiation of a row kernel and not in another
# made a token's bits depend on how many routes shared its expert, with one compiler)
CFLAGS = ["-O3", "-ffp-contract=off"]


def _build() -> ctypes.CDLL:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"{cxx} not found; install a C++ compiler for the fast CPU expert path")
    # No -march=native: the cached library may be reused on another CPU (shared home, container
    # image); the SIMD paths are per-function targets picked at run time instead.
    # Named by the sources' and torch's digest: processes running different sources (another
    # checkout, an upgrade) never rebuild one library under each other, which would load a
    # mismatched ABI. Where the build root is set (the engine sets it: engine.config), a library
    # built before is loaded as it is: torch's builder would check it through ninja and the
    # compiler first, seconds of subprocesses in a large process.
    sources = b"".join(f.read_bytes() for f in sorted(_SRC.parent.iterdir())) + torch.__version__.encode() + \
        " ".join(CFLAGS).encode()
    name = f"freetoken_cpu_moe_{hashlib.sha256(sources).hexdigest()[:12]}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    try:
        lib = ctypes.CDLL(os.path.join(root, name, f"{name}.so")) if root else None
    except OSError:  # not built yet (or another process is linking it: load() waits for it)
        lib = None
    if lib is None:
        from torch.utils.cpp_extension import load
        lib = ctypes.CDLL(load(name, [str(_SRC)], extra_cflags=CFLAGS, is_python_module=False))
    p, i = ctypes.c_void_p, ctypes.c_int
    m, a = ctypes.POINTER(_Mat), ctypes.POINTER(_ExpertAct)
    for fn, args, res in [("pool_create", [i, p, i], p), ("pool_destroy", [p], None),
                          ("submit", [p, p, m, m, p, p, p] + [i] * 7 + [a, i], p),
                          ("wait", [p, ctypes.c_double], i), ("error", [p], ctypes.c_char_p),
                          ("free", [p], None), ("cpu_features", [], i), ("put_x", [p, p, i, i, i], None),
                          ("seconds", [p], ctypes.c_double),
                          ("poller_start", [p] * 7 + [m, m] + [i] * 6 + [a, i], p),
                          ("poller_stop", [p], None), ("poller_stats", [p, p], i),
                          ("poller_error", [p], ctypes.c_char_p)]:
        getattr(lib, "ftmoe_" + fn).argtypes, getattr(lib, "ftmoe_" + fn).restype = args, res
    return lib


def _library() -> ctypes.CDLL | None:
    global _lib, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            try:
                _lib = _build()
            except Exception as e:  # not swallowed: reported once, and the torch path takes over
                _lib_error = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                print(f"freetoken: the CPU expert executor falls back to torch: {_lib_error}",
                      file=sys.stderr)
    return _lib


def cpu_executor_available() -> bool:
    """True when the C++ executor is built (building it now if needed)."""
    return _library() is not None


def _core_cpus() -> list[int]:
    """One logical CPU per physical core, among those this process may run on (Linux sysfs)."""
    cores: dict[str, int] = {}
    try:
        for c in sorted(os.sched_getaffinity(0)):
            cores.setdefault(Path(f"/sys/devices/system/cpu/cpu{c}/topology/"
                                  "thread_siblings_list").read_text(), c)
    except (AttributeError, OSError):  # not Linux, or no sysfs: the threads stay unpinned
        return []
    return list(cores.values())


# Engine threads that must run beside the workers: the one driving the steps (Python) and the
# CUDA-graph CPU branch's poller (cpu_moe.cpp). A worker pinned to a core that one of them also
# wants gets a share of it, and every job of the pool waits at its phase barrier for the worker
# descheduled inside a unit, a whole timeslice: 16 workers on 16 cores beside one busy thread ran
# at a sixth of the speed of 15 (H200 host, 2026-11-30).
HOST_THREADS = 2


def max_threads() -> int:
    """The most workers a pool runs: the physical cores this process may use, less one for each
    host thread (at least one worker)."""
    return max(1, _cores() - HOST_THREADS)


def _cores() -> int:
    return len(_core_cpus()) or psutil.cpu_count(logical=False) or os.cpu_count() or 1


class _Mat(ctypes.Structure):
    """cpu_moe.cpp's Mat: one bank [E, N, K], plain or quantized, and its bias [E, N] or null."""
    _fields_ = [("q", ctypes.c_void_p), ("s", ctypes.c_void_p), ("z", ctypes.c_void_p),
                ("sq", ctypes.c_int64), ("ss", ctypes.c_int64), ("sz", ctypes.c_int64),
                ("fmt", ctypes.c_int32), ("sdt", ctypes.c_int32), ("bn", ctypes.c_int32), ("bk", ctypes.c_int32),
                ("b", ctypes.c_void_p), ("sb", ctypes.c_int64)]


class _ExpertAct(ctypes.Structure):
    """cpu_moe.cpp's ExpertAct: freetoken_kernels.ref.ExpertAct, an infinite limit for none."""
    _fields_ = [("alpha", ctypes.c_float), ("limit", ctypes.c_float), ("shift", ctypes.c_float)]


def _act(act: ExpertAct) -> _ExpertAct:
    return _ExpertAct(act.alpha, float("inf") if act.limit is None else act.limit, act.shift)


def _mat(w, b: torch.Tensor | None = None) -> _Mat:
    bias = (None, 0) if b is None else (b.data_ptr(), b.stride(0) * b.element_size())
    if not isinstance(w, QWeight):
        return _Mat(w.data_ptr(), None, None, w.stride(0) * w.element_size(), 0, 0, _DTYPES[w.dtype], 0, 1, 1, *bias)
    z = w.z
    return _Mat(w.q.data_ptr(), w.s.data_ptr(), None if z is None else z.data_ptr(),
                w.q.stride(0) * w.q.element_size(), w.s.stride(0) * w.s.element_size(),
                0 if z is None else z.stride(0), _QFMT[w.fmt],
                _E8M0 if w.fmt == "mxfp4" else _DTYPES[w.s.dtype], *w.block, *bias)


def _parts(w) -> list[torch.Tensor]:
    return [t for t in (w.q, w.s, w.z) if t is not None] if isinstance(w, QWeight) else [w]


def _qweight_ok(w: QWeight) -> bool:
    """The parts' dtypes and shapes are those freetoken_kernels/quant.py defines for w's format and block."""
    if w.fmt not in FORMATS:
        return False
    S, N, K = w.shape
    (bn, bk), has_zero = w.block, w.fmt in ("int4", "int8")
    nb, kb = -(-N // bn), -(-K // bk)
    return (w.q.dtype == (torch.float8_e4m3fn if w.fmt == "fp8" else torch.uint8)
            and w.s.dtype in ((torch.uint8,) if w.fmt == "mxfp4" else tuple(_DTYPES))
            and tuple(w.s.shape) == (S, nb, kb) and (w.z is not None) == has_zero
            and (w.z is None or (w.z.dtype == torch.uint8 and tuple(w.z.shape) == (S, nb, kb))))


def _check_banks(wgu, wd, H: int | None = None, bias: ExpertBias | None = None) -> None:
    """w_gate_up [E, 2I, H] and w_down [E, H, I]: both tensors of one dtype, or both QWeights;
    bias None or float32 ([E, 2I], [E, H]) with contiguous rows."""
    quant = isinstance(wgu, QWeight)
    parts = _parts(wgu) + _parts(wd)
    if bias is not None:
        E, I2, Hg = wgu.shape
        b_ok = all(b.device.type == "cpu" and b.dtype == torch.float32 and b.dim() == 2 and b.stride(1) == 1
                   for b in bias) and (tuple(bias[0].shape), tuple(bias[1].shape)) == ((E, I2), (E, Hg))
        if not b_ok:
            got = ", ".join(f"{b.dtype} {list(b.shape)} {b.stride()}" for b in bias)
            raise ValueError(f"CPUExecutor: biases must be float32 [E, 2I] and [E, H] on the CPU; got {got}")
    (E, I2, Hg), (Ed, Hd, I) = (tuple(wgu.shape), tuple(wd.shape)) if all(
        t.dim() == 3 for t in parts) else ((0, 0, 0), (0, 0, 0))
    for ok, what in [
        (all(t.device.type == "cpu" for t in parts), "banks must be on the CPU"),
        (Hg > 0 and I > 0 and (E, I2, Hg) == (Ed, 2 * I, Hd) and H in (None, Hg),
         "need x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]"),
        (isinstance(wd, QWeight) == quant and (all(map(_qweight_ok, (wgu, wd))) if quant else
                                               wgu.dtype in _DTYPES and wd.dtype == wgu.dtype),
         "the banks must be fp32/bf16/fp16 tensors of one dtype, "
         "or two QWeights laid out as freetoken_kernels/quant.py says"),
        (all(t.stride(2) == 1 and t.stride(1) == t.shape[2] and t.stride(0) >= t.stride(1) * t.shape[1]
             for t in parts), "banks need contiguous [rows, cols] per expert")]:
        if not ok:
            got = ", ".join(f"{t.dtype} {list(t.shape)} {t.stride()}" for t in parts)
            raise ValueError(f"CPUExecutor: {what}; got (dtype shape strides) {got}")


def _check(x, wgu, wd, ids, weights, out, bias) -> None:
    _check_banks(wgu, wd, x.shape[1] if x.dim() == 2 else -1, bias)
    T = x.shape[0]
    for ok, what in [
        (all(t.device.type == "cpu" for t in (x, ids, weights, out)), "tensors must be on the CPU"),
        (x.dtype in _DTYPES, "x must be fp32/bf16/fp16"),
        (ids.dtype in (torch.int32, torch.int64) and ids.dim() == 2 and ids.shape[0] == T,
         "ids must be int32/int64 [T, K]"),
        (weights.dtype == torch.float32 and weights.shape == ids.shape,
         "weights must be fp32 [T, K]"),
        (out.dtype == torch.float32 and out.shape == x.shape and out.is_contiguous(),
         "out must be contiguous fp32 [T, H]")]:
        if not ok:
            got = ", ".join(f"{t.dtype} {list(t.shape)} {t.stride()}" for t in (x, ids, weights, out))
            raise ValueError(f"CPUExecutor: {what}; got (dtype shape strides) {got}")


class CPUFuture:
    """One submitted job. Holds its tensors alive until the workers are done with them."""

    def __init__(self, lib, job, keep: tuple, error: Exception | None = None, seconds: float | None = None):
        self._lib, self._job, self._keep, self._error = lib, job, keep, error
        self.seconds = seconds  # submit-to-finish time of the workers, set once done

    def wait(self, timeout: float | None = None) -> None:
        """Block (without the GIL) until done; raise a worker failure, or TimeoutError."""
        if self._job is not None:
            rc = self._lib.ftmoe_wait(self._job, -1.0 if timeout is None else timeout)
            if rc == 2:
                raise TimeoutError(f"CPU expert job not done after {timeout} s")
            if rc == 1:
                msg = self._lib.ftmoe_error(self._job).decode()
                self._error = RuntimeError(f"CPU expert executor: {msg}")
            self.seconds = self._lib.ftmoe_seconds(self._job)
            self._lib.ftmoe_free(self._job)
            self._job, self._keep = None, ()
        if self._error is not None:
            raise self._error

    def __del__(self):  # the workers may still read the tensors: let them finish first
        if getattr(self, "_job", None) is not None:
            self._lib.ftmoe_wait(self._job, -1.0)
            self._lib.ftmoe_free(self._job)


class CPUExecutor:
    """Persistent C++ worker pool of `threads` workers (default and at most: max_threads()).
    `backend` forces a path (tests): "torch", "scalar", "avx2_fma", "avx512" (AVX-512 F/BW:
    quantized banks in 512-bit registers), "avx512_bf16" (also bf16 banks, and int4 banks of
    64-column multiple blocks and mxfp4 banks, through the BF16 dot products)."""

    def __init__(self, threads: int | None = None, backend: str | None = None):
        self.threads = min(int(threads or max_threads()), max_threads())
        self._lib, self._pool = (None if backend == "torch" else _library()), None
        feats = self._lib.ftmoe_cpu_features() if self._lib else 0
        usable = ["torch"] + ["scalar"] * bool(self._lib) + ["avx2_fma"] * bool(feats & 1) + [
            "avx512"] * (feats & 5 == 5) + ["avx512_bf16"] * (feats & 7 == 7)  # slowest to fastest
        if backend not in usable + [None]:
            raise ValueError(f"backend {backend!r} is not usable here; choose from {usable}")
        self.backend = backend or usable[-1]
        if self.backend != "torch":
            pin = (_core_cpus() + [-1] * self.threads)[:self.threads]
            pin = (ctypes.c_int * self.threads)(*pin)
            # spin for new work (2 ms, some layer steps apart) only where the host threads keep
            # cores of their own (not on a 2-core CI box)
            spin = 2000 if self.threads + HOST_THREADS <= _cores() else 0
            self._pool = self._lib.ftmoe_pool_create(self.threads, pin, spin)

    def _mode(self, w) -> int:
        """cpu_moe.cpp Mode for banks w (a tensor, a QWeight, or their dtype) on this backend."""
        if self.backend == "scalar":
            return 2
        if isinstance(w, QWeight):  # AVX512_BF16Q where the BF16 dot products are there, else AVX512
            return {"avx512_bf16": 4, "avx512": 3}.get(self.backend, 1)
        dt = w if isinstance(w, torch.dtype) else w.dtype
        return 0 if self.backend == "avx512_bf16" and dt == torch.bfloat16 else 1  # DP_BF16: bf16 weights

    def submit(self, x, w_gate_up, w_down, ids, weights, out, act: ExpertAct = SILU,
               bias: ExpertBias | None = None) -> CPUFuture:
        """Start out[T, H] = sum_k weights * FFN_ids(x); returns at once (see ref.moe_experts).
        The banks are tensors [E, 2I, H] / [E, H, I] or QWeights of those shapes. With bf16 x, the
        paths that read bf16 activations (bf16 banks; int4 and mxfp4 on the BF16 dot products)
        round the intermediate act(gate, up) to bf16, as the model's own dtype does (the reference
        computes it in x's dtype); quantized weights enter at their exact values either way."""
        _check(x, w_gate_up, w_down, ids, weights, out, bias)
        E = w_gate_up.shape[0]
        if self.backend == "torch":
            try:  # same contract as the pool: a failure surfaces from wait()
                if ids.numel() and (ids.min() < -1 or ids.max() >= E):
                    raise IndexError(f"expert ids must be in [-1, {E})")
                t0 = time.perf_counter()
                xc = x.float() if isinstance(w_gate_up, QWeight) else x.to(w_gate_up.dtype)  # as the C++ paths
                out.copy_(ref.moe_experts(xc, w_gate_up, w_down, ids, weights, act, bias))
            except Exception as e:
                return CPUFuture(None, None, (), e)
            return CPUFuture(None, None, (), seconds=time.perf_counter() - t0)
        if self._pool is None:
            raise RuntimeError("CPUExecutor is closed")
        xa = x.to(self.act_dtype(w_gate_up)).contiguous()  # activations
        ids, weights = ids.contiguous(), weights.contiguous()
        b_gu, b_d = bias or (None, None)
        job = self._lib.ftmoe_submit(
            self._pool, xa.data_ptr(), _mat(w_gate_up, b_gu), _mat(w_down, b_d), ids.data_ptr(), weights.data_ptr(),
            out.data_ptr(), x.shape[0], x.shape[1], w_down.shape[2], E, ids.shape[1],
            int(ids.dtype == torch.int64), self._mode(w_gate_up), _act(act), int(x.dtype == torch.bfloat16))
        if not job:
            raise MemoryError("CPU expert executor: could not allocate the job's buffers")
        return CPUFuture(self._lib, job, (xa, w_gate_up, w_down, ids, weights, out, bias))

    def act_dtype(self, w) -> torch.dtype:
        """The activation dtype the C++ path reads for banks w (a tensor, a QWeight, or a dtype):
        bf16 for the AVX-512 BF16 dot products of bf16 banks, else fp32."""
        return torch.bfloat16 if self._mode(w) == 0 else torch.float32

    def poller(self, flags: torch.Tensor, nfill: torch.Tensor, x: torch.Tensor, ids: torch.Tensor,
               weights: torch.Tensor, out: torch.Tensor, gate_up: list, down: list, act: ExpertAct = SILU,
               biases: list | None = None, model_dtype: torch.dtype = torch.float32) -> "Poller":
        """Serve a CUDA graph's CPU branch: see cpu_moe.cpp's Poller. flags: int32 [go, done,
        fill]; nfill: int64 [1]; x [Tmax, H] (act_dtype), ids [Tmax, K] int64, weights [Tmax, K]
        fp32, out [Tmax, H] fp32, all in pinned memory; gate_up / down are the per-layer banks,
        tensors [E, 2I, H] / [E, H, I] or QWeights; biases the per-layer ExpertBias, or None;
        model_dtype: the model's activations (bf16: the intermediate rounded to bf16, as submit
        does for bf16 x)."""
        if self._pool is None:
            raise RuntimeError("the in-graph CPU branch needs the C++ executor")
        biases = biases or [None] * len(gate_up)
        for wgu, wd, b in zip(gate_up, down, biases, strict=True):
            _check_banks(wgu, wd, x.shape[1], b)
        mode = self._mode(gate_up[0])
        assert {self._mode(w) for w in gate_up} == {mode}, "one kernel family serves every layer"
        assert x.dtype == self.act_dtype(gate_up[0]) and ids.dtype == torch.int64 and out.dtype == torch.float32
        assert flags.dtype == torch.int32 and flags.numel() == 3 and nfill.dtype == torch.int64
        mats, none = _Mat * len(gate_up), (None, None)
        handle = self._lib.ftmoe_poller_start(
            self._pool, flags.data_ptr(), nfill.data_ptr(), x.data_ptr(), ids.data_ptr(), weights.data_ptr(),
            out.data_ptr(), mats(*(_mat(w, (b or none)[0]) for w, b in zip(gate_up, biases))),
            mats(*(_mat(w, (b or none)[1]) for w, b in zip(down, biases))), len(gate_up), x.shape[1],
            down[0].shape[2], gate_up[0].shape[0], ids.shape[1], mode, _act(act), int(model_dtype == torch.bfloat16))
        return Poller(self._lib, handle, (flags, nfill, x, ids, weights, out, gate_up, down, biases))

    def run(self, x, w_gate_up, w_down, ids, weights, out, act: ExpertAct = SILU,
            bias: ExpertBias | None = None) -> None:
        self.submit(x, w_gate_up, w_down, ids, weights, out, act, bias).wait()

    def close(self) -> None:
        """Finish queued jobs and join the workers."""
        if getattr(self, "_pool", None) is not None:
            self._lib.ftmoe_pool_destroy(self._pool)
            self._pool = None

    __del__ = close


class Poller:
    """A running CPU-branch poller; `stats()` returns (jobs, experts, seconds, experts filled,
    fill seconds) since the last call and raises if a job failed."""

    def __init__(self, lib, handle, keep: tuple):
        self._lib, self._h, self._keep = lib, handle, keep

    def stats(self) -> tuple[int, int, float, int, float]:
        buf = (ctypes.c_int64 * 5)()
        if self._lib.ftmoe_poller_stats(self._h, buf):
            raise RuntimeError(f"CPU expert branch: {self._lib.ftmoe_poller_error(self._h).decode()}")
        return buf[0], buf[1], buf[2] / 1e9, buf[3], buf[4] / 1e9

    def close(self) -> None:
        if self._h is not None:
            self._lib.ftmoe_poller_stop(self._h)
            self._h = None

    __del__ = close


def _constant_bank(fmt: str, n_experts: int, hidden: int, inter: int, group: int = 128) -> tuple:
    """(w_gate_up, w_down) of n_experts filled with constants, for timing (the values do not
    change it): tensors for fp32/bf16/fp16, QWeights (blocks of 1 x group, fp8 group x group,
    fp16 scales, fp32 for fp8) for the quantized formats."""
    plain = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    shapes = ((2 * inter, hidden), (hidden, inter))
    if fmt in plain:
        return tuple(torch.full((n_experts, n, k), 0.01, dtype=plain[fmt]) for n, k in shapes)
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; supported: {', '.join([*plain, *FORMATS])}")
    bn, bk = {"fp8": (group, group), "mxfp4": (1, 32)}.get(fmt, (1, group))

    def qweight(n: int, k: int) -> QWeight:
        q = torch.full((n_experts, n, k // 2 if fmt in ("int4", "mxfp4") else k), 0x37, dtype=torch.uint8)
        blocks = (n_experts, -(-n // bn), -(-k // bk))
        s = torch.full(blocks, 127, dtype=torch.uint8) if fmt == "mxfp4" else \
            torch.full(blocks, 0.01, dtype=torch.float32 if fmt == "fp8" else torch.float16)
        z = torch.full(blocks, 8, dtype=torch.uint8) if fmt in ("int4", "int8") else None
        return QWeight(fmt, q.view(torch.float8_e4m3fn) if fmt == "fp8" else q, s, z, (bn, bk))

    return tuple(qweight(n, k) for n, k in shapes)


def expert_bytes(fmt: str, shape: tuple[int, int] = (2048, 768), group: int = 128) -> int:
    """Bytes of one expert of shape (hidden, moe_intermediate) in a weight format (of a quantized
    one: its codes, scales and zero points)."""
    return sum(w.nbytes_per_slot if isinstance(w, QWeight) else w[0].nbytes
               for w in _constant_bank(fmt, 1, *shape, group))


def expert_gbps(fmt: str, threads: int | None = None, seconds: float = 1.0, bank_bytes: int = 1 << 30,
                shape: tuple[int, int] = (2048, 768), group: int = 128, backend: str | None = None,
                tokens: int = 1) -> float:
    """B_H of one weight format (fp32, bf16, fp16 or a freetoken_kernels.quant format): GB/s of expert bytes
    that the executor with `threads` threads reads, in jobs of `tokens` tokens (1: batch 1) that
    all route to the same 8 distinct experts of shape (hidden, moe_intermediate), cycling through
    bank_bytes of experts (make that exceed the CPU caches), timed by the executor's own clock
    from submit to retire; `backend` as CPUExecutor's."""
    hidden, inter = shape
    per_expert = expert_bytes(fmt, shape, group)
    n = max(8, -(-bank_bytes // per_expert))
    gu, down = _constant_bank(fmt, n, hidden, inter, group)
    ex = CPUExecutor(threads, backend)
    try:
        # a bf16 model's activations, in bf16 as the engine passes them (int4 and mxfp4 through the
        # BF16 dot products then read half of x and of the intermediate)
        x, out = torch.randn(tokens, hidden).bfloat16(), torch.empty(tokens, hidden)
        w = torch.full((tokens, 8), 1 / 8)
        i, busy, t0 = 0, 0.0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            job = ex.submit(x, gu, down, (torch.arange(8) + i).remainder(n).expand(tokens, 8).contiguous(), w, out)
            job.wait()
            busy, i = busy + job.seconds, i + 8
    finally:
        ex.close()
    return i * per_expert / busy / 1e9
