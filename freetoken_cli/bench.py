"""`freetoken bench decode|prefill|agent`: measured throughput beside the physical bound, and an
agent session's time to first token with reuse on and off."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import ModelArg, Progress, engine_config, user_errors

Synthetic = typer.Option(None, help="random weights of a real shape: qwen3-30b-a3b, qwen3-235b-a22b, "
                                     "qwen3.5-35b-a3b, tiny, tiny-hybrid")
Layers = typer.Option(None, help="with --synthetic: keep only the first N layers")
Threads = typer.Option(None, help="CPU expert threads")
Device = typer.Option("auto", help="cuda | cpu | auto")
Json = typer.Option(False, "--json", help="print rows as JSON")
Out = typer.Option(None, help="also write the rows and profile as JSON to this file")

app = typer.Typer(help="Benchmarks: decode throughput per miss policy, prefill TTFT, agent sessions.",
                  no_args_is_help=True)


@app.command("decode")
@user_errors
def decode(model: Optional[str] = ModelArg,
           synthetic: Optional[str] = Synthetic,
           layers: Optional[int] = Layers,
           expert_budget: str = typer.Option("auto", help="expert cache size(s), comma list: 4GiB,8GiB,auto"),
           cpu_threads: Optional[int] = Threads,
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
    cfg = engine_config(model, device, "auto", policies[0].replace("-fixed", ""), cpu_threads, max_context)
    cfg = replace(cfg, expert_budget=budgets[0])
    runner = _load(cfg, model, synthetic, layers)
    prof = load_or_measure(cpu_threads, say=lambda m: typer.echo(m, err=True))
    graphs = [{"on": None, "off": False}[g.strip()] for g in graph.split(",")]
    rows: list[dict] = []

    def say(r: dict) -> None:  # --out holds every row measured so far: a bench cut short keeps them
        typer.echo(f"{r['policy']}, {r['routing']}, {r['budget_gib']:.1f} GiB, graph {'on' if r['graph'] else 'off'}, "
                   f"load {r['load']}: {r['tok_s']:.2f} tok/s, {r['ratio']:.0%} of its bound", err=True)
        rows.append(r)
        if out:
            out.write_text(json.dumps({"rows": rows, "profile": prof}, indent=1))

    run(runner, runner.runtime.store, cfg, budgets, policies, routing.split(","), graphs, tokens, repeats,
        prompt_tokens, prof, contention, say=say)
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


@app.command("agent")
@user_errors
def agent(model: Optional[str] = ModelArg,
          synthetic: Optional[str] = Synthetic,
          layers: Optional[int] = Layers,
          expert_budget: str = typer.Option("auto", help="device memory for the expert cache, e.g. 8GiB"),
          cpu_threads: Optional[int] = Threads,
          system_tokens: int = typer.Option(2000, help="tokens of the session's system prompt"),
          queries: int = typer.Option(2, help="user queries"),
          steps: int = typer.Option(3, help="tool calls per query"),
          response_tokens: int = typer.Option(300, help="tokens of each tool response"),
          state_checkpoints: int = typer.Option(16, min=0, help="hybrid models: checkpoint pool size"),
          prefill_chunk: str = typer.Option("auto", help="tokens per prefill chunk"),
          device: str = Device,
          as_json: bool = Json,
          out: Optional[Path] = Out):
    """An agent session, turn by turn: TTFT and reused tokens with reuse on and off (hybrid models:
    state checkpoints; others: the prefix cache)."""
    from engine.bench.agent import Shape, run
    shape = Shape(system=system_tokens, queries=queries, steps=steps, response=response_tokens)
    cfg = engine_config(model, device, expert_budget, "adaptive", cpu_threads, 32768, prefill_chunk=prefill_chunk,
                        state_checkpoints=state_checkpoints)
    runner = _load(cfg, model, synthetic, layers)
    rows: list[dict] = []

    def say(r: dict) -> None:
        typer.echo(f"turn {r['turn']}: {r['prompt_tokens']} tokens, TTFT {r['ttft_on_s']:.3f} s "
                   f"(reused {r['reused_on']}) vs {r['ttft_off_s']:.3f} s (reused {r['reused_off']})", err=True)
        rows.append(r)
        if out:
            out.write_text(json.dumps({"rows": rows}, indent=1))
    run(runner, shape, say)
    if as_json:
        typer.echo(json.dumps({"rows": rows}))
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"agent session: {runner.cfg.num_layers} layers, reuse = {rows[0]['reuse']}")
    for col in ("turn", "prompt tokens", "reused (on)", "TTFT on s", "reused (off)", "TTFT off s", "off / on"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["turn"]), str(r["prompt_tokens"]), str(r["reused_on"]), f"{r['ttft_on_s']:.3f}",
                  str(r["reused_off"]), f"{r['ttft_off_s']:.3f}", f"{r['ttft_off_s'] / r['ttft_on_s']:.2f}x")
    Console(width=max(120, Console().width)).print(t)


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
    for col in ("graph", "routing", "budget GiB", "policy", "load", "tok/s", "hit rate", "fetched/tok", "CPU/tok", "PCIe MiB/tok",
                "CPU MiB/tok", "q*", "bound tok/s", "of bound"):
        t.add_column(col, justify="left" if col in ("routing", "policy", "load") else "right")
    for r in rows:
        t.add_row("on" if r["graph"] else "off", r["routing"], f"{r['budget_gib']:.1f}", r["policy"], r["load"], f"{r['tok_s']:.2f}", f"{r['hit_rate']:.1%}", f"{r['fetched']:.2f}",
                  f"{r['cpu']:.2f}", f"{r['bytes_filled'] / mib:.1f}", f"{r['bytes_cpu'] / mib:.1f}",
                  f"{r['q_star']:.2f}", f"{r['bound_tok_s']:.2f}", f"{r['ratio']:.0%}")
    con = Console(width=max(150, Console().width))
    con.print(t)
    p = prof
    con.print(f"B_P {p['h2d_concurrent_gbps'] or 0:.1f} GB/s, B_H {p['cpu_expert_concurrent_gbps']:.1f} GB/s "
                    f"(concurrent, {'quick' if p.get('quick') else 'saved'} profile)")
