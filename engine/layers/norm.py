"""RMSNorm in the HF convention: normalise in fp32, cast back, then scale."""
import torch

from engine.layers.fuse import fused


@fused
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
