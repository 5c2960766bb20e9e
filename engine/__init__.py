"""FreeToken engine: loads a converted MoE checkpoint, keeps routed experts in host RAM with a
budgeted expert cache on the compute device, and generates tokens."""

import sys

from engine.config import bytecode_prefix, persist_compile_caches

# before torch is imported: its bytecode, where it cannot sit beside the sources
sys.pycache_prefix = bytecode_prefix() or sys.pycache_prefix
# before anything compiles: torch fixes its cache directory on first use (importing torch._dynamo sets it)
persist_compile_caches()
