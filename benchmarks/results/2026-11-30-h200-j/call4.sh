#!/usr/bin/env bash
# Call 4: the profile as the median of three runs of each measurement, four times back to back
# on a fresh machine (call 3 ran five single-run profiles).
set -u; out=${1:-/tmp/ftout}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_policies.py -k profile 2>&1 | tail -1
for i in 1 2 3 4; do
  python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile_$i.json" 2>&1
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); print(sys.argv[1][-14:], *(f'{k} {p[k]:.1f}' for k in ('h2d_gbps','cpu_expert_gbps','h2d_concurrent_gbps','cpu_expert_concurrent_gbps','stream_read_gbps')), f'q* {p[\"q_star\"]:.3f}')" "$out/profile_$i.json"
done
