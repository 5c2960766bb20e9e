#!/usr/bin/env bash
# call 1: GPU tests of the hybrid decode-ahead (123d4ae), the routes buffer (fcb9883) and the link-bound groups
# (15ed9af); the hybrid agent session at 64k, main against fcb9883 (.probe/ab/g15: before the link-bound groups).
# needs, beside the tracked files: .probe/c1.sh .probe/ft.sh .probe/ab/g15
set -u
out=$1; w=/tmp/c1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; new=$PWD; old=$PWD/.probe/ab/g15
for t in $new $old; do
  el executor $t; (cd $t && PYTHONPATH=$t timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
el profile; timeout -s ABRT 90 $ft $new profile --json > $w/profile.json 2>&1; tail -c 600 $w/profile.json; echo
el tests; PYTHONPATH=$new timeout -s ABRT 170 python3 -m pytest -q -rf -p no:cacheprovider --engine-device cuda tests/test_hybrid.py \
  tests/test_prefill.py tests/test_graphs.py > $w/tests.txt 2>&1; tail -6 $w/tests.txt; pack
agent() {  # tree tag
  [ $(left) -gt 100 ] || return 1
  [ $1 = new ] && d=$new || d=$old
  el agent $*; timeout -s ABRT $(( $(left) - 20 )) $ft $d bench agent --synthetic qwen3.5-35b-a3b --layers 16 --expert-budget 8GiB \
    --system-tokens 64000 --out $w/agent_$1_$2.json > $w/agent_$1_$2.txt 2> $w/agent_$1_$2.err
  grep "│" $w/agent_$1_$2.txt | cut -c1-120; grep "^turn 2" $w/agent_$1_$2.txt; pack
}
agent new 1; agent old 1
el done
