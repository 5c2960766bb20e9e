#!/usr/bin/env bash
# call 3: elastic expert memory (another process takes 20 GiB mid-decode), then the parity/arch suites on CUDA in one process
set -u
out=$1; w=/tmp/c3; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
el elastic; timeout -s ABRT 250 python3 -m engine.bench.elastic --layers 16 --gpu-gib 32 --other-gib 20 \
    > $w/elastic.json 2> $w/elastic.err; tail -3 $w/elastic.json; tail -5 $w/elastic.err; pack
el tests; timeout -s ABRT 280 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_elastic.py tests/test_parity.py tests/test_archs.py > $w/gpu_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $w/gpu_tests.txt | tail -30; pack; el done
