#!/usr/bin/env bash
# tests on the merged tree, then old (729d708) vs new decode rows alternating
set -u
out=$1
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache
bash benchmarks/h200.sh tests $out/t
grep -E "passed|failed" $out/t/gpu_tests.txt | tail -3
grep -E "^(FAILED|ERROR)" $out/t/gpu_tests.txt | head -30
args="bench decode --synthetic qwen3-30b-a3b --layers 8 --expert-budget 1152MiB --moe-policy adaptive,fetch,cpu --routing uniform --cpu-threads 8 --tokens 64 --repeats 3"
for r in 1 2; do
  for tree in old new; do
    d=$PWD; [ $tree = old ] && d=$PWD/.probe/old
    (cd $d && PYTHONPATH=$d timeout 150 python3 -m freetoken_cli.main $args --out $out/dec_${tree}_$r.json > $out/dec_${tree}_$r.txt 2>&1)
    echo "== $tree $r"; python3 -c "
import json; rows = json.load(open('$out/dec_${tree}_$r.json'))['rows']
print([(x['policy'], round(x['tok_s'], 2), round(x['hit_rate'], 3)) for x in rows])" 2>&1 | tail -2
  done
done
