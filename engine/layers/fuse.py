"""Elementwise chains fused on the GPU: the rotary embedding where attention runs it unfused
(MLA; q/k norm over all heads, clipped q/k/v, an output gate or (1 + w) norms; the others take
the Triton attention prologue).
At decode each tiny op is a ~2 us kernel launch; torch.compile turns the function into one or
two kernels. Other devices run the plain function, which stays the reference. (Norms are plain
Triton kernels, freetoken_kernels.norm_triton: Dynamo traces every compiled region again in each new
process, which a cold start pays.) one_token: when a linear layer runs in one launch with the work after it."""
from __future__ import annotations

import functools

import torch
from torch import nn


def fused(fn):
    """fn, compiled (shape-generic) on first use with a CUDA tensor as its first argument."""
    compiled = None

    @functools.wraps(fn)
    def call(x, *args):
        nonlocal compiled
        if not x.is_cuda:
            return fn(x, *args)
        if compiled is None:
            # one compiled variant per (dtype, rank, constant such as eps) in use: a process that
            # loads several models (a bench, the test suite) needs more than Dynamo's default 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(x, *args)
    return call


def one_token(x: torch.Tensor, lin: nn.Linear) -> bool:
    """Whether lin(x) runs fused with the work after it (the router's top-k, o_proj's residual add and
    norm: freetoken_kernels.router_triton.route_linear, norm_triton.linear_add_rms_norm): one token on
    CUDA through a plain nn.Linear of x's dtype. At batch 1 a layer step is launch-bound; at more
    tokens a GEMM and the separate kernels are faster."""
    w = lin.weight
    return x.is_cuda and x.shape[0] == 1 and type(lin) is nn.Linear and w.dtype == x.dtype and w.is_contiguous()
