"""Rotary position embeddings (rotate-half form) with the scaling variants MoE configs use:
default, linear, yarn and llama3. Frequencies follow transformers' definitions exactly."""
from __future__ import annotations

import math

import torch

from engine.errors import UserError
from engine.layers.fuse import fused


def yarn_mscale(scale: float, m: float = 1.0) -> float:
    """YaRN's attention magnitude correction for a context extended `scale` times."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _yarn(rp: dict, dim: int, base: float) -> tuple[torch.Tensor, float]:
    factor, orig = rp["factor"], rp["original_max_position_embeddings"]
    attn = rp.get("attention_factor")
    if attn is None:
        m, m_all = rp.get("mscale"), rp.get("mscale_all_dim")
        attn = yarn_mscale(factor, m) / yarn_mscale(factor, m_all) if m and m_all else yarn_mscale(factor)

    def corr(rot):  # dimension index at which `rot` rotations fit in the original context
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = corr(rp.get("beta_fast") or 32), corr(rp.get("beta_slow") or 1)
    if rp.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float) - lo) / ((hi - lo) or 0.001)).clamp(0, 1)
    extra = 1 - ramp  # share of the unscaled (extrapolated) frequency
    return (1 / (factor * pos)) * (1 - extra) + (1 / pos) * extra, float(attn)


def _llama3(rp: dict, inv: torch.Tensor) -> torch.Tensor:
    factor, lo_f, hi_f = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    orig = rp["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / lo_f, inv / factor, inv)
    smooth = (orig / wavelen - lo_f) / (hi_f - lo_f)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= orig / hi_f) & (wavelen <= orig / lo_f)
    return torch.where(is_mid, mid, scaled)


def inv_freq(rp: dict, head_dim: int) -> tuple[torch.Tensor, float]:
    """-> (inverse frequencies [dim/2], attention scaling applied to cos/sin)."""
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    base = float(rp["rope_theta"])
    kind = rp.get("rope_type", "default")
    if kind == "yarn":
        return _yarn(rp, dim, base)
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / rp["factor"], 1.0
    if kind == "llama3":
        return _llama3(rp, inv), 1.0
    raise UserError(f"rope_type {kind!r} is not supported; supported: default, linear, yarn, llama3")


class Rope:
    """cos/sin tables for positions, applied to [T, heads, head_dim] tensors."""

    def __init__(self, rp: dict, head_dim: int, device: torch.device):
        inv, self.scale = inv_freq(rp, head_dim)
        self.inv = inv.to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float()[:, None] * self.inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scale).to(dtype)[:, None, :], (emb.sin() * self.scale).to(dtype)[:, None, :]


@fused
def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos, sin [T, 1, rot]: the first rot dims rotate, the rest pass."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    rotated = torch.cat((-xr[..., rot // 2:], xr[..., :rot // 2]), dim=-1)
    out = xr * cos + rotated * sin
    return torch.cat((out, xp), dim=-1) if rot < x.shape[-1] else out
