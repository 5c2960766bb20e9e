#!/usr/bin/env bash
set -u
out=$1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
nproc > $out/env.txt; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA" >> $out/env.txt
python3 -c "import psutil; print('physical', psutil.cpu_count(logical=False))" >> $out/env.txt
cat $out/env.txt
timeout 200 python3 .probe/threads.py $out/threads.json > $out/threads.txt 2>&1; tail -32 $out/threads.txt
for n in 8 12 14 16; do
  timeout 120 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 --expert-budget 1152MiB \
    --moe-policy adaptive,cpu --routing uniform --cpu-threads $n --tokens 64 --repeats 3 --out $out/dec_t$n.json > $out/dec_t$n.txt 2>&1
  echo "== threads $n"; tail -6 $out/dec_t$n.txt
done
