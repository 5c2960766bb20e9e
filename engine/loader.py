"""Build a `ModelRunner` from an FTW directory (or a synthetic model): dense weights on the device,
every routed expert in the host store, one expert cache sized from the budget, the paged KV pool."""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch

from engine.config import EngineConfig, SamplingParams
from engine.errors import UserError
from engine.kv.paged import KVPool, SlidingPool
from engine.kv.state import StatePool
from engine.layers.rope import Rope
from engine.models import model_config
from engine.models.base import ModelConfig
from engine.models.transformer import CausalLM, checkpoint_names, param_dtype
from engine.moe.cache import CacheStats, ExpertCache, slots_for_budget
from engine.moe.layout import SlotLayout
from engine.moe.policy import MissPolicy
from engine.moe.runtime import ExpertRuntime
from engine.moe.shard import this_rank
from engine.moe.store import HostExpertStore
from engine.runner import ModelRunner
from engine.sampling import generator, sample
from ftw.format import DTYPES
from freetoken_kernels import linear_attn

GiB = 2**30
log = logging.getLogger("freetoken.loader")


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


def read_dense(reader, cfg: ModelConfig, dtype: torch.dtype) -> CausalLM:
    """The model with its dense weights read into host tensors in `dtype` (built on the meta
    device and the weights assigned: no initialisation)."""
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
    return model


def to_device(model: CausalLM, device: torch.device) -> CausalLM:
    model.to(device).requires_grad_(False)
    model.rope = Rope(model.cfg.rope, model.cfg.head_dim, device)
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
    """The dense weights are read on a thread while this one creates the device context, then
    the experts on another (which meanwhile page-locks their buffer); this thread moves the dense
    weights to the device, builds the KV pool, the expert cache and its control, which need only
    the host store's addresses, warms the prefill path and captures the decode graphs while the
    experts are read; only the resident copy waits for the read, a layer at a time."""
    from ftw import FTWReader
    clock = Phases()
    reader = FTWReader(path)
    if config.verify:
        reader.verify()
    cfg = model_config(json.loads(reader.file("config.json").read_text()))
    clock.mark("header")
    device = pick_device(config.device)
    dtype = compute_dtype(reader.meta["dtype"], device)
    clock.mark("driver")
    layout, shard = SlotLayout.from_meta(reader.meta["layout"]), this_rank(cfg.num_experts)
    total = sum(len(shard.owned(i)) for i in range(len(cfg.moe_layer_ids))) * layout.slot_bytes
    check_host_memory(path, total)
    done = [0]

    def tick(n):
        done[0] += n
        if progress:
            progress("experts", done[0], total)
    with ThreadPoolExecutor(1, thread_name_prefix="dense-read") as pool:
        dense = pool.submit(read_dense, reader, cfg, dtype)  # first: the disk is the dense weights' alone
        store = HostExpertStore.load(reader, cfg.moe_layer_ids, shard, layout, tick, pin=device.type == "cuda",
                                     after=dense)
        try:
            start_device(device)
            clock.mark("device")
            model = to_device(dense.result(), device)
            clock.mark("dense")
            return assemble(config, cfg, model, store, device, dtype, path, clock)
        except BaseException:
            store.stop()
            raise


def check_host_memory(path: Path, nbytes: int) -> None:
    """Refuse a load whose experts (`nbytes`) do not fit in the host memory available, before
    any is read; a read ftw.early began was checked when it began (its buffer now counts as used)."""
    from ftw import early
    if not early.started(path) and (short := early.host_shortfall(nbytes)):
        raise UserError(f"the experts need {nbytes / 2**30:.1f} GiB of host memory and only "
                        f"{(nbytes - short) / 2**30:.1f} GiB are available: free memory, or convert the model "
                        "with `freetoken convert --quant int4` (about 3.5x fewer bytes than bf16)")


def start_device(device: torch.device) -> None:
    """Create the CUDA context and the cuBLAS handle now, a phase of its own while the experts are
    read (the first CUDA call and the first matmul would otherwise, the latter after the read)."""
    if device.type == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.current_blas_handle()


def load_synthetic(config: EngineConfig, shape: str, layers: int | None = None, seed: int = 0,
                   progress: Callable[[str, int, int], None] | None = None,
                   quant: str | None = None) -> ModelRunner:
    """A random-weight model of a real model's shape (see engine.synthetic), its experts in bf16
    or quantized to the format `quant` in its default groups (engine.convert.DEFAULT_GROUP)."""
    from engine.convert import DEFAULT_GROUP
    from engine.synthetic import expert_layout, random_banks, random_dense, synthetic_config
    cfg = synthetic_config(shape, layers)
    clock = Phases()
    device = pick_device(config.device)
    dtype = compute_dtype(cfg.dtype, device)
    clock.mark("driver")
    gen = torch.Generator().manual_seed(seed)
    start_device(device)
    clock.mark("device")
    with torch.device("meta"):
        model = CausalLM(cfg)
    model.to_empty(device="cpu")
    random_dense(model, gen)
    to_device(model.to(dtype), device)
    clock.mark("dense")
    layout = expert_layout(cfg, quant and (quant, DEFAULT_GROUP[quant]))
    store = HostExpertStore.empty(len(cfg.moe_layer_ids), this_rank(cfg.num_experts), layout)
    random_banks(store, DTYPES[cfg.dtype], gen, progress=progress and (lambda d, n: progress("experts", d, n)))
    clock.mark("build")  # random experts written in place of the read
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
    """KV pool, expert cache and runtime around loaded weights (the store's contents may still be
    loading); runner.timings gets the load's phases."""
    max_context = min(config.max_context, cfg.max_position_embeddings)
    kv_tokens = config.kv_tokens or max_context
    kv = KVPool(len(cfg.attention_layer_ids), -(-kv_tokens // config.page_size) + config.max_running,
                config.page_size, *cfg.kv_row, dtype, device, values=cfg.mla is None)
    if cfg.sliding_layer_ids:
        kv.sliding = sliding_pool(cfg, config, kv.n_pages, dtype, device)
    runner = ModelRunner(cfg, model, kv, None, device, path, max_context)
    runner.prefill_chunk = config.prefill_chunk or runner.prefill_chunk  # the chunk the warm-up and the reserve assume, until sized below
    note_missing_kernels(cfg, device, dtype)
    if cfg.linear_layer_ids:  # two slots per running sequence (a decode step writes the other) and one for the graphs' capture
        runner.states = StatePool(cfg, 2 * config.max_running + 1, config.state_checkpoints, dtype, device)
        for layer in model.linear_layers():
            layer.states = runner.states
    clock.mark("kv")
    rebuild_experts(runner, store, config, clock=clock)
    runner.prefill_chunk = config.prefill_chunk or prefill_chunk_for(free_memory(device), cfg, max_context, dtype)
    runner.timings = clock.seconds
    return runner


def note_missing_kernels(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
    """A hybrid in half precision on CUDA runs flash-linear-attention's kernels where installed:
    say so where it is not (the same results, slower)."""
    if cfg.linear_layer_ids and device.type == "cuda" and dtype != torch.float32 and not linear_attn.fla_available():
        log.warning("flash-linear-attention is not installed, so the Gated DeltaNet layers run a plain-torch path "
                    "(long prompts take about twice as long); install it: pip install 'freetoken[cuda]'")


def sliding_pool(cfg: ModelConfig, config: EngineConfig, full_pages: int, dtype: torch.dtype,
                 device: torch.device) -> SlidingPool:
    """The sliding layers' pool: a window for each running sequence (and one more for the one in a
    prefill chunk), twice that for the prefix cache's windows (a turn's end and its prompt's end),
    never more pages than the main pool has, and the pool's own dummy page."""
    w, ps = cfg.sliding_window, config.page_size
    pages = min(full_pages, (3 * config.max_running + 1) * SlidingPool.held(w, ps)) + 1
    return SlidingPool(w, len(cfg.sliding_layer_ids), pages, ps, *cfg.kv_row, dtype, device)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil
    return psutil.virtual_memory().available


def prefill_bytes(chunk: int, cfg: ModelConfig, max_context: int, dtype: torch.dtype) -> int:
    """Device memory a prefill chunk of `chunk` tokens works in: per token, a layer step's hidden
    states, q/k/v/o, one row of the causal mask over the context (bool and additive) and the fp32 expert
    intermediates; once, K and V of the whole context expanded to every query head (MLA: decompressed;
    with attention sinks twice: SDPA reads a padded copy, see freetoken_kernels.ref.paged_attention)."""
    H, b = cfg.hidden_size, dtype.itemsize
    D = sum(cfg.attn_dims)  # a head's K and V widths
    inter = max(cfg.moe_intermediate_size, cfg.intermediate_size)
    per_token = (4 * H + (cfg.num_heads + cfg.num_kv_heads) * D) * b + (3 * H + 3 * inter) * 4 + 3 * max_context
    return (1 + cfg.attention_sinks) * cfg.num_heads * D * max_context * b + chunk * per_token


def prefill_chunk_for(free: int, cfg: ModelConfig, max_context: int, dtype: torch.dtype) -> int:
    """Tokens per prefill chunk: as many as half of `free` bytes hold (every chunk is one more pass
    of the experts over PCIe), a power of two in [256, 16384], at most the context."""
    chunk = 16384
    while chunk > 256 and 2 * prefill_bytes(chunk, cfg, max_context, dtype) > free:
        chunk //= 2
    return min(chunk, max(256, max_context))


def rebuild_experts(runner: ModelRunner, store: HostExpertStore, config: EngineConfig, routing=None,
                    clock: Phases | None = None) -> ExpertRuntime:
    """(Re)build the device expert cache and runtime for config's budget and policy (and an
    optional routing override, which a CUDA graph must see at capture). The host store is
    untouched; the old cache is freed first. The warm-ups and the capture need only the store's
    pinned addresses (what they compute on rows still being read is thrown away); the resident
    copy takes each layer once the read has reached it. clock marks the phases cache (its pool and
    tables), experts (runtime, control), pin, prefill (warm-up), graphs, wait (for the read, the
    resident copy beside it)."""
    clock = clock or Phases()
    cfg, layout, old = runner.cfg, store.layout, runner.runtime
    release_graphs(runner)
    if old is not None:
        old.close()
        old.cache.pool = old.cache.w = None  # free device memory before allocating the new pool
        runner.runtime = None
        if runner.device.type == "cuda":
            torch.cuda.empty_cache()
    E = store.n_experts  # this rank's experts per layer
    slots = expert_slots(config, layout, store.nbytes, E, runner.device, device_reserve(runner, config.prefill_chunk))
    policy = MissPolicy(config.moe_policy, len(store.banks), slots // E)
    graph = use_graphs(config, runner.device)
    cache = ExpertCache(layout, slots, len(cfg.moe_layer_ids), E, runner.device, device_tables=graph)
    clock.mark("cache")
    cpu = old._cpu if old is not None else None
    if cpu is not None and old.cpu_threads != config.cpu_threads:  # else keep the worker pool
        cpu.close()
        cpu = None
    runtime = ExpertRuntime(store, cache, policy, config.cpu_threads, config.prefill_mode, cpu, cfg.expert_act)
    runtime.routing = routing
    for block in runner.model.moe_blocks():
        block.runtime = runtime
    runner.runtime = runtime
    if graph:
        from engine.moe.device_control import DeviceControl
        runtime.device_ctl = DeviceControl(runtime, config.max_running, cfg.router.top_k, runner.kv.k.dtype)
    clock.mark("experts")
    if runner.device.type == "cuda":
        store.pin()
    clock.mark("pin")
    cuda_graphs = graph and runner.device.type == "cuda"
    if cuda_graphs:  # on dummy tokens; the capture empties the tables after both
        warm_prefill(runner)
    clock.mark("prefill")
    if cuda_graphs:
        capture_graphs(runner, config.max_running)
    clock.mark("graphs")
    if slots * layout.slot_bytes >= store.nbytes or policy.static_layers:
        runtime.warm()  # bank by bank, as the read reaches each
    store.wait()
    clock.mark("wait")
    return runtime


def device_reserve(runner: ModelRunner, prefill_chunk: int | None) -> int:
    """Device memory an auto expert budget leaves free: 1 GiB, an eighth of the KV pool and the
    room a prefill chunk works in."""
    kv = runner.kv
    room = 2 * prefill_bytes(prefill_chunk or 2048, runner.cfg, runner.max_context, kv.k.dtype)
    return GiB + (kv.bytes + (kv.sliding.bytes if kv.sliding else 0)) // 8 + room


WARM_PROMPT_TOKENS = 512  # a first prompt's size, for the kernels' choices by row count
WARM_GEMM_ROWS = 2048     # the layers' dense projections are warmed at every row count up to this


@torch.no_grad()
def warm_gemms(model: CausalLM, rows: int) -> None:
    """cuBLAS picks a GEMM's kernel by its row count, among dozens that CUDA loads at their
    first use (2-4 ms each): a first 500-token prompt paid ~8 ms of such loads in the dense
    projections. Each distinct projection of the layers runs once at every row count up to
    `rows`, queued without a wait, so those kernels are loaded before the first request; the
    boundaries between kernels are irregular, so no sparser ladder covers them
    (benchmarks/RESULTS.md, thirty-third run). Longer prompts pay the loads of their own row
    count's kernels."""
    seen = set()
    for m in model.model.layers.modules():
        key = isinstance(m, torch.nn.Linear) and (m.in_features, m.out_features, m.weight.dtype, m.bias is not None)
        if key and key not in seen:
            seen.add(key)
            x = torch.zeros(rows, m.in_features, dtype=m.weight.dtype, device=m.weight.device)
            for n in range(1, rows + 1):
                m(x[:n])


def warm_prefill(runner: ModelRunner) -> None:
    """The dense GEMMs at every short row count (once a runner), then three prefills on dummy
    tokens (at most a prefill chunk each), so that the first request does not pay the first use
    of the prefill path (lazily loaded kernels, the eager plan's and experts' torch ops, the
    samplers' kernels): one just long enough to scan like a long prompt, one of a first prompt's
    length and one of WARM_GEMM_ROWS (the kernels' choices by size: a long prompt's routes are
    sorted by another kernel), their KV written to one scratch page (the sliding layers' to
    their pool's dummy page, and a hybrid model's recurrent state to a scratch slot), the
    model's own routing (a replayed trace keeps its place). The expert cache's counters and the
    streamer's compute estimate are reset after it; the tables it filled are emptied by the
    capture that follows."""
    from engine.kv.batch import ForwardBatch
    from engine.moe.prefill import LayerStreamer
    from engine.moe.runtime import SHORT_ROUTES_PER_EXPERT
    cfg, kv, rt, states = runner.cfg, runner.kv, runner.runtime, runner.states
    scan = SHORT_ROUTES_PER_EXPERT * cfg.num_experts // cfg.router.top_k + 1
    page, ps = kv.alloc(1)[0], kv.page_size
    slot = states.alloc() if states else None
    t = dict(device=runner.device)

    def batch(T: int) -> ForwardBatch:
        def in_page(p: int):  # (page table, slots) of the T tokens, all in page p
            return torch.full((1, -(-T // ps)), p, dtype=torch.int32, **t), p * ps + torch.arange(T, **t) % ps
        return ForwardBatch(torch.zeros(T, dtype=torch.int64, **t), torch.arange(T, **t), [T], [T],
                            torch.tensor([T], dtype=torch.int32, **t), *in_page(page), torch.tensor([T - 1], **t),
                            None if slot is None else torch.tensor([slot], **t), (),
                            *(in_page(kv.sliding.dummy) if kv.sliding else (None, None)))
    if not runner.gemms_warm:  # a rebuild of the experts (the benches' rows) keeps the dense model's
        warm_gemms(runner.model, WARM_GEMM_ROWS)
        runner.gemms_warm = True
    routing, rt.routing = rt.routing, None
    try:
        longest = min(runner.max_context, runner.prefill_chunk)
        for T in sorted({min(n, longest) for n in (scan, WARM_PROMPT_TOKENS, WARM_GEMM_ROWS)}):
            logits = runner.model(batch(T), kv)[-1:].float()
        for p in (SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9, top_k=20)):  # greedy, sampled
            sample(logits, [p], [generator(p, logits.device)], [None])
        if kv.k.is_cuda:
            torch.cuda.synchronize()
    finally:
        kv.release([page])
        if slot is not None:
            states.release(slot)
        rt.routing = routing
    rt.cache.stats = CacheStats()
    rt.streamer = LayerStreamer(rt, rt.streamer.mode)


def capture_graphs(runner: ModelRunner, max_running: int) -> None:
    """Capture the decode graphs against the current expert cache and tables; the capture's
    warm-up steps run on dummy tokens, so they leave the tables empty and the counters unmoved."""
    from engine.graphs import DecodeGraphs
    runner.runtime.device_ctl.set_q()  # the warm-up steps follow the cache's policy (its CPU branch or none)
    runner.graphs = DecodeGraphs(runner.model, runner.kv, -(-runner.max_context // runner.kv.page_size),
                                 max_running, runner.runtime.device_ctl.counts, runner.states)
    runner.runtime.cache.tables.clear()


def release_graphs(runner: ModelRunner) -> None:
    """Drop the decode graphs (they point into the expert cache) and their scratch KV page (and state slot)."""
    if runner.graphs is not None:
        runner.graphs.release()
        runner.graphs = None


def use_graphs(config: EngineConfig, device: torch.device) -> bool:
    """Device-resident control with CUDA graphs: the default on CUDA; on the CPU only when asked
    (tests of the same control logic, no capture)."""
    return device.type == "cuda" if config.graph is None else config.graph
