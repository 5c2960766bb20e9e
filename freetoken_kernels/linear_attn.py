"""Gated-delta-rule kernels for Gated DeltaNet layers: flash-linear-attention's Triton kernels
(the optional `flash-linear-attention` package) on CUDA when it imports and the values are in
half precision, else the plain-torch references of freetoken_kernels/ref.py, which are also the CPU path:
FLA's matrix products run in TF32 for fp32 inputs (~1e-3 relative), so an fp32 model, the
exact path the parity tests hold to 1e-4 of transformers, keeps the references. Same arguments
and results as ref.gated_delta_chunked (one sequence) and ref.gated_delta_step (one token per
sequence)."""
from __future__ import annotations

import functools

import torch

from freetoken_kernels import ref


@functools.cache
def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def fla_available() -> bool:
    return _fla() is not None


def _use_fla(v: torch.Tensor):
    return _fla() if v.is_cuda and v.dtype in (torch.bfloat16, torch.float16) else None


def _heads(q, k, v):
    """FLA takes as many q/k heads as v heads: expand grouped keys."""
    return ref._expand_heads(q, v.shape[-2]), ref._expand_heads(k, v.shape[-2])


def chunked(q, k, v, g, beta, state):
    fla = _use_fla(v)
    if fla is None:
        return ref.gated_delta_chunked(q, k, v, g, beta, state)
    # q and k normalized here, not in FLA: its normalization kernel is autotuned afresh for every
    # 65,536 rows of prompt length it meets (seconds each time)
    q, k = _heads(*(ref._l2norm(t.float()).to(v.dtype) for t in (q, k)), v)
    o, s = fla[0](q[None], k[None], v[None], g=g[None].float(), beta=beta[None].to(v.dtype),
                  initial_state=state[None].float(), output_final_state=True)
    return o[0], s[0]


def step(q, k, v, g, beta, state):
    fla = _use_fla(v)
    if fla is None:
        return ref.gated_delta_step(q, k, v, g, beta, state)
    q, k = _heads(q, k, v)  # B sequences of one token: [B, 1, H, D]
    o, s = fla[1](q[:, None], k[:, None], v[:, None], g=g[:, None].float(), beta=beta[:, None].to(v.dtype),
                  initial_state=state.float(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    return o[:, 0], s

