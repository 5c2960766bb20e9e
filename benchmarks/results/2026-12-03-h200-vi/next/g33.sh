#!/usr/bin/env bash
# g33 (prepared, not run; issue 20): g30, g31 and g32's patches together against main in one call (fused_router,
# linear_norm, plan_regs: three launches fewer a layer step, two global round trips fewer in the plan). ab.sh: the
# GPU tests of all three, the three probes (g32 times the plan in main too), decode against main (as many rounds as the
# call's time leaves). Run first: if the three together gain little, g30-g32 say which of them costs what.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g33.sh $OUT"); outputs in g33.tgz
exec bash "$(dirname "$0")/ab.sh" "$1" g33 "fused_router.patch linear_norm.patch plan_regs.patch" \
  "router or linear_add or norm or plan" "router_bench.py linear_norm_bench.py ../../2026-12-02-h200-vii/c2/planbench.py"
