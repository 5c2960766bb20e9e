"""Qwen3.5 / Qwen3.6 MoE (Qwen3.5-35B-A3B, ...): Qwen3-Next's hybrid with separate DeltaNet
projections (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and always renormalised top-k. The
published checkpoints are the vision-language wrapper: text weights under
`model.language_model.`, the text config under `text_config`; the vision tower (model.visual.*)
and the multi-token-prediction head (mtp.*) are skipped. Text positions are the same on the
three M-RoPE axes, so the rotary embedding is the plain (partial) one."""
from engine.models import qwen3_next
from engine.models.base import RouterSpec, need

RENAMES = [(r"^model\.language_model\.", "model.")]
SKIP = r"^(mtp|model\.visual)\."


def config(hf: dict):
    text = {**hf, **hf.get("text_config", {}), "model_type": "qwen3_5_moe"}
    return qwen3_next.config(text, fused_qkvz=False,
                             router=RouterSpec(top_k=need(text, "num_experts_per_tok"), norm_topk_prob=True))
