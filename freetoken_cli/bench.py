"""`freetoken bench decode|prefill`: measured throughput beside the physical bound."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import ModelArg, Progress, engine_config, user_errors

Synthetic = typer.Option(None, help="random weights of a real shape: qwen3-30b-a3b, qwen3-235b-a22b, "
                                        "deepseek-v3, glm-4.5-air, tiny")
Layers = typer.Option(None, help="with --synthetic: keep only the first N layers")
Threads = typer.Option(None, help="CPU expert threads")
Device = typer.Option("auto", help="cuda | cpu | auto")
Json = typer.Option(False, "--json", help="print rows as JSON")
Out = typer.Option(None, help="also write the rows and profile as JSON to this file")

app = typer.Typer(help="Benchmarks: decode throughput per miss policy (and prefill TTFT).", no_args_is_help=True)


@app.command("decode")
@user_errors
def decode(model: Optional[str] = ModelArg,
           synthetic: Optional[str] = Synthetic,
           layers: Optional[int] = Layers,
           expert_budget: str = typer.Option("auto", help="expert cache size(s), comma list: 4GiB,8GiB,auto"),
           cpu_threads: Optional[str] = typer.Option(None, help="CPU expert threads, comma list: 4,8,12,16 (rows for each, one load; default: the profile's)"),
           moe_policy: str = typer.Option("adaptive,fetch,cpu", help="comma list; adaptive-fixed = q* fixed at the profile's (with adaptive listed too, the two take turns repeat by repeat)"),
           routing: str = typer.Option("model", help="comma list of model | uniform | trace:FILE"),
           tokens: int = typer.Option(64, help="decode tokens per repeat"),
           repeats: int = typer.Option(3, help="repeats per policy (median reported)"),
           prompt_tokens: int = typer.Option(32, help="prompt length"),
           contention: int = typer.Option(0, help="also measure with N processes streaming through host RAM"),
           device: str = Device,
           graph: str = typer.Option("on", help="comma list of on | off: CUDA-graph decode rows, eager rows"),
           max_context: int = typer.Option(4096, help="context length"),
           as_json: bool = Json,
           out: Optional[Path] = Out):
    """Decode tok/s for each miss policy, with hit rate, traffic and the bound."""
    from engine.bench.decode import run
    from engine.bench.threads import Census
    from engine.config import parse_policy
    from engine.profile import load_or_measure
    from engine.config import parse_size
    policies = [p.strip() for p in moe_policy.split(",") if p.strip()]
    for p in policies:
        p == "adaptive-fixed" or parse_policy(p)
    from engine.moe.replay import check_routing
    budgets = [parse_size(b.strip()) for b in expert_budget.split(",")]
    for spec in routing.split(","):
        check_routing(spec)
    threads = _ints(cpu_threads, "--cpu-threads") if cpu_threads else [None]
    cfg = engine_config(model, device, "auto", policies[0].replace("-fixed", ""), threads[0], max_context)
    cfg = replace(cfg, expert_budget=budgets[0])
    runner = _load(cfg, model, synthetic, layers)
    prof = load_or_measure(threads[0], say=lambda m: typer.echo(m, err=True))
    graphs = [{"on": None, "off": False}[g.strip()] for g in graph.split(",")]
    rows: list[dict] = []
    census = Census()

    def say(r: dict) -> None:  # --out holds every row measured so far: a bench cut short keeps them
        rt = runner.runtime  # threads: asked for (None: the default); cpu_busy: cores per thread name, warm-up included
        r.update(threads=rt.cpu_threads, pool_threads=rt.cpu.threads, cpu_busy=census.take())
        typer.echo(f"{r['policy']}, {r['routing']}, {r['budget_gib']:.1f} GiB, graph {'on' if r['graph'] else 'off'}, "
                   f"load {r['load']}, {r['pool_threads']} CPU threads: {r['tok_s']:.2f} tok/s, "
                   f"{r['ratio']:.0%} of its bound", err=True)
        rows.append(r)
        if out:
            out.write_text(json.dumps({"rows": rows, "profile": prof}, indent=1))

    for n in threads:
        run(runner, runner.runtime.store, replace(cfg, cpu_threads=n), budgets, policies, routing.split(","), graphs,
            tokens, repeats, prompt_tokens, prof, contention, say=say)
    if as_json:
        typer.echo(json.dumps({"rows": rows, "profile": prof}))
    else:
        _table(rows, prof, runner, cfg)


@app.command("prefill")
@user_errors
def prefill(model: Optional[str] = ModelArg,
            synthetic: Optional[str] = Synthetic,
            layers: Optional[int] = Layers,
            expert_budget: str = typer.Option("auto", help="device memory for the expert cache, e.g. 8GiB"),
            cpu_threads: Optional[int] = Threads,
            mode: str = typer.Option("stream,routed,adaptive", help="comma list of prefill modes"),
            lengths: str = typer.Option("1024,4096,16384", help="comma list of cold prompt lengths"),
            follow_up: int = typer.Option(200, help="tokens of a follow-up after the last (cached) prompt; 0 = none"),
            prefill_chunk: int = typer.Option(2048, help="tokens per prefill chunk"),
            device: str = Device,
            as_json: bool = Json,
            out: Optional[Path] = Out):
    """Time to first token per prefill mode, beside the PCIe streaming bound."""
    from engine.bench.prefill import run
    from engine.moe.prefill import PREFILL_MODES
    from engine.profile import load_or_measure
    modes = [m.strip() for m in mode.split(",")]
    from engine.errors import UserError
    if bad := [m for m in modes if m not in PREFILL_MODES]:
        raise UserError(f"unknown --mode {bad[0]!r}; choose from {', '.join(PREFILL_MODES)}")
    sizes = [int(n) for n in lengths.split(",")]
    cfg = engine_config(model, device, expert_budget, "adaptive", cpu_threads, max(sizes) + follow_up + 16,
                        prefill_chunk=prefill_chunk)
    runner = _load(cfg, model, synthetic, layers)
    prof = load_or_measure(cpu_threads, say=lambda m: typer.echo(m, err=True))
    rows = run(runner, cfg, modes, sizes, follow_up, prof)
    if out:
        out.write_text(json.dumps({"rows": rows, "profile": prof}, indent=1))
    if as_json:
        typer.echo(json.dumps({"rows": rows, "profile": prof}))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"prefill: {runner.cfg.num_layers} layers x {runner.cfg.num_experts} experts, chunk {prefill_chunk}")
    for col in ("mode", "prompt", "tokens", "TTFT s", "streaming bound s", "TTFT / bound", "layers streamed", "moved GiB"):
        t.add_column(col, justify="left" if col in ("mode", "prompt") else "right")
    for r in rows:
        t.add_row(r["mode"], r["prompt"], str(r["tokens"]), f"{r['ttft_s']:.3f}", f"{r['bound_s']:.3f}",
                  f"{r['ttft_s'] / r['bound_s']:.2f}", str(r["streamed_layers"]), f"{r['moved_gib']:.2f}")
    Console(width=max(150, Console().width)).print(t)


def _ints(text: str, option: str) -> list[int]:
    """'1024,16384' -> [1024, 16384]: a comma list of positive counts."""
    from engine.errors import UserError
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"cannot read {option} {text!r}; give a comma list of positive numbers like 1,4,8")
    return [int(p) for p in parts]


def _load(cfg, model: Optional[str], synthetic: Optional[str], layers: Optional[int]):
    """The runner to measure, with a progress bar while its experts load (or are built)."""
    from engine.loader import load_runner, load_synthetic
    from engine.resolve import ensure_ftw
    bar = Progress()
    try:
        return load_synthetic(cfg, synthetic, layers, progress=bar) if synthetic else \
            load_runner(cfg, ensure_ftw(model), bar)
    finally:
        bar.close()


def _table(rows: list[dict], prof: dict, runner, cfg) -> None:
    from rich.console import Console
    from rich.table import Table
    mib = 2**20
    t = Table(title=f"decode: {runner.cfg.num_layers} layers x {runner.cfg.num_experts} experts, "
                    f"top-{runner.cfg.router.top_k}, expert {runner.runtime.store.layout.slot_bytes / mib:.1f} MiB")
    for col in ("graph", "routing", "budget GiB", "policy", "load", "threads", "tok/s", "hit rate", "fetched/tok", "CPU/tok", "PCIe MiB/tok",
                "CPU MiB/tok", "q*", "bound tok/s", "of bound"):
        t.add_column(col, justify="left" if col in ("routing", "policy", "load") else "right")
    for r in rows:
        t.add_row("on" if r["graph"] else "off", r["routing"], f"{r['budget_gib']:.1f}", r["policy"], r["load"], str(r["pool_threads"]), f"{r['tok_s']:.2f}", f"{r['hit_rate']:.1%}", f"{r['fetched']:.2f}",
                  f"{r['cpu']:.2f}", f"{r['bytes_filled'] / mib:.1f}", f"{r['bytes_cpu'] / mib:.1f}",
                  f"{r['q_star']:.2f}", f"{r['bound_tok_s']:.2f}", f"{r['ratio']:.0%}")
    con = Console(width=max(150, Console().width))
    con.print(t)
    p = prof
    con.print(f"B_P {p['h2d_concurrent_gbps'] or 0:.1f} GB/s, B_H {p['cpu_expert_concurrent_gbps']:.1f} GB/s "
                    f"(concurrent, {'quick' if p.get('quick') else 'saved'} profile)")
