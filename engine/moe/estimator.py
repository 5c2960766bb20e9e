"""Online bandwidth estimates. The runtime reports the bytes and seconds of its own fills and
CPU expert batches; smoothed estimates of B_P and B_H give q* = B_P / (B_P + B_H), so the miss
split follows contention from other programs instead of a one-off profile."""
from __future__ import annotations


class BandwidthEstimator:
    def __init__(self, b_p: float, b_h: float, alpha: float = 0.1, min_bytes: int = 1 << 20):
        self.b_p, self.b_h = b_p, b_h            # bytes / s
        self.alpha, self.min_bytes = alpha, min_bytes

    def _ema(self, old: float, nbytes: int, seconds: float) -> float:
        if nbytes < self.min_bytes or seconds <= 0:
            return old  # too small to time reliably
        return (1 - self.alpha) * old + self.alpha * nbytes / seconds

    def fill(self, nbytes: int, seconds: float) -> None:
        self.b_p = self._ema(self.b_p, nbytes, seconds)

    def cpu(self, nbytes: int, seconds: float) -> None:
        self.b_h = self._ema(self.b_h, nbytes, seconds)

    @property
    def q_star(self) -> float:
        return self.b_p / (self.b_p + self.b_h)
