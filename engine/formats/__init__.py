"""Quantized checkpoints users have: one module per quantization method, each a Scheme that
groups a weight's checkpoint tensors and unpacks them into freetoken_kernels.quant's layout. Routed
experts keep that quantized form; everything else is dequantized to the conversion's dtype."""
from __future__ import annotations

from engine.errors import UserError
from engine.formats.awq import AWQ
from engine.formats.base import QParts, Scheme, dequant_parts, fuse_gate_up
from engine.formats.compressed import CompressedTensors
from engine.formats.fp8 import FP8
from engine.formats.gptq import GPTQ
from engine.formats.mxfp4 import MXFP4

SCHEMES = {s.method: s for s in (FP8, GPTQ, AWQ, CompressedTensors, MXFP4)}

__all__ = ["QParts", "SCHEMES", "Scheme", "dequant_parts", "fuse_gate_up", "scheme_of"]


def scheme_of(hf: dict) -> Scheme | None:
    """The Scheme of a HF config.json's `quantization_config`; None for a float checkpoint."""
    qc = hf.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method not in SCHEMES:
        raise UserError(f"quantization method {method!r} is not supported; supported: {', '.join(SCHEMES)} "
                        "(or convert the bf16 release, optionally with --quant)")
    return SCHEMES[method](qc)
