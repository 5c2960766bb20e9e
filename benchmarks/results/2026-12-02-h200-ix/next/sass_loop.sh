#!/bin/bash
# sass_loop.sh FMT BLOCK_I BLOCK_H NUM_WARPS (from the repository root): compile the decode gate_up GEMV offline and
# count the instructions of its main loop (the first backward branch), its barriers, global and shared loads.
H=$(dirname "$0"); D=${SASS_DIR:-/tmp/sass}; B=$(python3 -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin
PYTHONPATH=. python3 $H/sass_comp.py "$@" > /dev/null || exit 1
$B/cuobjdump -sass $D/k.cubin | grep -E "^\s+/\*[0-9a-f]{4}\*/" | sed 's#/\* 0x[0-9a-f]* \*/##' | awk '{$1=$1};1' > $D/k.sass
lb=$(grep -nE "BRA 0x" $D/k.sass | while IFS=: read n l; do a=$(echo "$l" | sed 's#^/\*\([0-9a-f]*\)\*/.*#\1#'); t=$(echo "$l" | sed 's/.*BRA 0x\([0-9a-f]*\).*/\1/'); [ $((16#$t)) -lt $((16#$a)) ] && echo "$n $t"; done | head -1)
set -- $lb; end=$1; st=$(grep -n "^/\*0*$2\*/" $D/k.sass | cut -d: -f1); L=$(awk -v a=$st -v b=$end 'NR>=a&&NR<=b' $D/k.sass)
echo "loop: $((end-st+1)) instructions; BAR $(echo "$L" | grep -c BAR); MOV $(echo "$L" | grep -c MOV); $(echo "$L" | grep -o 'LDG[.A-Z0-9]*' | sort | uniq -c | tr '\n' ' ')LDS/STS $(echo "$L" | grep -cE 'LDS|STS')"
