"""GQA attention over the paged KV cache, with the q/k norm, bias, sliding-window and
attention-sink variants MoE models use."""
from __future__ import annotations

import torch
from torch import nn

from engine.kv.batch import ForwardBatch
from engine.layers.fuse import one_token
from engine.layers.norm import add_rms_norm, rms_norm
from engine.layers.rope import apply_rope
from engine.models.base import ModelConfig
from freetoken_kernels import ref


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, centered: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps, self.centered = eps, centered  # centered: scale by (1 + weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.centered)

    def add(self, h: torch.Tensor, delta: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (h + delta, its norm); delta None: (h, norm of h)."""
        if delta is None:
            return h, self(h)
        return add_rms_norm(h, delta, self.weight, self.eps, self.centered)

    def add_linear(self, h: torch.Tensor, a: torch.Tensor, lin: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """self.add(h, lin(a)); one token on CUDA in one launch with the linear layer
        (freetoken_kernels.norm_triton.linear_add_rms_norm)."""
        if one_token(a, lin) and h.dtype == a.dtype:
            from freetoken_kernels.norm_triton import linear_add_rms_norm
            return linear_add_rms_norm(h, a, lin.weight, lin.bias, self.weight, self.eps, self.centered)
        return self.add(h, lin(a))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, window: int | None = None):
        """layer: this layer's index in its KV pool (hybrid models keep KV for attention layers only);
        window: its sliding window (None: full attention), whose KV is in the sliding pool."""
        super().__init__()
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.layer, self.hq, self.hkv, self.d = layer, hq, hkv, d
        # gated (Qwen3-Next, Qwen3.5): q_proj holds per head d query rows, then d output-gate rows
        self.gated = cfg.attn_output_gate
        # q_proj, k_proj and v_proj of the checkpoint as one matrix (the loader concatenates them):
        # one GEMV per decode step instead of three
        self.qkv_proj = nn.Linear(cfg.hidden_size, ((1 + self.gated) * hq + 2 * hkv) * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(hq * d, cfg.hidden_size, bias=cfg.o_bias)
        self.qk_norm, self.clip = cfg.qk_norm, cfg.clip_qkv
        self.window = window
        if cfg.attention_sinks:  # gpt-oss: a logit per head in every softmax's denominator [Hq]
            self.sinks = nn.Parameter(torch.empty(hq), requires_grad=False)
        if cfg.qk_norm != "none":
            full, c = cfg.qk_norm == "full", cfg.norm_zero_centered
            self.q_norm = RMSNorm(hq * d if full else d, cfg.rms_norm_eps, c)
            self.k_norm = RMSNorm(hkv * d if full else d, cfg.rms_norm_eps, c)
        # the fused CUDA prologue knows neither the output gate nor (1 + w) norms
        self.fused_prologue = not self.gated and not cfg.norm_zero_centered and cfg.qk_norm != "full" \
            and cfg.clip_qkv is None

    def _qkv(self, x: torch.Tensor):
        """-> q, k, v [T, heads, D] (normed, not rotated) and the output gate [T, Hq * D] or None."""
        q, k, v = self.qkv_proj(x).split([(1 + self.gated) * self.hq * self.d, self.hkv * self.d,
                                          self.hkv * self.d], dim=-1)
        gate = None
        if self.gated:
            q, gate = q.view(-1, self.hq, 2 * self.d).chunk(2, dim=-1)
            gate = gate.reshape(x.shape[0], -1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q, k, v = q.view(-1, self.hq, self.d), k.view(-1, self.hkv, self.d), v.view(-1, self.hkv, self.d)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, gate

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv, cos, sin, project: bool = True) -> torch.Tensor:
        """project False: o_proj's input (the caller applies o_proj)."""
        gate = None
        if self.window:  # the sliding pool, through the sequences' pages of it
            kv, table, slots = kv.sliding, batch.sliding_table, batch.sliding_slots
        else:
            table, slots = batch.page_table, batch.slots
        # a sliding layer's prefill chunk reads its own keys as computed: the pages of those behind
        # the window of the chunk's end are the pool's dummy page (engine.kv.paged.SlidingPool)
        chunk = self.window is not None and max(batch.q_lens) > 1
        if x.is_cuda and self.fused_prologue and not chunk:
            from freetoken_kernels.attention_triton import qkv_rope_write
            head = self.qk_norm == "head"
            q = qkv_rope_write(self.qkv_proj(x), self.q_norm.weight if head else None,
                               self.k_norm.weight if head else None, self.q_norm.eps if head else 0.0,
                               cos, sin, slots, kv.k[self.layer].view(-1, self.hkv, self.d),
                               kv.v[self.layer].view(-1, self.hkv, self.d), self.hq)
        else:
            q, k, v, gate = self._qkv(x)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            kv.write(self.layer, k, v, slots)
        sinks = getattr(self, "sinks", None)
        if q.is_cuda and max(batch.q_lens) == 1:
            from freetoken_kernels.attention_triton import paged_decode_attention
            o = paged_decode_attention(q, kv.k[self.layer], kv.v[self.layer], table,
                                       batch.ctx_lens_t, self.d ** -0.5, self.window, sinks)
        else:
            o = ref.paged_attention(q, kv.k[self.layer], kv.v[self.layer], table,
                                    batch.q_lens, batch.ctx_lens, self.d ** -0.5, self.window, sinks,
                                    (k, v) if chunk else None)
        o = o.reshape(x.shape[0], -1)
        o = o if gate is None else o * torch.sigmoid(gate)
        return self.o_proj(o) if project else o
