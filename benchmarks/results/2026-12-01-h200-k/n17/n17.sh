#!/usr/bin/env bash
# 1. Profiles with their thread sweeps, bf16 and int4 (the default threads follow the format's profile, ee52fea).
# 2. Decode at 1/8 budget, bf16 and int4, default threads, every policy: int4 against 3x bf16 (issue 20).
# 3. Cold starts of main with the profile saved and the start timed from the process's start tick (issue 22 item 2).
# needs, beside the tracked files: .probe/n17.sh .probe/ft.sh .whl
set -u
out=$1; w=/tmp/n17; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n17.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/
ft="$PWD/.probe/ft.sh"
el executors; PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 150 python3 -c \
  "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build.txt 2>&1
for f in bfloat16 int4; do
  el profile $f; timeout -s ABRT 120 $ft $PWD profile --format $f --json --out $w/profile_$f.json > $w/profile_$f.txt 2>&1
  grep -o '"cpu_threads": [0-9]*\|"cpu_expert_concurrent_gbps": [0-9.]*' $w/profile_$f.json | tr '\n' ' '; echo; pack
done
for q in bf16 int4; do
  qa=""; [ $q = int4 ] && qa="--quant int4"
  el decode $q; timeout -s ABRT 150 $ft $PWD bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --expert-budget 1152MiB \
    --moe-policy adaptive,fetch,cpu --routing uniform --tokens 32 --repeats 3 --out $w/decode_$q.json > $w/decode_$q.txt 2>&1
  tail -8 $w/decode_$q.txt | cut -c1-180; pack
done
el checkpoint; { PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt
for i in 0 1 2 3 4; do
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 40 ] || break
  el startup $i; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_main timeout -s ABRT 60 $ft $PWD bench startup \
    /tmp/q30b8/ftw --out $w/startup_$i.json > $w/startup_$i.txt 2>&1
  grep -E "import|device|dense|wait|profile|ready" $w/startup_$i.txt | cut -c1-60 | tr -s ' ' | tr '\n' ' '; echo; pack
done; el done
