"""Plan rules compared on the trained proxy's trace with engine.bench.split_model's pricing (H200 numbers of the
2026-12-01-h200-b profile, all resident 1112 tok/s as measured in g7), replacing HostTables.plan (decode steps
only: no cold fills, no reserved slots). cur: the rule of 1002eac (F >= 1 when a miss recurs); empty: also F >= 1
when the least recently used slot is empty; emptyall: F >= the empty slots (landed, 242752c); lru1 / lru1e /
lruall: F >= 1 (/ or empty / F >= their number) when a miss was demanded since the LRU victim's last use.
Run from the repository root: .venv/bin/python benchmarks/results/2026-12-03-h200-iv/g7/rules.py"""
import sys, json, numpy as np, torch
from engine.moe import tables as T
from kernels import ref
from engine.bench import split_model as sm
from engine.config import parse_size

RULE = "cur"
def plan(self, ids, base, q, cold=False):
    self.clock += 1
    experts, routes = T.distinct(ids)
    uniq = [base + e for e in experts.tolist()]
    counts = dict(zip(uniq, routes))
    hit_slots = {self.slot_of[f] for f in uniq if self.slot_of[f] >= 0}
    misses = sorted((f for f in uniq if self.slot_of[f] < 0), key=lambda f: (-self.seen[f], -counts[f], f))
    rec = [ref.recurs(self.seen[f], self.clock, self.n_layers) for f in misses]
    lru = next((s for s in self.lru if s not in hit_slots), None)
    vlast = self.last.get(lru, -1) if lru is not None else 10**9
    if RULE == "lru1":   # a miss seen since the LRU victim's last use: fetch at least one
        rec = [self.seen[f] >= 0 and self.seen[f] > vlast for f in misses]
    elif RULE == "lruall":
        rec = [self.seen[f] >= 0 and self.seen[f] > vlast for f in misses]
    elif RULE == "empty":  # the LRU victim is empty: fetch at least one
        rec = [r or self.owner_of[lru] < 0 for r in rec] if lru is not None else rec
    elif RULE == "lru1e":
        rec = [(self.seen[f] >= 0 and self.seen[f] > vlast) or (lru is not None and self.owner_of[lru] < 0) for f in misses]
    n = ref.split_fetch(len(misses), q, any(rec))
    if RULE == "lruall":
        n = max(n, sum(rec))
    if RULE == "emptyall":
        n = max(n, min(len(misses), sum(1 for s in self.lru if self.owner_of[s] < 0)))
    n = min(n, len(self.lru) - len(hit_slots))
    victims = []
    for s in self.lru:
        if len(victims) == n: break
        if s not in hit_slots: victims.append(s)
    for s, f in zip(victims, misses):
        self.install(s, f)
    for s in sorted(hit_slots.union(victims)):
        self.lru.move_to_end(s); self.last[s] = self.clock
    for f in uniq: self.seen[f] = self.clock
    route = torch.zeros(1)
    return route, victims, [f - base for f in misses[:n]], len(hit_slots), len(misses)

T.HostTables.plan = plan
_init = T.HostTables.__init__
def init(self, *a):
    _init(self, *a); self.last = {}
T.HostTables.__init__ = init

trace = np.load("benchmarks/traces/qwen3-30b-a3b-proxy.npy")
prof = json.load(open("benchmarks/results/2026-12-01-h200-b/c1/profile.json"))
m = sm.Machine.from_profile(prof)
res = 1 / 1112.0
for span in [(40, 240), (1024, None)]:
    for budget in ["1152MiB", "2731MiB", "8GiB"]:
        slots = min(parse_size(budget) // m.expert_bytes, 1024)
        out = []
        for rule in ["cur", "empty", "emptyall", "lru1", "lru1e", "lruall"]:
            RULE = rule
            r = sm.price(trace, slots, 128, m, None, warm_tokens=span[0], end=span[1])
            out.append(f"{rule} {sm.tok_s(r, res):.0f} ({r['hit_rate']:.3f})")
        f = sm.price(trace, slots, 128, m, 1.0, warm_tokens=span[0], end=span[1]) if True else None
        print(span, budget, " | ".join(out), "| fetch", f"{sm.tok_s(f, res):.0f}", flush=True)
