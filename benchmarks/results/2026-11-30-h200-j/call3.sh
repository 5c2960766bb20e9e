#!/usr/bin/env bash
# Call 3: how much the profile's concurrent pair (the bound's bandwidths) varies on one machine:
# five full profiles back to back.
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
for i in 1 2 3 4 5; do
  python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile_$i.json" 2>&1
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(sys.argv[1][-14:], *(f'{k} {p[k]:.1f}' for k in ('h2d_gbps','cpu_expert_gbps','h2d_concurrent_gbps','cpu_expert_concurrent_gbps','stream_read_gbps')), f'q* {p[\"q_star\"]:.3f}')" "$out/profile_$i.json"
done
