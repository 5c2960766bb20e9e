"""Paged KV cache: one pool of fixed-size pages per layer, pages handed out by a ref-counted
allocator so that sequences can share prefix pages."""
from __future__ import annotations

import torch

from engine.errors import UserError


class KVPool:
    """k, v: [L, P, page, Hkv, D]; without values (MLA's latent rows, which attention reads as
    both) v is None. Page 0..P-1 are owned through `alloc`/`release`."""

    def __init__(self, n_layers: int, n_pages: int, page_size: int, n_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device, values: bool = True):
        shape = (n_layers, n_pages, page_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device) if values else None
        self.page_size = page_size
        self.n_pages = n_pages
        self.refs = [0] * n_pages
        self.free = list(range(n_pages - 1, -1, -1))
        self.log: list | None = None  # as StatePool.log: rank 0's copies between steps (engine.dist)

    @property
    def bytes(self) -> int:
        return (1 if self.v is None else 2) * self.k.numel() * self.k.element_size()

    @property
    def used(self) -> int:
        return self.n_pages - len(self.free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free):
            raise UserError(f"KV cache is full ({self.n_pages} pages of {self.page_size} tokens); "
                            "shorten the prompt or raise --max-context")
        pages = [self.free.pop() for _ in range(n)]
        for p in pages:
            self.refs[p] = 1
        return pages

    def share(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] -= 1
            assert self.refs[p] >= 0
            if self.refs[p] == 0:
                self.free.append(p)

    def copy_page(self, src: int, dst: int) -> None:
        """Page dst := page src, every layer (a shared partial page its new owner writes on)."""
        self.k[:, dst].copy_(self.k[:, src])
        if self.v is not None:
            self.v[:, dst].copy_(self.v[:, src])
        if self.log is not None:
            self.log.append(("kv", "copy_page", src, dst))

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor | None, slots: torch.Tensor) -> None:
        """k, v [T, Hkv, D] (v None without values) into flat token slots [T] (page * page_size + offset)."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        if v is not None:
            self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)
