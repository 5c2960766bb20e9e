"""`freetoken run [MODEL]`: one-shot answers (--prompt or piped stdin) and interactive chat."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from freetoken_cli.common import (Budget, Checkpoints, Chunk, Context, Device, Elastic, Gpus, ModelArg, NoGraph, Policy,
                                  Progress, Threads, Verify, WorldSize, check_writable, engine_config, start_expert_read,
                                  user_errors)


@user_errors
def run(model: Optional[str] = ModelArg,
        prompt: Optional[str] = typer.Option(None, "--prompt", "-p", help="prompt text; piped stdin is appended"),
        max_tokens: int = typer.Option(512, help="most tokens to generate"),
        temperature: Optional[float] = typer.Option(None, help="0 = greedy [default: the model's, else 0]"),
        top_p: Optional[float] = typer.Option(None, help="nucleus sampling mass [default: the model's, else 1]"),
        top_k: Optional[int] = typer.Option(None, help="sample among the k most likely tokens, 0 = off "
                                            "[default: the model's, else 0]"),
        seed: Optional[int] = typer.Option(None, help="sampling seed"),
        raw: bool = typer.Option(False, "--raw", help="no chat template: continue the prompt text"),
        system: Optional[str] = typer.Option(None, help="system message"),
        ignore_eos: bool = typer.Option(False, "--ignore-eos", help="keep generating past end-of-sequence"),
        expert_budget: str = Budget,
        device: str = Device,
        moe_policy: str = Policy,
        cpu_threads: Optional[int] = Threads,
        max_context: int = Context,
        no_graph: bool = NoGraph,
        prefill_chunk: str = Chunk,
        verify: bool = Verify,
        elastic: Optional[bool] = Elastic,
        state_checkpoints: int = Checkpoints,
        world_size: int = WorldSize,
        gpus: Optional[str] = Gpus,
        record_trace: Optional[Path] = typer.Option(None, help="save the routed expert ids (.npy) for bench --routing trace:FILE"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object with text, token ids and stats"),
        no_server: bool = typer.Option(False, "--no-server", help="load the model here even when a "
                                       "`freetoken serve` of it answers (one-shot answers use one by default)"),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="print stats to stderr")):
    """Chat in a terminal, or answer one prompt (--prompt and/or piped stdin) printing only the answer.
    A one-shot answer comes from a `freetoken serve` of the same model when one answers on
    FREETOKEN_HOST:FREETOKEN_PORT (default 127.0.0.1:8000), without loading the model."""
    from engine.config import SamplingParams, launched
    given = {k: v for k, v in dict(temperature=temperature, top_p=top_p, top_k=top_k).items() if v is not None}
    params = SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos, **given)  # checked before loading
    cfg = engine_config(model, device, expert_budget, moe_policy, cpu_threads, max_context,
                        no_graph or record_trace is not None,  # recording reads ids on the host
                        prefill_chunk=prefill_chunk, verify=verify, elastic=elastic,
                        state_checkpoints=state_checkpoints, world_size=world_size, gpus=gpus)
    if launched():  # under torchrun, ranks other than 0 follow rank 0 from here (torch is imported only then)
        from engine.dist import follow_if_worker
        follow_if_worker(cfg)
    interactive = prompt is None and sys.stdin is not None and sys.stdin.isatty()
    text = None if interactive else _read_prompt(prompt)
    if record_trace:
        check_writable(record_trace, "--record-trace")
    if not (interactive or no_server or as_json or record_trace or cfg.ranks > 1):  # those need the engine here
        from freetoken_cli import client
        if server := client.find_server(model):
            _print(client.stream(*server, text, raw, _messages(system, text), params))
            if verbose:
                typer.echo(f"(answered by the server at {server[0]}; its /v1/stats has the engine's statistics)", err=True)
            return
    start_expert_read(cfg)
    from engine.llm import LLM
    bar = Progress(quiet=as_json)
    try:
        llm = LLM(cfg, bar, say=lambda m: typer.echo(m, err=True) if verbose else None)
    finally:
        bar.close()
    # what the command line leaves out comes from the model's generation_config.json
    params = replace(params, **{k: v for k, v in llm.sampling_defaults.items() if k not in given})
    if record_trace:
        from engine.moe.replay import Recorder
        llm.runner.runtime.routing = Recorder(record_trace, len(llm.runner.runtime.store.banks))
    try:
        _answer(llm, interactive, text, raw, system, params, as_json, verbose)
    finally:
        if record_trace:
            llm.runner.runtime.routing.save()


def _answer(llm, interactive: bool, text, raw: bool, system, params, as_json: bool, verbose: bool) -> None:
    if interactive:
        from freetoken_cli.chat import Chat
        Chat(llm, params, system, verbose).loop()
        return
    ids = llm.tokenizer.encode(text) if raw else llm.tokenizer.chat(_messages(system, text))
    if as_json:
        toks = list(llm.generate(ids, params))
        out = {"text": llm.tokenizer.decode(toks), "token_ids": toks, "stats": llm.stats.as_dict()}
        typer.echo(json.dumps(out))
        return
    _print(llm.stream(ids, params))
    if verbose:
        from freetoken_cli.stats import print_stats
        print_stats(llm.stats)


def _print(deltas) -> None:
    for delta in deltas:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")


def _messages(system: Optional[str], text: str) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def _read_prompt(prompt: Optional[str]) -> str:
    from engine.errors import UserError
    piped = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    if prompt is None and piped is None:
        raise UserError("no prompt: pass --prompt TEXT or pipe text on stdin (interactive chat needs a terminal)")
    text = "\n\n".join(p for p in (prompt, piped) if p and p.strip())
    if not text:
        raise UserError("the prompt is empty: give some text with --prompt or on stdin")
    return text
