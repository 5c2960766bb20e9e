"""Which routed experts this rank holds when experts are spread over ranks (engine.dist), and the
sum that joins the ranks' partial outputs. The single-process engine is the one-rank case.

Ownership is round-robin over the flat index: rank (l * E + e) % W holds expert e of MoE layer l.
Every rank gets E // W or E // W + 1 experts of every layer, so each layer step's routed work
spreads over all ranks, and the leftovers of E % W rotate from layer to layer, so host memory
stays balanced too. Within a layer a rank's experts are e = c, c + W, c + 2W, ..., so e // W is
a dense local id: a rank's store, cache and tables see a model of ceil(E / W) experts per layer
(the last id of a layer is padding where the rank has one fewer), and routes to other ranks'
experts become id -1, which the plan, the expert kernels and the CPU executor skip.

engine.dist records this process's place in a group here (join), so that the loader builds the
store of its rank's experts (this_rank)."""
from __future__ import annotations

from typing import Callable

import torch


class ExpertShard:
    """This rank's part of the routed experts; reduce(out) sums out [T, H] over ranks in place
    (None: one rank)."""

    def __init__(self, rank: int, world: int, n_experts: int, reduce: Callable | None = None):
        assert 0 <= rank < world and (world == 1 or reduce is not None)
        self.rank, self.world, self.n_experts = rank, world, n_experts
        self.n_local = -(-n_experts // world)  # local ids per layer
        self._reduce = reduce

    def owned(self, layer: int) -> list[int]:
        """Expert ids of MoE layer `layer` that this rank holds, in local-id order."""
        first = (self.rank - layer * self.n_experts) % self.world
        return list(range(first, self.n_experts, self.world))

    def local(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        """ids [T, K] of the router -> local ids, -1 for routes another rank computes (device ops
        only: graph-capturable)."""
        if self.world == 1:
            return ids
        mine = (ids + layer * self.n_experts) % self.world == self.rank
        return torch.where(mine, ids // self.world, -1)

    def reduce(self, out: torch.Tensor) -> torch.Tensor:
        """The layer's routed output: this rank's partial sum plus every other rank's."""
        if self.world > 1:
            self._reduce(out)
        return out


_place: tuple[int, int, Callable] | None = None  # (rank, world, all-reduce) of this process in a group


def join(rank: int, world: int, reduce: Callable) -> None:
    """engine.dist: this process is rank `rank` of `world`, summing outputs with reduce(out)."""
    global _place
    _place = (rank, world, reduce)


def leave() -> None:
    global _place
    _place = None


def this_rank(n_experts: int) -> ExpertShard:
    """This process's share of a model's routed experts: all of them outside a group."""
    return ExpertShard(*_place[:2], n_experts, _place[2]) if _place else ExpertShard(0, 1, n_experts)
