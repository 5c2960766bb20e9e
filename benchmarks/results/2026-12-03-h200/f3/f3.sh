#!/usr/bin/env bash
# call 3: compressed-tensors checkpoints (FP8 / int8 with a scale per row, w4a16) on CUDA; per-row scales' GEMV cost
out=$1; mkdir -p $out/f3; nvidia-smi -L > $out/f3/machine.txt
pip install -q --no-deps --target /tmp/site .probe/wheels/*.whl > $out/f3/pip.txt 2>&1
export PYTHONPATH=$PWD:/tmp/site TRITON_DEFAULT_FP_FUSION=1
python3 -c "from kernels.cpu_executor import CPUExecutor; CPUExecutor(2).close()" > $out/f3/build.txt 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider --engine-device cuda tests/test_quant_checkpoints.py tests/test_quant_unpack.py tests/test_triton_kernels.py -k "ct- or compressed or scale_per_row or quantized_matches_ref" 2>&1 | tail -15 | tee $out/f3/tests.txt
timeout 100 python3 .probe/chan.py 2>&1 | tee $out/f3/chan.jsonl
cp .probe/f3.sh .probe/chan.py $out/f3/
