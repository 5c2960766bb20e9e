"""Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2) over a compressed KV cache.

Each token caches one latent row per layer: its kv_lora_rank normed latent dims and the
qk_rope_head_dim dims of its rotated key, which all heads share (576 values for DeepSeek-V3,
instead of 128 heads of K and V). Decode absorbs the up-projection kv_b_proj = [W_UK; W_UV] per
head: W_UK folds into each head's query, attention runs as one-head MQA over the latent rows (a
Triton kernel on CUDA, freetoken_kernels.ref.latent_attention elsewhere), and W_UV maps the attended latent
to the head's value. A prefill chunk decompresses its sequences' context latents into per-head K
and V for torch SDPA, which is cheaper when many queries share one context."""
from __future__ import annotations

import torch
from torch import nn

from engine.kv.batch import ForwardBatch
from engine.layers.attention import RMSNorm
from engine.layers.rope import apply_rope
from engine.models.base import ModelConfig
from freetoken_kernels import ref

LORA_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: DeepSeek's default, not rms_norm_eps


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        m, H, hq = cfg.mla, cfg.hidden_size, cfg.num_heads
        self.layer, self.hq, self.m = layer, hq, m
        q_dim = hq * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        if m.q_lora_rank:
            self.q_a_proj = nn.Linear(H, m.q_lora_rank, bias=cfg.qkv_bias)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, LORA_EPS)
            self.q_b_proj = nn.Linear(m.q_lora_rank, q_dim, bias=False)
        else:
            self.q_proj = nn.Linear(H, q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, m.kv_lora_rank + m.qk_rope_head_dim, bias=cfg.qkv_bias)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, LORA_EPS)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, hq * (m.qk_nope_head_dim + m.v_head_dim), bias=False)
        self.o_proj = nn.Linear(hq * m.v_head_dim, H, bias=cfg.o_bias)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv, cos, sin, project: bool = True) -> torch.Tensor:
        """project False: o_proj's input (the caller applies o_proj)."""
        m, T = self.m, x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if m.q_lora_rank else self.q_proj(x)
        q_nope, q_pe = q.view(T, self.hq, -1).split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        row = torch.cat((self.kv_a_layernorm(latent), apply_rope(k_pe[:, None], cos, sin)[:, 0]), dim=-1)
        kv.write(self.layer, row[:, None], None, batch.slots)
        pool = kv.k[self.layer]                                              # [P, page, 1, C + R]
        if max(batch.q_lens) == 1:
            o = self._absorbed(q_nope, q_pe, pool, batch)
        else:
            o = self._decompressed(torch.cat((q_nope, q_pe), dim=-1), pool, batch)
        return self.o_proj(o.reshape(T, -1)) if project else o.reshape(T, -1)

    def _absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, pool: torch.Tensor,
                  batch: ForwardBatch) -> torch.Tensor:
        """Decode: attention in the latent space -> [T, Hq, dv]."""
        m = self.m
        w_uk, w_uv = self.kv_b_proj.weight.view(self.hq, -1, m.kv_lora_rank).split(
            [m.qk_nope_head_dim, m.v_head_dim], dim=1)                      # [Hq, dn, C], [Hq, dv, C]
        q = torch.cat((torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1), q_pe), dim=-1)  # [T, Hq, C + R]
        if q.is_cuda:
            from freetoken_kernels.mla_triton import mla_decode_attention
            o = mla_decode_attention(q, pool, batch.page_table, batch.ctx_lens_t, m.softmax_scale, m.kv_lora_rank)
        else:
            o = ref.latent_attention(q, pool, batch.page_table, batch.q_lens, batch.ctx_lens, m.softmax_scale,
                                     m.kv_lora_rank)
        return torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)

    def _decompressed(self, q: torch.Tensor, pool: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Prefill: per sequence, its context latents up-projected to per-head K and V -> [T, Hq, dv]."""
        m, page = self.m, pool.shape[1]
        out, start = [], 0
        for b, (ql, ctx) in enumerate(zip(batch.q_lens, batch.ctx_lens)):
            pages = batch.page_table[b, :-(-ctx // page)].long()
            latent, k_pe = pool[pages, :, 0].split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)  # [n, page, .]
            k_nope, v = self.kv_b_proj(latent).view(*latent.shape[:2], self.hq, -1).split(
                [m.qk_nope_head_dim, m.v_head_dim], dim=-1)
            k = torch.cat((k_nope, k_pe[:, :, None].expand(-1, -1, self.hq, -1)), dim=-1)
            own = torch.arange(len(pages), dtype=torch.int32, device=q.device)[None]
            out.append(ref.paged_attention(q[start:start + ql], k, v, own, [ql], [ctx], m.softmax_scale))
            start += ql
        return torch.cat(out)
