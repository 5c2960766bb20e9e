#!/usr/bin/env bash
# call 4: where the first 500-token request after a cold start spends its extra time: cProfile and torch.profiler of
# the first and second request (bench startup on the 8-layer checkpoint on disk, main).
# needs, beside the tracked files: .probe/c4.sh .probe/ft.sh .probe/firstreq.py
set -u
out=$1; w=/tmp/c4; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 400 - ($(date +%s) - t0) )); }
cp $0 .probe/firstreq.py $w/; d=$PWD
el executor; (PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
el checkpoint; { PYTHONPATH=$d timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$d timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -c 100 $w/checkpoint.txt; echo
run() {
  [ $(left) -gt 40 ] || return 1
  el $*; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$d timeout -s ABRT 60 python3 .probe/firstreq.py $1 $w $2 /tmp/q30b8/ftw > $w/$1_$2.txt 2>&1
  grep "first prefill\|second prefill" $w/$1_$2.txt | tr -s ' '; pack
}
run cprof 0; run cprof 1; run torch 1; run cprof 2
el done
