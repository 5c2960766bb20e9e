#!/usr/bin/env bash
# Call 2: GPU tests of the prefill path; the cold start of the 8-layer checkpoint on disk with bytecode
# writable (the device sets PYTHONDONTWRITEBYTECODE; users keep bytecode), after the meta-embedding fix
# needs, beside the tracked files: ".probe/next2.sh"
set -u
out=$1; w=/tmp/n2; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD
pack() { tar czf $out/n2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( $1 - ($(date +%s) - t0) )); }
cp $0 $w/call.sh
el tests; timeout -s ABRT 150 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_prefill.py tests/test_expert_memory.py tests/test_triton_kernels.py \
  tests/test_hybrid.py > $w/gpu_tests.txt 2>&1; tail -3 $w/gpu_tests.txt; pack
el checkpoint; { timeout -s ABRT 200 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  timeout -s ABRT 150 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -1 $w/checkpoint.txt
python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2>&1
for run in dontwrite writable1 writable2; do
  [ $(left 560) -gt 40 ] || break
  if [ $run = dontwrite ]; then env=""; else env="env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc"; fi
  el startup $run; $env timeout -s ABRT 60 python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 \
    --out $w/startup_$run.json > $w/startup_$run.txt 2>&1; grep -E "import|dense|ready|prefill" $w/startup_$run.txt; pack
done; el done
