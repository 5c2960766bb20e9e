"""Compile the prefill gate_up grouped GEMM for sm_90a without a GPU (the tree on PYTHONPATH): sass_gemm.py FMT
BLOCK_M BLOCK_N BLOCK_K NUM_WARPS (quantization group 128). Writes /tmp/sg/k.cubin."""
import os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.moe_gemm_triton import _gate_up_gemm as fn
fmt, BM, BN, BK, nw = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
types = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*bf16", "z_ptr": "*u8", "tile_ptr": "*i32", "order_ptr": "*i64",
         "h_ptr": "*bf16", "b_ptr": "*fp32", "alpha": "fp32", "limit": "fp32", "shift": "fp32", "H": "i32", "I": "i32", "K": "i32"}
cons = dict(FMT=fmt, BN=1, BK=128, GK=min(BK, 128), PREC="tf32", BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, EVEN_K=True, BIAS=False, CLAMP=False)
sig = {n: "constexpr" if n in cons else types.get(n, "i64") for n in fn.arg_names}
div = [i for i, n in enumerate(fn.arg_names) if n not in cons and n not in ("K", "alpha", "limit", "shift")]
src = ASTSource(fn, signature=sig, constexprs=cons, attrs={(i,): [["tt.divisibility", 16]] for i in div})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw})
os.makedirs("/tmp/sg", exist_ok=True); open("/tmp/sg/k.cubin", "wb").write(k.asm["cubin"])
