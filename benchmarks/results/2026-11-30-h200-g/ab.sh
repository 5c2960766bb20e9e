#!/usr/bin/env bash
# A/B in one call: fills on the copy engine queued by the poller (this tree) against main's gather
# kernel (this tree with ce_fill.patch reversed). Usage: bash ab.sh [tests|notests] ["tree order"]
set -u
out=$OUT; T0=$(date +%s); here=benchmarks/results/2026-11-30-h200-g
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$out/log.txt"; }
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache
BR=$PWD; MAIN=/tmp/main
mkdir -p $MAIN && cp -r $(ls) $MAIN/ && patch -s -R -p1 -d $MAIN < $here/${PATCH:-ce_fill}.patch && log "main tree ready"
build() { (cd $1 && TORCH_EXTENSIONS_DIR=$2 PYTHONPATH=$1 timeout 200 python3 -c "from kernels.cpu_executor import cpu_executor_available as a; print('$1', a())"); }
build $MAIN /tmp/ext_main >> "$out/log.txt" 2>&1 &
build $BR /tmp/ext_br >> "$out/log.txt" 2>&1 &
python3 benchmarks/make_trace.py /tmp/trace.npy --tokens 512 >> "$out/log.txt" 2>&1
wait; log built
run() {  # tree-name outfile limit cmd...
  local t=$1 f=$2 lim=$3; shift 3
  local d=$([ $t = main ] && echo $MAIN || echo $BR)
  (cd $d && TORCH_EXTENSIONS_DIR=/tmp/ext_$t PYTHONPATH=$d timeout $lim "$@") >> "$out/$f" 2>&1
}
run br profile.json 60 python3 -m freetoken_cli.main profile --json --cpu-threads 8; log profiled
if [ "${1:-tests}" = tests ]; then
  run br tests.txt 200 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_triton_kernels.py -k "stage or moe or fill or graph or polic" \
    tests/test_graphs.py tests/test_policies.py tests/test_cpu_executor.py; log "tests: $(tail -1 $out/tests.txt)"
fi
dec() {
  echo "== $1" >> "$out/decode.txt"
  run $1 decode.txt 150 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b --cpu-threads 8 --tokens 32 \
    --repeats 3 --moe-policy adaptive --routing trace:/tmp/trace.npy --expert-budget 4GiB,8GiB,16GiB; log "decode $1"
}
order=${2:-br main br main}; i=0
for t in $order; do [ $(( $(date +%s) - T0 )) -lt $(( 180 + 100 * i )) ] && dec $t; i=$((i + 1)); done
grep -E "^==|tok/s" "$out/decode.txt" | grep -v "┃" | head -40
