"""Compile the decode gate_up GEMV for sm_90a on a machine without a GPU (the tree on PYTHONPATH):
sass_comp.py FMT BLOCK_I BLOCK_H NUM_WARPS; env GK (columns a thread sums, default 32), BK (group,
default 128). Writes k.cubin, k.ptx, k.ttgir to $SASS_DIR (default /tmp/sass)."""
import os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.moe_triton import _gate_up_kernel as fn

fmt, BI, BH, nw = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
plain = fmt == "plain"
types = {"x_ptr": "*bf16", "q_ptr": "*bf16" if plain else "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16" if plain else "*u8",
         "slot_ptr": "*i32", "h_ptr": "*fp32", "b_ptr": "*fp32", "alpha": "fp32", "limit": "fp32", "shift": "fp32",
         "H": "i32", "I": "i32", "K": "i32", "f23": "i32"}
cons = dict(FMT=fmt, BN=1, BK=int(os.environ.get("BK", 1 if plain else 128)), GK=int(os.environ.get("GK", 8 if plain else 32)),
            BLOCK_I=BI, BLOCK_H=BH, EVEN_K=True, BIAS=False, CLAMP=False)
sig = {n: "constexpr" if n in cons else types.get(n, "i64") for n in fn.arg_names}
div = [i for i, n in enumerate(fn.arg_names) if n not in cons and n not in ("K", "alpha", "limit", "shift", "f23")]
src = ASTSource(fn, signature=sig, constexprs=cons, attrs={(i,): [["tt.divisibility", 16]] for i in div})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw})
d = os.environ.get("SASS_DIR", "/tmp/sass"); os.makedirs(d, exist_ok=True)
open(f"{d}/k.cubin", "wb").write(k.asm["cubin"]); open(f"{d}/k.ptx", "w").write(k.asm["ptx"]); open(f"{d}/k.ttgir", "w").write(k.asm["ttgir"])
