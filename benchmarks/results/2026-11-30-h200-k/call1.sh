#!/usr/bin/env bash
# Call 1: main (15438bd): the four policies at 4/8/16 GiB on the locality trace and at 8 GiB with
# model routing, after a fresh profile (median of three runs).
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max --format=csv > "$out/env.txt"
git log --oneline -1 >> "$out/env.txt"
bash benchmarks/h200.sh decode-a "$out" 2>&1 | tail -40
