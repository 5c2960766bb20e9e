#!/usr/bin/env bash
set -u
out=$1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
timeout 150 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_graphs.py tests/test_cpu_executor.py tests/test_policies.py > $out/gt.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $out/gt.txt | tail -8
timeout 330 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 \
    --expert-budget 1152MiB --routing uniform --moe-policy adaptive,cpu --tokens 32 --repeats 3 \
    --cpu-threads 4,8,12,14,16 --out $out/td.json > $out/td.txt 2>&1
python3 -c "import json; [print(r['policy'], r['threads'], r['pool_threads'], round(r['tok_s'], 1), round(r['ratio'], 2), r['cpu_busy']) for r in json.load(open('$out/td.json'))['rows']]"
tail -3 $out/td.txt
