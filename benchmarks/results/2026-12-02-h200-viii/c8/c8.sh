#!/usr/bin/env bash
# thirty-first run, call 4: the int4 GEMV's per-instruction counters from c7's report.
set -u
out=$1; w=$out/c8; mkdir -p $w; cp $0 $w/
N=/usr/local/cuda/bin/ncu
$N --version > $w/log.txt 2>&1
$N --import .probe/gemv.ncu-rep --page source --csv --print-source sass > $w/src_sass.csv 2>> $w/log.txt; echo "rc $? $(wc -c < $w/src_sass.csv)" >> $w/log.txt
[ -s $w/src_sass.csv ] || $N --import .probe/gemv.ncu-rep --page source --csv > $w/src.csv 2>> $w/log.txt
$N --import .probe/gemv.ncu-rep --page details --print-details all > $w/details_all.txt 2>> $w/log.txt
cat $w/log.txt; head -c 1500 $w/src_sass.csv
cd $out && tar -czf c8.tgz c8 && rm -rf c8
