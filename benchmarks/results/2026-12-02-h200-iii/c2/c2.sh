#!/usr/bin/env bash
# call 2, with flash-linear-attention 0.6.0 (wheels carried in .whl): the hybrid agent session at 64k, main against
# fcb9883 (.probe/ab/g15: before the link-bound groups); hybrid decode at 8 GiB and all resident, b1 / b8, main
# against f027c04 (.probe/ab/pre123: before the decode-ahead of hybrids).
# needs, beside the tracked files: .probe/c2.sh .probe/ft.sh .probe/ab/{g15,pre123} .whl
set -u
out=$1; w=/tmp/c2; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c2.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 575 - ($(date +%s) - t0) )); }
cp $0 $w/; nproc > $w/machine.txt; nvidia-smi -L >> $w/machine.txt
ft="$PWD/.probe/ft.sh"; A=$PWD/.probe/ab
tree() { case $1 in new) echo $PWD;; *) echo $A/$1;; esac; }
for t in new g15 pre123; do
  d=$(tree $t); el executor $t; (cd $d && PYTHONPATH=$d timeout -s ABRT 150 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") >> $w/build.txt 2>&1
done
(cd /tmp && PYTHONPATH=/tmp/site python3 -c "import fla; print('fla', fla.__version__)") > $w/fla.txt 2>&1; cat $w/fla.txt
el profile; timeout -s ABRT 90 $ft $PWD profile --json > $w/profile.json 2>&1; tail -c 300 $w/profile.json; echo
agent() {  # tree tag
  [ $(left) -gt 120 ] || return 1
  el agent $*; timeout -s ABRT $(( $(left) - 20 )) $ft $(tree $1) bench agent --synthetic qwen3.5-35b-a3b --layers 16 --expert-budget 8GiB \
    --system-tokens 64000 --out $w/agent_$1_$2.json > $w/agent_$1_$2.txt 2> $w/agent_$1_$2.err
  grep "│" $w/agent_$1_$2.txt | cut -c1-120; grep "^turn 2" $w/agent_$1_$2.txt; pack
}
dec() {  # tree tag
  [ $(left) -gt 60 ] || return 1
  el decode $*; timeout -s ABRT $(( $(left) - 10 )) $ft $(tree $1) bench decode --synthetic qwen3.5-35b-a3b --layers 16 --expert-budget 8GiB,64GiB \
    --batch 1,8 --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/decode_$1_$2.json > $w/decode_$1_$2.txt 2>&1
  grep "│" $w/decode_$1_$2.txt | cut -c1-150; pack
}
agent new 1; agent g15 1
dec new 1; dec pre123 1
el done
