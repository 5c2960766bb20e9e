"""Machine profile: the bandwidths behind the miss split, measured with the engine's own paths
on realistic expert sizes in one expert format (bfloat16, which float models of any dtype use,
or a freetoken_kernels.quant format: the CPU may turn compute-bound on dequantization, so B_H is measured
per quantized format and never carried over from bf16; bandwidths count the format's own bytes,
which is what q* splits). B_P = pinned
host-to-device expert fills into a slot pool; B_H = the CPU expert executor at batch 1 over a
working set larger than the CPU caches; both again while running concurrently (they share host
memory); plus two ceilings, a STREAM-like host read and a linear pinned copy. The CPU expert thread
count is the fastest of a sweep, measured beside busy stand-ins for the engine's host threads,
and becomes the engine's default. Saved per machine and format in the user cache directory."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import platform
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import torch

from engine.config import cache_dir
from engine.moe.layout import SlotLayout
from freetoken_kernels.quant import FORMATS, quantize

GB = 1e9
EXPERT = (2048, 768)  # hidden, moe_intermediate of Qwen3-30B-A3B: 9.4 MB bf16 experts
GROUP = 128           # values a scale covers in the quantized formats (mxfp4: 32 by definition)


def machine() -> dict:
    """GPU, CPU, cores, RAM and PCIe link (NVML); the profile's key."""
    desc = {"cpu": _cpu_model(), "physical_cores": psutil.cpu_count(logical=False),
            "ram_gib": round(psutil.virtual_memory().total / 2**30), "gpu": None,
            "pcie_gen": None, "pcie_width": None}
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        desc.update(gpu=name.decode() if isinstance(name, bytes) else name,
                    pcie_gen=pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                    pcie_width=pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))
    except Exception:  # pynvml raises NVMLError_LibraryNotFound etc. without a GPU: no GPU
        pass
    return desc


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llc_bytes(root: Path = Path("/sys/devices/system/cpu")) -> int:
    """Total last-level (L3) cache of this machine, from sysfs (0 where unknown)."""
    shared = {}
    for d in root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (d / "level").read_text().strip() == "3":
                size = (d / "size").read_text().strip()
                shared[(d / "shared_cpu_list").read_text().strip()] = int(size.rstrip("KMG")) << {
                    "K": 10, "M": 20, "G": 30}.get(size[-1], 0)
        except (OSError, ValueError):
            pass
    return sum(shared.values())


def profile_path(desc: dict, fmt: str = "bfloat16") -> Path:
    key = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / (f"{key}.json" if fmt == "bfloat16" else f"{key}-{fmt}.json")


def expert_rows(n: int, fmt: str) -> tuple[SlotLayout, torch.Tensor]:
    """A layout of the profile's expert shape in `fmt` and n rows of it in host memory (the same
    expert in every row: the values do not change the timing, and drawing them takes seconds)."""
    from ftw import aligned_empty
    hidden, inter = EXPERT
    if fmt in FORMATS:
        g = torch.Generator().manual_seed(0)
        w = {"gate_up": torch.randn(2 * inter, hidden, generator=g), "down": torch.randn(hidden, inter, generator=g)}
        parts = {k: quantize(fmt, v * 0.02, GROUP) for k, v in w.items()}
        layout = SlotLayout.for_qweights(fmt, parts)
    else:
        layout = SlotLayout.for_experts(hidden, inter, torch.bfloat16)
    bank = aligned_empty((n, layout.slot_bytes), torch.uint8)
    bank[0].zero_()
    for k, v in layout.views(bank[:1]).items():
        if fmt in FORMATS:
            for dst, src in zip((v.q, v.s, v.z), parts[k][:3]):
                if src is not None:
                    dst[0].copy_(src)
        else:
            v.fill_(0.01)
    bank[1:].copy_(bank[:1].expand(n - 1, -1))
    return layout, bank


class Bench:
    """Expert-sized rows of one format in host memory, and the two paths that consume them."""

    def __init__(self, n_experts: int, cuda: bool, fmt: str = "bfloat16"):
        self.layout, self.bank = expert_rows(n_experts, fmt)
        self.views = self.layout.views(self.bank)
        self.cuda = cuda
        if cuda:
            from engine.moe.store import pin_
            pin_(self.bank)
            self.pool = torch.empty(8, self.layout.slot_bytes, dtype=torch.uint8, device="cuda")
        self.cpu = None
        self.x = torch.randn(1, EXPERT[0], dtype=torch.bfloat16)
        self.out = torch.empty(1, EXPERT[0], dtype=torch.float32)

    @classmethod
    def beyond_llc(cls, cuda: bool, fmt: str = "bfloat16") -> "Bench":
        """A bench whose rows outgrow the CPU caches: at least 96 experts, 3x the last-level cache."""
        slot = expert_rows(1, fmt)[0].slot_bytes
        return cls(max(96, -(-3 * llc_bytes() // slot)), cuda, fmt)

    def use_threads(self, threads: int | None) -> None:
        """The CPU executor from now on: `threads` workers (None: its default)."""
        from freetoken_kernels.cpu_executor import CPUExecutor
        if self.cpu is not None:
            self.cpu.close()
        self.cpu = CPUExecutor(threads)

    def h2d(self, seconds: float, stop: threading.Event | None = None) -> float:
        """Fill pool slots from successive bank rows; GB/s."""
        n, i, stream = self.bank.shape[0], 0, torch.cuda.Stream()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            while time.perf_counter() - t0 < seconds and not (stop and stop.is_set()):
                for s in range(8):
                    self.pool[s].copy_(self.bank[(i + s) % n], non_blocking=True)
                i += 8
                stream.synchronize()
        return i * self.layout.slot_bytes / (time.perf_counter() - t0) / GB

    def cpu_experts(self, seconds: float, stop: threading.Event | None = None, k: int = 8) -> float:
        """Batch-1 steps of k distinct experts cycling through the bank; GB/s of expert bytes
        over the executor's own time, submit to retire (the engine drives it from C++, so the
        Python loop's own time between steps is not counted)."""
        n, i, busy = self.bank.shape[0], 0, 0.0
        w = torch.full((1, k), 1.0 / k)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds and not (stop and stop.is_set()):
            ids = (torch.arange(k) + i).remainder(n).view(1, k).int()
            job = self.cpu.submit(self.x, self.views["gate_up"], self.views["down"], ids, w, self.out)
            job.wait()
            busy, i = busy + job.seconds, i + k
        return i * self.layout.slot_bytes / busy / GB

    def concurrent(self, seconds: float) -> tuple[float, float]:
        res = {}
        t = threading.Thread(target=lambda: res.setdefault("h2d", self.h2d(seconds)))
        t.start()
        res["cpu"] = self.cpu_experts(seconds)
        t.join()
        return res["h2d"], res["cpu"]


def stream_read_gbps(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = max(best, nbytes / (time.perf_counter() - t0) / GB)
    return best


def linear_h2d_gbps(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t0) / GB)
    return best


def median_run(measure_once, n: int, key=None):
    """The result of n runs of measure_once() that is the median by key (a pair, by its sum:
    both values from one run); two seconds of the host's bandwidth vary by ~20% run to run."""
    return sorted((measure_once() for _ in range(n)), key=key)[n // 2]


def thread_candidates(most: int) -> list[int]:
    """The CPU expert thread counts a profile tries: a handful up to `most` (the executor's
    max_threads()), closer together near the top, where memory bandwidth saturates."""
    return sorted({n for n in (most, most - 2, 3 * most // 4, most // 2, 8) if 1 <= n <= most})


def pick_threads(sweep: list[dict], within: float = 0.03) -> int:
    """The fewest threads of a sweep ([{threads, gbps}]) within `within` of the fastest: the
    same speed (the spread of repeated runs), and the most cores left to everything else."""
    top = max(r["gbps"] for r in sweep)
    return min(r["threads"] for r in sweep if r["gbps"] >= (1 - within) * top)


@contextmanager
def busy_host_threads(n: int):
    """n processes spinning on a core each, for as long as the block runs: stand-ins for the
    engine's host threads (the step's driver and the CPU branch's poller) at their busiest."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def sweep_threads(b: Bench, seconds: float, reps: int) -> list[dict]:
    """B_H (GB/s) of each candidate thread count, beside busy stand-ins for the host threads
    (nothing where there is one candidate)."""
    from freetoken_kernels.cpu_executor import HOST_THREADS, max_threads
    counts, rows = thread_candidates(max_threads()), []
    if len(counts) < 2:
        return rows
    with busy_host_threads(HOST_THREADS):
        for n in counts:
            b.use_threads(n)
            rows.append({"threads": n, "gbps": median_run(lambda: b.cpu_experts(seconds), reps)})
    return rows


def measure(quick: bool = False, threads: int | None = None, fmt: str = "bfloat16") -> dict:
    """Full profile of experts in `fmt` (~35 s: the median of three runs of each measurement), or
    a quick one (< 3 s) when no saved profile fits this machine. A full profile without `threads`
    sweeps the thread counts first and measures the rest at its pick."""
    if fmt not in ("bfloat16", *FORMATS):
        from engine.errors import UserError
        raise UserError(f"unknown expert format {fmt!r}; choose bfloat16, {', '.join(FORMATS)}")
    cuda = torch.cuda.is_available()
    secs, reps = (0.3, 1) if quick else (2.0, 3)
    b = Bench.beyond_llc(cuda, fmt)
    sweep = sweep_threads(b, secs / 4, reps) if threads is None and not quick else []
    b.use_threads(pick_threads(sweep) if sweep else threads)
    res = {"machine": machine(), "quick": quick, "format": fmt, "cpu_threads": b.cpu.threads,
           "cpu_backend": b.cpu.backend, "expert_bytes": b.layout.slot_bytes, "thread_sweep": sweep}
    res["cpu_expert_gbps"] = median_run(lambda: b.cpu_experts(secs), reps)
    res["h2d_gbps"] = median_run(lambda: b.h2d(secs), reps) if cuda else None
    if cuda:
        res["h2d_concurrent_gbps"], res["cpu_expert_concurrent_gbps"] = median_run(lambda: b.concurrent(secs), reps, key=sum)
    else:
        res["h2d_concurrent_gbps"], res["cpu_expert_concurrent_gbps"] = None, res["cpu_expert_gbps"]
    res["stream_read_gbps"] = None if quick else stream_read_gbps()
    res["linear_h2d_gbps"] = linear_h2d_gbps() if cuda and not quick else None
    p, h = res["h2d_concurrent_gbps"], res["cpu_expert_concurrent_gbps"]
    res["q_star"] = p / (p + h) if p else 0.0
    return res


def save(res: dict, path: Path | None = None) -> Path:
    path = path or profile_path(res["machine"], res.get("format", "bfloat16"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    return path


def saved(fmt: str = "bfloat16") -> dict | None:
    """The saved profile of this machine for experts in `fmt`, if any."""
    path = profile_path(machine(), fmt)
    return json.loads(path.read_text()) if path.exists() else None


def default_threads(fmt: str = "bfloat16") -> int | None:
    """CPU expert threads when none are asked for: the pick of the sweep of the saved profile of
    experts in `fmt` (a dequantizing format may be bound by arithmetic and scale to more cores
    than bf16), else of the bf16 one; None without either (the executor's default, every core
    the host threads leave)."""
    for f in (fmt, "bfloat16"):  # a float format has no profile of its own
        if (prof := saved(f)) and prof.get("cpu_threads"):
            return prof["cpu_threads"]
    return None


def load_or_measure(threads: int | None = None, say=print, fmt: str = "bfloat16") -> dict:
    """The saved profile of this machine for experts in `fmt` (a slot layout's dtype; float ones
    use bfloat16's); else the quick measurement an earlier start saved for these threads; else a
    quick one now (< 3 s, and a note saying so), saved beside for the next start. A quick profile
    picks no default threads (default_threads reads only `freetoken profile`'s)."""
    fmt = fmt if fmt in FORMATS else "bfloat16"
    prof = saved(fmt)
    if prof is not None:
        return prof
    quick = profile_path(machine(), fmt).with_suffix(f".quick{threads or 0}.json")
    if quick.exists():
        return json.loads(quick.read_text())
    flag = "" if fmt == "bfloat16" else f" --format {fmt}"
    say(f"no bandwidth profile of {fmt} experts for this machine (run `freetoken profile{flag}` once); "
        "measuring quickly")
    res = measure(quick=True, threads=threads, fmt=fmt)
    save(res, quick)
    return res
