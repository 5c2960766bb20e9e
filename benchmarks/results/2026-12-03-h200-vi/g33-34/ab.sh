#!/usr/bin/env bash
# A decode-step kernel change against main (issue 20), one device call: the GPU tests of the patched tree, its probe
# alone, then decode against main, alternating: every expert resident (bf16, 16 GiB) and int4 adaptive at 1152 MiB,
# uniform routing, three rounds. Builds its trees from the working tree: /tmp/main = as it is, /tmp/NAME = patched.
# bash ab.sh OUT NAME "PATCH..." "PYTEST -k EXPRESSION" "PROBE.py[:both]..."; outputs in OUT/NAME.tgz (g33.sh and g34.sh
# call it); patches and probes are paths from this directory; a probe gets its tree's name as its argument, and one
# named with :both runs in the patched tree and main alternately, twice each.
set -u
out=$1; n=$2; patches=$3; kexpr=$4; probe=$5; w=/tmp/$n-out; mkdir -p $w; d=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
pack() { tar czf $out/$n.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 540 - ($(date +%s) - t0) )); }
for t in main $n; do mkdir -p /tmp/$t; cp -r freetoken_kernels engine ftw freetoken_cli tests pyproject.toml /tmp/$t/; done
for p in $patches; do (cd /tmp/$n && patch -p1 < $d/$p); done > $w/patch.txt 2>&1
(cd /tmp/$n && timeout -s ABRT 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_kernels.py -k "$kexpr" -rf --tb=short 2>&1 | tail -30
 timeout -s ABRT 150 python3 -m pytest -q -x -p no:cacheprovider --engine-device cuda tests/test_graphs.py tests/test_parity.py 2>&1 | tail -5) > $w/tests.txt
cat $w/tests.txt; el tested; pack
for pr in $probe; do
  f=${pr%:both}; trees=$n; [ "$f" != "$pr" ] && trees="$n main $n main"
  for t in $trees; do (cd /tmp/$t && PYTHONPATH=/tmp/$t timeout -s ABRT 150 python3 $d/$f $t 2>&1 | sed "s|^|$t $f: |"); done
done | grep -v "Warn\|warn" | tee $w/probe.txt; el probe; pack
dec() {  # tree fmt budget i
  [ $(left) -gt 35 ] || { el skip $1 $2 $3 $4; return 1; }
  el decode $1 $2 $3 $4; a="--quant $2"; [ $2 = bf16 ] && a=""
  (cd /tmp/$1 && FREETOKEN_CACHE=/tmp/ftc PYTHONPATH=/tmp/$1:/tmp/site timeout -s ABRT 60 python3 -m freetoken_cli.main bench decode --synthetic qwen3-30b-a3b \
    --layers 8 $a --expert-budget $3 --moe-policy adaptive --routing uniform --tokens 64 --repeats 3 --out $w/dec_$1_$2_$3_$4.json) > $w/dec_$1_$2_$3_$4.txt 2>&1
  python3 -c "
import json; d=json.load(open('$w/dec_$1_$2_$3_$4.json'))
for r in d['rows']: print('$1 $2 $3 $4', r['policy'], round(r['tok_s'], 1), 'bound', round(r['bound_tok_s'], 1))" | tee -a $w/summary.txt
}
dec main int4 1152MiB 0  # warm-up: builds the synthetic checkpoint
for i in 1 2 3; do dec main bf16 16GiB $i; dec $n bf16 16GiB $i; dec $n int4 1152MiB $i; dec main int4 1152MiB $i; pack; done
el done; pack
