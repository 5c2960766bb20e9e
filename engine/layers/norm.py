"""RMSNorm in the HF convention: normalise in fp32, cast back, then scale. On CUDA one Triton
launch each (kernels.norm_triton), elsewhere the plain functions below, which are the reference."""
import torch


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda:
        from kernels.norm_triton import rms_norm as kernel
        return kernel(x, weight, eps)
    return _rms_norm(x, weight, eps)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """The residual add and the next norm in one kernel: -> (h + delta, rms_norm(h + delta))."""
    if h.is_cuda:
        from kernels.norm_triton import add_rms_norm as kernel
        return kernel(h, delta, weight, eps)
    h = h + delta
    return h, _rms_norm(h, weight, eps)
