# sass_gemm_loop.sh FMT BLOCK_M BLOCK_N BLOCK_K WARPS (from the repository root): the gate_up grouped GEMM's main loop, instructions by opcode
PYTHONPATH=. TRITON_DEFAULT_FP_FUSION=1 timeout 300 .venv/bin/python $(dirname "$0")/sass_gemm.py "$@" || exit 1
B=$(.venv/bin/python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin
$B/cuobjdump -sass /tmp/sg/k.cubin | grep -E "^\s+/\*[0-9a-f]{4}\*/" | sed 's#/\* 0x[0-9a-f]* \*/##' | awk '{$1=$1};1' > /tmp/sg/k.sass
lb=$(grep -nE "BRA 0x" /tmp/sg/k.sass | while IFS=: read n l; do a=$(echo "$l" | sed 's#^/\*\([0-9a-f]*\)\*/.*#\1#'); t=$(echo "$l" | sed 's/.*BRA 0x\([0-9a-f]*\).*/\1/'); [ $((16#$t)) -lt $((16#$a)) ] && echo "$n $t"; done | head -1)
set -- $lb; end=$1; st=$(grep -n "^/\*0*$2\*/" /tmp/sg/k.sass | cut -d: -f1); L=$(awk -v a=$st -v b=$end 'NR>=a&&NR<=b' /tmp/sg/k.sass)
echo "loop $((end-st+1)):" $(echo "$L" | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -12 | awk '{print $2"="$1}')
