"""Elementwise chains fused on the GPU: the rotary embedding where attention runs it unfused
(MLA; q/k norm over all heads, clipped q/k/v, an output gate or (1 + w) norms; the others take
the Triton attention prologue).
At decode each tiny op is a ~2 us kernel launch; torch.compile turns the function into one or
two kernels. Other devices run the plain function, which stays the reference. (Norms are plain
Triton kernels, freetoken_kernels.norm_triton: Dynamo traces every compiled region again in each new
process, which a cold start pays.)"""
from __future__ import annotations

import functools

import torch


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
