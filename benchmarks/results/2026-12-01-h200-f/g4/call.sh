#!/usr/bin/env bash
# GPU tests of main (Triton kernels incl. the E2M1 decode, prefill streaming of non-resident experts, hybrids),
# then a CPU probe: bf16 expert FFNs through torch's matmul (oneDNN, AMX) beside the executor at T routes per expert.
# needs, beside the tracked files: ".probe/g1.sh", ".probe/amx.py", ".whl"
set -u
out=$1; w=/tmp/g1; mkdir -p $w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
pack() { tar czf $out/g1.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 .probe/amx.py $w/
el tests; timeout -s ABRT 330 python3 -m pytest -q -p no:cacheprovider -rf --engine-device cuda tests/test_triton_kernels.py \
  tests/test_prefill.py tests/test_expert_memory.py tests/test_hybrid.py > $w/gpu_tests.txt 2>&1; grep -v "^  File\|^Extension" $w/gpu_tests.txt | tail -15; pack
el amx; timeout -s ABRT 150 python3 .probe/amx.py 8,16 > $w/amx.txt 2>&1; tail -12 $w/amx.txt; pack; el done
