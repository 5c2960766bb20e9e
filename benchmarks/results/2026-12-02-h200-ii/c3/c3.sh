#!/usr/bin/env bash
# call 3: GPU tests of the prefill change; cold starts of the 8-layer checkpoint on disk, the working tree (a 512-token
# warm-up prefill beside the scan-length one) against main d291472 (.probe/ab/head), alternating; then bench decode
# int4 and bf16 at 1152 MiB on main, default threads, b1 and b8.
# needs, beside the tracked files: .probe/c3.sh .probe/ft.sh .probe/ab/head
set -u
out=$1; w=/tmp/c3; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 560 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/head
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el tests; PYTHONPATH=$new timeout -s ABRT 90 python3 -m pytest -q --engine-device cuda tests/test_prefill.py > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack
el checkpoint; { PYTHONPATH=$new timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$new timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt; echo
sta() {  # tree tag
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 40 ] || return 1
  [ $1 = new ] && d=$new || d=$old
  el startup $*; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout -s ABRT 60 $ft $d bench startup /tmp/q30b8/ftw \
    --out $w/startup_$1_$2.json > $w/startup_$1_$2.txt 2>&1
  grep -o '"ready_s": [0-9.]*\|"first_prefill_s": [0-9.]*\|"second_prefill_s": [0-9.]*\|"first_request_ratio": [0-9.]*' $w/startup_$1_$2.json | tr '\n' ' '; echo; pack
}
sta new 0; sta old 0
for i in 1 2 3 4; do sta new $i; sta old $i; done
for q in int4 bf16; do
  [ $(left) -gt 70 ] || break
  qa=""; [ $q = bf16 ] || qa="--quant $q"
  el decode $q; timeout -s ABRT 90 $ft $old bench decode --synthetic qwen3-30b-a3b --layers 8 $qa --expert-budget 1152MiB \
    --moe-policy adaptive --routing uniform --batch 1,8 --depth 1024 --tokens 64 --repeats 3 \
    --out $w/decode_$q.json > $w/decode_$q.txt 2>&1
  grep "tok/s (" $w/decode_$q.txt | cut -c1-160; pack
done
el done
