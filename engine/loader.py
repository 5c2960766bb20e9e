"""Build a `ModelRunner` from an FTW directory (or a synthetic model): dense weights on the device,
every routed expert in the host store, one expert cache sized from the budget, the paged KV pool."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import torch

from engine.config import EngineConfig, persist_compile_caches
from engine.errors import UserError
from engine.kv.paged import KVPool
from engine.layers.rope import Rope
from engine.models import model_config
from engine.models.base import ModelConfig
from engine.models.transformer import CausalLM, checkpoint_names, param_dtype
from engine.moe.cache import ExpertCache, slots_for_budget
from engine.moe.layout import SlotLayout
from engine.moe.shard import this_rank
from engine.moe.policy import MissPolicy
from engine.moe.runtime import ExpertRuntime
from engine.moe.store import HostExpertStore
from engine.runner import ModelRunner
from ftw.format import DTYPES

GiB = 2**30


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA device is available; use --device cpu")
    if name not in ("cuda", "cpu"):
        raise UserError(f"unknown --device {name!r}; choose cuda, cpu or auto")
    return torch.device(name)


def compute_dtype(stored: str, device: torch.device) -> torch.dtype:
    """The dtype of activations and dense weights: the checkpoint's on the GPU, float32 on the CPU
    (CPUs without bf16 units are faster and exact in fp32; experts are upcast as they run)."""
    return DTYPES[stored] if device.type == "cuda" else torch.float32


def load_dense(reader, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(cfg)
    names = [n for n in model.state_dict() if not (cfg.tie_word_embeddings and n == "lm_head.weight")]
    sd = {}
    for n in names:
        parts = [reader.read(p) for p in checkpoint_names(n)]
        sd[n] = (parts[0] if len(parts) == 1 else torch.cat(parts)).to(param_dtype(n, dtype))
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, assign=True, strict=True)
    model.to(device).requires_grad_(False)
    model.rope = Rope(cfg.rope, cfg.head_dim, device)
    return model


def expert_slots(config: EngineConfig, layout: SlotLayout, store_bytes: int, n_experts: int,
                 device: torch.device, reserve: int) -> int:
    """Slots from --expert-budget; auto = free device memory after dense weights, KV and a reserve
    (on the CPU, every expert; for the embedded demo model, 40% of them, so that the offload path
    runs and shows in the stats). Never more slots than experts."""
    budget = config.expert_budget
    if budget is None and config.model is None:
        budget = max(int(0.4 * store_bytes), n_experts * layout.slot_bytes)
    elif budget is None:
        budget = store_bytes if device.type == "cpu" else free_memory(device) - reserve
    total = store_bytes // layout.slot_bytes
    return min(slots_for_budget(budget, layout, n_experts), total)


def load_runner(config: EngineConfig, path: Path, progress: Callable[[str, int, int], None] | None = None) -> ModelRunner:
    from ftw import FTWReader
    reader = FTWReader(path)
    if config.verify:
        reader.verify()
    cfg = model_config(json.loads(reader.file("config.json").read_text()))
    device = pick_device(config.device)
    dtype = compute_dtype(reader.meta["dtype"], device)
    clock = Phases()
    model = load_dense(reader, cfg, device, dtype)
    clock.mark("dense")
    layout, shard = SlotLayout.from_meta(reader.meta["layout"]), this_rank(cfg.num_experts)
    total = sum(len(shard.owned(i)) for i in range(len(cfg.moe_layer_ids))) * layout.slot_bytes
    done = [0]

    def tick(n):
        done[0] += n
        if progress:
            progress("experts", done[0], total)
    store = HostExpertStore.load(reader, cfg.moe_layer_ids, shard, layout, tick)
    clock.mark("read")
    if device.type == "cuda":
        store.pin()
    clock.mark("pin")
    return assemble(config, cfg, model, store, device, dtype, path, clock)


def load_synthetic(config: EngineConfig, shape: str, layers: int | None = None, seed: int = 0,
                   progress: Callable[[str, int, int], None] | None = None,
                   quant: tuple[str, int] | None = None) -> ModelRunner:
    """A random-weight model of a real model's shape (see engine.synthetic), its experts in bf16
    or quantized as quant = (format, group) says."""
    from engine.synthetic import expert_layout, random_banks, random_dense, synthetic_config
    cfg = synthetic_config(shape, layers)
    device = pick_device(config.device)
    dtype = compute_dtype(cfg.dtype, device)
    gen, clock = torch.Generator().manual_seed(seed), Phases()
    with torch.device("meta"):
        model = CausalLM(cfg)
    model.to_empty(device="cpu")
    random_dense(model, gen)
    model.to(device, dtype).requires_grad_(False)
    model.rope = Rope(cfg.rope, cfg.head_dim, device)
    clock.mark("dense")
    store = HostExpertStore.empty(len(cfg.moe_layer_ids), this_rank(cfg.num_experts), expert_layout(cfg, quant))
    random_banks(store, DTYPES[cfg.dtype], gen, progress=progress and (lambda d, n: progress("experts", d, n)))
    clock.mark("read")  # random experts written in place of the read
    if device.type == "cuda":
        store.pin()
    clock.mark("pin")
    return assemble(config, cfg, model, store, device, dtype, None, clock)


class Phases:
    """Seconds per load phase: mark(name) closes the phase that ran since the last mark."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name], self._t = now - self._t, now


def assemble(config: EngineConfig, cfg: ModelConfig, model: CausalLM, store: HostExpertStore,
             device: torch.device, dtype: torch.dtype, path: Path | None, clock: Phases) -> ModelRunner:
    """KV pool, expert cache and runtime around loaded weights; runner.timings gets the load's phases."""
    persist_compile_caches()  # before the graph warm-up compiles anything
    max_context = min(config.max_context, cfg.max_position_embeddings)
    kv_tokens = config.kv_tokens or max_context
    kv = KVPool(cfg.num_layers, -(-kv_tokens // config.page_size) + config.max_running, config.page_size,
                *cfg.kv_row, dtype, device, values=cfg.mla is None)
    runner = ModelRunner(cfg, model, kv, None, device, path, max_context)
    clock.mark("kv")
    rebuild_experts(runner, store, config)
    runner.prefill_chunk = config.prefill_chunk or prefill_chunk_for(free_memory(device), cfg, max_context, dtype)
    clock.mark("experts")
    runner.timings = clock.seconds
    return runner


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil
    return psutil.virtual_memory().available


def prefill_bytes(chunk: int, cfg: ModelConfig, max_context: int, dtype: torch.dtype) -> int:
    """Device memory a prefill chunk of `chunk` tokens works in: per token, a layer step's hidden
    states, q/k/v/o, one row of the causal mask over the context (bool and additive) and the fp32 expert
    intermediates; once, K and V of the whole context expanded to every query head (MLA: decompressed)."""
    H, b = cfg.hidden_size, dtype.itemsize
    D = sum(cfg.attn_dims)  # a head's K and V widths
    inter = max(cfg.moe_intermediate_size, cfg.intermediate_size)
    per_token = (4 * H + (cfg.num_heads + cfg.num_kv_heads) * D) * b + (3 * H + 3 * inter) * 4 + 3 * max_context
    return cfg.num_heads * D * max_context * b + chunk * per_token


def prefill_chunk_for(free: int, cfg: ModelConfig, max_context: int, dtype: torch.dtype) -> int:
    """Tokens per prefill chunk: as many as half of `free` bytes hold (every chunk is one more pass
    of the experts over PCIe), a power of two in [256, 16384], at most the context."""
    chunk = 16384
    while chunk > 256 and 2 * prefill_bytes(chunk, cfg, max_context, dtype) > free:
        chunk //= 2
    return min(chunk, max(256, max_context))


def rebuild_experts(runner: ModelRunner, store: HostExpertStore, config: EngineConfig, routing=None) -> ExpertRuntime:
    """(Re)build the device expert cache and runtime for config's budget and policy (and an
    optional routing override, which a CUDA graph must see at capture). The host store is
    untouched; the old cache is freed first."""
    cfg, layout, old = runner.cfg, store.layout, runner.runtime
    if runner.graphs is not None:
        runner.kv.release([runner.graphs.page])
    if old is not None:
        old.close()
        old.cache.pool = old.cache.w = None  # free device memory before allocating the new pool
        runner.runtime = runner.graphs = None
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
    room = 2 * prefill_bytes(config.prefill_chunk or 2048, cfg, runner.max_context, runner.kv.k.dtype)
    E = store.n_experts  # this rank's experts per layer
    slots = expert_slots(config, layout, store.nbytes, E, runner.device,
                         reserve=GiB + runner.kv.bytes // 8 + room)  # room: a prefill chunk
    policy = MissPolicy(config.moe_policy, len(store.banks), slots // E)
    graph = use_graphs(config, runner.device)
    cache = ExpertCache(layout, slots, len(cfg.moe_layer_ids), E, runner.device, device_tables=graph)
    cpu = old._cpu if old is not None else None
    if cpu is not None and old.cpu_threads != config.cpu_threads:  # else keep the worker pool
        cpu.close()
        cpu = None
    runtime = ExpertRuntime(store, cache, policy, config.cpu_threads, config.prefill_mode, cpu)
    runtime.routing = routing
    for block in runner.model.moe_blocks():
        block.runtime = runtime
    runner.runtime = runtime
    if graph:
        from engine.moe.device_control import DeviceControl
        runtime.device_ctl = DeviceControl(runtime, config.max_running, cfg.router.top_k)
        runtime.device_ctl.set_q()  # the capture's warm-up steps must follow the policy too
        if runner.device.type == "cuda":
            from engine.graphs import DecodeGraphs
            runner.graphs = DecodeGraphs(runner.model, runner.kv, -(-runner.max_context // runner.kv.page_size),
                                         config.max_running, runtime.device_ctl.counts)
            cache.tables.clear()  # the warm-up steps ran on dummy tokens: start from an empty cache
    if slots * layout.slot_bytes >= store.nbytes or policy.static_layers:
        runtime.warm()
    return runtime


def use_graphs(config: EngineConfig, device: torch.device) -> bool:
    """Device-resident control with CUDA graphs: the default on CUDA; on the CPU only when asked
    (tests of the same control logic, no capture)."""
    return device.type == "cuda" if config.graph is None else config.graph
