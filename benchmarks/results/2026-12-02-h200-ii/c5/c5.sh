#!/usr/bin/env bash
# call 5: cold starts of the 8-layer checkpoint on disk, main (the all-resident prefill's hit count without
# torch.bincount, a 512-token warm-up prefill) against d291472 (.probe/ab/head), alternating; GPU tests.
# needs, beside the tracked files: .probe/c5.sh .probe/ft.sh .probe/ab/head
set -u
out=$1; w=/tmp/c5; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c5.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 330 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/head
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
[ -d /tmp/q30b8/ftw ] || { el checkpoint; { PYTHONPATH=$new timeout -s ABRT 120 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  PYTHONPATH=$new timeout -s ABRT 100 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; }
sta() {  # tree tag
  [ -d /tmp/q30b8/ftw ] && [ $(left) -gt 30 ] || return 1
  [ $1 = new ] && d=$new || d=$old
  el startup $*; env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout -s ABRT 50 $ft $d bench startup /tmp/q30b8/ftw \
    --out $w/startup_$1_$2.json > $w/startup_$1_$2.txt 2>&1
  grep -o '"ready_s": [0-9.]*\|"first_prefill_s": [0-9.]*\|"second_prefill_s": [0-9.]*\|"first_request_ratio": [0-9.]*' $w/startup_$1_$2.json | tr '\n' ' '; echo; pack
}
sta new 0; sta old 0
for i in 1 2 3 4; do sta new $i; sta old $i; done
[ $(left) -gt 60 ] && { el tests; PYTHONPATH=$new timeout -s ABRT 55 python3 -m pytest -q --engine-device cuda tests/test_expert_memory.py tests/test_graphs.py -k "resident or warm" > $w/tests.txt 2>&1; tail -2 $w/tests.txt; pack; }
el done
