"""The LLM facade: load a model, then generate token ids or stream text; owns the step loop and
the statistics a user sees after each answer."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

from engine import dist
from engine.config import EngineConfig, SamplingParams
from engine.constrain import Grammars
from engine.elastic import check_elastic, elastic_experts
from engine.errors import UserError
from engine.kv.anchors import Anchors
from engine.kv.checkpoints import HybridPrefixCache
from engine.loader import load_runner, pick_device
from engine.moe.cache import CacheStats
from engine.resolve import ensure_ftw, model_key
from engine.sampling import model_defaults
from engine.scheduler import Scheduler, Sequence
from engine.tokenizer import StopText, Tokenizer


@dataclass
class GenStats:
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cache: CacheStats = field(default_factory=CacheStats)  # what this answer did to the expert cache
    cache_occupancy: float = 0.0
    cache_bytes: int = 0                # the expert cache's size at the end of the answer
    q_star: float = 0.0                 # current split: share of misses fetched
    b_p_gbps: float | None = None       # current online estimates (None: not estimated)
    b_h_gbps: float | None = None
    graph_steps: int = 0                # decode steps that ran as a captured CUDA graph
    world_size: int = 1                 # ranks whose experts these counters sum (q*, B_P, B_H: their mean)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return (self.output_tokens - 1) / self.decode_s if self.decode_s and self.output_tokens > 1 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        c = d.pop("cache")
        return {**d, "expert_hits": c.pop("hits"), "expert_misses": c.pop("misses"), **c,
                "prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s, "hit_rate": self.cache.hit_rate}


def open_model(config: EngineConfig, path, progress: Callable[[str, int, int], None] | None = None,
               say: Callable[[str], None] = lambda msg: None):
    """One rank's runner for the FTW directory `path`, with q* from this machine's profile under
    the adaptive policy."""
    runner = load_runner(config, path, progress)
    if config.moe_policy == "adaptive":
        from engine.profile import load_or_measure
        runner.runtime.qstar.use_profile(load_or_measure(config.cpu_threads, say=say, fmt=runner.runtime.store.layout.dtype))
    return runner


class LLM:
    def __init__(self, config: EngineConfig, progress: Callable[[str, int, int], None] | None = None,
                 say: Callable[[str], None] = lambda msg: None):
        check_elastic(config, pick_device(config.device))
        path = ensure_ftw(config.model, progress=(lambda d, t: progress("convert", d, t)) if progress else None)
        with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:  # beside the weights' load
            tokenizer = pool.submit(Tokenizer, path)
            self.runner = dist.load(config, open_model, path, local={"progress": progress, "say": say})
            self.tokenizer = tokenizer.result()
        self.name = config.model or "demo"
        self.source, self.path = model_key(config.model), path.resolve()  # what `run` matches a server by
        self.sampling_defaults = model_defaults(path)
        r = self.runner
        self.grammars = Grammars(self.tokenizer.tok, self.tokenizer.eos_ids)
        self.scheduler = Scheduler(r, self.tokenizer.eos_ids, config.max_running, r.prefill_chunk,
                                   grammars=self.grammars, anchors=Anchors.from_tokenizer(self.tokenizer.tok))
        self.elastic = elastic_experts(r, self.scheduler, config)  # the expert budget while serving
        self.stats = GenStats()

    @property
    def cache_stats(self) -> CacheStats:
        """Expert-cache counters since load, summed over ranks."""
        return dist.cache_totals(self.runner)["stats"]

    def server_stats(self) -> dict:
        t, reports = self.scheduler.totals, dist.on_ranks(self.runner, dist.cache_report)
        agg = dist.combine(reports)
        ranks = [{"expert_hit_rate": r["stats"].hit_rate, "q_star": r["q_star"], "cache_slots": r["slots"],
                  "cache_occupancy": r["owned"] / r["slots"]} for r in reports]
        return {"prefill_tok_s": t["prefill_tokens"] / t["prefill_s"] if t["prefill_s"] else 0.0,
                "decode_tok_s": t["decode_tokens"] / t["decode_s"] if t["decode_s"] else 0.0,
                **t, **self.elastic.stats(), "expert_hit_rate": agg["stats"].hit_rate, **asdict(agg["stats"]),
                "q_star": agg["q_star"], "cache_occupancy": agg["occupancy"], "cache_slots": agg["slots"],
                "world_size": len(reports), "ranks": ranks, "kv_pages_used": self.runner.kv.used,
                "kv_pages_total": self.runner.kv.n_pages,
                **({"kv_sliding_pages_used": sl.used, "kv_sliding_pages_total": sl.n_pages}
                   if (sl := self.runner.kv.sliding) else {}),
                "prefix_hit_tokens": self.scheduler.prefix.hit_tokens if self.scheduler.prefix else 0,
                "prefix_cached_pages": self.scheduler.prefix.pages if self.scheduler.prefix else 0,
                "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "graph_steps": self.runner.graphs.replays if self.runner.graphs else 0,
                **(self.scheduler.prefix.stats() if isinstance(self.scheduler.prefix, HybridPrefixCache) else {})}

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise UserError("the prompt is empty; give some text")
        limit, trained = self.runner.max_context, self.runner.cfg.max_position_embeddings
        if len(ids) >= limit:
            fix = (f"shorten it ({trained} tokens is the model's trained length; a larger --max-context does not help)"
                   if limit >= trained else f"shorten it or raise --max-context (up to {trained}, the model's trained length)")
            raise UserError(f"the prompt has {len(ids)} tokens but the context holds {limit}; {fix}")

    def generate(self, prompt: list[int], params: SamplingParams,
                 progress: Callable[[int, int], None] | None = None) -> Iterator[int]:
        """Yield generated token ids (eos included when it ends the answer); progress(done, total)
        is called after each prefill chunk of a prompt longer than one chunk."""
        self.check_prompt(prompt)
        seq = Sequence(prompt, params)
        before, t0 = self.cache_stats, time.perf_counter()
        replays0 = self.runner.graphs.replays if self.runner.graphs else 0
        self.stats = GenStats(prompt_tokens=len(prompt))
        if params.max_tokens == 0:
            return
        self.scheduler.add(seq)
        try:
            while not seq.finish:
                stepped = self.scheduler.step()
                if progress and len(prompt) > self.scheduler.chunk and seq.n_cached <= len(prompt):
                    progress(min(seq.n_cached, len(prompt)), len(prompt))
                for s, tok in stepped:
                    if s is seq:
                        self._tick(t0)
                        yield tok
        finally:
            if not seq.finish:
                self.scheduler.abort(seq)
            self._cache_delta(before)
            self.stats.graph_steps = (self.runner.graphs.replays if self.runner.graphs else 0) - replays0

    def _tick(self, t0: float) -> None:
        st, now = self.stats, time.perf_counter() - t0
        st.output_tokens += 1
        if st.output_tokens == 1:
            st.prefill_s = now
        else:
            st.decode_s = now - st.prefill_s

    def _cache_delta(self, before: CacheStats) -> None:
        st, reports = self.stats, dist.on_ranks(self.runner, dist.cache_report)
        agg = dist.combine(reports)
        st.cache = agg["stats"] - before
        st.cache_occupancy, st.cache_bytes, st.q_star = agg["occupancy"], agg["bytes"], agg["q_star"]
        st.world_size = len(reports)
        if agg["b_h"] is not None:
            st.b_p_gbps, st.b_h_gbps = agg["b_p"] / 1e9, agg["b_h"] / 1e9

    def stream(self, prompt: list[int], params: SamplingParams,
               progress: Callable[[int, int], None] | None = None) -> Iterator[str]:
        """Yield text deltas; stops at eos, max_tokens or a stop string (not included)."""
        dec, stop = self.tokenizer.decoder(), StopText(params.stop)
        for tok in self.generate(prompt, params, progress):
            text, hit = stop.feed(dec.add(tok))
            if text:
                yield text
            if hit:
                return
        if rest := stop.flush():
            yield rest
