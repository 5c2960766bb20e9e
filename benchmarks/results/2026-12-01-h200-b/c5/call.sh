#!/usr/bin/env bash
# call 5: part train of benchmarks/h200.sh with shorter training windows (the device time left)
set -u
sed -e 's/--train-until 240/--train-until 165/; s/timeout -s ABRT 320/timeout -s ABRT 225/' \
    -e 's/--train-until 150/--train-until 95/; s/timeout -s ABRT 195/timeout -s ABRT 140/' benchmarks/h200.sh > /tmp/h200_train.sh
grep -n "train-until" /tmp/h200_train.sh
bash /tmp/h200_train.sh train $1
