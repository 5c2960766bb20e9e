"""The model's own tokenizer and chat template (through transformers), end-of-sequence ids, and
incremental detokenisation that never splits a multi-byte character."""
from __future__ import annotations

import json
from pathlib import Path

from engine.errors import UserError


class Tokenizer:
    def __init__(self, path: Path):
        from transformers import AutoTokenizer
        try:
            self.tok = AutoTokenizer.from_pretrained(str(path))
        except Exception as e:  # transformers raises many types for missing/corrupt files
            raise UserError(f"cannot load the tokenizer in {path} ({type(e).__name__}: {e}); "
                            "the model directory needs tokenizer files") from None
        self.tok.model_max_length = 2**62  # the engine checks the context; no second warning from transformers
        self.eos_ids = self._eos_ids(path)

    def _eos_ids(self, path: Path) -> set[int]:
        ids = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()
        gen = path / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return ids

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tok.chat_template)

    def encode(self, text: str, special: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=special)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        if not self.has_chat_template:
            raise UserError("this model has no chat template; use --raw for plain text continuation")
        text = self.tok.apply_chat_template(messages, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    def decoder(self, skip_special: bool = True) -> "IncrementalDecoder":
        return IncrementalDecoder(self, skip_special)


class IncrementalDecoder:
    """Feed token ids one by one; get back only text that is complete (no partial UTF-8)."""

    def __init__(self, tok: Tokenizer, skip_special: bool = True):
        self.tok, self.skip = tok, skip_special
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] is context already emitted

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self.prefix:self.read], self.skip)
        text = self.tok.decode(self.ids[self.prefix:], self.skip)
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(before):]
        return ""


class StopText:
    """Hold back just enough text to never emit the start of a stop string."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops, self.buf = [s for s in stops if s], ""
        self.hold = max((len(s) for s in self.stops), default=1) - 1

    def feed(self, text: str) -> tuple[str, str | None]:
        """-> (text safe to emit, the stop string that ended the text or None)."""
        self.buf += text
        found = [(i, s) for s in self.stops if (i := self.buf.find(s)) >= 0]
        if found:
            cut, hit = min(found)
            out, self.buf = self.buf[:cut], ""
            return out, hit
        n = max(0, len(self.buf) - self.hold)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out, None

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out
