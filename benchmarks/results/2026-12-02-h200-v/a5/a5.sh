#!/usr/bin/env bash
# the executor's tests on the H200 host's Xeon (every forced path), then quantized checkpoints on CUDA
set -u
out=$1; w=/tmp/a5; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
cp $0 $w/
PYTHONPATH=$PWD timeout -s ABRT 120 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_executor.py > $w/cpu_executor.txt 2>&1; tail -3 $w/cpu_executor.txt
PYTHONPATH=$PWD timeout -s ABRT 100 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_quant_checkpoints.py > $w/quant_cuda.txt 2>&1; tail -3 $w/quant_cuda.txt
tar czf $out/a5.tgz -C $w .
