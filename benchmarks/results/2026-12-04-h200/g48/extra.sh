#!/usr/bin/env bash
# g48's later calls on the same warm machine (after g48.sh had built llama.cpp and converted the checkpoint into
# /tmp/g48): run(command="bash benchmarks/results/2026-12-04-h200/g48/extra.sh $OUT CALL") with CALL 3, 4 or 5.
# Call 3 first moved the second call's outputs to /tmp/g48/r1/ and ran g48.sh again (every benchmark a second time).
set -u
out=$1; w=/tmp/g48; B=$w/llb/bin
export PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftc
case $2 in
3) mkdir -p $w/r1 && mv $w/lcpp_* $w/ft_* $w/r1/; bash benchmarks/results/2026-12-04-h200/g48/g48.sh $out > /dev/null 2>&1
   timeout 120 $B/llama-bench -m $w/q4km.gguf -ngl 99 -ncmoe 5,0 -p 16384 -n 0 -r 2 -ub 4096 -b 4096 > $w/lcpp_pp_ub4096.txt 2> $w/lcpp_pp_ub4096.err
   timeout 100 $B/llama-bench -m $w/q4km.gguf -ngl 99 -ncmoe 5 -p 0 -n 128 -r 5 -t 16,14,16,14 > $w/lcpp_t16_r5.txt 2>&1 ;;
4) timeout 150 $B/llama-bench -m $w/q4km.gguf -ngl 99 -ncmoe 5,0 -p 0 -n 64 -d 16384 -r 3 -t 16 > $w/lcpp_d16k.txt 2> $w/lcpp_d16k.err
   timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode $w/int4 --expert-budget 1152MiB,8GiB --moe-policy adaptive \
     --routing uniform,model --depth 16384 --tokens 64 --repeats 3 --out $w/ft_d16k.json > $w/ft_d16k.txt 2>&1 ;;
5) for i in 1 2; do
     timeout -s ABRT 150 python3 -m freetoken_cli.main bench decode $w/int4 --expert-budget 1152MiB --moe-policy adaptive \
       --routing uniform --depth 1024,16384 --tokens 64 --repeats 3 --out $w/ft_depth_$i.json > $w/ft_depth_$i.txt 2>&1
     timeout 150 $B/llama-bench -m $w/q4km.gguf -ngl 99 -ncmoe 5 -p 0 -n 64 -d 1024,16384 -r 3 -t 16 > $w/lcpp_depth_$i.txt 2> $w/lcpp_depth_$i.err
   done ;;
esac
tar czf $out/g48.tgz -C $w --exclude=llb --exclude=hf --exclude=int4 --exclude='*.gguf' .
