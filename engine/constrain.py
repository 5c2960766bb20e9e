"""Constrained decoding: a sequence whose SamplingParams carry a grammar (llguidance's Lark
dialect, which embeds JSON schemas with `%json`) samples only tokens the grammar allows.

llguidance computes the allowed set of the next token on the CPU (an Earley parser over a lazy
lexer: no per-schema precompilation, a few to tens of microseconds per token) as a bitmask of
vocab/32 int32 words; the mask is applied to the sequence's logits row on its device after the
forward (after the CUDA-graph replay), so the captured decode step is the same with or without a
grammar, and a sequence without one costs nothing."""
from __future__ import annotations

import torch

from engine.errors import UserError


class Grammars:
    """The model's tokenizer as llguidance sees it (built on first use) and grammar checks."""

    def __init__(self, hf_tokenizer, eos_ids: set[int]):
        self.hf, self.eos = hf_tokenizer, sorted(eos_ids)
        self._tok = None

    @property
    def tokenizer(self):
        if self._tok is None:
            import llguidance.hf
            self._tok = llguidance.hf.from_tokenizer(self.hf, eos_token=self.eos or None)
        return self._tok

    def check(self, grammar: str) -> None:
        """Raise UserError if the grammar (or a schema in it) cannot be compiled."""
        from llguidance import LLMatcher
        err = LLMatcher.validate_grammar(grammar, self.tokenizer)
        if err:
            raise UserError(f"cannot use this output format: {err.splitlines()[0]}")

    def matcher(self, grammar: str) -> "Constraint":
        return Constraint(self.tokenizer, grammar)


class Constraint:
    """One sequence's grammar state: mask its logits, then advance by the sampled token."""

    def __init__(self, tokenizer, grammar: str):
        from llguidance import LLMatcher
        self.m = LLMatcher(tokenizer, grammar, log_level=0)
        if self.m.is_error():
            raise UserError(f"cannot use this output format: {self.m.get_error().splitlines()[0]}")
        self.bits = torch.zeros((tokenizer.vocab_size + 31) // 32, dtype=torch.int32)
        self.shifts: torch.Tensor | None = None

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with every token the grammar forbids at -inf (a copy: the forward's output
        is an inference tensor, and a CUDA graph's static buffer)."""
        self.m.unsafe_compute_mask_ptr(self.bits.data_ptr(), self.bits.numel() * 4)
        if self.shifts is None or self.shifts.device != logits.device:
            self.shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        words = self.bits.to(logits.device, non_blocking=True)
        allowed = ((words.unsqueeze(-1) >> self.shifts) & 1).view(-1).bool()
        n = min(logits.numel(), allowed.numel())
        out = torch.full_like(logits, float("-inf"))
        out[:n] = logits[:n].masked_fill(~allowed[:n], float("-inf"))
        return out

    def advance(self, token: int) -> None:
        if not self.m.consume_token(token):
            raise RuntimeError(f"token {token} violates the grammar: {self.m.get_error()}")
