"""q* = B_P / (B_P + B_H): the share of a layer step's misses fetched over the link, the rest
computed on the CPU from host memory. This module owns q* and its upkeep: the bandwidths it
starts from (a machine profile, engine.profile), online estimates fed by the runtime's own
timings (fills by CUDA events or the host clock, CPU jobs by the workers' clock, both from the
poller in graph mode), so that q* follows contention from other programs, and a CPU probe for
graph decode that stopped sending work to the CPU. The miss policy turns q* into each layer
step's share (engine.moe.policy)."""
from __future__ import annotations

import random
import time
from contextlib import contextmanager
from typing import Callable

import torch

# Graph decode steps with no CPU job before one expert is timed on the CPU anyway (see QStar._probe_cpu).
PROBE_STEPS = 16


class BandwidthEstimator:
    """Smoothed B_P and B_H (bytes / s) from the bytes and seconds of fills and CPU expert jobs."""

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


class QStar:
    """The current q* (`value`) of one expert runtime; store: the host expert store (expert bytes,
    the probe's weights); cpu() -> the runtime's CPU executor."""

    def __init__(self, store, cpu: Callable):
        self.store, self._cpu = store, cpu
        self.value = 1.0  # fetch every miss until bandwidths are given
        self.estimator: BandwidthEstimator | None = None  # None: value stays as set
        self._start: tuple[BandwidthEstimator, float] | None = None  # the estimator and its q* at start()
        self._pending_fill = None  # (start event, end event, bytes) of a CUDA fill, folded in once complete
        self._probe, self._idle = None, 0  # a CPU probe job in flight; graph steps without a CPU job

    def start(self, b_p_gbps: float, b_h_gbps: float, online: bool = True) -> None:
        """Start from B_P and B_H in GB/s; online: re-estimated from the engine's own timings."""
        est = BandwidthEstimator(b_p_gbps * 1e9, b_h_gbps * 1e9)
        self._start = (est, est.q_star)
        self.follow(online)

    def use_profile(self, prof: dict, concurrent: bool = True) -> None:
        """Start from a machine profile (engine.profile): the bandwidths measured with both sides
        running (concurrent; a decode step splits so), or each side alone. No B_P measured (no
        GPU): 1 B/s, not 0, so that recurring misses are still fetched and their fills teach B_P
        (at q* = 0 nothing is ever fetched)."""
        p, h = ("h2d_concurrent_gbps", "cpu_expert_concurrent_gbps") if concurrent else ("h2d_gbps", "cpu_expert_gbps")
        self.start(prof[p] or 1e-9, prof[h])

    def follow(self, online: bool) -> None:
        """Switch between q* re-estimated online (resuming the estimates) and q* held at start()'s."""
        est, q0 = self._start
        self.estimator = est if online else None
        self.value = est.q_star if online else q0

    @property
    def _slot(self) -> int:
        return self.store.layout.slot_bytes

    @contextmanager
    def timed_fill(self, nbytes: int, cuda: bool):
        """Time the fill copies issued inside (on the current stream): CUDA events, folded into B_P
        at the next update() that finds them complete; the host clock on the CPU."""
        if self.estimator is None:
            yield
        elif cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._pending_fill = (start, end, nbytes)
        else:
            t0 = time.perf_counter()
            yield
            self.estimator.fill(nbytes, time.perf_counter() - t0)

    def cpu_job(self, experts: int, fut, t0: float) -> None:
        """Fold a finished CPU job over `experts` experts into B_H: the workers' own time, else
        the host clock since its submit at t0."""
        if self.estimator:
            self.estimator.cpu(experts * self._slot, getattr(fut, "seconds", None) or time.perf_counter() - t0)

    def update(self) -> None:
        """Before an eager layer step: fold the last timed CUDA fill into B_P (once its events
        completed) and refresh q*."""
        if self.estimator is None:
            return
        if self._pending_fill and self._pending_fill[1].query():
            start, end, nbytes = self._pending_fill
            self.estimator.fill(nbytes, start.elapsed_time(end) / 1e3)
            self._pending_fill = None
        self.value = self.estimator.q_star

    def graph_step(self, poller) -> None:
        """Between graph decode steps: fold the poller's timings of the CPU branch and of the fills
        (poller None: no CPU branch) into B_H and B_P, probe an idle CPU, refresh q*."""
        if poller is not None:
            jobs, experts, seconds, fills, fill_seconds = poller.stats()
            if self.estimator:
                if experts:
                    self.estimator.cpu(experts * self._slot, seconds)
                if fills:
                    self.estimator.fill(fills * self._slot, fill_seconds)
                self._probe_cpu(experts)
        if self.estimator:
            self.value = self.estimator.q_star

    def _probe_cpu(self, experts: int) -> None:
        """After PROBE_STEPS graph decode steps without a CPU job (a load made B_H look so low
        that every miss is fetched, and only CPU jobs measure it), time one expert on the CPU
        beside the GPU's work, its result unused, so B_H and q* recover once the load is gone."""
        fut, self._idle = self._probe, 0 if experts else self._idle + 1
        if fut is not None:
            try:
                fut.wait(0.0)
            except TimeoutError:
                return
            self._probe = None
            self.estimator.cpu(self._slot, fut.seconds)
        if self._idle >= PROBE_STEPS:
            self._idle = 0
            v = self.store.views[random.randrange(len(self.store.views))]
            H = v["down"].shape[1]
            e = torch.tensor([[random.randrange(self.store.n_experts)]])
            self._probe = self._cpu().submit(torch.zeros(1, H), v["gate_up"], v["down"], e,
                                             torch.ones(1, 1), torch.empty(1, H))
