#!/usr/bin/env bash
# call 5, run as one command line (with the wheels in .whl): the hybrid decode table (graph decode, model routing, three
# policies) and the 16k prefill with its 200-token follow-up, 8 GiB, 16 layers of the Qwen3.5-35B-A3B shape
w=/tmp/n3; mkdir -p $w; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache PYTHONPATH=$PWD:/tmp/site
hy="--synthetic qwen3.5-35b-a3b --layers 16 --cpu-threads 8 --expert-budget 8GiB"
timeout -s ABRT 200 python3 -m freetoken_cli.main bench decode $hy --moe-policy adaptive,fetch,cpu --routing model --tokens 32 --repeats 2 --out $w/decode.json > $w/decode.txt 2>&1
tail -9 $w/decode.txt; cp $w/* $OUT/
timeout -s ABRT 100 python3 -m freetoken_cli.main bench prefill $hy --lengths 16384 --mode adaptive --follow-up 200 --out $w/prefill.json > $w/prefill.txt 2>&1
tail -6 $w/prefill.txt; cp $w/* $OUT/
