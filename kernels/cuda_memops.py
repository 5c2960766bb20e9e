"""CUDA stream memory operations through libcuda (ctypes): a stream waits for a 32-bit value in
mapped pinned host memory. The wait is captured into CUDA graphs like any other stream work,
which lets a graph wait for the CPU expert branch's answer (a release store at system scope at
the end of the plan and fill kernels is the other direction)."""
from __future__ import annotations

import ctypes

import torch

WAIT_EQ = 0x1  # CU_STREAM_WAIT_VALUE_EQ
_lib = None


def _cuda():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
        fn = getattr(_lib, "cuStreamWaitValue32_v2", None) or _lib.cuStreamWaitValue32
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        _lib.ft_cuStreamWaitValue32 = fn
        _lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    return _lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed with CUresult {rc}")


def device_ptr(t: torch.Tensor) -> int:
    """Device address of a pinned host tensor."""
    out = ctypes.c_uint64()
    _check(_cuda().cuMemHostGetDevicePointer_v2(ctypes.byref(out), ctypes.c_void_p(t.data_ptr()), 0),
           "cuMemHostGetDevicePointer")
    return out.value


def wait_value(ptr: int, value: int) -> None:
    """On the current stream: later work waits until *ptr == value."""
    s = torch.cuda.current_stream().cuda_stream
    _check(_cuda().ft_cuStreamWaitValue32(s, ptr, value, WAIT_EQ), "cuStreamWaitValue32")
