"""RMSNorm in the HF convention: normalise in fp32, cast back, then scale."""
import torch

from engine.layers.fuse import fused


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


rms_norm = fused(_rms_norm)


@fused
def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """The residual add and the next norm in one kernel: -> (h + delta, rms_norm(h + delta))."""
    h = h + delta
    return h, _rms_norm(h, weight, eps)
