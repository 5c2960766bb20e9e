"""The flat description of one forward step: sequences' new tokens back to back."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor     # [T] int64
    positions: torch.Tensor     # [T] int64
    q_lens: list[int]           # new tokens per sequence
    ctx_lens: list[int]         # tokens per sequence after this step
    ctx_lens_t: torch.Tensor    # the same, [B] int32 on the device (decode kernels)
    page_table: torch.Tensor    # [B, max_pages] int32
    slots: torch.Tensor         # [T] int64 KV slot of each new token
    logit_rows: torch.Tensor    # rows of [T] whose logits are wanted
    state_slots: torch.Tensor | None = None  # [B] int64 recurrent-state slot (hybrid models)
    snapshots: tuple[tuple[int, int, int], ...] = ()  # (sequence, offset in its new tokens, checkpoint)
    sliding_table: torch.Tensor | None = None  # [B, max_pages] int32 and [T] int64: as page_table and
    sliding_slots: torch.Tensor | None = None  # slots, in the sliding layers' pool (engine.kv.paged)
    state_out: torch.Tensor | None = None  # [B] int64 slot each sequence's new states go to (None: state_slots)

    @property
    def state_dst(self) -> torch.Tensor | None:
        """The slots the new recurrent states are written to."""
        return self.state_slots if self.state_out is None else self.state_out

    def to(self, device: torch.device | str) -> "ForwardBatch":
        """The same step with its tensors on `device` (how it travels to other ranks)."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    @staticmethod
    def build(seqs: list[tuple[list[int], int, list[int]]], page_size: int,
              device: torch.device, all_logits: bool = False, states: list[int] | None = None,
              snapshots: tuple[tuple[int, int, int], ...] = (),
              sliding: list[list[int]] | None = None, states_out: list[int] | None = None) -> "ForwardBatch":
        """seqs: (new token ids, tokens already in KV, page ids: a list or an int32 array) per
        sequence; states: their recurrent-state slots, read (and written, unless states_out names
        other slots); snapshots: where linear layers save states mid-sequence; sliding: their pages
        in the sliding layers' pool (models with sliding-window layers)."""
        ids, pos, rows, q_lens, ctx_lens = [], [], [], [], []
        for new, start, _ in seqs:
            n = len(new)
            ids += new
            pos += range(start, start + n)
            rows += range(len(ids) - n, len(ids)) if all_logits else [len(ids) - 1]
            q_lens.append(n)
            ctx_lens.append(start + n)

        def t(x, dt=np.int64):  # a copy that does not wait for the stream: a step may run ahead of this one
            return torch.from_numpy(np.asarray(x, dtype=dt)).to(device, non_blocking=True)  # (numpy: ~3x faster)

        def paged(page_lists):  # -> (page table, slot of each new token)
            table = np.zeros((len(page_lists), max(len(p) for p in page_lists)), np.int32)
            for row, pages in zip(table, page_lists):  # numpy converts a list ~4x faster than torch.tensor
                row[:len(pages)] = pages
            at = [np.arange(start, start + len(new)) for new, start, _ in seqs]  # the new tokens' positions
            slots = np.concatenate([row[p // page_size] * page_size + p % page_size for row, p in zip(table, at)])
            return torch.from_numpy(table).to(device, non_blocking=True), \
                torch.from_numpy(slots.astype(np.int64)).to(device, non_blocking=True)
        table, slots = paged([p for _, _, p in seqs])
        sliding_table, sliding_slots = paged(sliding) if sliding is not None else (None, None)
        return ForwardBatch(t(ids), t(pos), q_lens, ctx_lens, t(ctx_lens, np.int32), table, slots, t(rows),
                            None if states is None else t(states), tuple(snapshots), sliding_table, sliding_slots,
                            None if states_out is None else t(states_out))
