#!/usr/bin/env bash
# thirty-third run, call 4: cold starts of the 8-layer checkpoint on disk, the dense GEMMs warmed at every row count
# up to 2048 (new = working tree) against dcbc6d9 (.probe/ab/head), alternating, at 500-, 1500- and 3000-token
# prompts; GPU tests of the graphs and the warm-up.
set -u
out=$1; w=/tmp/e4; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/e4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 330 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new head; do d=$(tree $t); (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build_$t.txt 2>&1) & done
el checkpoint; { PYTHONPATH=$PWD timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$PWD timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1
wait; el converted; rm -rf /tmp/q30b8/hf
sta() {  # tree tag prompt-tokens
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 25 ] || return 1
  el startup $*; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout -s ABRT 40 $ft $(tree $1) bench startup /tmp/q30b8/ftw \
    --prompt-tokens $3 --out $w/startup_$1_$2_$3.json > $w/startup_$1_$2_$3.txt 2>&1
  grep -o '"ready_s": [0-9.]*\|"first_prefill_s": [0-9.]*\|"second_prefill_s": [0-9.]*\|"first_request_ratio": [0-9.]*' $w/startup_$1_$2_$3.json | tr '\n' ' ' | tee -a $w/log.txt; echo; pack
}
sta new 0 500; sta head 0 500
for i in 1 2; do sta head $i 500; sta new $i 500; done
for i in 1 2; do sta new $i 1500; sta head $i 1500; done
sta head 1 3000; sta new 1 3000
el tests; PYTHONPATH=$PWD timeout -s ABRT 100 python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py > $w/tests.txt 2>&1; tail -n 1 $w/tests.txt
el done; pack
