#!/usr/bin/env bash
# instruction probe (vdpbf16ps / vfmadd / vpermw) and the executor per backend at T=1
set -u
out=$1; w=/tmp/a3; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
cp $0 .probe/gbs3.py .probe/ubench.cpp $w/; lscpu > $w/machine.txt
(cd $w && g++ -O2 -std=c++17 -o ub ubench.cpp && ./ub && ./ub) > $w/ubench.txt 2>&1; cat $w/ubench.txt
PYTHONPATH=$PWD timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build.txt 2>&1
PYTHONPATH=$PWD timeout -s ABRT 300 python3 $w/gbs3.py > $w/gbs3.txt 2>&1; cat $w/gbs3.txt
tar czf $out/a3.tgz -C $w .
