#!/usr/bin/env bash
# call 1 (2026-12-01 thirteenth run): depth + batch rows, the profile's default thread sweep, thread rows
set -u
out=$1; w=/tmp/c1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
ft() { python3 -m freetoken_cli.main "$@"; }
pack() { tar czf $out/c1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nproc; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
el profile; timeout -s ABRT 120 python3 -m freetoken_cli.main profile --json > $w/profile.json 2> $w/profile.err
python3 -c "import json; p = json.load(open('$w/profile.json')); print('sweep', p.get('thread_sweep'), 'pick', p.get('cpu_threads'))"; pack
m8="--synthetic qwen3-30b-a3b --layers 8 --moe-policy adaptive --routing model --tokens 32 --repeats 3"
el depth; timeout -s ABRT 220 python3 -m freetoken_cli.main bench decode $m8 --expert-budget 16GiB,1152MiB \
  --depth 1024,16384,32768,65536 --out $w/depth.json > $w/depth.txt 2>&1; tail -14 $w/depth.txt; pack
el batch; timeout -s ABRT 110 python3 -m freetoken_cli.main bench decode $m8 --expert-budget 16GiB,1152MiB --depth 1024 \
  --batch 1,4,8 --out $w/batch.json > $w/batch.txt 2>&1; tail -12 $w/batch.txt; pack
el threads; timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --layers 8 \
  --expert-budget 1152MiB --routing uniform --moe-policy adaptive,cpu --tokens 32 --repeats 3 \
  --cpu-threads 1,2,4,6,8,10,12,14,16 --out $w/threads.json > $w/threads.txt 2>&1
python3 -c "import json; [print(r['policy'], r['threads'], r['pool_threads'], round(r['tok_s'], 1), r['cpu_busy']) for r in json.load(open('$w/threads.json'))['rows']]"
tail -3 $w/threads.txt; pack; el done
