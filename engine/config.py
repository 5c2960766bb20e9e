"""Engine configuration: frozen dataclasses and the only place environment variables are read."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError

POLICIES = ("adaptive", "fetch", "cpu")  # plus "static:N"


def cache_dir() -> Path:
    """User cache directory: converted models, machine profiles, built extensions."""
    root = os.environ.get("FREETOKEN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "freetoken")
    return Path(root)


def persist_compile_caches() -> None:
    """Keep compiled artifacts in the user cache directory, so every start after the first reuses
    them: TorchInductor's caches (FX graphs, AOTAutograd, its Triton kernels; by default under the
    temporary directory, which a reboot or a fresh machine empties), the Triton cache of the
    engine's own kernels and torch's extension builds (the C++ CPU executor). Directories the
    user set win. The engine package calls this when it is imported, before torch can fix its
    own default."""
    root = cache_dir() / "compile"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(root / "extensions"))


def bytecode_prefix(package: str = "torch") -> str | None:
    """Where Python should cache bytecode, if not beside the sources: the user cache directory
    when `package` (torch: thousands of modules) has no cached bytecode and its directory cannot
    take any (a read-only image), else every start compiles them from source again; None to
    leave Python's default (or a prefix, or PYTHONDONTWRITEBYTECODE, that the user set)."""
    import importlib.util
    import sys
    if sys.pycache_prefix or sys.dont_write_bytecode:
        return None
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    cached = Path(importlib.util.cache_from_source(spec.origin))
    where = cached.parent if cached.parent.exists() else cached.parent.parent
    if cached.exists() or os.access(where, os.W_OK):
        return None
    return str(cache_dir() / "pycache")


def hf_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")


def launched() -> dict | None:
    """torchrun's environment (rank, world, local_rank, local_world), if this process was started
    by it or another launcher like it (engine.dist)."""
    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(k in os.environ for k in keys):
        return None
    env = {k: os.environ[k] for k in keys}
    return {"rank": int(env["RANK"]), "world": int(env["WORLD_SIZE"]),
            "local_rank": int(os.environ.get("LOCAL_RANK", env["RANK"])),
            "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))}


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str | int | None) -> int | None:
    """'8GiB', '512MiB', '1.5g', 1234 -> bytes; 'auto' or None -> None."""
    if text is None or isinstance(text, int):
        return text
    if text.strip().lower() == "auto":
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UserError(f"cannot read size {text!r}; use a number with a unit like 8GiB or 512MiB, or 'auto'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_chunk(text: str | int | None) -> int | None:
    """--prefill-chunk: 'auto' or None -> None (sized from free memory at load), else tokens >= 16."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    if not str(text).strip().isdigit() or int(text) < 16:
        raise UserError(f"cannot read --prefill-chunk {text!r}; give a number of tokens (at least 16) or auto")
    return int(text)


def check_positive(flag: str, value: int | None) -> None:
    """A count the user gave (None = the default) must be at least 1."""
    if value is not None and value < 1:
        raise UserError(f"{flag} {value} is out of range; give a positive number")


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    """--gpus '0,1' -> (0, 1); None -> None (GPUs 0..N-1)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise UserError(f"cannot read --gpus {text!r}; give distinct GPU indices like 0,1")
    return tuple(int(p) for p in parts)


def parse_policy(text: str) -> str:
    if text in POLICIES or re.fullmatch(r"static:(\d+|auto)", text):
        return text
    raise UserError(f"unknown --moe-policy {text!r}; choose adaptive, fetch, cpu, static:N or static:auto")


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run one model."""
    model: str                          # FTW dir, HF dir, or hub id
    device: str = "auto"                # auto | cuda | cpu
    expert_budget: int | None = None    # bytes for the expert cache; None = auto
    moe_policy: str = "adaptive"
    cpu_threads: int | None = None      # CPU expert threads; None = the machine profile's, else max_threads()
    max_context: int = 32768            # tokens per sequence (capped by the model)
    max_running: int = 1                # sequences decoded together (they share the KV pool)
    prefill_chunk: int | None = None    # tokens per prefill forward; None = from free memory at load
    page_size: int = 16                 # tokens per KV page
    kv_tokens: int | None = None        # KV pool size in tokens; None = max_context
    verify: bool = False                # verify FTW checksums at load
    graph: bool | None = None           # device-resident control + CUDA-graph decode; None = on CUDA
    prefill_mode: str = "adaptive"      # long prefill chunks: adaptive | stream | routed (engine.moe.prefill)
    state_checkpoints: int = 16         # hybrid models: recurrent-state checkpoints kept at anchors (LRU)
    elastic: bool | None = None         # follow free GPU memory (engine.elastic); None = on with an auto budget, one rank
    world_size: int = 1                 # ranks sharing the routed experts (engine.dist); torchrun: its WORLD_SIZE
    gpus: tuple[int, ...] | None = None  # the GPU of each rank of this host; None = 0..N-1

    @property
    def ranks(self) -> int:
        """Ranks that share the routed experts: torchrun's WORLD_SIZE under it, else world_size."""
        env = launched()
        return env["world"] if env else self.world_size

    def __post_init__(self):
        check_positive("--world-size", self.world_size)
        check_positive("--max-context", self.max_context)
        check_positive("--max-running", self.max_running)
        check_positive("--cpu-threads", self.cpu_threads)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0            # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                      # 0 = off
    repetition_penalty: float = 1.0     # transformers' rule over prompt and output tokens; 1 = off
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    forced: tuple[int, ...] = ()        # tests: emit these tokens first (the forward still runs)
    grammar: str | None = None          # sample only what this grammar allows (engine.constrain)

    def __post_init__(self):
        if (self.max_tokens < 0 or self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0
                or self.repetition_penalty <= 0):
            raise UserError("sampling options out of range: need max_tokens >= 0, temperature >= 0, "
                            "0 < top_p <= 1, top_k >= 0, repetition_penalty > 0")
