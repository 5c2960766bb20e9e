#!/usr/bin/env bash
# g42 (forty-third run; issue 20, a probe): since the twenty-ninth run a CPU job's units run slower the more threads
# the job has (int4 phase 1 +44% a unit at 14 threads, phase 2 +84%), and g38/g41 saw units slow down again when the
# lock spin made the workers join sooner, with no tok/s gained. freq.cpp: T pinned threads started together, each
# for 0.5 s: a scalar add chain (the clock), VDPBF16PS on registers (the clock under AVX-512), the int4 row kernel
# over a private L2-sized region and over 256 MiB. If the per-thread rates fall with T without memory in the loop,
# the cores clock down under the load and the executor's threads share a power budget, not a lock.
# run(command="bash benchmarks/results/2026-12-03-h200-vi/g42/g42.sh $OUT"); outputs in g42.tgz
set -u
out=$1; w=/tmp/g42; mkdir -p $w; d=$(cd "$(dirname "$0")" && pwd)
lscpu > $w/lscpu.txt; (grep . /sys/devices/system/cpu/cpu0/cpufreq/* /sys/devices/system/cpu/intel_pstate/* 2>&1 | head -40) > $w/cpufreq.txt
g++ -O2 -pthread -o /tmp/freq $d/freq.cpp > $w/build.txt 2>&1
timeout -s ABRT 100 /tmp/freq 1,2,4,8,14,16 0.5 2>&1 | tee $w/freq.txt
grep -h "MHz" /proc/cpuinfo | sort | uniq -c | head -5 >> $w/cpufreq.txt
tar czf $out/g42.tgz -C $w .
