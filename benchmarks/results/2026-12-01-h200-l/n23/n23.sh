#!/usr/bin/env bash
# The GPU tests of branch lookahead (the working tree): scheduler, graphs, demo, prefill, Triton kernels, with the engine on cuda.
# needs, beside the tracked files: .probe/n23.sh .whl
set -u
out=$1; w=/tmp/n23; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
cp $0 $w/
PYTHONPATH=$PWD:/tmp/site timeout -s ABRT 400 python3 -m pytest -q --engine-device cuda tests/test_radix.py \
  tests/test_graphs.py tests/test_demo.py tests/test_prefill.py tests/test_triton_kernels.py tests/test_sliding.py -k "not beats and not readme" > $w/tests.txt 2>&1
tail -15 $w/tests.txt; cp $w/* $out/
