"""Routing overrides that replace the router's expert ids (engine.moe.router) for benchmarks,
and trace recording (ExpertRuntime.routing). A trace is an int16 .npy array
[tokens, moe_layers, K] of expert ids; replaying one on random weights emulates a real model's
expert locality. `uniform` draws K distinct experts per token uniformly (no locality)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.errors import UserError


class Replay:
    """Replace the router's ids with a recorded trace, token by token (cycling at the end)."""

    def __init__(self, path: Path, n_layers: int, n_experts: int, top_k: int):
        try:
            trace = np.load(path)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read routing trace {path} ({e}); record one with `freetoken run --record-trace`") from None
        if trace.ndim != 3 or trace.shape[1] < n_layers or trace.shape[2] != top_k or trace.max() >= n_experts:
            raise UserError(f"trace {path} has shape {trace.shape} and max id {trace.max()}; this model needs "
                            f"[tokens, >= {n_layers}, {top_k}] with ids < {n_experts}")
        self.trace = torch.from_numpy(trace[:, :n_layers].transpose(1, 0, 2).astype(np.int64))  # [L, tokens, K]
        self.cursor = torch.zeros(1, dtype=torch.int64)
        self.rows = None

    def __call__(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        """Device ops only (the cursor is a tensor), so replay works inside a CUDA graph; the
        tokens' trace rows are found at the first MoE layer and indexed in every layer."""
        if self.trace.device != ids.device:
            self.trace, self.cursor = self.trace.to(ids.device), self.cursor.to(ids.device)
        if layer == 0:
            self.rows = (self.cursor + torch.arange(ids.shape[0], device=ids.device)) % self.trace.shape[1]
            self.cursor += ids.shape[0]
        return self.trace[layer][self.rows]


class Uniform:
    # draws of one step's layers together at most (decode-sized steps; a prefill chunk's per layer)
    STEP_DRAWS = 1 << 20

    def __init__(self, n_experts: int, n_layers: int = 1, seed: int = 0):
        self.n, self.layers, self.gen = n_experts, n_layers, torch.Generator().manual_seed(seed)
        self.step = None

    def __call__(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        """The k largest of E uniform draws per token: on CUDA in the router's one kernel (torch's
        topk takes three), on the default generator, which is graph-safe, and for a decode-sized
        step every layer's at its first MoE layer (the draw and the kernel once a step, not ~5 us
        a layer that no model's routing pays)."""
        T, K = ids.shape
        if ids.device.type == "cpu":
            return torch.rand(T, self.n, generator=self.gen).topk(K, dim=-1).indices
        from freetoken_kernels.router_triton import route
        if T * self.layers * self.n > self.STEP_DRAWS:
            return route(torch.rand(T, self.n, device=ids.device), K, "sigmoid", False, 1.0)[1]
        if layer == 0:
            draws = torch.rand(self.layers * T, self.n, device=ids.device)
            self.step = route(draws, K, "sigmoid", False, 1.0)[1].view(self.layers, T, K)
        return self.step[layer]


class Recorder:
    """Collect the ids every MoE layer sees; save() writes the trace."""

    def __init__(self, path: Path, n_layers: int):
        self.path, self.steps = Path(path), [[] for _ in range(n_layers)]

    def __call__(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        self.steps[layer].append(ids.to("cpu", torch.int16))
        return ids

    def save(self) -> None:
        trace = torch.stack([torch.cat(s) for s in self.steps], dim=1)  # [tokens, L, K]
        np.save(self.path, trace.numpy())


def check_routing(spec: str) -> None:
    """Refuse a bad --routing value before any heavy work."""
    if spec.startswith("trace:") and not Path(spec[6:]).is_file():
        raise UserError(f"cannot read routing trace {spec[6:]} (no such file); "
                        "record one with `freetoken run --record-trace FILE`")
    if spec not in ("model", "uniform") and not spec.startswith("trace:"):
        raise UserError(f"unknown --routing {spec!r}; choose model, uniform or trace:FILE")


def make_routing(spec: str, n_layers: int, n_experts: int, top_k: int, seed: int = 0):
    """'model' -> None (the router decides); 'uniform'; 'trace:FILE'."""
    check_routing(spec)
    if spec == "model":
        return None
    if spec == "uniform":
        return Uniform(n_experts, n_layers, seed)
    return Replay(Path(spec[6:]), n_layers, n_experts, top_k)
