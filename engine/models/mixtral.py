"""Mixtral: experts named w1/w3/w2 under `block_sparse_moe` in the original layout; the top-k
softmax weights always sum to one."""
from engine.models.base import RouterSpec, common

RENAMES = [
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
    (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
    (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
]


def config(hf: dict):
    return common(hf, router=RouterSpec(top_k=hf["num_experts_per_tok"], norm_topk_prob=True))
