#!/usr/bin/env bash
# 1. The decode expert GEMVs over a wider tile set (gemvsweep.py): int4, bf16, int8 at T = 1 and 8.
# 2. Page faults of large anonymous mappings (hugeprobe.py): MADV_HUGEPAGE, O_DIRECT reads into fresh or zeroed memory.
# needs, beside the tracked files: .probe/c3.sh .probe/gemvsweep.py .probe/hugeprobe.py .whl
set -u
out=$1; w=/tmp/c3; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/c3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 .probe/gemvsweep.py .probe/hugeprobe.py $w/
el file; dd if=/dev/zero of=/tmp/big bs=16M count=260 oflag=direct 2> $w/dd.txt; tail -1 $w/dd.txt
el huge; timeout -s ABRT 150 python3 .probe/hugeprobe.py /tmp/big > $w/huge.txt 2>&1; cat $w/huge.txt; pack
el gemv; timeout -s ABRT 330 python3 .probe/gemvsweep.py int4,bf16,int8 $w/gemv.json > $w/gemv.txt 2>&1; cat $w/gemv.txt | cut -c1-400; pack
el done
