"""Recurrent state of hybrid models' linear-attention layers, beside the KV pages: per running
sequence one slot of conv state (the last K-1 conv inputs, in the compute dtype) and recurrent
state (fp32) in every linear layer, on the device at fixed addresses (graph decode indexes them);
and `saved` checkpoint slots, copies of a sequence's states at some position, in host memory
(pinned on CUDA). Which checkpoint is kept where is engine.kv.checkpoints' business."""
from __future__ import annotations

import torch

from engine.errors import UserError
from engine.models.base import ModelConfig


class StatePool:
    """conv [L, S, K-1, C], rec [L, S, H, Dk, Dv]; saved_conv [N, L, K-1, C], saved_rec [N, L, H, Dk, Dv]."""

    def __init__(self, cfg: ModelConfig, n_slots: int, n_saved: int, dtype: torch.dtype, device: torch.device):
        la, n_layers = cfg.linear_attn, len(cfg.linear_layer_ids)
        conv = (la.conv_kernel - 1, 2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim)
        rec = (la.num_value_heads, la.key_head_dim, la.value_head_dim)
        self.conv = torch.zeros(n_layers, n_slots, *conv, dtype=dtype, device=device)
        self.rec = torch.zeros(n_layers, n_slots, *rec, dtype=torch.float32, device=device)
        pin = device.type == "cuda"
        self.saved_conv = torch.zeros(n_saved, n_layers, *conv, dtype=dtype, pin_memory=pin)
        self.saved_rec = torch.zeros(n_saved, n_layers, *rec, dtype=torch.float32, pin_memory=pin)
        self.free = list(range(n_slots - 1, -1, -1))
        # rank 0 of several (engine.dist): the changes made between steps, which the others replay
        self.log: list | None = None

    @property
    def n_saved(self) -> int:
        return self.saved_conv.shape[0]

    @property
    def saved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.saved_conv, self.saved_rec))

    def alloc(self) -> int:
        """A zeroed slot for a new sequence."""
        if not self.free:
            raise UserError(f"all {self.conv.shape[1]} recurrent-state slots are in use; lower --max-running")
        slot = self.free.pop()
        self.clear(slot)
        return slot

    def clear(self, slot: int) -> None:
        """Zero a live slot's states (a new sequence's)."""
        self.conv[:, slot].zero_()
        self.rec[:, slot].zero_()
        self._logged("clear", slot)

    def release(self, slot: int) -> None:
        assert slot not in self.free
        self.free.append(slot)

    def save(self, slot: int, dst: int) -> None:
        """Checkpoint `dst` := the states of live `slot`, every layer."""
        self.saved_conv[dst].copy_(self.conv[:, slot], non_blocking=True)
        self.saved_rec[dst].copy_(self.rec[:, slot], non_blocking=True)
        self._logged("save", slot, dst)

    def save_layer(self, layer: int, dst: int, conv: torch.Tensor, rec: torch.Tensor) -> None:
        """Checkpoint `dst`'s states of one layer (a layer saving mid-sequence)."""
        self.saved_conv[dst, layer].copy_(conv, non_blocking=True)
        self.saved_rec[dst, layer].copy_(rec, non_blocking=True)

    def restore(self, src: int, slot: int) -> None:
        """Live `slot` := checkpoint `src`."""
        self.conv[:, slot].copy_(self.saved_conv[src], non_blocking=True)
        self.rec[:, slot].copy_(self.saved_rec[src], non_blocking=True)
        self._logged("restore", src, slot)

    def _logged(self, *op) -> None:
        if self.log is not None:
            self.log.append(("states", *op))
