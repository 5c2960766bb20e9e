"""Share of layer steps the plan rule leaves without a CPU route at a fixed high q, replaying a
routing trace through the host residency tables (the GPU plan kernel's rule); no GPU needed.
Usage (repository root): PYTHONPATH=. python3 no_cpu_steps.py TRACE"""
import sys

import numpy as np

from engine.bench.split_model import EXPERT_BYTES
from engine.moe.tables import HostTables

trace, E = np.load(sys.argv[1]), 128
tokens, layers, _ = trace.shape
for gib in (8, 16):
    for q in (0.8, 0.85, 0.88, 0.9):
        t = HostTables(int(gib * 2**30) // EXPERT_BYTES, layers * E, layers)
        for n in range(min(layers, len(t.owner_of) // E)):
            t.install_block(n * E, n * E, E)
        none = steps = cpu = 0
        for tok in range(tokens):
            for layer in range(layers):
                _, victims, _, _, m = t.plan([trace[tok, layer].tolist()], layer * E, q)
                if tok >= 64:  # after the cache warmed up
                    steps, none, cpu = steps + 1, none + (m == len(victims)), cpu + m - len(victims)
        print(f"{gib} GiB, q {q}: {none / steps:.1%} of layer steps without a CPU route, "
              f"{cpu / (tokens - 64):.1f} CPU experts per token")
