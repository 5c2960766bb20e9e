#!/usr/bin/env bash
# thirtieth run, call 3: the 48-layer rows again after a1045b8 (the plan kernel's scan), bf16 and int4 side by side,
# three policies, and the int4 step profile at 48 layers.
set -u
out=$1; w=/tmp/c3; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/c3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $w/log.txt; }; left() { echo $(( 570 - ($(date +%s) - t0) )); }
cp $0 $w/; lscpu > $w/machine.txt; nvidia-smi -L >> $w/machine.txt; free -g >> $w/machine.txt
ft="$PWD/.probe/ft.sh"
(PYTHONPATH=$PWD timeout -s ABRT 200 python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $w/build.txt 2>&1); el built
dec() {  # format need_s
  [ $(left) -gt $2 ] || { el skip $1; return 1; }
  el decode $1; a="--quant $1"; [ $1 = bf16 ] && a=""
  timeout -s ABRT $(( $(left) - 5 )) $ft $PWD bench decode --synthetic qwen3-30b-a3b $a --expert-budget 8GiB \
    --moe-policy adaptive,fetch,cpu --routing uniform --tokens 32 --repeats 3 --out $w/decode48_$1.json > $w/decode48_$1.txt 2>&1
  grep "│\|B_P\|rror" $w/decode48_$1.txt | cut -c1-220; pack
}
dec bf16 100; dec int4 60
if [ $(left) -gt 90 ]; then el step_profile; (PYTHONPATH=$PWD timeout -s ABRT $(( $(left) - 5 )) mkdir -p /tmp/c3sp; python3 -m engine.bench.step_profile uniform 48 8GiB /tmp/c3sp qwen3-30b-a3b cuda int4 1024) > $w/step_profile48_int4.txt 2>&1; tail -n 80 $w/step_profile48_int4.txt | cut -c1-160; fi
el done; pack
