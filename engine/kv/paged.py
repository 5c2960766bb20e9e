"""Paged KV cache: one pool of fixed-size pages per layer, pages handed out by a ref-counted
allocator so that sequences can share prefix pages. The sliding-window layers (every other
layer of gpt-oss) keep their KV in a second, smaller pool that holds only each sequence's window."""
from __future__ import annotations

from contextlib import contextmanager

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
        self.sliding: SlidingPool | None = None  # the sliding-window layers' pages (set by the loader)

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

    @contextmanager
    def scratch(self, n: int):
        """Pages of one sequence of n tokens from position 0, prefilled in one step outside the
        scheduler (benches, tests), given back after -> (pages, its sliding layers' pages or None:
        only the window of its end, as the scheduler grows them)."""
        pages = self.alloc(-(-n // self.page_size))
        sliding = None
        if self.sliding:
            sliding = []
            self.sliding.grow(sliding, n)
        try:
            yield pages, sliding
        finally:
            self.release(pages)
            if sliding:
                self.sliding.release(sliding)

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


class SlidingPool(KVPool):
    """The KV pages of the sliding-window layers. A sequence holds them by the same logical page
    numbers as its pages in the main pool, but only the pages its next queries can read: those
    wholly before the window point at `dummy`, a page the pool keeps for itself, which no kernel
    reads (the window masks those positions) and which share and release leave alone."""

    def __init__(self, window: int, *args, **kw):
        super().__init__(*args, **kw)
        self.window = window
        self.dummy = self.alloc(1)[0]

    @staticmethod
    def held(window: int, page_size: int) -> int:
        """Pages a sequence holds at most in a decode step (in a prefill chunk's, twice that)."""
        return (window + page_size - 2) // page_size + 2

    def first_live(self, n: int) -> int:
        """The first logical page a sequence with n tokens in KV still needs: the window of a query
        at the page boundary at or before n (where a prefix match of it resumes), which also
        covers every query from n on."""
        ps = self.page_size
        return max(0, n // ps * ps - self.window + 1) // ps

    def wanted(self, pages: list[int], n: int) -> int:
        """New pages `grow` takes for the sequence of `pages` to hold n tokens."""
        return max(0, -(-n // self.page_size) - max(len(pages), self.first_live(n)))

    def grow(self, pages: list[int], n: int) -> None:
        """Extend `pages` in place to hold n tokens: the dummy page for those behind the window of
        n (the step that writes them reads them as computed), new pages from there on."""
        new = self.alloc(self.wanted(pages, n))
        pages += [self.dummy] * (max(len(pages), self.first_live(n)) - len(pages)) + new

    def slide(self, pages: list[int], start: int, n: int) -> None:
        """After a step from `start` to n tokens in KV: release, in place, the pages it left behind
        the window (before it, those behind start's window were released already)."""
        for i in range(self.first_live(start), self.first_live(n)):
            self.release([pages[i]])
            pages[i] = self.dummy

    def share(self, pages: list[int]) -> None:
        super().share([p for p in pages if p != self.dummy])

    def release(self, pages: list[int]) -> None:
        super().release([p for p in pages if p != self.dummy])
