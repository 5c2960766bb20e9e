#!/usr/bin/env bash
# g33 (issue 20, the forty-first run): three decode-step changes together against main: the router's linear layer and
# top-k in one launch (fused_router.patch, probe router_bench.py), o_proj + residual add + next norm in one launch
# (linear_norm.patch, probe linear_norm_bench.py sweeping its tiles), the plan taking a fetched route's victim from the
# candidates' lanes in registers (plan_regs.patch, probe: the thirtieth run's planbench.py; without :both it ran in
# the patched tree only). ab.sh: the GPU tests of all three, the probes, decode against main.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g33-34/g33.sh $OUT"); outputs in g33.tgz (unpacked in out33/)
exec bash "$(dirname "$0")/ab.sh" "$1" g33 "fused_router.patch linear_norm.patch plan_regs.patch" \
  "router or linear_add or norm or plan" "router_bench.py linear_norm_bench.py ../../2026-12-02-h200-vii/c2/planbench.py"
