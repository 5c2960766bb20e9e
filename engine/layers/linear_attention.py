"""Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5: one projection of the
input to q, k, v, the output gate z and the per-head b (learning rate beta = sigmoid(b)) and a
(decay g = -exp(A_log) * softplus(a + dt_bias)); a short causal conv with SiLU over q, k, v; the
gated delta rule over a recurrent state; a gated RMSNorm; the output projection.

Each sequence's conv and recurrent states live in a slot of the StatePool (engine.kv.state),
named by the batch's `state_slots` (and written to its `state_out` where it names other slots, so
that a decode step launched ahead leaves the state its predecessor wrote for a checkpoint to copy).
A decode batch runs in one batched step with the slots read
and written by index (so it can be captured in a CUDA graph); other batches run sequence by
sequence and can save the states at given offsets inside a sequence's new tokens (checkpoints)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.kv.batch import ForwardBatch
from engine.layers.norm import gated_rms_norm
from engine.models.base import ModelConfig
from freetoken_kernels import linear_attn, ref


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int):
        """index: this layer's place among the model's linear-attention layers (its state rows)."""
        super().__init__()
        la = cfg.linear_attn
        self.hk, self.hv, self.dk, self.dv = la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim
        self.index, self.eps = index, cfg.rms_norm_eps
        key, value = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * key + value
        rows = 2 * key + 2 * value + 2 * self.hv
        # the checkpoint's projections as one matrix, rows in the order q, k, v, z, b, a (heads
        # ascending in each; Qwen3-Next's, grouped by key head, are reordered at conversion)
        self.proj_name = "in_proj_qkvz_ba" if la.fused_qkvz else "in_proj_qkvzba"
        self.add_module(self.proj_name, nn.Linear(cfg.hidden_size, rows, bias=False))
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, la.conv_kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(self.hv), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.hv), requires_grad=False)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(self.dv), requires_grad=False)
        self.out_proj = nn.Linear(value, cfg.hidden_size, bias=False)
        self.states = None  # set by the loader: engine.kv.state.StatePool

    @property
    def in_proj(self) -> nn.Linear:
        return getattr(self, self.proj_name)

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        T = x.shape[0]
        qkv, z, b, a = self.in_proj(x).split([self.conv_dim, self.hv * self.dv, self.hv, self.hv], dim=-1)
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        conv_w = self.conv1d.weight[:, 0]                                  # [C, K]
        conv_pool, rec_pool = self.states.conv[self.index], self.states.rec[self.index]
        slots = batch.state_slots
        conv0, rec0 = conv_pool[slots], rec_pool[slots]                    # [B, K-1, C], [B, H, Dk, Dv]
        if max(batch.q_lens) == 1:
            qkv, conv1 = ref.causal_conv1d_step(qkv, conv0, conv_w)
            o, rec1 = linear_attn.step(*self._heads(qkv), g, beta, rec0)
        else:
            o, conv1, rec1 = self._sequences(qkv, g, beta, conv0, rec0, conv_w, batch)
        conv_pool.index_copy_(0, batch.state_dst, conv1.to(conv_pool.dtype))
        rec_pool.index_copy_(0, batch.state_dst, rec1.to(rec_pool.dtype))
        o = gated_rms_norm(o.reshape(-1, self.dv), z.reshape(-1, self.dv), self.norm.weight, self.eps)
        return self.out_proj(o.reshape(T, -1))

    def _heads(self, qkv: torch.Tensor):
        """[T, C] -> q, k [T, Hk, Dk], v [T, H, Dv]."""
        q, k, v = qkv.split([self.hk * self.dk, self.hk * self.dk, self.hv * self.dv], dim=-1)
        return q.view(-1, self.hk, self.dk), k.view(-1, self.hk, self.dk), v.view(-1, self.hv, self.dv)

    def _sequences(self, qkv, g, beta, conv0, rec0, conv_w, batch: ForwardBatch):
        """Each sequence's new tokens in turn; saves the states at the batch's snapshot offsets."""
        outs, convs, recs, start = [], [], [], 0
        for i, n in enumerate(batch.q_lens):
            rows = slice(start, start + n)
            y, conv1 = ref.causal_conv1d(qkv[rows], conv0[i], conv_w)
            q, k, v = self._heads(y)
            s, cut = rec0[i], 0
            snaps = sorted((o, d) for row, o, d in batch.snapshots if row == i)
            if snaps:  # the conv inputs incl. the old state: the conv state after `off` tokens
                xx = torch.cat((conv0[i].to(qkv.dtype), qkv[rows]))
            for off, dst in snaps + [(n, None)]:
                o, s = linear_attn.chunked(q[cut:off], k[cut:off], v[cut:off], g[rows][cut:off],
                                           beta[rows][cut:off], s)
                outs.append(o)
                cut = off
                if dst is not None:
                    self.states.save_layer(self.index, dst, xx[off:off + conv1.shape[0]], s)
            convs.append(conv1)
            recs.append(s)
            start += n
        return torch.cat(outs), torch.stack(convs), torch.stack(recs)
