"""Semantic anchors: token positions where an agent's context is likely to be cut or edited
later (the end of a thinking segment, the start and end of a tool call or tool response, the end
of a turn), found from the chat template's special tokens. Hybrid models checkpoint their
recurrent state there (engine.kv.checkpoints), since a recurrent state cannot be cut anywhere
else. Position p means "after tokens[:p]"."""
from __future__ import annotations

from dataclasses import dataclass

GAP = 8  # anchors closer than this to the previous one are skipped (one checkpoint serves both)
OPENERS = ("<|im_start|>", "<|im_end|>", "<think>", "<tool_call>", "<tool_response>")  # anchor before
CLOSERS = ("</think>", "</tool_call>", "</tool_response>")                              # anchor after


@dataclass(frozen=True)
class Anchors:
    open: frozenset[int]
    close: frozenset[int]

    @staticmethod
    def from_tokenizer(tok) -> "Anchors":
        """The anchor tokens this tokenizer has as single tokens (a transformers tokenizer)."""
        vocab = tok.get_vocab()
        pick = lambda names: frozenset(vocab[n] for n in names if n in vocab)  # noqa: E731
        return Anchors(pick(OPENERS), pick(CLOSERS))

    def at(self, tokens: list[int], p: int) -> bool:
        return (p < len(tokens) and tokens[p] in self.open) or (p > 0 and tokens[p - 1] in self.close)

    def positions(self, tokens: list[int], lo: int, hi: int) -> list[int]:
        """Anchors p with lo < p <= hi, each at least GAP after the one before."""
        out: list[int] = []
        for p in range(lo + 1, hi + 1):
            if self.at(tokens, p) and p - (out[-1] if out else lo) >= GAP:
                out.append(p)
        return out
