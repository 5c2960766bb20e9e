"""Gated DeltaNet kernels: the chunked gated delta rule against the token-by-token recurrence at
chunk boundaries, resumed from a split state, and the causal conv's state; on CUDA,
flash-linear-attention (when installed) against the references."""
import pytest
import torch

from freetoken_kernels import linear_attn, ref


def inputs(T, Hk=2, H=4, Dk=8, Dv=6, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k, v = r(T, Hk, Dk), r(T, Hk, Dk), r(T, H, Dv)
    decay, beta = -torch.rand(T, H, generator=g), torch.rand(T, H, generator=g)
    state = r(H, Dk, Dv) * 0.1
    return [t.to(device) for t in (q, k, v, decay, beta, state)]


def recurrent(q, k, v, g, beta, state):
    s, outs = state[None], []
    for t in range(q.shape[0]):
        o, s = ref.gated_delta_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], s)
        outs.append(o)
    return torch.cat(outs), s[0]


@pytest.mark.parametrize("T", [1, 63, 64, 65, 128, 130])
def test_chunked_equals_recurrent_at_chunk_boundaries(T):
    args = inputs(T)
    o, s = ref.gated_delta_chunked(*args)
    o_r, s_r = recurrent(*args)
    assert torch.allclose(o, o_r, atol=1e-5) and torch.allclose(s, s_r, atol=1e-5)


@pytest.mark.parametrize("cut", [1, 50, 64, 65])
def test_chunked_resumes_from_a_split_state(cut):
    q, k, v, g, beta, s0 = inputs(150, seed=1)
    o, s = ref.gated_delta_chunked(q, k, v, g, beta, s0)
    o1, s1 = ref.gated_delta_chunked(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], s0)
    o2, s2 = ref.gated_delta_chunked(q[cut:], k[cut:], v[cut:], g[cut:], beta[cut:], s1)
    assert torch.allclose(torch.cat((o1, o2)), o, atol=1e-5) and torch.allclose(s2, s, atol=1e-5)


def test_conv_state_carries_over():
    g = torch.Generator().manual_seed(2)
    x, w, state = torch.randn(9, 5, generator=g), torch.randn(5, 4, generator=g), torch.randn(3, 5, generator=g)
    full, end = ref.causal_conv1d(x, state, w)
    head, mid = ref.causal_conv1d(x[:4], state, w)
    outs, s = [head], mid[None]
    for t in range(4, 9):
        y, s = ref.causal_conv1d_step(x[t:t + 1], s, w)
        outs.append(y)
    assert torch.allclose(torch.cat(outs), full, atol=1e-6) and torch.equal(s[0], end)
    assert torch.equal(end, x[-3:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_kernels_match_the_references(dtype):
    """bf16 runs flash-linear-attention where installed (against the fp32 reference, bf16's
    tolerance); fp32 runs the reference itself."""
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    q, k, v, g, beta, s0 = inputs(200, H=4, Dk=64, Dv=64, device="cuda")
    o, s = linear_attn.chunked(q.to(dtype), k.to(dtype), v.to(dtype), g, beta, s0)
    o_r, s_r = ref.gated_delta_chunked(q, k, v, g, beta, s0)
    assert torch.allclose(o.float(), o_r, **tol) and torch.allclose(s, s_r, **tol)
    q, k, v, g, beta, s0 = inputs(3, H=4, Dk=64, Dv=64, device="cuda")
    s0 = s0.expand(3, -1, -1, -1).contiguous()
    o, s = linear_attn.step(q.to(dtype), k.to(dtype), v.to(dtype), g, beta, s0.clone())
    o_r, s_r = ref.gated_delta_step(q, k, v, g, beta, s0)
    assert torch.allclose(o.float(), o_r, **tol) and torch.allclose(s, s_r, **tol)
