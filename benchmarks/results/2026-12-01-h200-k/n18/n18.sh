#!/usr/bin/env bash
# Where a hybrid agent's reuse turn (32k) spends its time: main (.probe/ab/main18: fills and streamed layers copied
# in runs of consecutive rows), the commit before that (.probe/ab/pre18: a copy per expert), and the two CPU-share
# variants that did not gain: shortchunks (1b5d975, .probe/ab/sc: streamed layers leave a 1 - q* share to the CPU)
# and shortchunks16 (f1e1edb, .probe/ab/sc16: chunks <= 16 routes an expert split like decode). torch.profiler Chrome traces of turn 3 (on and off),
# the CPU job's wait and the activations' copy to the host annotated (probe-only patches), summarised by
# traceparts.py: the link's busy share and GB/s, the kernels', the host's blocking calls, the link's longest gaps.
# needs, beside the tracked files: .probe/n18.sh .probe/prof.py .probe/traceparts.py .probe/ab/{main18,pre18,sc,sc16} .whl
set -u
out=$1; w=/tmp/n18; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/n18.tgz -C $w --exclude='trace_*' . ; }  # the traces stay there: their summaries come back
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 .probe/prof.py .probe/traceparts.py $w/
A=$PWD/.probe/ab; P=$PWD/.probe
el executors; (cd $A/main18 && PYTHONPATH=$A/main18:/tmp/site timeout -s ABRT 150 python3 -c \
  "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/build.txt 2>&1
el profile; (cd $A/main18 && PYTHONPATH=$A/main18:/tmp/site timeout -s ABRT 120 python3 -m freetoken_cli.main profile --cpu-threads 8 --json) > $w/profile.json 2>&1
for t in main18 pre18 sc sc16; do
  [ $(left) -gt 100 ] || break
  el agent $t; (cd $A/$t && PYTHONPATH=$A/$t:/tmp/site PROF_TURNS=3 PROF_TORCH=1 PROF_PY=0 PROF_TRACE=$w/trace_$t timeout -s ABRT 170 \
    python3 $P/prof.py bench agent --synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB \
    --system-tokens 30000) > $w/agent_$t.txt 2> $w/agent_$t.err
  tail -14 $w/agent_$t.txt | cut -c1-150; grep "=====" $w/agent_$t.err
  python3 $P/traceparts.py $w/trace_$t/*.json > $w/parts_$t.txt 2>&1; cat $w/parts_$t.txt; pack
done; el done
