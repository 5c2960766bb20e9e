#!/usr/bin/env bash
# g32 (prepared, not run; issue 20): the plan kernel without two dependent global round trips (next/plan_regs.patch:
# a fetched route's victim and the expert it evicts are taken from the candidates' lanes in registers instead of
# being stored to vic_ptr and loaded back, then looked up in owner_of; 14 -> 12 loads in the kernel's TTIR, 18 -> 23
# barriers in its PTX at 4 warps). The thirty-eighth run's step profile: 6.7-8.7 us a plan launch, every MoE layer
# step. ab.sh: GPU tests (-k plan), the plan alone in both trees alternately (the thirtieth run's c2/planbench.py: a
# layer step's plan in a CUDA graph, 48 layers, T 1 and 8, 489-7000 slots, q 0.5 and 1), decode against main.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/next/g32.sh $OUT"); outputs in g32.tgz
exec bash "$(dirname "$0")/ab.sh" "$1" g32 plan_regs.patch plan ../../2026-12-02-h200-vii/c2/planbench.py:both
