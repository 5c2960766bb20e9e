"""RMSNorm in the HF conventions: normalise in fp32, then either cast back and scale by w (most
models) or, zero-centered (Qwen3-Next, Qwen3.5), scale by (1 + w) in fp32 and cast back. On CUDA
one Triton launch each (freetoken_kernels.norm_triton), elsewhere the plain functions below, which are the
reference."""
import torch


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, centered: bool = False) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if centered:
        return (xf * (1.0 + weight.float())).to(x.dtype)
    return weight * xf.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, centered: bool = False) -> torch.Tensor:
    if x.is_cuda:
        from freetoken_kernels.norm_triton import rms_norm as kernel
        return kernel(x, weight, eps, centered)
    return _rms_norm(x, weight, eps, centered)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, centered: bool = False):
    """The residual add and the next norm in one kernel: -> (h + delta, rms_norm(h + delta))."""
    if h.is_cuda:
        from freetoken_kernels.norm_triton import add_rms_norm as kernel
        return kernel(h, delta, weight, eps, centered)
    h = h + delta
    return h, _rms_norm(h, weight, eps, centered)


def _gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (_rms_norm(x, weight, eps) * torch.nn.functional.silu(gate.float())).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The output norm of Gated DeltaNet: rms_norm(x) * silu(gate), the gate applied in fp32."""
    if x.is_cuda:
        from freetoken_kernels.norm_triton import gated_rms_norm as kernel
        return kernel(x, gate, weight, eps)
    return _gated_rms_norm(x, gate, weight, eps)
