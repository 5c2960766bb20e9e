#!/usr/bin/env bash
# call 4: the GPU suites on the merged tree (quantized, architectures incl. gpt-oss and hybrids, elastic), then the
# elastic scenario again (another process takes 20 GiB mid-decode and frees it)
set -u
out=$1; w=/tmp/c4; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c4.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
el tests; timeout -s ABRT 300 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_quant_checkpoints.py \
  tests/test_quant_convert.py tests/test_triton_kernels.py tests/test_parity.py tests/test_archs.py tests/test_hybrid.py \
  tests/test_linear_attention.py tests/test_elastic.py tests/test_graphs.py > $w/gpu_tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $w/gpu_tests.txt | tail -40; pack
el elastic; timeout -s ABRT 200 python3 -m engine.bench.elastic --layers 16 --gpu-gib 32 --other-gib 20 --baseline 8 --hold 15 --recover 15 \
    > $w/elastic.json 2> $w/elastic.err; tail -2 $w/elastic.json; grep -v "^W1201" $w/elastic.err | tail -5; pack; el done
