"""The normalised model description every architecture file produces from a HF config.json.

An architecture file states only its differences: config fields, weight renames (data), router
settings and quirks. Everything here reads both spellings that HF configs use in the wild
(`rope_theta`/`rope_scaling` vs `rope_parameters`, `torch_dtype` vs `dtype`,
`num_experts` vs `num_local_experts`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import UserError
from freetoken_kernels.ref import SILU, ExpertAct

# spellings of the float dtypes a model computes in (config.json, --dtype) -> their name in
# ftw.format.DTYPES, the one table of dtypes
FLOAT_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
               "half": "float16", "float32": "float32", "fp32": "float32", "float": "float32"}


@dataclass(frozen=True)
class RouterSpec:
    top_k: int
    scoring: str = "softmax"            # softmax | sigmoid
    norm_topk_prob: bool = False        # renormalise the top-k weights to sum to 1
    scaling: float = 1.0                # routed_scaling_factor
    bias: bool = False                  # e_score_correction_bias: added to the scores for the choice only
    n_group: int = 1                    # experts in n_group equal groups; the choice is limited to
    topk_group: int = 1                 # the topk_group best groups,
    group_score: str = "top2"           # each scored by top2 (the sum of its two best choice scores) | max


@dataclass(frozen=True)
class MLASpec:
    """Multi-head Latent Attention (DeepSeek-V2/V3): per token one latent row of kv_lora_rank
    (normed) + qk_rope_head_dim (rotated) dims is cached instead of per-head K and V."""
    q_lora_rank: int | None             # None: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float                # qk_head_dim ** -0.5, times YaRN's mscale(mscale_all_dim) squared


@dataclass(frozen=True)
class LinearAttnSpec:
    """Gated DeltaNet (linear attention) layers of hybrid models, in HF's field names."""
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int                    # linear_conv_kernel_dim
    fused_qkvz: bool = False            # Qwen3-Next: in_proj_qkvz / in_proj_ba, grouped by key head


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int                       # per-head q/k/v width; for MLA the rotary width, as in transformers
    rms_norm_eps: float
    rope: dict                          # rope_parameters incl. rope_type and rope_theta
    max_position_embeddings: int
    tie_word_embeddings: bool
    num_experts: int
    moe_intermediate_size: int
    router: RouterSpec
    moe_layers: tuple[bool, ...]        # per layer: MoE block (True) or dense MLP
    intermediate_size: int = 0          # dense MLP width
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"               # none | head (per head_dim) | full (over all heads)
    clip_qkv: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()   # per layer: full_attention | sliding_attention | linear_attention; () = all full
    attention_sinks: bool = False       # a learned logit per head in every softmax (gpt-oss `sinks`)
    router_bias: bool = False           # the router's linear layer has a bias
    expert_bias: bool = False           # routed experts have gate_up and down biases
    expert_act: ExpertAct = SILU        # the routed experts' gated activation
    shared_expert_size: int = 0         # 0 = no shared expert
    shared_expert_gate: bool = False    # sigmoid gate on the shared expert
    mla: MLASpec | None = None          # Multi-head Latent Attention instead of GQA
    dtype: str = "bfloat16"
    extra: dict = field(default_factory=dict)
    linear_attn: LinearAttnSpec | None = None
    attn_output_gate: bool = False      # sigmoid gate on the attention output (q_proj holds it)
    norm_zero_centered: bool = False    # RMSNorms scale by (1 + w), w stored around 0

    @property
    def moe_layer_ids(self) -> list[int]:
        return [i for i, m in enumerate(self.moe_layers) if m]

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`'s attention; None: full attention."""
        if self.layer_types and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def attn_dims(self) -> tuple[int, int]:
        """(q/k, v) widths of one attention head as attention computes it."""
        m = self.mla
        return (m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim) if m else (self.head_dim, self.head_dim)

    @property
    def kv_row(self) -> tuple[int, int]:
        """(heads, width) of one token's cached K (and V) per layer; MLA: one latent row, no V."""
        m = self.mla
        return (1, m.kv_lora_rank + m.qk_rope_head_dim) if m else (self.num_kv_heads, self.head_dim)

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def attention_layer_ids(self) -> list[int]:
        """Layers with softmax attention over the whole context: their KV is in the main pool."""
        linear = set(self.linear_layer_ids)
        return [i for i in range(self.num_layers) if i not in linear and self.window(i) is None]

    @property
    def sliding_layer_ids(self) -> list[int]:
        """Layers with sliding-window attention: their KV is in the sliding pool (engine.kv.paged)."""
        linear = set(self.linear_layer_ids)
        return [i for i in range(self.num_layers) if i not in linear and self.window(i) is not None]


def rope_params(hf: dict) -> dict:
    """Both spellings -> one dict with rope_type and rope_theta (transformers 5 layout)."""
    rp = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rp.setdefault("rope_type", rp.pop("type", "default"))
    rp.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if "partial_rotary_factor" in hf:
        rp.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    if rp["rope_type"] in ("yarn", "llama3", "longrope"):
        rp.setdefault("original_max_position_embeddings",
                      hf.get("original_max_position_embeddings", hf.get("max_position_embeddings")))
    return rp


def source_dtype(hf: dict) -> str:
    name = str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16").replace("torch.", "")
    return FLOAT_NAMES.get(name, "bfloat16")


def moe_layer_flags(hf: dict, n_layers: int) -> tuple[bool, ...]:
    """Qwen-style `mlp_only_layers` / `decoder_sparse_step`, DeepSeek-style `first_k_dense_replace`."""
    only = set(hf.get("mlp_only_layers") or [])
    step = hf.get("decoder_sparse_step") or 1
    first_dense = hf.get("first_k_dense_replace") or 0
    return tuple(i not in only and (i + 1) % step == 0 and i >= first_dense for i in range(n_layers))


def need(hf: dict, *keys: str):
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    raise UserError(f"config.json of this {hf.get('model_type')} model lacks {' / '.join(keys)}; "
                    "the checkpoint looks incomplete")


def common(hf: dict, **overrides) -> ModelConfig:
    """Fields shared by every decoder-only MoE config; an arch passes only what differs."""
    n_layers = need(hf, "num_hidden_layers")
    heads = need(hf, "num_attention_heads")
    fields = dict(
        model_type=hf["model_type"], vocab_size=need(hf, "vocab_size"),
        hidden_size=need(hf, "hidden_size"), num_layers=n_layers, num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope=rope_params(hf),
        max_position_embeddings=hf.get("max_position_embeddings", 32768),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        num_experts=need(hf, "num_experts", "num_local_experts", "n_routed_experts"),
        moe_intermediate_size=hf.get("moe_intermediate_size") or need(hf, "intermediate_size"),
        intermediate_size=hf.get("intermediate_size") or 0,
        router=RouterSpec(top_k=need(hf, "num_experts_per_tok"),
                          norm_topk_prob=bool(hf.get("norm_topk_prob", False))),
        moe_layers=moe_layer_flags(hf, n_layers), dtype=source_dtype(hf),
        sliding_window=(hf.get("sliding_window") or None) if hf.get("use_sliding_window", True) else None,
    )
    fields.update(overrides)
    return ModelConfig(**fields)
