"""FreeToken engine: loads a converted MoE checkpoint, keeps routed experts in host RAM with a
budgeted expert cache on the compute device, and generates tokens."""

from engine.config import persist_compile_caches

# before anything compiles: torch fixes its cache directory on first use (importing torch._dynamo sets it)
persist_compile_caches()
