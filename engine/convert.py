"""HF checkpoint -> FTW conversion. Streams layer by layer (peak RAM about one layer's expert
bank): dense tensors are cast and written as they are (dequantized first if the checkpoint
quantized them); routed experts of a layer, whether stored per expert or fused, are packed into
one [E, slot_bytes] bank in the runtime layout: in the checkpoint's quantized format when it has
one (engine.formats unpacks it), quantized with --quant, or cast to --dtype."""
from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Callable, Iterator

import torch

from engine.errors import UserError
from engine.formats import QParts, Scheme, dequant_parts, fuse_gate_up, scheme_of
from engine.models import arch_tensor, canonical_name, dense_tensor, model_config, read_hf_config, skipped
from engine.models.base import FLOAT_NAMES, ModelConfig
from engine.moe.layout import BIASES, WEIGHTS, SlotLayout
from engine.moe.store import bank_name
from engine.fingerprint import CONVERTER, SIDE_FILES, fingerprint
from ftw.format import DTYPES
from freetoken_kernels.quant import FORMATS, QWeight, quantize

LAYER = re.compile(r"model\.layers\.(\d+)\.")
EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\."
                    r"(?:(\d+)\.(gate_proj|up_proj|down_proj)\.weight|(gate_up_proj|down_proj)(_bias)?)$")
IGNORED = re.compile(r"rotary_emb\.inv_freq$")
log = logging.getLogger("freetoken.convert")
DEFAULT_GROUP = {"int4": 128, "int8": 128, "fp8": 128, "mxfp4": 32}  # values a scale covers (fp8: blocks of G x G)


class Source:
    """All tensors of a safetensors checkpoint, by canonical name, opened lazily per file, grouped
    by the weight they make up: a quantized weight is several tensors (its scheme's parts)."""

    def __init__(self, model_dir: Path, model_type: str, scheme: Scheme | None = None):
        from safetensors import safe_open
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise UserError(f"{model_dir} has no *.safetensors files; only safetensors checkpoints are supported")
        self.scheme = scheme
        self.raw: dict[str, tuple] = {}     # checkpoint tensor -> (handle, key, file)
        self.where: dict[str, dict] = {}    # weight -> {part: checkpoint tensor}, part None = itself
        unused = 0
        for f in files:
            try:
                h = safe_open(str(f), framework="pt")
                keys = list(h.keys())
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise UserError(f"{f} is not a readable safetensors file ({e}); re-download it") from None
            for k in keys:
                if skipped(model_type, k):
                    unused += 1
                    continue
                name = canonical_name(model_type, k)
                self.raw[name] = (h, k, f)
                weight, part = scheme.split(name) if scheme else (name, None)
                self.where.setdefault(weight, {})[part] = name
        if unused:
            log.warning("skipping %d tensors this engine does not run (vision tower, multi-token prediction)", unused)
        self.files = files

    def drop_layers_from(self, n_layers: int) -> int:
        """Forget the tensors of layers >= n_layers (DeepSeek's and GLM's multi-token-prediction
        layers, which plain decoding never runs) -> how many there were."""
        extra = [n for n in self.where if (m := LAYER.match(n)) and int(m.group(1)) >= n_layers]
        for n in extra:
            del self.where[n]
        return len(extra)

    def _read(self, name: str) -> torch.Tensor:
        h, key, f = self.raw[name]
        try:
            return h.get_tensor(key)
        except Exception as e:
            raise UserError(f"cannot read tensor {key} from {f} ({e}); the file looks corrupt, re-download it") from None

    def weight(self, name: str) -> torch.Tensor | QParts:
        """Weight `name` as stored: a float tensor, or a quantized one unpacked into QParts."""
        parts = self.where[name]
        if set(parts) != {None}:
            return self.scheme.unpack(name, {p: self._read(n) for p, n in parts.items()})
        t = self._read(parts[None])
        if not t.is_floating_point() or t.element_size() == 1:
            raise UserError(f"tensor {name} is {t.dtype} without the scale tensors of a quantized weight; "
                            "the checkpoint or its quantization_config is incomplete")
        return t

    def get(self, name: str) -> torch.Tensor:
        """Weight `name` in floating point (a quantized one dequantized)."""
        w = self.weight(name)
        return dequant_parts(self.scheme.fmt, w) if isinstance(w, tuple) else w


def source_label(src: Path) -> str:
    """What a conversion came from: the hub id of a hub snapshot, else the absolute directory."""
    src = src.absolute()
    if src.parent.name == "snapshots" and src.parent.parent.name.startswith("models--"):
        return src.parent.parent.name.removeprefix("models--").replace("--", "/")
    return str(src)


def target_dtype(cfg: ModelConfig, dtype: str) -> str:
    if dtype == "auto":
        return cfg.dtype
    if dtype not in FLOAT_NAMES:
        raise UserError(f"unknown --dtype {dtype!r}; choose bf16, fp16, fp32 or auto")
    return FLOAT_NAMES[dtype]


def quant_target(quant: str | None, group_size: int | None, scheme: Scheme | None, cfg: ModelConfig,
                 src_dir: Path) -> tuple[str, int] | None:
    """--quant and --group-size checked against the checkpoint -> (format, group) or None."""
    if quant is None:
        if group_size is not None:
            raise UserError("--group-size applies to --quant; add --quant int4, int8, fp8 or mxfp4")
        return None
    if quant not in FORMATS:
        raise UserError(f"unknown --quant {quant!r}; choose {', '.join(FORMATS)}")
    if scheme is not None:
        raise UserError(f"{src_dir} is already quantized ({scheme.method}); --quant needs a bf16, fp16 or fp32 "
                        "checkpoint (without --quant its quantized experts are kept as they are)")
    group = DEFAULT_GROUP[quant] if group_size is None else group_size
    if quant == "mxfp4" and group != 32:
        raise UserError("mxfp4 has blocks of 32 values by definition; leave --group-size out")
    dims = (cfg.hidden_size, cfg.moe_intermediate_size)
    if group < 2 or any(d % group for d in dims) or (quant == "int4" and group % 2):
        fits = [g for g in (128, 64, 32, 16, 8) if not any(d % g for d in dims)]
        hint = f"choose a divisor of both, e.g. {fits[0]}" if fits else "this model cannot be quantized group-wise"
        raise UserError(f"--group-size {group} does not divide the hidden size {dims[0]} and the expert width "
                        f"{dims[1]}; {hint}")
    return quant, group


def expected_names(cfg: ModelConfig) -> set[str]:
    from engine.models.transformer import CausalLM, checkpoint_names
    with torch.device("meta"):
        names = {p for n in CausalLM(cfg).state_dict() for p in checkpoint_names(n)}
    if cfg.tie_word_embeddings:
        names.discard("lm_head.weight")
    return names


def layer_experts(src: Source, layer: int, cfg: ModelConfig) -> Iterator[dict]:
    """Each routed expert of `layer` as {"gate_up": w [2I, H], "down": w [H, I]}, w a float tensor
    or QParts as the checkpoint stores it (gate rows first, then up), and with expert biases
    "gate_up_bias" [2I] and "down_bias" [H] (fused checkpoints only, as gpt-oss ships them)."""
    pre = f"model.layers.{layer}.mlp.experts."
    if pre + "gate_up_proj" in src.where:  # fused layout: [E, 2I, H] and [E, H, I] (after arch_tensor)
        names = ("gate_up_proj", "down_proj") + (("gate_up_proj_bias", "down_proj_bias") if cfg.expert_bias else ())
        for n in names:
            if pre + n not in src.where:
                raise UserError(f"checkpoint lacks {pre}{n}; it looks incomplete, re-download it")
        fused = {k: arch_tensor(cfg, pre + n, src.weight(pre + n)) for k, n in zip(WEIGHTS + BIASES, names)}
        for e in range(cfg.num_experts):
            yield {n: _index(w, e) for n, w in fused.items()}
        return
    if cfg.expert_bias:
        raise UserError(f"checkpoint lacks {pre}gate_up_proj; {cfg.model_type} experts come as fused tensors")
    for e in range(cfg.num_experts):
        part = f"{pre}{e}."
        if part + "gate_proj.weight" not in src.where:
            raise UserError(f"checkpoint lacks {part}gate_proj.weight; it looks incomplete, re-download it")
        gate, up, down = (src.weight(f"{part}{p}.weight") for p in ("gate_proj", "up_proj", "down_proj"))
        if isinstance(gate, tuple) != isinstance(up, tuple):
            raise UserError(f"only one of {part}gate_proj and {part}up_proj is quantized; FreeToken needs both alike")
        yield {"gate_up": fuse_gate_up(gate, up, part + "gate_proj") if isinstance(gate, tuple)
               else torch.cat([gate, up]), "down": down}


def _index(w: torch.Tensor | QParts, e: int) -> torch.Tensor | QParts:
    if isinstance(w, tuple):
        return tuple(None if t is None else t[e] for t in w[:3]) + (w[3],)
    return w[e]


def to_slot(w: torch.Tensor | QParts, dt: torch.dtype, quant: tuple | None) -> torch.Tensor | QParts:
    """One expert weight as its slot holds it: quantized ones as stored, float ones quantized by
    --quant (format, group) or cast to dt."""
    if isinstance(w, tuple):
        return w
    return quantize(quant[0], w, quant[1]) if quant else w.to(dt)


def expert_layout(src: Source, cfg: ModelConfig, dt: torch.dtype, quant: tuple | None) -> SlotLayout:
    """The slot layout, from the first routed expert as its slot will hold it."""
    first = next(layer_experts(src, cfg.moe_layer_ids[0], cfg))
    first = {n: to_slot(first[n], dt, quant) for n in WEIGHTS}
    kinds = {isinstance(w, tuple) for w in first.values()}
    if kinds == {False}:
        return SlotLayout.for_experts(cfg.hidden_size, cfg.moe_intermediate_size, dt, cfg.expert_bias)
    if kinds != {True}:
        raise UserError("the first routed expert has quantized and unquantized weights; FreeToken needs every "
                        "routed expert weight in one format")
    return SlotLayout.for_qweights(quant[0] if quant else src.scheme.fmt, first, cfg.expert_bias)


def pack_bank(src: Source, layer: int, cfg: ModelConfig, layout: SlotLayout, dt: torch.dtype,
              quant: tuple | None = None) -> torch.Tensor:
    """One MoE layer's experts -> [E, slot_bytes] uint8 in the runtime layout."""
    bank = torch.zeros(cfg.num_experts, layout.slot_bytes, dtype=torch.uint8)
    views = layout.views(bank)
    for e, weights in enumerate(layer_experts(src, layer, cfg)):
        for n, w in weights.items():  # biases stay float32 (kernels add them to fp32 sums)
            _put(views[n], e, w.float() if n in BIASES else to_slot(w, dt, quant),
                 f"{n} weight of expert {e} in layer {layer}")
    return bank


def _put(view: torch.Tensor | QWeight, e: int, w: torch.Tensor | QParts, what: str) -> None:
    """view[e] = w, refusing anything that differs from the layout (a cast would hide it)."""
    if isinstance(view, QWeight) != isinstance(w, tuple) or (isinstance(w, tuple) and tuple(w[3]) != view.block):
        raise UserError(f"the {what} is stored differently from the first expert's; FreeToken needs every "
                        "routed expert in one format and block size")
    pairs = zip((view.q, view.s, view.z), w[:3]) if isinstance(w, tuple) else [(view, w)]
    for dst, t in pairs:
        got = None if t is None else (list(t.shape), t.dtype)
        want = None if dst is None else (list(dst.shape[1:]), dst.dtype)
        if got != want:
            raise UserError(f"the {what} is {got} where the first expert's is {want}; the checkpoint is not uniform")
        if t is not None:
            dst[e].copy_(t)


def check_names(src: Source, cfg: ModelConfig) -> None:
    dense = {n for n in src.where if not EXPERT.match(n) and not IGNORED.search(n)}
    want = expected_names(cfg)
    if missing := sorted(want - dense):
        raise UserError(f"checkpoint lacks {missing[0]} (and {len(missing) - 1} more); it looks incomplete")
    if extra := sorted(dense - want - {"lm_head.weight"}):
        raise UserError(f"checkpoint has tensor {extra[0]} that this {cfg.model_type} model does not use; "
                        "the config and weights disagree")


def convert(src_dir: Path, out: Path, dtype: str = "auto", force: bool = False,
            progress: Callable[[int, int], None] | None = None, quant: str | None = None,
            group_size: int | None = None) -> Path:
    """Convert a local HF directory to FTW at `out`. progress(done_layers, total_layers). Routed
    experts stay in a quantized checkpoint's format, or are quantized to `quant` (int4, int8,
    fp8, mxfp4; `group_size` values a scale); everything else is written in `dtype`."""
    from ftw import FTWWriter
    hf = read_hf_config(src_dir)
    scheme = scheme_of(hf)
    cfg = model_config(hf)
    qt = quant_target(quant, group_size, scheme, cfg, src_dir)
    dt_name = target_dtype(cfg, dtype)
    dt = DTYPES[dt_name]
    src = Source(src_dir, cfg.model_type, scheme)
    if mtp := src.drop_layers_from(cfg.num_layers):
        log.warning("ignoring %d tensors of layers >= %d (multi-token prediction, unused by decoding)",
                    mtp, cfg.num_layers)
    check_names(src, cfg)
    layout = expert_layout(src, cfg, dt, qt)
    meta = {"model_type": cfg.model_type, "dtype": dt_name, "layout": layout.to_meta(),
            "moe_layers": cfg.moe_layer_ids, "converter": CONVERTER, "source": source_label(src_dir)}
    with FTWWriter(out, fingerprint=fingerprint(src_dir, dt_name, qt), meta=meta, force=force) as w:
        dense = sorted(n for n in src.where if not EXPERT.match(n) and not IGNORED.search(n))
        for layer in range(cfg.num_layers):
            for n in (n for n in dense if n.startswith(f"model.layers.{layer}.")):
                w.add(n, dense_tensor(cfg, n, src.get(n), dt))
            if cfg.moe_layers[layer]:
                w.add(bank_name(layer), pack_bank(src, layer, cfg, layout, dt, qt), meta={"bank": True})
            if progress:
                progress(layer + 1, cfg.num_layers)
        for n in (n for n in dense if not n.startswith("model.layers.")):
            w.add(n, dense_tensor(cfg, n, src.get(n), dt))
        for name in SIDE_FILES:
            if (src_dir / name).exists():
                w.copy_file(src_dir / name, name)
    return out
