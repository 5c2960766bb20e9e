#!/usr/bin/env bash
# call 3 (2026-12-01 fourteenth run): the startup phases with the warm-ups and capture overlapped with the expert
# read (empty compile caches; warm; warm with bytecode writable: the device sets PYTHONDONTWRITEBYTECODE); then
# issue 23's decode rows at an 8 GiB budget: gpt-oss-120b (MXFP4, 8 layers), DeepSeek-V3 (FP8, 5 layers: 3 dense
# + 2 MoE), GLM-4.5-Air (bf16, 9 layers: 1 dense + 8 MoE)
set -u
out=$1; w=/tmp/d3; mkdir -p $w
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH=$PWD FREETOKEN_CACHE=/tmp/ftcache
pack() { tar czf $out/d3.tgz -C $w . ; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
cp $0 $w/call.sh
el checkpoint; { timeout -s ABRT 200 python3 -m engine.bench.make_checkpoint /tmp/q30b8/hf --layers 8 &&
  timeout -s ABRT 150 python3 -m freetoken_cli.main convert /tmp/q30b8/hf /tmp/q30b8/ftw; } > $w/checkpoint.txt 2>&1; tail -1 $w/checkpoint.txt
el profile; ls /tmp/ftcache/profiles/*.json > /dev/null 2>&1 || timeout 60 python3 -m freetoken_cli.main profile --json --cpu-threads 8 > $w/profile.json 2> $w/profile.err
st() { timeout -s ABRT 75 "$@" python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 --out $w/startup_$run.json > $w/startup_$run.txt 2>&1
  grep -E "│ (import|dense|pin|prefill|compile|wait|ready|first|second)|Triton|modules" $w/startup_$run.txt | cut -c1-150; }
rm -rf /tmp/ftcache/compile /tmp/ftcache/pycache
for run in cold warm; do el $run; st; pack; done
run=bytecode; el $run; st env -u PYTHONDONTWRITEBYTECODE; pack
d() { timeout -s ABRT 65 python3 -m freetoken_cli.main bench decode --synthetic $1 --layers $2 --quant $3 --expert-budget 8GiB \
  --cpu-threads 8 --moe-policy adaptive,fetch,cpu --routing model --tokens 32 --repeats 3 --out $w/decode_$1.json > $w/decode_$1.txt 2>&1
  tail -6 $w/decode_$1.txt; }
el gpt-oss; d gpt-oss-120b 8 mxfp4; pack
el deepseek; d deepseek-v3 5 fp8; pack
el glm; timeout -s ABRT 65 python3 -m freetoken_cli.main bench decode --synthetic glm-4.5-air --layers 9 --expert-budget 8GiB \
  --cpu-threads 8 --moe-policy adaptive,fetch,cpu --routing model --tokens 32 --repeats 3 --out $w/decode_glm.json > $w/decode_glm.txt 2>&1
tail -6 $w/decode_glm.txt; pack; el done
