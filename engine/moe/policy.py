"""Miss policies. Every policy reduces to one number per layer step: q, the share of the
step's misses fetched into the cache (the rest run on the CPU from host memory).

adaptive: q = q* = B_P / (B_P + B_H) (engine.moe.qstar); fetch: q = 1; cpu: q = 0 (hits still
run from the cache); static:N: the experts of the first N MoE layers always run on the CPU
(never cached), the other layers fetch. Long prefill chunks (scan mode, see ExpertRuntime.forward)
fetch (q = 1) except in static CPU layers; short ones split like decode."""
from __future__ import annotations

from engine.config import parse_policy


class MissPolicy:
    def __init__(self, name: str, n_layers: int, layers_that_fit: int):
        self.name = parse_policy(name)
        self.static_layers = 0
        if name.startswith("static:"):
            arg = name.split(":")[1]
            self.static_layers = max(0, n_layers - layers_that_fit) if arg == "auto" else min(int(arg), n_layers)

    def q(self, layer: int, scan: bool, q_star: float) -> float:
        """The fetched share of a layer step's misses; scan = a long prefill chunk; q_star: the
        current q* (engine.moe.qstar)."""
        if layer < self.static_layers:
            return 0.0
        if scan or self.name == "fetch" or self.static_layers:
            return 1.0
        return 0.0 if self.name == "cpu" else q_star

    def may_cpu(self, layer: int) -> bool:
        """Whether a decode step of this layer can ever send a miss to the CPU (graph capture
        includes the CPU branch only where it can)."""
        return layer < self.static_layers or self.name in ("adaptive", "cpu")

    def cacheable(self, layer: int) -> bool:
        return layer >= self.static_layers
