"""Router scoring and top-k in one launch (Triton): the semantics of engine.moe.router's plain
function (scores, optional correction bias, optional limit to the best expert groups, top-k by
descending choice, optional renormalisation, scaling). At decode torch runs softmax, topk, a sort
of the k winners, gather and renormalise as ~10 kernels per layer; here one program per token
holds its E scores in registers, as [groups, experts per group], and extracts the k largest in
order (ties: lowest group or expert id first)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from freetoken_kernels.gemv_triton import counter, last_program, linear_rows


@triton.jit
def _route_row(t, logits_ptr, bias_ptr, w_ptr, ids_ptr, E, K, NG, GS, TOPK_G, scaling, eps,
               SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
               GROUPS: tl.constexpr, TOP2: tl.constexpr,
               BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    """Token t's k experts and weights from its row of logits."""
    gi, j = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_S)
    g = gi[:, None]
    e = g * GS + j[None, :]                                        # [BLOCK_G, BLOCK_S] expert ids
    me = (g < NG) & (j[None, :] < GS)
    # .cg: in the fused router other programs wrote these rows just before (their stores are ordered
    # before this program's acquire, and L2 is where they are)
    x = tl.load(logits_ptr + t * E + e, mask=me, other=-float("inf"), cache_modifier=".cg").to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        p = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        s = p / tl.sum(tl.sum(p, axis=1), axis=0)
    choice = s
    if HAS_BIAS:
        choice = s + tl.load(bias_ptr + e, mask=me, other=0.0).to(tl.float32)
    choice = tl.where(choice != choice, float("inf"), choice)      # NaN ranks first, as in torch.topk
    choice = tl.where(me, choice, -float("inf"))
    if GROUPS:  # keep the TOPK_G best groups, ranked by their best or best two choices
        m1 = tl.max(choice, axis=1)                                # [BLOCK_G]
        rank = m1
        if TOP2:
            first = tl.min(tl.where(choice == m1[:, None], j[None, :], BLOCK_S), axis=1)
            rank = m1 + tl.max(tl.where(j[None, :] == first[:, None], -float("inf"), choice), axis=1)
        rank = tl.where(gi < NG, rank, -float("inf"))
        keep = gi < 0
        for _ in range(0, TOPK_G):
            best = tl.max(rank, axis=0)
            i = tl.min(tl.where(rank == best, gi, BLOCK_G), axis=0)
            keep = keep | (gi == i)
            rank = tl.where(gi == i, -float("inf"), rank)
        choice = tl.where(keep[:, None], choice, -float("inf"))
    k = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], tl.int64)
    w = tl.zeros([BLOCK_K], tl.float32)
    for n in range(0, K):
        best = tl.max(tl.max(choice, axis=1), axis=0)
        i = tl.min(tl.min(tl.where((choice == best) & me, e, E - 1), axis=1), axis=0)  # lowest id among ties
        ids = tl.where(k == n, i, ids)
        w = tl.where(k == n, tl.sum(tl.sum(tl.where(e == i, s, 0.0), axis=1), axis=0), w)
        choice = tl.where(e == i, -float("inf"), choice)
    if NORM:
        w = w / (tl.sum(w, axis=0) + eps)
    mk = k < K
    tl.store(ids_ptr + t * K + k, ids, mask=mk)
    tl.store(w_ptr + t * K + k, (w * scaling).to(w_ptr.dtype.element_ty), mask=mk)


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, E, K, NG, GS, TOPK_G, scaling, eps,
                  SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                  GROUPS: tl.constexpr, TOP2: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    _route_row(tl.program_id(0).to(tl.int64), logits_ptr, bias_ptr, w_ptr, ids_ptr, E, K, NG, GS, TOPK_G,
               scaling, eps, SIGMOID, HAS_BIAS, NORM, GROUPS, TOP2, BLOCK_G, BLOCK_S, BLOCK_K)


@triton.jit
def _router_kernel(x_ptr, gw_ptr, gb_ptr, logits_ptr, cnt_ptr, H,
                   bias_ptr, w_ptr, ids_ptr, E, K, NG, GS, TOPK_G, scaling, eps,
                   GATE_BIAS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                   SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                   GROUPS: tl.constexpr, TOP2: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    """One token: logits = x @ gate_w.T (+ gate_b) in the logits' dtype, BLOCK_E experts a program
    (linear_rows); the last program to finish routes the token (_route_row)."""
    linear_rows(x_ptr, gw_ptr, gb_ptr, logits_ptr, E, H, GATE_BIAS, BLOCK_E, BLOCK_H)
    if last_program(cnt_ptr, tl.num_programs(0)):
        _route_row(0, logits_ptr, bias_ptr, w_ptr, ids_ptr, E, K, NG, GS, TOPK_G, scaling, eps,
                   SIGMOID, HAS_BIAS, NORM, GROUPS, TOP2, BLOCK_G, BLOCK_S, BLOCK_K)


def _route_args(E: int, top_k: int, scoring: str, norm: bool, scaling: float, bias, n_group: int,
                topk_group: int, group_score: str) -> tuple[tuple, dict]:
    """The routing arguments of _route_row: (runtime values, constexprs)."""
    gs = E // n_group
    assert gs * n_group == E, "experts must split into equal groups"
    return ((E, top_k, n_group, gs, topk_group, float(scaling), 1e-20 if scoring == "sigmoid" else 0.0),
            dict(SIGMOID=scoring == "sigmoid", HAS_BIAS=bias is not None, NORM=norm, GROUPS=n_group > 1,
                 TOP2=group_score == "top2", BLOCK_G=triton.next_power_of_2(n_group),
                 BLOCK_S=triton.next_power_of_2(gs), BLOCK_K=triton.next_power_of_2(top_k)))


def route(logits: torch.Tensor, top_k: int, scoring: str, norm: bool, scaling: float,
          bias: torch.Tensor | None = None, n_group: int = 1, topk_group: int = 1,
          group_score: str = "top2") -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, K] in logits' dtype, expert ids [T, K] int64). With n_group > 1
    the choice is limited to the topk_group best of n_group equal groups (scored by the sum of
    their two best choices, top2, or by the best, max)."""
    T, E = logits.shape
    w = torch.empty(T, top_k, dtype=logits.dtype, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    args, const = _route_args(E, top_k, scoring, norm, scaling, bias, n_group, topk_group, group_score)
    if T:
        _route_kernel[(T,)](logits.contiguous(), bias if bias is not None else logits, w, ids, *args, **const,
                            num_warps=1)  # one warp: the k extractions reduce within a warp
    return w, ids


def route_linear(x: torch.Tensor, weight: torch.Tensor, gate_bias: torch.Tensor | None, top_k: int, scoring: str,
                 norm: bool, scaling: float, bias: torch.Tensor | None = None, n_group: int = 1,
                 topk_group: int = 1, group_score: str = "top2", scratch: tuple | None = None,
                 block_e: int = 1, num_warps: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """route(F.linear(x, weight, gate_bias), ...) in one launch for one token (decode at batch 1):
    each program computes a few experts' logits (fp32 sums, rounded to x's dtype as the linear
    layer's output is; the order of the sums differs from a GEMM's, so a logit may differ from it
    by one rounding), and the last program to finish routes the token. scratch = (logits [E] in x's
    dtype, counter [1] int32, zero, kept zero by the kernel), both on x's device; None: new logits
    and the device's counter. block_e experts a program, num_warps warps: one expert and one warp a
    program was the fastest on an H200 (benchmarks/RESULTS.md); at more tokens a GEMM and route()
    are faster."""
    T, H = x.shape
    E = weight.shape[0]
    assert T == 1 and weight.shape[1] == H
    logits, cnt = scratch or (torch.empty(E, dtype=x.dtype, device=x.device), counter(x.device))
    w = torch.empty(1, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(1, top_k, dtype=torch.int64, device=x.device)
    args, const = _route_args(E, top_k, scoring, norm, scaling, bias, n_group, topk_group, group_score)
    _router_kernel[(triton.cdiv(E, block_e),)](
        x.contiguous(), weight, gate_bias if gate_bias is not None else weight, logits, cnt, H,
        bias if bias is not None else logits, w, ids, *args, GATE_BIAS=gate_bias is not None, BLOCK_E=block_e,
        BLOCK_H=min(2048, triton.next_power_of_2(H)), **const, num_warps=num_warps)
    return w, ids
