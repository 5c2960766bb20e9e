#!/usr/bin/env bash
# thirty-third run, call 5: where the first 1500-token request's time goes with the GEMM warm-up (cProfile, working tree).
out=$1; w=/tmp/e5; mkdir -p $w; cp $0 .probe/firstreq.py $w/
[ -d /tmp/q30b8/ftw ] || { echo no checkpoint; exit 0; }
sed -i 's/sys.argv\[4:5\]/sys.argv[4:5] + ["--prompt-tokens", "1500"]/' $w/firstreq.py
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONPATH=$PWD timeout -s ABRT 60 python3 $w/firstreq.py cprof $w new /tmp/q30b8/ftw > $w/cprof_new.txt 2>&1
head -30 $w/cprofnew_1.txt; tar czf $out/e5.tgz -C $w .
