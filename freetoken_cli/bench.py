"""`freetoken bench decode|prefill|startup|agent`: measured throughput beside the physical bound,
the phases of a cold start, and an agent session's time to first token with reuse on and off."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import (Budget, Checkpoints, Chunk, Context, Gpus, ModelArg, Policy, Progress, WorldSize,
                                  engine_config, start_expert_read, user_errors)
from freetoken_cli.quality import quality

Synthetic = typer.Option(None, help="random weights of a real shape: qwen3-30b-a3b, qwen3-235b-a22b, "
                                        "deepseek-v3, glm-4.5-air, gpt-oss-120b, qwen3.5-35b-a3b, tiny, "
                                        "tiny-hybrid")
Layers = typer.Option(None, help="with --synthetic: keep only the first N layers")
Quant = typer.Option(None, "--quant", help="with --synthetic: experts in int4, int8, fp8 or mxfp4 (groups of 128; mxfp4: 32)")
Threads = typer.Option(None, help="CPU expert threads")
Device = typer.Option("auto", help="cuda | cpu | auto")
Json = typer.Option(False, "--json", help="print rows as JSON")
Out = typer.Option(None, help="also write the rows and profile as JSON to this file")

app = typer.Typer(help="Benchmarks: decode throughput per miss policy, prefill TTFT, cold-start phases, agent "
                       "sessions, quality against a reference.", no_args_is_help=True)
app.command("quality")(quality)


@app.command("decode")
@user_errors
def decode(model: Optional[str] = ModelArg,
           synthetic: Optional[str] = Synthetic,
           layers: Optional[int] = Layers,
           quant: Optional[str] = Quant,
           expert_budget: str = typer.Option("auto", help="expert cache size(s), comma list: 4GiB,8GiB,auto"),
           cpu_threads: Optional[str] = typer.Option(None, help="CPU expert threads, comma list: 4,8,12,16 (rows for each, one load; default: the profile's)"),
           moe_policy: str = typer.Option("adaptive,fetch,cpu", help="comma list; adaptive-fixed = q* fixed at the profile's (with adaptive listed too, the two take turns repeat by repeat)"),
           routing: str = typer.Option("model", help="comma list of model | uniform | trace:FILE"),
           tokens: int = typer.Option(64, help="decode tokens per repeat"),
           repeats: int = typer.Option(3, help="repeats per policy (median reported)"),
           depth: str = typer.Option("32", help="comma list of context depths: prompt tokens before the timed decode, e.g. 1024,16384,32768,65536"),
           batch: str = typer.Option("1", help="comma list of streams decoded together (distinct prompts), e.g. 1,4,8"),
           contention: int = typer.Option(0, help="also measure with N processes streaming through host RAM"),
           sampling: str = typer.Option("greedy", help="greedy, model (the checkpoint's generation_config.json) or "
                                        "key=value pairs: temperature=0.7,top_k=20,top_p=0.8,repetition_penalty=1.05"),
           device: str = Device,
           graph: str = typer.Option("on", help="comma list of on | off: CUDA-graph decode rows, eager rows"),
           world_size: int = WorldSize,
           gpus: Optional[str] = Gpus,
           as_json: bool = Json,
           out: Optional[Path] = Out):
    """Decode tok/s for each miss policy, context depth and number of streams, with hit rate, traffic and the bound."""
    from engine.bench.decode import context_for, run
    from engine.bench.threads import Census
    from engine.config import parse_policy
    policies = [p.strip() for p in moe_policy.split(",") if p.strip()]
    for p in policies:
        p == "adaptive-fixed" or parse_policy(p)
    from engine.moe.replay import check_routing
    budgets = _sizes(expert_budget)
    for spec in routing.split(","):
        check_routing(spec)
    depths, batches = _ints(depth, "--depth"), _ints(batch, "--batch")
    sample = _sampling(sampling, synthetic)
    max_context, kv_tokens = context_for(depths, batches, tokens)
    threads = _ints(cpu_threads, "--cpu-threads") if cpu_threads else [None]
    cfg = engine_config(model, device, "auto", policies[0].replace("-fixed", ""), threads[0], max_context,
                        max_running=max(batches), kv_tokens=kv_tokens, world_size=world_size, gpus=gpus)
    cfg = replace(cfg, expert_budget=budgets[0])
    from engine.dist import follow_if_worker
    follow_if_worker(cfg)  # under torchrun, ranks other than 0 follow rank 0 from here
    runner = _load(cfg, model, synthetic, layers, quant)
    if runner.max_context < max_context:
        from engine.errors import UserError
        raise UserError(f"--depth {max(depths)} needs {max_context} tokens of context with --tokens {tokens}, but the "
                        f"model holds {runner.max_context}; lower --depth")
    prof = _profile(runner, threads[0])
    if sample is None:  # the model's own, as `run` and `serve` sample (none: greedy)
        from engine.sampling import model_defaults
        sample = model_defaults(runner.path)
    graphs = [{"on": None, "off": False}[g.strip()] for g in graph.split(",")]
    rows: list[dict] = []
    census = Census()

    def say(r: dict) -> None:  # --out holds every row measured so far: a bench cut short keeps them
        rt = runner.runtime  # threads: asked for (None: the default); cpu_busy: cores per thread name, warm-up included
        r.update(threads=rt.cpu_threads, pool_threads=rt.cpu.threads, cpu_busy=census.take())
        typer.echo(f"{r['policy']}, {r['routing']}, {r['budget_gib']:.1f} GiB, graph {'on' if r['graph'] else 'off'}, "
                   f"load {r['load']}, depth {r['depth']}, batch {r['batch']}, {r['pool_threads']} CPU threads: "
                   f"{r['tok_s']:.2f} tok/s ({r['stream_tok_s']:.2f} per stream), {r['ratio']:.0%} of its bound", err=True)
        rows.append(r)
        if out:
            out.write_text(json.dumps({"rows": rows, "profile": prof}, indent=1))

    for n in threads:
        run(runner, runner.runtime.store, replace(cfg, cpu_threads=n), budgets, policies, routing.split(","), graphs,
            tokens, repeats, depths, batches, prof, contention, say=say, sampling=sample)
    if as_json:
        typer.echo(json.dumps({"rows": rows, "profile": prof}))
    else:
        _table(rows, prof, runner, cfg)


@app.command("prefill")
@user_errors
def prefill(model: Optional[str] = ModelArg,
            synthetic: Optional[str] = Synthetic,
            layers: Optional[int] = Layers,
            quant: Optional[str] = Quant,
            expert_budget: str = typer.Option("auto", help="expert cache size(s), comma list: 1152MiB,16GiB (a budget "
                                               "holding every expert gives the others' 'of all resident')"),
            cpu_threads: Optional[int] = Threads,
            mode: str = typer.Option("stream,routed,adaptive", help="comma list of prefill modes"),
            lengths: str = typer.Option("1024,4096,16384", help="comma list of cold prompt lengths"),
            follow_up: int = typer.Option(200, help="tokens of a follow-up after the last (cached) prompt; 0 = none"),
            repeats: int = typer.Option(3, min=1, help="repeats per row (median reported)"),
            prefill_chunk: str = Chunk,
            device: str = Device,
            as_json: bool = Json,
            out: Optional[Path] = Out):
    """Time to first token per prefill mode, beside the PCIe streaming bound."""
    from engine.bench.prefill import run
    from engine.dist import one_rank
    from engine.moe.prefill import PREFILL_MODES
    one_rank("bench prefill")
    modes = [m.strip() for m in mode.split(",")]
    from engine.errors import UserError
    if bad := [m for m in modes if m not in PREFILL_MODES]:
        raise UserError(f"unknown --mode {bad[0]!r}; choose from {', '.join(PREFILL_MODES)}")
    sizes = _ints(lengths, "--lengths")
    budgets = _sizes(expert_budget)
    cfg = replace(engine_config(model, device, "auto", "adaptive", cpu_threads, max(sizes) + follow_up + 16,
                                prefill_chunk=prefill_chunk), expert_budget=budgets[0])
    runner = _load(cfg, model, synthetic, layers, quant)
    prof = _profile(runner, cpu_threads)
    rows = run(runner, cfg, modes, sizes, follow_up, prof, repeats, budgets)
    if out:
        out.write_text(json.dumps({"rows": rows, "profile": prof}, indent=1))
    if as_json:
        typer.echo(json.dumps({"rows": rows, "profile": prof}))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"prefill: {runner.cfg.num_layers} layers x {runner.cfg.num_experts} experts, chunk {runner.prefill_chunk}")
    for col in ("budget GiB", "mode", "prompt", "tokens", "TTFT s", f"min-max of {repeats}", "streaming bound s",
                "TTFT / bound", "of all resident", "layers streamed (passes)", "moved GiB", "CPU GiB"):
        t.add_column(col, justify="left" if col in ("mode", "prompt") else "right")
    for r in rows:
        t.add_row(f"{r['budget_gib']:.2f}" + (" (all)" if r["all_resident"] else ""), r["mode"], r["prompt"],
                  str(r["tokens"]), f"{r['ttft_s']:.3f}", f"{min(r['ttft_runs']):.3f}-{max(r['ttft_runs']):.3f}",
                  f"{r['bound_s']:.3f}", f"{r['ttft_s'] / r['bound_s']:.2f}",
                  "-" if r["of_floor"] is None else f"{r['of_floor']:.2f}x", f"{r['streamed_layers']} ({r['stream_passes']})",
                  f"{r['moved_gib']:.2f}", f"{r['cpu_gib']:.2f}")
    Console(width=max(175, Console().width)).print(t)


def process_start() -> float:
    """Epoch seconds of this process's start: on Linux, its start tick (/proc/self/stat) against
    CLOCK_BOOTTIME, to 10 ms; psutil's create_time adds the boot time, which Linux gives in whole
    seconds, and was up to a second early (every start's import and ready phases with it)."""
    import time
    try:
        tick = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - tick / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil
        return psutil.Process().create_time()


@app.command("startup")
@user_errors
def startup(model: Optional[str] = ModelArg,
            synthetic: Optional[str] = Synthetic,
            layers: Optional[int] = Layers,
            quant: Optional[str] = Quant,
            expert_budget: str = Budget,
            cpu_threads: Optional[int] = Threads,
            moe_policy: str = Policy,
            max_context: int = Context,
            prompt_tokens: int = typer.Option(500, help="tokens of each of the two prompts prefilled after the load"),
            device: str = Device,
            as_json: bool = Json,
            out: Optional[Path] = Out):
    """The phases of a cold `run` (read beside the disk's bound, pin, compile, capture, first prefill)."""
    import time
    cfg = engine_config(model, device, expert_budget, moe_policy, cpu_threads, max_context)
    if not synthetic:
        start_expert_read(cfg)  # as `run` does
    from engine.bench.startup import report
    from engine.dist import one_rank
    one_rank("bench startup")
    started, imported = process_start(), time.time()
    runner = _load(cfg, model, synthetic, layers, quant)
    loaded, t0 = time.time(), time.perf_counter()
    if cfg.moe_policy == "adaptive":  # as `run` does
        runner.runtime.qstar.use_profile(_profile(runner, cpu_threads))
    r = report(runner, started, imported, loaded, time.perf_counter() - t0, prompt_tokens)
    if out:
        out.write_text(json.dumps(r, indent=1))
    if as_json:
        typer.echo(json.dumps(r))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"startup: {runner.cfg.num_layers} layers x {runner.cfg.num_experts} experts, "
                    f"{r['expert_bytes'] / 2**30:.2f} GiB of experts")
    t.add_column("phase")
    t.add_column("seconds", justify="right")
    t.add_column("", justify="left")
    read = "" if r["read_s"] is None else (
        f"the expert read's remainder, the resident experts copied in as it goes (the read: {r['read_s']:.2f} s, {r['read_gbps']:.2f} GB/s"
        + (f"; the disk's bound {r['read_bound_s']:.2f} s at {r['disk_gbps']:.2f} GB/s"
           f"{'' if r['disk_direct'] else ', buffered: maybe the page cache'}" if "read_bound_s" in r else "") + ")")
    notes = {"setup": "up to the loader's first phase: its imports, the checkpoint's path",
             "header": "the checkpoint's index and config read (and verified with --verify)",
             "driver": "the device picked: CUDA's driver started (torch.cuda.is_available)",
             "device": "CUDA context, cuBLAS (the dense weights are read meanwhile)",
             "dense": "the rest of the dense read; to the device", "build": "random experts built (synthetic)", "wait": read,
             "pin": "waits for the expert thread's page-lock of its buffer, taken before its read",
             "cache": "the expert cache's device pool and residency tables allocated",
             "experts": "expert runtime, device control and the CPU executor its poller starts",
             "prefill": "the dense GEMMs at every row count to 2048, prefills on dummy tokens: the prefill path's first use",
             "compile": "decode graphs' warm-up steps: Triton JIT, torch.compile", "capture": "decode graphs captured"}
    for name, sec in r["phases"].items():
        t.add_row(name, f"{sec:.2f}", notes.get(name, ""))
    t.add_row("ready", f"{r['ready_s']:.2f}", "from the process's start")
    t.add_row("first prefill", f"{r['first_prefill_s']:.3f}", f"{prompt_tokens} tokens, to the first token")
    t.add_row("second prefill", f"{r['second_prefill_s']:.3f}", f"another {prompt_tokens}; first / second {r['first_request_ratio']:.2f}")
    con = Console(width=max(120, Console().width))
    con.print(t)
    con.print(f"{r['triton_compiled']} Triton kernels compiled (not found in its cache); torch.compile "
              f"{r['torch_compile_s']:.2f} s in all, FX graph cache {r['fx_graph_cache_hit']} hits, "
              f"{r['fx_graph_cache_miss']} misses, AOTAutograd cache {r['autograd_cache_hit']} hits, "
              f"{r['autograd_cache_miss']} misses; {r['modules_compiled_from_source']} Python modules compiled from source"
              + (" (PYTHONDONTWRITEBYTECODE is set)" if r["dont_write_bytecode"] else "")
              + (f" (bytecode kept under {r['pycache_prefix']})" if r["pycache_prefix"] else ""))


@app.command("agent")
@user_errors
def agent(model: Optional[str] = ModelArg,
          synthetic: Optional[str] = Synthetic,
          layers: Optional[int] = Layers,
          expert_budget: str = Budget,
          cpu_threads: Optional[int] = Threads,
          system_tokens: int = typer.Option(16000, help="tokens of the session's system prompt (coding agents send 15-20k)"),
          queries: int = typer.Option(2, help="user queries"),
          steps: int = typer.Option(3, help="tool calls per query"),
          response_tokens: int = typer.Option(300, help="tokens of each tool response"),
          state_checkpoints: int = Checkpoints,
          prefill_chunk: str = Chunk,
          device: str = Device,
          as_json: bool = Json,
          out: Optional[Path] = Out):
    """An agent session, turn by turn: TTFT and reused tokens with reuse on and off (hybrid models:
    state checkpoints; others: the prefix cache)."""
    from engine.bench.agent import Shape, context, run
    shape = Shape(system=system_tokens, queries=queries, steps=steps, response=response_tokens)
    longest, distinct = context(shape)  # one KV pool for both modes: the session cached beside a turn
    cfg = engine_config(model, device, expert_budget, "adaptive", cpu_threads, longest, prefill_chunk=prefill_chunk,
                        state_checkpoints=state_checkpoints, kv_tokens=longest + distinct)
    runner = _load(cfg, model, synthetic, layers, None)
    if runner.max_context < longest:  # else the turns past it would end at their first token
        from engine.errors import UserError
        raise UserError(f"the session's longest turn needs {longest} tokens of context, but the model holds "
                        f"{runner.max_context}; lower --system-tokens")
    prof = _profile(runner, cpu_threads)
    runner.runtime.qstar.use_profile(prof)  # q* and the prefill's link estimate, as `run` and `serve` have them
    rows: list[dict] = []

    def say(r: dict) -> None:
        typer.echo(f"turn {r['turn']}: {r['prompt_tokens']} tokens, TTFT {r['ttft_s_on']:.3f} s (reused "
                   f"{r['reused_on']}; moved {r['moved_gib_on']:.2f} GiB, CPU {r['cpu_gib_on']:.2f} GiB, streamed "
                   f"{r['streamed_on']} in {r['passes_on']} passes) vs {r['ttft_s_off']:.3f} s (reused {r['reused_off']}; "
                   f"moved {r['moved_gib_off']:.2f} GiB, CPU {r['cpu_gib_off']:.2f} GiB, streamed {r['streamed_off']} in "
                   f"{r['passes_off']} passes)", err=True)
        rows.append(r)
        if out:
            out.write_text(json.dumps({"rows": rows, "profile": prof}, indent=1))
    run(runner, shape, say)
    if as_json:
        typer.echo(json.dumps({"rows": rows, "profile": prof}))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"agent session: {runner.cfg.num_layers} layers, reuse = {rows[0]['reuse']}")
    for col in ("turn", "prompt tokens", "reused (on)", "TTFT on s", "reused (off)", "TTFT off s", "off / on"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["turn"]), str(r["prompt_tokens"]), str(r["reused_on"]), f"{r['ttft_s_on']:.3f}",
                  str(r["reused_off"]), f"{r['ttft_s_off']:.3f}", f"{r['ttft_s_off'] / r['ttft_s_on']:.2f}x")
    Console(width=max(120, Console().width)).print(t)


def _profile(runner, cpu_threads: Optional[int]) -> dict:
    """This machine's profile for the runner's expert format (measured quickly if none is saved)."""
    from engine.profile import load_or_measure
    return load_or_measure(cpu_threads, say=lambda m: typer.echo(m, err=True), fmt=runner.runtime.store.layout.dtype)


def _ints(text: str, option: str) -> list[int]:
    """'1024,16384' -> [1024, 16384]: a comma list of positive counts."""
    from engine.errors import UserError
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"cannot read {option} {text!r}; give a comma list of positive numbers like 1,4,8")
    return [int(p) for p in parts]


def _sizes(text: str) -> list[int | None]:
    """--expert-budget '1152MiB,16GiB,auto' -> bytes (None: auto), each checked."""
    from engine.config import parse_size
    return [parse_size(b.strip()) for b in text.split(",")]


def _sampling(spec: str, synthetic: Optional[str]) -> dict | None:
    """--sampling as SamplingParams fields: {} greedy, None the checkpoint's own (read once it is
    loaded), else its key=value pairs, checked."""
    from engine.config import SamplingParams
    from engine.errors import UserError
    spec = spec.strip()
    if spec == "model" and synthetic:
        raise UserError("--sampling model reads a checkpoint's generation_config.json; a --synthetic shape has "
                        "none: give the values, e.g. --sampling temperature=0.7,top_k=20,top_p=0.8")
    if spec in ("greedy", "model"):
        return {} if spec == "greedy" else None
    kinds = {"temperature": float, "top_k": int, "top_p": float, "repetition_penalty": float}
    out = {}
    for part in spec.split(","):
        key, _, value = (x.strip() for x in part.partition("="))
        try:
            out[key] = kinds[key](value)
        except (KeyError, ValueError):
            raise UserError(f"cannot read --sampling {part!r}; give greedy, model or pairs like "
                            "temperature=0.7,top_k=20,top_p=0.8,repetition_penalty=1.05") from None
    SamplingParams(**out)  # its ranges
    return out


def _load(cfg, model: Optional[str], synthetic: Optional[str], layers: Optional[int], quant: Optional[str]):
    """The runner to measure, with a progress bar while its experts load (or are built)."""
    from engine.convert import DEFAULT_GROUP
    from engine.dist import load
    from engine.errors import UserError
    from engine.loader import load_runner, load_synthetic
    from engine.resolve import ensure_ftw
    if quant and (not synthetic or quant not in DEFAULT_GROUP):
        raise UserError(f"--quant applies to --synthetic and takes {', '.join(DEFAULT_GROUP)}; "
                        "for a checkpoint, convert it with `freetoken convert SRC OUT --quant F`")
    bar = Progress()
    try:
        if synthetic:
            return load(cfg, load_synthetic, synthetic, layers, quant=quant, local={"progress": bar})
        return load(cfg, load_runner, ensure_ftw(model), local={"progress": bar})
    finally:
        bar.close()


def _table(rows: list[dict], prof: dict, runner, cfg) -> None:
    from rich.console import Console
    from rich.table import Table
    mib = 2**20
    world = runner.runtime.store.shard.world
    t = Table(title=f"decode: {runner.cfg.num_layers} layers x {runner.cfg.num_experts} experts, "
                    f"top-{runner.cfg.router.top_k}, expert {runner.runtime.store.layout.slot_bytes / mib:.1f} MiB"
                    + (f", experts over {world} ranks (budget per rank; hit rate and traffic summed)" if world > 1 else "")
                    + (f", sampling {rows[0]['sampling']}" if rows and rows[0]["sampling"] != "greedy" else ""))
    for col in ("graph", "routing", "budget GiB", "policy", "load", "threads", "depth", "batch", "tok/s", "tok/s/stream", "hit rate",
                "fetched/tok", "CPU/tok", "PCIe MiB/tok", "CPU MiB/tok", "q*", "bound tok/s", "of bound"):
        t.add_column(col, justify="left" if col in ("routing", "policy", "load") else "right")
    for r in rows:
        t.add_row("on" if r["graph"] else "off", r["routing"], f"{r['budget_gib']:.1f}", r["policy"], r["load"],
                  str(r["pool_threads"]), str(r["depth"]), str(r["batch"]), f"{r['tok_s']:.2f}", f"{r['stream_tok_s']:.2f}",
                  f"{r['hit_rate']:.1%}", f"{r['fetched']:.2f}",
                  f"{r['cpu']:.2f}", f"{r['bytes_filled'] / mib:.1f}", f"{r['bytes_cpu'] / mib:.1f}",
                  f"{r['q_star']:.2f}", f"{r['bound_tok_s']:.2f}", f"{r['ratio']:.0%}")
    con = Console(width=max(150, Console().width))
    con.print(t)
    p = prof
    con.print(f"B_P {p['h2d_concurrent_gbps'] or 0:.1f} GB/s, B_H {p['cpu_expert_concurrent_gbps']:.1f} GB/s "
                    f"(concurrent, {'quick' if p.get('quick') else 'saved'} profile)")
