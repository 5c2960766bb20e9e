#!/usr/bin/env bash
# call 1 (2026-12-01 fourteenth run): versions; elastic scenario (another process takes 20 GiB mid-decode and
# frees it); the startup phases of the 8-layer checkpoint (part startup of benchmarks/h200.sh)
set -u
out=$1; w=/tmp/d1; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/d1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee $w/env.txt
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a $w/env.txt
el elastic; timeout -s ABRT 170 python3 -m engine.bench.elastic --layers 16 --gpu-gib 32 --other-gib 20 --baseline 8 --hold 15 --recover 15 \
    > $w/elastic.json 2> $w/elastic.err; tail -2 $w/elastic.json; grep -v "^W1201" $w/elastic.err | tail -8; pack
sed "s/timeout -s ABRT 300 python3 -m pytest/timeout -s ABRT 100 python3 -m pytest/" benchmarks/h200.sh > /tmp/h200.sh
el startup; timeout -s ABRT 360 bash /tmp/h200.sh startup $w/startup | grep -v "^$" | tail -40; pack; el done
