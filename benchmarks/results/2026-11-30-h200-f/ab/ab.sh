#!/usr/bin/env bash
# A/B: main's CPU executor vs the mailbox pool, same machine, one call.
set -u
out=$OUT; T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$out/log.txt"; }
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache
MAIN=$PWD; MB=/tmp/mb
mkdir -p $MB && cp -r $(ls) $MB/
patch -s -p1 -d $MB < benchmarks/results/2026-11-30-h200-f/ab/cpu_moe_mailbox.patch
ls $MB >> "$out/log.txt"
build() { (cd $1 && TORCH_EXTENSIONS_DIR=$2 PYTHONPATH=$1 python3 -c "from kernels.cpu_executor import cpu_executor_available as a; print('$1', a())"); }
build $MAIN /tmp/ext_main >> "$out/log.txt" 2>&1 &
build $MB /tmp/ext_mb >> "$out/log.txt" 2>&1 &
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512 >> "$out/log.txt" 2>&1
wait; log built
nproc >> "$out/log.txt"
(cd $MAIN && TORCH_EXTENSIONS_DIR=/tmp/ext_main PYTHONPATH=$MAIN timeout 60 python3 -m freetoken_cli.main profile --json --cpu-threads 8 > "$out/profile.json" 2>>"$out/log.txt"); log profiled
run() {  # tree ext name cmd...
  local d=$1 e=$2 name=$3; shift 3
  (cd $d && TORCH_EXTENSIONS_DIR=$e PYTHONPATH=$d "$@") >> "$out/$name" 2>&1
}
for t in main mb; do
  d=$([ $t = main ] && echo $MAIN || echo $MB)
  echo "== $t" >> "$out/probe.txt"
  run $d /tmp/ext_$t probe.txt timeout 60 python3 $MAIN/benchmarks/results/2026-11-30-h200-f/ab/probe_short.py; log probe $t
done
dec() {
  local t=$1 d=$([ $1 = main ] && echo $MAIN || echo $MB)
  echo "== $t" >> "$out/decode.txt"
  run $d /tmp/ext_$t decode.txt timeout 150 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 --repeats 3 \
    --moe-policy adaptive --routing trace:/tmp/trace.npy --expert-budget 4GiB,8GiB,16GiB; log decode $t
}
dec main; dec mb
[ $(( $(date +%s) - T0 )) -lt 330 ] && { dec mb; dec main; }
[ $(( $(date +%s) - T0 )) -lt 480 ] && { run $MB /tmp/ext_mb tests.txt timeout $(( 570 - $(date +%s) + T0 )) python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_cpu_executor.py tests/test_policies.py tests/test_graphs.py; log tests; }
grep -E "tok/s|B_P" "$out/decode.txt" | grep -v "^┃" | head -40
cat "$out/probe.txt"; tail -3 "$out/tests.txt" 2>/dev/null
