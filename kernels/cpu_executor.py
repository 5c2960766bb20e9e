"""CPU expert executor: the routed expert FFNs of the CPU routes, computed by a persistent pool of
C++ worker threads straight from the host expert banks (kernels/csrc/cpu_moe.cpp), with the
semantics of kernels.ref.moe_experts. The library is built on first use with torch's extension
builder and called through ctypes (which releases the GIL); where it cannot be built, one line on
stderr says why and a plain-torch path gives the same result."""
from __future__ import annotations

import ctypes
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from kernels import ref
from kernels.quant import QWeight

_SRC = Path(__file__).with_name("csrc") / "cpu_moe.cpp"
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # cpu_moe.cpp DType codes
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None


def _build() -> ctypes.CDLL:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"{cxx} not found; install a C++ compiler for the fast CPU expert path")
    from torch.utils.cpp_extension import load
    # No -march=native: the cached library may be reused on another CPU (shared home, container
    # image); the SIMD paths are per-function targets picked at run time instead.
    path = load("freetoken_cpu_moe", [str(_SRC)], extra_cflags=["-O3"], is_python_module=False)
    lib, p, i = ctypes.CDLL(path), ctypes.c_void_p, ctypes.c_int
    for fn, args, res in [("pool_create", [i, p, i], p), ("pool_destroy", [p], None),
                          ("submit", [p] * 7 + [i] * 5 + [ctypes.c_int64] * 2 + [i] * 3, p),
                          ("wait", [p, ctypes.c_double], i), ("error", [p], ctypes.c_char_p),
                          ("free", [p], None), ("cpu_features", [], i),
                          ("seconds", [p], ctypes.c_double),
                          ("poller_start", [p] * 9 + [i] * 5 + [ctypes.c_int64] * 2 + [i] * 2, p),
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


def _check(x, wgu, wd, ids, weights, out) -> None:
    tensors, dims_ok = (x, wgu, wd, ids, weights, out), x.dim() == 2 and wgu.dim() == wd.dim() == 3
    (T, H), E, I = (x.shape, wgu.shape[0], wgu.shape[1] // 2) if dims_ok else ((0, 0), 0, 0)
    for ok, what in [
        (all(t.device.type == "cpu" for t in tensors), "tensors must be on the CPU"),
        (x.dim() == 2 and H > 0 and I > 0 and wgu.shape == (E, 2 * I, H) and wd.shape == (E, H, I),
         "need x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I]"),
        (x.dtype in _DTYPES and wgu.dtype in _DTYPES and wd.dtype == wgu.dtype,
         "x and the banks must be fp32/bf16/fp16, both banks of one dtype"),
        (all(w.stride(2) == 1 and w.stride(1) == w.shape[2] and w.stride(0) >= w.stride(1)
             * w.shape[1] for w in (wgu, wd)), "banks need contiguous [rows, cols] per expert"),
        (ids.dtype in (torch.int32, torch.int64) and ids.dim() == 2 and ids.shape[0] == T,
         "ids must be int32/int64 [T, K]"),
        (weights.dtype == torch.float32 and weights.shape == ids.shape,
         "weights must be fp32 [T, K]"),
        (out.dtype == torch.float32 and out.shape == x.shape and out.is_contiguous(),
         "out must be contiguous fp32 [T, H]")]:
        if not ok:
            got = ", ".join(f"{t.dtype} {list(t.shape)} {t.stride()}" for t in tensors)
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
    """Persistent C++ worker pool. `backend` forces a path (tests): "torch", "avx2_fma", ..."""

    def __init__(self, threads: int | None = None, backend: str | None = None):
        self.threads = int(threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1)
        self._lib, self._pool = (None if backend == "torch" else _library()), None
        feats = self._lib.ftmoe_cpu_features() if self._lib else 0
        usable = ["torch"] + ["scalar"] * bool(self._lib) + ["avx2_fma"] * bool(feats & 1) + [
            "avx512_bf16"] * (feats & 3 == 3)  # slowest to fastest
        if backend not in usable + [None]:
            raise ValueError(f"backend {backend!r} is not usable here; choose from {usable}")
        self.backend = backend or usable[-1]
        if self.backend != "torch":
            pin = (_core_cpus() + [-1] * self.threads)[:self.threads]
            pin = (ctypes.c_int * self.threads)(*pin)
            # spin for new work (2 ms, some layer steps apart) only when a core is left for the
            # caller (never on a 2-core CI box)
            spin = 2000 if self.threads < (psutil.cpu_count(logical=False) or 1) else 0
            self._pool = self._lib.ftmoe_pool_create(self.threads, pin, spin)

    def submit(self, x, w_gate_up, w_down, ids, weights, out) -> CPUFuture:
        """Start out[T, H] = sum_k weights * FFN_ids(x); returns at once (see ref.moe_experts)."""
        quant = isinstance(w_gate_up, QWeight)  # quantized banks: the torch path until the C++ one reads them
        if not quant:
            _check(x, w_gate_up, w_down, ids, weights, out)
        E, dt = w_gate_up.shape[0], x.dtype if quant else w_gate_up.dtype
        if self.backend == "torch" or quant:
            try:  # same contract as the pool: a failure surfaces from wait()
                if ids.numel() and (ids.min() < -1 or ids.max() >= E):
                    raise IndexError(f"expert ids must be in [-1, {E})")
                t0 = time.perf_counter()
                out.copy_(ref.moe_experts(x.to(dt), w_gate_up, w_down, ids, weights))
            except Exception as e:
                return CPUFuture(None, None, (), e)
            return CPUFuture(None, None, (), seconds=time.perf_counter() - t0)
        if self._pool is None:
            raise RuntimeError("CPUExecutor is closed")
        mode = {"avx512_bf16": 0 if dt == torch.bfloat16 else 1, "avx2_fma": 1, "scalar": 2}[
            self.backend]  # cpu_moe.cpp Mode: DP_BF16 needs bf16 weights
        xa = x.to(torch.bfloat16 if mode == 0 else torch.float32).contiguous()  # activations
        ids, weights, esz = ids.contiguous(), weights.contiguous(), w_gate_up.element_size()
        job = self._lib.ftmoe_submit(
            self._pool, xa.data_ptr(), w_gate_up.data_ptr(), w_down.data_ptr(), ids.data_ptr(),
            weights.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], w_down.shape[2], E,
            ids.shape[1], w_gate_up.stride(0) * esz, w_down.stride(0) * esz, _DTYPES[dt],
            int(ids.dtype == torch.int64), mode)
        if not job:
            raise MemoryError("CPU expert executor: could not allocate the job's buffers")
        return CPUFuture(self._lib, job, (xa, w_gate_up, w_down, ids, weights, out))

    def act_dtype(self, weight_dtype: torch.dtype) -> torch.dtype:
        """The activation dtype the C++ path reads (bf16 for the AVX-512 BF16 dot products)."""
        return torch.bfloat16 if self.backend == "avx512_bf16" and weight_dtype == torch.bfloat16 else torch.float32

    def poller(self, flags: torch.Tensor, nfill: torch.Tensor, x: torch.Tensor, ids: torch.Tensor,
               weights: torch.Tensor, out: torch.Tensor, gate_up: list, down: list) -> "Poller":
        """Serve a CUDA graph's CPU branch: see cpu_moe.cpp's Poller. flags: int32 [go, done,
        fill]; nfill: int64 [1]; x [Tmax, H] (act_dtype), ids [Tmax, K] int64, weights [Tmax, K]
        fp32, out [Tmax, H] fp32, all in pinned memory; gate_up / down are the per-layer bank
        views [E, 2I, H] / [E, H, I]."""
        if self._pool is None:
            raise RuntimeError("the in-graph CPU branch needs the C++ executor")
        dt = gate_up[0].dtype
        assert x.dtype == self.act_dtype(dt) and ids.dtype == torch.int64 and out.dtype == torch.float32
        assert flags.dtype == torch.int32 and flags.numel() == 3 and nfill.dtype == torch.int64
        mode = {"avx512_bf16": 0 if dt == torch.bfloat16 else 1, "avx2_fma": 1, "scalar": 2}[self.backend]
        arr = ctypes.c_void_p * len(gate_up)
        esz = gate_up[0].element_size()
        handle = self._lib.ftmoe_poller_start(
            self._pool, flags.data_ptr(), nfill.data_ptr(), x.data_ptr(), ids.data_ptr(), weights.data_ptr(),
            out.data_ptr(), arr(*[w.data_ptr() for w in gate_up]), arr(*[w.data_ptr() for w in down]),
            len(gate_up), x.shape[1], down[0].shape[2], gate_up[0].shape[0], ids.shape[1],
            gate_up[0].stride(0) * esz, down[0].stride(0) * esz, _DTYPES[dt], mode)
        return Poller(self._lib, handle, (flags, nfill, x, ids, weights, out, gate_up, down))

    def run(self, x, w_gate_up, w_down, ids, weights, out) -> None:
        self.submit(x, w_gate_up, w_down, ids, weights, out).wait()

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
