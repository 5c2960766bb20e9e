#!/usr/bin/env bash
# g48: FreeToken against llama.cpp on one checkpoint, one machine. The 8-layer Qwen3-30B-A3B-shaped model in HF layout
# (random bf16 weights, `engine.bench.make_checkpoint`) converted both ways: `freetoken convert --quant int4` (groups
# of 128) and llama.cpp's convert_hf_to_gguf.py (to_gguf.py beside this script) then `llama-quantize Q4_K_M`.
# llama.cpp built here from source: unslothai/llama.cpp d32676d77 (a fork tracking ggml-org master, 2026-08-18),
# pruned to CMakeLists.txt cmake common ggml src include tools/{llama-bench,quantize} vendor gguf-py conversion
# convert_hf_to_gguf.py (the other ggml backends and tools deleted, tools/CMakeLists.txt reduced to the two tools), at
# $LLAMA_SRC (default .probe/llama/src); CUDA for sm_90 with its defaults (FlashAttention kernels on), -march=native.
# Decode: llama-bench -ngl 99 with the experts of the first N layers on the CPU (--n-cpu-moe N, the placement
# llama.cpp's users run), N chosen so that the experts left on the GPU take at most FreeToken's budget (1152 MiB),
# against `freetoken bench decode` at that budget; then every expert on the GPU on both; the threads; a 16k prefill.
# Steps are skipped when their output exists, so a second call on a warm machine goes on where the first stopped.
# run(command="bash benchmarks/results/2026-12-04-h200/g48/g48.sh $OUT", carry=[".probe/llama/src"]); outputs in g48.tgz
set -u
out=$1; w=/tmp/g48; mkdir -p $w; here=$PWD/benchmarks/results/2026-12-04-h200/g48
L=${LLAMA_SRC:-$PWD/.probe/llama/src}; B=$w/llb/bin
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
pack() { tar czf $out/g48.tgz -C $w --exclude=llb --exclude=hf --exclude=int4 --exclude='*.gguf' . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 575 - ($(date +%s) - t0) )); }
[ -f $w/machine.txt ] || { nproc; lscpu | grep -i "model name\|flags" | cut -c1-400; nvidia-smi -L; free -g; df -h /tmp; } > $w/machine.txt 2>&1
ft() { PYTHONPATH=$PWD python3 -m freetoken_cli.main "$@"; }

# build llama.cpp (background) while the checkpoint is made and converted
if [ ! -x $B/llama-bench ]; then
  el build llama.cpp
  ( cmake -S $L -B $w/llb -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_NATIVE=ON -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF \
    && timeout 520 ninja -C $w/llb -j16 llama-bench llama-quantize && echo BUILD OK ) > $w/build.log 2>&1 &
  bp=$!
fi
(PYTHONPATH=$PWD timeout -s ABRT 150 python3 -c "from freetoken_kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()") > $w/ext.txt 2>&1 &
[ -f $w/hf/config.json ] || { el checkpoint; PYTHONPATH=$PWD python3 -m engine.bench.make_checkpoint $w/hf --layers 8 > $w/make.txt 2>&1; }
[ -f $w/bf16.gguf ] || { el to_gguf; (time python3 $here/to_gguf.py $L $w/hf $w/bf16.gguf) > $w/to_gguf.txt 2>&1 || rm -f $w/bf16.gguf; } & p1=$!
[ -f $w/int4/config.json ] || { el convert int4; (time ft convert $w/hf $w/int4 --quant int4) > $w/convert.txt 2>&1; } & p2=$!
wait $p1 $p2; tail -4 $w/to_gguf.txt $w/convert.txt
du -sh $w/hf $w/int4 $w/bf16.gguf >> $w/log.txt 2>&1
[ -n "${bp:-}" ] && { el wait build; wait $bp; }
tail -3 $w/build.log; pack
[ -x $B/llama-quantize ] || { el NO BUILD; pack; exit 1; }
[ -f $w/q4km.gguf ] || { el quantize; (time $B/llama-quantize $w/bf16.gguf $w/q4km.gguf Q4_K_M 16) > $w/quantize.txt 2>&1; tail -3 $w/quantize.txt; }
# the experts' bytes a layer in the GGUF, and N: the fewest layers' experts on the CPU that leave <= 1152 MiB on the GPU
[ -f $w/ncmoe.txt ] || python3 - $L $w/q4km.gguf > $w/ncmoe.txt <<'EOF'
import sys; sys.path.insert(0, sys.argv[1] + "/gguf-py")
import gguf
r = gguf.GGUFReader(sys.argv[2]); per = {}; types = set()
for t in r.tensors:
    if "_exps" in t.name:
        per[int(t.name.split(".")[1])] = per.get(int(t.name.split(".")[1]), 0) + int(t.n_bytes); types.add((t.name.split(".")[2], t.tensor_type.name))
L = len(per); budget = 1152 * 2**20
n = next(n for n in range(L + 1) if sum(per[i] for i in range(n, L)) <= budget)
print("per-layer expert bytes (MiB):", [round(per[i] / 2**20, 1) for i in range(L)], "types:", sorted(types))
print("gpu expert MiB at n-cpu-moe", {k: round(sum(per[i] for i in range(k, L)) / 2**20) for k in range(L + 1)})
print(n)
EOF
N=$(tail -1 $w/ncmoe.txt); el "n-cpu-moe $N"; cat $w/ncmoe.txt
lb() {  # name need_s args...
  local n=$1 need=$2; shift 2
  [ -s $w/$n.txt ] && return 0; [ $(left) -gt $need ] || { el skip $n; return 1; }
  el $n; timeout $(( $(left) - 5 )) $B/llama-bench -m $w/q4km.gguf -ngl 99 "$@" > $w/$n.tmp 2> $w/$n.err && mv $w/$n.tmp $w/$n.txt || el "$n rc $?"; cat $w/$n.t*; pack
}
fb() {  # name need_s bench-kind args...
  local n=$1 need=$2; shift 2
  [ -s $w/$n.json ] && return 0; [ $(left) -gt $need ] || { el skip $n; return 1; }
  el $n; (timeout -s ABRT $(( $(left) - 5 )) python3 -m freetoken_cli.main bench "$@" --out $w/$n.json) > $w/$n.txt 2>&1 || el "$n failed"
  grep -v "^\s*$" $w/$n.txt | tail -12; pack
}
export PYTHONPATH=$PWD
lb lcpp_dec 60 -ncmoe $N,$(( N - 1 )),8,0 -p 0 -n 128 -r 3
fb ft_dec 120 decode $w/int4 --expert-budget 1152MiB,8GiB --moe-policy adaptive --routing uniform,model --tokens 64 --repeats 3
lb lcpp_threads 60 -ncmoe $N -p 0 -n 128 -r 3 -t 4,8,12,14,16
fb ft_threads 90 decode $w/int4 --expert-budget 1152MiB --moe-policy adaptive --routing uniform --cpu-threads 4,8,12,16 --tokens 64 --repeats 3
lb lcpp_pp 90 -ncmoe $N,0 -p 16384 -n 0 -r 2
fb ft_pp 90 prefill $w/int4 --expert-budget 1152MiB,8GiB --lengths 16384 --mode adaptive --follow-up 0 --repeats 3
lb lcpp_dec2 60 -ncmoe $N,8,0 -p 0 -n 128 -r 3
fb ft_dec2 120 decode $w/int4 --expert-budget 1152MiB,8GiB --moe-policy adaptive,fetch,cpu --routing uniform,model --tokens 64 --repeats 3
el done; pack
