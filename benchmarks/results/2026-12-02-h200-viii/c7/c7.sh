#!/usr/bin/env bash
# thirty-first run, call 3: where the int4 decode GEMV stalls (ncu, if the host has it); the Triton kernel tests on the GPU.
set -u
out=$1; w=$out/c7; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }
cp $0 .probe/ncu.py $w/
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); el "ncu: ${N:-none}"
ls /usr/local/ 2>&1 | head -20 >> $w/log.txt; pip list 2>/dev/null | grep -i -E "nvidia|cuda|nsight" >> $w/log.txt
if [ -n "$N" ]; then
  PYTHONPATH=$PWD timeout -s ABRT 200 $N --kernel-name regex:"_gate_up_kernel|_down_kernel" --launch-skip 2 --launch-count 2 --set full \
    --import-source no -o $w/gemv python3 .probe/ncu.py > $w/ncu.txt 2>&1; el ncu rc $?
  $N --import $w/gemv.ncu-rep --page details > $w/ncu_details.txt 2>&1
  $N --import $w/gemv.ncu-rep --page raw --csv > $w/ncu_raw.csv 2>&1; el reports
fi
(PYTHONPATH=$PWD timeout -s ABRT 260 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py -k moe_experts > $w/tests.txt 2>&1); tail -n 3 $w/tests.txt
el done
cd $out && tar -czf c7.tgz c7 && rm -rf c7
